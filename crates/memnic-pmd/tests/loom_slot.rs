//! Loom models of the MEMNIC slot handshake (`specs/memnic.md` §5–§6), run on the very steps the
//! driver uses (`memnic_pmd::slot`), with loom's atomics behind the `StatusWord` trait and each
//! slot's payload in a `loom::cell::UnsafeCell`, so loom reports any access to a payload that the
//! status word's orderings do not order (P1, C1, C2).
//!
//! RUSTFLAGS="--cfg loom" cargo test -p memnic-pmd --test loom_slot --release
//! (a separate CARGO_TARGET_DIR keeps the loom build apart from the normal one.)
#![cfg(loom)]

use std::sync::atomic::Ordering;

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU32;
use loom::sync::Arc;
use loom::thread;
use memnic_pmd::layout::PKT_ST_FILLED;
use memnic_pmd::slot::{self, StatusWord};

/// A slot's status word on loom's atomics (a newtype: the trait and the type are both foreign).
struct Status(AtomicU32);

impl StatusWord for Status {
    fn load(&self, o: Ordering) -> u32 {
        self.0.load(o)
    }
    fn store(&self, v: u32, o: Ordering) {
        self.0.store(v, o)
    }
    fn compare_exchange(&self, cur: u32, new: u32, s: Ordering, f: Ordering) -> Result<u32, u32> {
        self.0.compare_exchange(cur, new, s, f)
    }
}

/// The same word with every ordering weakened to Relaxed: the control that shows the model
/// catches a missing Acquire/Release.
struct RelaxedStatus(AtomicU32);

impl StatusWord for RelaxedStatus {
    fn load(&self, _: Ordering) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
    fn store(&self, v: u32, _: Ordering) {
        self.0.store(v, Ordering::Relaxed)
    }
    fn compare_exchange(&self, cur: u32, new: u32, _: Ordering, _: Ordering) -> Result<u32, u32> {
        self.0
            .compare_exchange(cur, new, Ordering::Relaxed, Ordering::Relaxed)
    }
}

/// `n` slots: status words and payloads (standing in for `len` + `data`).
struct Ring<S> {
    status: Vec<S>,
    data: Vec<UnsafeCell<u64>>,
}

impl<S> Ring<S> {
    fn new(n: usize, word: impl Fn() -> S) -> Ring<S> {
        Ring {
            status: (0..n).map(|_| word()).collect(),
            data: (0..n).map(|_| UnsafeCell::new(0)).collect(),
        }
    }

    fn write(&self, i: usize, v: u64) {
        // SAFETY: the caller owns slot i (claimed FREE, not yet published); loom checks that
        // claim against the consumer's last read of the slot.
        self.data[i].with_mut(|p| unsafe { *p = v })
    }

    fn read(&self, i: usize) -> u64 {
        // SAFETY: the caller saw slot i FILLED; loom checks the order against the write.
        self.data[i].with(|p| unsafe { *p })
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// The single-producer path (guest tx and the only host tx queue): claim by seeing FREE.
fn produce_single<S: StatusWord>(r: &Ring<S>, values: &[u64]) {
    let n = r.status.len();
    for (k, &v) in values.iter().enumerate() {
        let i = k % n;
        while !slot::claim_single(&r.status[i]) {
            thread::yield_now(); // ring full
        }
        r.write(i, v);
        slot::publish(&r.status[i]);
    }
}

/// The consumer (both sides' rx): wait for FILLED, read, hand back.
fn consume<S: StatusWord>(r: &Ring<S>, count: usize) -> Vec<u64> {
    let n = r.status.len();
    let mut got = Vec::new();
    for k in 0..count {
        let i = k % n;
        while !slot::is_filled(&r.status[i]) {
            thread::yield_now(); // ring empty
        }
        got.push(r.read(i));
        slot::release(&r.status[i]);
    }
    got
}

fn spsc<S: StatusWord + Send + Sync + 'static>(slots: usize, count: u64, word: fn() -> S) {
    model(move || {
        let r = Arc::new(Ring::new(slots, word));
        let values: Vec<u64> = (1..=count).map(|k| k * 1000 + 7).collect();
        let p = {
            let r = r.clone();
            let values = values.clone();
            thread::spawn(move || produce_single(&r, &values))
        };
        let got = consume(&r, values.len());
        p.join().unwrap();
        assert_eq!(
            got, values,
            "the consumer reads exactly what was written, in order"
        );
    });
}

#[test]
fn single_producer_two_slots_wrapping() {
    // 3 frames through 2 slots: slot 0 is reused, so C2 (read before the producer's rewrite)
    // is exercised as well as P1/C1.
    spsc(2, 3, || Status(AtomicU32::new(0)));
}

#[test]
fn single_producer_three_slots() {
    spsc(3, 4, || Status(AtomicU32::new(0)));
}

#[test]
#[should_panic]
fn relaxed_orderings_are_caught() {
    spsc(2, 2, || RelaxedStatus(AtomicU32::new(0)));
}

/// The host's multi-producer path (`HostTxQueue::transmit_shared`): a shared head index, a CAS
/// claim, the v1 false-positive check (the head moved: put FREE back and retry), publish.
///
/// With three threads of which two may spin, loom can starve the third forever (it assumes no
/// fairness), so here every wait is bounded: a producer gives up a frame after `TRIES` attempts
/// and the consumer stops after `TRIES` empty polls. Loom still explores every interleaving of
/// what is done, and checks every payload access; the asserts check what was delivered.
const TRIES: usize = 3;

fn produce_shared<S: StatusWord>(
    r: &Ring<S>,
    head: &AtomicU32,
    values: &[u64],
    unclaim: fn(&S),
) -> usize {
    let n = r.status.len() as u32;
    let mut sent = 0;
    'frames: for &v in values {
        for _ in 0..TRIES {
            let h = head.load(Ordering::Acquire) % n;
            let s = &r.status[h as usize];
            match slot::claim_shared(s) {
                Ok(()) => {
                    if head.load(Ordering::Acquire) % n != h {
                        unclaim(s); // false positive
                        thread::yield_now();
                        continue;
                    }
                    head.store((h + 1) % n, Ordering::Release);
                    r.write(h as usize, v);
                    slot::publish(s);
                    sent += 1;
                    continue 'frames;
                }
                Err(PKT_ST_FILLED) if head.load(Ordering::Acquire) % n == h => {
                    thread::yield_now() // full
                }
                Err(_) => thread::yield_now(),
            }
        }
        break; // gave up: the later frames are not sent either (order)
    }
    sent
}

/// Consumes up to `count` frames starting at frame number `from`.
fn consume_bounded<S: StatusWord>(r: &Ring<S>, from: usize, count: usize) -> Vec<u64> {
    let n = r.status.len();
    let mut got = Vec::new();
    'slots: for k in from..from + count {
        let i = k % n;
        for _ in 0..TRIES {
            if slot::is_filled(&r.status[i]) {
                got.push(r.read(i));
                slot::release(&r.status[i]);
                continue 'slots;
            }
            thread::yield_now();
        }
        break;
    }
    got
}

/// The driver's `unclaim`, as a function pointer.
fn driver_unclaim(s: &Status) {
    slot::unclaim(s)
}

fn mpsc(slots: usize, a: Vec<u64>, b: Vec<u64>) {
    mpsc_with(slots, a, b, driver_unclaim, None)
}

fn mpsc_with(
    slots: usize,
    a: Vec<u64>,
    b: Vec<u64>,
    unclaim: fn(&Status),
    preemptions: Option<usize>,
) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(preemptions.unwrap_or(3));
    }
    builder.check(move || {
        let r = Arc::new(Ring::new(slots, || Status(AtomicU32::new(0))));
        let head = Arc::new(AtomicU32::new(0));
        let spawn = |vals: Vec<u64>| {
            let (r, head) = (r.clone(), head.clone());
            thread::spawn(move || produce_shared(&r, &head, &vals, unclaim))
        };
        let pa = spawn(a.clone());
        let pb = spawn(b.clone());
        let mut got = consume_bounded(&r, 0, a.len() + b.len());
        let sent_a = pa.join().unwrap();
        let sent_b = pb.join().unwrap();
        // Whatever the consumer gave up on is still in the ring: drain it now, single-threaded.
        let rest = consume_bounded(&r, got.len(), sent_a + sent_b - got.len());
        got.extend(rest);
        // Each producer's frames arrive once each, in its own order, and nothing else does.
        let only = |from: &[u64]| {
            got.iter()
                .copied()
                .filter(|v| from.contains(v))
                .collect::<Vec<_>>()
        };
        assert_eq!(only(&a), a[..sent_a]);
        assert_eq!(only(&b), b[..sent_b]);
        assert_eq!(got.len(), sent_a + sent_b);
    });
}

#[test]
fn two_producers_claim_shared() {
    mpsc(2, vec![11], vec![21]);
}

#[test]
fn two_producers_claim_shared_wrapping() {
    // Three frames through two slots: a producer can see the head it loaded go stale, claim a
    // slot the consumer has just freed (the false positive) and must put it back.
    mpsc(2, vec![11], vec![21, 22]);
}

#[test]
fn two_producers_false_positive_then_reuse() {
    // After a false positive puts FREE back, another producer reuses that slot: its payload
    // write must still be ordered after the consumer's read of the previous frame (C2 through
    // the unclaim store). Two preemptions keep this model to minutes.
    mpsc_with(2, vec![11], vec![21, 22, 23], driver_unclaim, Some(2));
}

/// The control for the test above: `unclaim` as it was first written (a Relaxed store) lets the
/// reusing producer's write race with the consumer's read, and loom must say so.
#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_unclaim_is_caught() {
    fn relaxed_unclaim(s: &Status) {
        s.0.store(memnic_pmd::layout::PKT_ST_FREE, Ordering::Relaxed)
    }
    mpsc_with(2, vec![11], vec![21, 22, 23], relaxed_unclaim, Some(2));
}
