//! Loom models of the memif head/tail protocol (`specs/memif.md` §5), one producer and one
//! consumer on one ring, run on the very steps the driver uses: [`Window::server`] and
//! [`Window::client`] (the peer's counter read once with `ring::acquire`, checked once) and
//! `ring::publish`, with loom's atomics behind the `ring::Counter` trait. Each slot's descriptor
//! length and buffer are `loom::cell::Cell`s, so loom reports any access to them that the
//! counters' orderings do not order, as well as the values being checked here.
//!
//! The counters start just below 2^16, so every model wraps the `u16` counters.
//!
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p memnic-memif --test loom_ring --release
#![cfg(loom)]

use std::sync::atomic::Ordering;

use loom::cell::Cell;
use loom::sync::atomic::AtomicU16;
use loom::sync::Arc;
use loom::thread;
use memnic_memif::msg::RingDirection;
use memnic_memif::queue::REFILL_SHARE;
use memnic_memif::ring::{publish, Counter};
use memnic_memif::window::Window;

/// Where both counters start: two slots before they wrap.
const START: u16 = 0xfffe;
/// The capacity the client posts in each S2C slot.
const CAP: u32 = 2048;

/// A counter on loom's atomics (a newtype: the trait and the type are both foreign).
struct Loom(AtomicU16);

impl Counter for Loom {
    fn load(&self, o: Ordering) -> u16 {
        self.0.load(o)
    }
    fn store(&self, v: u16, o: Ordering) {
        self.0.store(v, o)
    }
}

/// The control: the same counter with its stores weakened to Relaxed, whatever `publish` asks.
struct RelaxedStore(AtomicU16);

impl Counter for RelaxedStore {
    fn load(&self, o: Ordering) -> u16 {
        self.0.load(o)
    }
    fn store(&self, v: u16, _: Ordering) {
        self.0.store(v, Ordering::Relaxed)
    }
}

/// The control: the same counter with its loads weakened to Relaxed, whatever `acquire` asks.
struct RelaxedLoad(AtomicU16);

impl Counter for RelaxedLoad {
    fn load(&self, _: Ordering) -> u16 {
        self.0.load(Ordering::Relaxed)
    }
    fn store(&self, v: u16, o: Ordering) {
        self.0.store(v, o)
    }
}

trait New {
    fn at(v: u16) -> Self;
}
impl New for Loom {
    fn at(v: u16) -> Self {
        Loom(AtomicU16::new(v))
    }
}
impl New for RelaxedStore {
    fn at(v: u16) -> Self {
        RelaxedStore(AtomicU16::new(v))
    }
}
impl New for RelaxedLoad {
    fn at(v: u16) -> Self {
        RelaxedLoad(AtomicU16::new(v))
    }
}

/// A ring of `size` slots: head (client), tail (server), and per slot the descriptor's length
/// and the buffer (standing in for the frame bytes).
struct Ring<H, T> {
    head: H,
    tail: T,
    len: Vec<Cell<u32>>,
    data: Vec<Cell<u64>>,
    size: u16,
}

impl<H: New, T: New> Ring<H, T> {
    fn new(size: u16) -> Self {
        Ring {
            head: H::at(START),
            tail: T::at(START),
            len: (0..size).map(|_| Cell::new(0)).collect(),
            data: (0..size).map(|_| Cell::new(0)).collect(),
            size,
        }
    }
}

impl<H, T> Ring<H, T> {
    fn index(&self, slot: u16) -> usize {
        (slot & (self.size - 1)) as usize
    }

    /// A producer fills a slot it owns: its buffer, then its descriptor's length.
    fn fill(&self, slot: u16, v: u64) {
        let i = self.index(slot);
        self.data[i].set(v);
        self.len[i].set(len_of(v));
    }

    /// A consumer reads a slot the peer published.
    fn read(&self, slot: u16) -> u64 {
        let i = self.index(slot);
        let v = self.data[i].get();
        assert_eq!(
            self.len[i].get(),
            len_of(v),
            "a slot's length and buffer agree"
        );
        v
    }
}

/// The length a producer writes beside value `v`.
fn len_of(v: u64) -> u32 {
    60 + (v % 1000) as u32
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

fn values(count: u64) -> Vec<u64> {
    (1..=count).map(|k| k * 1000 + k).collect()
}

/// C2S, the client transmitting (`MemifTxQueue::tx_client`'s steps): window on the server's
/// tail, fill the free slots after our head, publish head.
fn client_tx<H: Counter, T: Counter>(r: &Ring<H, T>, values: &[u64], burst: usize) {
    let (mut head, mut seen) = (START, START);
    let mut next = 0;
    while next < values.len() {
        let w = Window::client(&r.tail, seen, head, r.size, RingDirection::C2S)
            .expect("an honest server's tail stays between our last tail and our head");
        seen = w.end;
        let free = w.room(head, r.size);
        if free == 0 {
            thread::yield_now(); // ring full
            continue;
        }
        for _ in 0..(free as usize).min(values.len() - next).min(burst) {
            r.fill(head, values[next]);
            head = head.wrapping_add(1);
            next += 1;
        }
        publish(&r.head, head);
    }
}

/// C2S, the server receiving (`MemifRxQueue::rx_server`'s steps): window on the client's head,
/// read every slot in it, publish tail.
fn server_rx<H: Counter, T: Counter>(r: &Ring<H, T>, count: usize, max: u16) -> Vec<u64> {
    let mut seen = START;
    let mut got = Vec::new();
    while got.len() < count {
        let w = Window::server(&r.head, seen, r.size)
            .expect("an honest client's head is at most a ring ahead");
        if w.avail == 0 {
            thread::yield_now(); // ring empty
            continue;
        }
        let n = w.avail.min(max);
        for i in 0..n {
            got.push(r.read(w.slot(i)));
        }
        seen = w.slot(n);
        publish(&r.tail, seen);
    }
    got
}

/// S2C, the client posting free slots (`MemifRxQueue::refill`): each gets its capacity, then
/// head moves.
fn refill<H: Counter, T>(r: &Ring<H, T>, head: &mut u16, seen: u16) {
    let from = *head;
    while head.wrapping_sub(seen) < r.size {
        r.len[r.index(*head)].set(CAP);
        *head = head.wrapping_add(1);
    }
    if *head != from {
        publish(&r.head, *head);
    }
}

/// S2C, the client receiving (`MemifRxQueue::rx_client`'s steps): window on the server's tail
/// (bounded by our own head), read, refill once `1/share` of the ring is free (the driver's
/// `REFILL_SHARE`; below that share's ring size, every burst).
fn client_rx<H: Counter, T: Counter>(
    r: &Ring<H, T>,
    count: usize,
    max: u16,
    share: u16,
) -> Vec<u64> {
    let (mut head, mut seen) = (START, START);
    refill(r, &mut head, seen); // at connect
    let mut got = Vec::new();
    while got.len() < count {
        let w = Window::client(&r.tail, seen, head, r.size, RingDirection::S2C)
            .expect("an honest server's tail never passes our head");
        if w.avail == 0 {
            thread::yield_now();
            continue;
        }
        let n = w.avail.min(max);
        for i in 0..n {
            got.push(r.read(w.slot(i)));
        }
        seen = w.slot(n);
        if r.size - head.wrapping_sub(seen) >= r.size / share {
            refill(r, &mut head, seen);
        }
    }
    got
}

/// S2C, the server transmitting (`MemifTxQueue::tx_server`'s steps): window on the client's
/// head, use each slot's posted capacity, fill, publish tail.
fn server_tx<H: Counter, T: Counter>(r: &Ring<H, T>, values: &[u64], burst: usize) {
    let mut tail = START;
    let mut next = 0;
    while next < values.len() {
        let w = Window::server(&r.head, tail, r.size)
            .expect("an honest client's head is at most a ring ahead");
        if w.avail == 0 {
            thread::yield_now(); // nothing posted
            continue;
        }
        let n = (w.avail as usize).min(values.len() - next).min(burst);
        for i in 0..n as u16 {
            let slot = w.slot(i);
            assert_eq!(
                r.len[r.index(slot)].get(),
                CAP,
                "the client posted this slot"
            );
            r.fill(slot, values[next]);
            next += 1;
        }
        tail = w.slot(n as u16);
        publish(&r.tail, tail);
    }
}

/// Model executions explored (printed by each test: a model that explores one is no model).
static EXPLORED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One model: `count` frames through a ring of `size` slots, the producer sending at most
/// `burst` frames per burst and the consumer taking at most `max` per burst.
#[derive(Clone, Copy)]
struct Shape {
    size: u16,
    count: u64,
    burst: usize,
    max: u16,
}

fn c2s<H: New + Counter + 'static, T: New + Counter + 'static>(s: Shape) {
    EXPLORED.store(0, std::sync::atomic::Ordering::Relaxed);
    model(move || {
        EXPLORED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let r = Arc::new(Ring::<H, T>::new(s.size));
        let vals = values(s.count);
        let p = {
            let (r, vals) = (r.clone(), vals.clone());
            thread::spawn(move || client_tx(&r, &vals, s.burst))
        };
        let got = server_rx(&r, vals.len(), s.max);
        p.join().unwrap();
        assert_eq!(got, vals, "every frame arrives intact, once, in order");
    });
    println!(
        "explored {} executions",
        EXPLORED.load(std::sync::atomic::Ordering::Relaxed)
    );
}

fn s2c<H: New + Counter + 'static, T: New + Counter + 'static>(s: Shape) {
    s2c_refilling::<H, T>(s, REFILL_SHARE);
}

/// [`s2c`] with the client refilling once `1/share` of the ring is free.
fn s2c_refilling<H: New + Counter + 'static, T: New + Counter + 'static>(s: Shape, share: u16) {
    EXPLORED.store(0, std::sync::atomic::Ordering::Relaxed);
    model(move || {
        EXPLORED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let r = Arc::new(Ring::<H, T>::new(s.size));
        let vals = values(s.count);
        let p = {
            let (r, vals) = (r.clone(), vals.clone());
            thread::spawn(move || server_tx(&r, &vals, s.burst))
        };
        let got = client_rx(&r, vals.len(), s.max, share);
        p.join().unwrap();
        assert_eq!(got, vals, "every frame arrives intact, once, in order");
    });
    println!(
        "explored {} executions",
        EXPLORED.load(std::sync::atomic::Ordering::Relaxed)
    );
}

const ALL: usize = usize::MAX;

#[test]
fn c2s_two_slots_wrapping() {
    // 3 frames through 2 slots, one per burst: a slot is reused (the producer's rewrite must
    // follow the consumer's read) and both counters wrap past 0xffff.
    c2s::<Loom, Loom>(Shape {
        size: 2,
        count: 3,
        burst: 1,
        max: 1,
    });
}

#[test]
fn c2s_two_slots_whole_bursts() {
    c2s::<Loom, Loom>(Shape {
        size: 2,
        count: 4,
        burst: ALL,
        max: u16::MAX,
    });
}

#[test]
fn c2s_four_slots_wrapping() {
    // Bursts of up to 3 into 4 slots, taken 2 at a time: windows that end mid-ring and
    // consumers that leave frames for the next burst.
    c2s::<Loom, Loom>(Shape {
        size: 4,
        count: 6,
        burst: 3,
        max: 2,
    });
}

#[test]
fn c2s_four_slots_twice_round() {
    // Nine frames through four slots: every slot reused twice, in bursts that straddle the
    // wrap of the ring and of the counters.
    c2s::<Loom, Loom>(Shape {
        size: 4,
        count: 9,
        burst: 2,
        max: 3,
    });
}

#[test]
fn s2c_two_slots_wrapping() {
    // The client posts capacities and the server fills: each slot's length is written by both
    // sides in turn, so both counters' orderings are exercised in both directions.
    s2c::<Loom, Loom>(Shape {
        size: 2,
        count: 3,
        burst: 1,
        max: 1,
    });
}

#[test]
fn s2c_four_slots_refilled_in_runs_of_two() {
    // The client hands slots back only once half the ring is free (the driver's rule with a
    // share of 2): the server meanwhile fills what stays posted, and nothing stalls.
    s2c_refilling::<Loom, Loom>(
        Shape {
            size: 4,
            count: 6,
            burst: 3,
            max: 1,
        },
        2,
    );
}

#[test]
fn s2c_four_slots_wrapping() {
    s2c::<Loom, Loom>(Shape {
        size: 4,
        count: 6,
        burst: 3,
        max: 2,
    });
}

#[test]
fn s2c_four_slots_twice_round() {
    s2c::<Loom, Loom>(Shape {
        size: 4,
        count: 9,
        burst: 2,
        max: 3,
    });
}

/// Control: the client publishing head with a Relaxed store lets the server read a slot before
/// its bytes are ordered after the client's writes, and loom must say so.
#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_head_publish_is_caught() {
    c2s::<RelaxedStore, Loom>(Shape {
        size: 2,
        count: 2,
        burst: 1,
        max: 1,
    });
}

/// Control: the server handing slots back with a Relaxed tail lets the client reuse a slot while
/// the server's read of it is not ordered before the rewrite.
#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_tail_publish_is_caught() {
    c2s::<Loom, RelaxedStore>(Shape {
        size: 2,
        count: 3,
        burst: 1,
        max: 1,
    });
}

/// Control: the client reading tail with a Relaxed load takes frames the server's writes are
/// not ordered before.
#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_tail_load_is_caught() {
    s2c::<Loom, RelaxedLoad>(Shape {
        size: 2,
        count: 2,
        burst: 1,
        max: 1,
    });
}

/// Control: the server reusing S2C slots on a head read with a Relaxed load writes a slot whose
/// posting (the client's capacity write) it is not ordered after.
#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_head_load_is_caught() {
    s2c::<RelaxedLoad, Loom>(Shape {
        size: 2,
        count: 2,
        burst: 1,
        max: 1,
    });
}
