//! Loom models of the data handoff between a virtio driver and our backend, both ring layouts:
//! the driver makes chains available, the backend takes them and hands them back as used, the
//! driver takes the used entries. The device side is the backend's own ring code
//! (`SplitRing`/`PackedRing` and their `Vring` steps: `cursor`, `next` with the chain walk,
//! `put_used`, `publish`) running on loom's atomics behind `RingMemory`; the driver side is the
//! spec's (Linux's `virtqueue_add_*` and `virtqueue_get_buf_*`: the descriptors, a write
//! barrier, the index or the head's flags; the index or the flags, a read barrier, the
//! entries). Every 16-bit word of the ring is a loom atomic, so a load the orderings do not
//! order may return any value stored earlier, and the model checks the values.
//!
//! What is checked: the backend reads each chain's descriptor as the driver wrote it (its
//! buffer address and length come out of the walk), and the driver, once it sees the index or
//! the burst's head flag, reads every used entry of the burst (id, length, and in the packed
//! ring the other entries' flags: the whole burst is seen at once). The split indices start
//! just below the wrap of their `u16`; the packed burst starts in the last slot, so it wraps
//! the ring and the wrap counters. The control (every Acquire and Release of the ring code
//! weakened to Relaxed) must be caught.
//!
//! Mutations of the ring code these models catch: avail.idx read Relaxed, used.idx published
//! Relaxed, a packed slot's flags read Relaxed, the packed burst's head flag stored before the
//! other entries'. One they cannot: the packed head flag stored Relaxed. loom lets a load that
//! reads a relaxed store see nothing older than what the location's previous (release) store
//! published, and the driver released that very word when it made the slot available, so
//! the driver's stale view of the entry never comes up (a two-thread program of the same shape
//! shows it; C11 allows the stale value). The packed entries' own Release is kept for that
//! reason, not proven here.
//!
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p memnic-vhost --test loom_handoff --release
#![cfg(loom)]

use std::fs::File;
use std::sync::atomic::Ordering::{self, Acquire, Relaxed, Release};
use std::sync::Arc;

use loom::sync::atomic::AtomicU16;
use loom::thread;
use memnic_shm::Region;
use memnic_vhost::chain::{Dir, Piece};
use memnic_vhost::mem::{MemTable, RegionDesc};
use memnic_vhost::packed::{PackedRing, DESC_F_AVAIL, DESC_F_USED, WRAP};
use memnic_vhost::split::{SplitRing, DESC_F_WRITE};
use memnic_vhost::vring::{Next, RingMemory, RingWord, Vring};

/// Chains in the burst.
const CHAINS: u16 = 2;
/// The ring's size (both layouts).
const SIZE: u16 = 2;
/// Where the split indices start: just below the wrap.
const START: u16 = 0xffff;
/// Where the packed positions start: the last slot, wrap counter 1.
const PACKED_START: u16 = (SIZE - 1) | WRAP;
/// The guest's buffers (guest-physical), one page of a real memfd the walk checks them
/// against; chain k's is BUF + 256 k, its length LEN + k.
const BUF: u64 = 0x1000;
const LEN: u32 = 100;

/// The split ring's areas in the model's memory, and the packed ring's.
const SPLIT_DESC: usize = 0;
const SPLIT_AVAIL: usize = 16 * SIZE as usize;
const SPLIT_USED: usize = 64;
const PACKED_DESC: usize = 0;
const PACKED_DRIVER: usize = 16 * SIZE as usize;
const PACKED_DEVICE: usize = PACKED_DRIVER + 4;
/// The model's memory, bytes.
const BYTES: usize = 128;

/// Guest memory on loom's atomics: 32-bit words, each two 16-bit atomics (every 32-bit word
/// the rings touch is written by one side and read by the other after an ordered load, so the
/// model needs no 32-bit atomicity, and a descriptor is read a 16-bit word at a time).
struct LoomMem {
    words: Vec<Word32>,
}

/// A 16-bit word; `weak` is the control: every Acquire and Release the ring code asks for
/// becomes Relaxed.
struct Word16 {
    v: AtomicU16,
    weak: bool,
}

/// A 32-bit word, low half first.
struct Word32([Word16; 2]);

impl Word16 {
    fn order(&self, o: Ordering) -> Ordering {
        if self.weak {
            Relaxed
        } else {
            o
        }
    }
}

impl RingWord<u16> for Word16 {
    fn load(&self, o: Ordering) -> u16 {
        self.v.load(self.order(o))
    }
    fn store(&self, v: u16, o: Ordering) {
        self.v.store(v, self.order(o))
    }
}

impl RingWord<u32> for Word32 {
    fn load(&self, o: Ordering) -> u32 {
        u32::from(self.0[0].load(o)) | u32::from(self.0[1].load(o)) << 16
    }
    fn store(&self, v: u32, o: Ordering) {
        self.0[0].store(v as u16, o);
        self.0[1].store((v >> 16) as u16, o);
    }
}

impl LoomMem {
    fn new(weak: bool) -> LoomMem {
        let word = || Word16 {
            v: AtomicU16::new(0),
            weak,
        };
        LoomMem {
            words: (0..BYTES / 4).map(|_| Word32([word(), word()])).collect(),
        }
    }
}

impl RingMemory for LoomMem {
    type Word16 = Word16;
    type Word32 = Word32;
    fn u16(&self, off: usize) -> &Word16 {
        assert!(off.is_multiple_of(2), "a 16-bit word at an odd offset");
        &self.words[off / 4].0[off / 2 % 2]
    }
    fn u32(&self, off: usize) -> &Word32 {
        assert!(
            off.is_multiple_of(4),
            "a 32-bit word at an offset not a multiple of 4"
        );
        &self.words[off / 4]
    }
    fn read_desc(&self, off: usize) -> [u8; 16] {
        let mut b = [0u8; 16];
        for (k, pair) in b.chunks_exact_mut(2).enumerate() {
            pair.copy_from_slice(&self.u16(off + 2 * k).load(Relaxed).to_le_bytes());
        }
        b
    }
}

/// The driver's side of the same memory, with the orderings the spec's driver uses (the
/// control weakens the ring code's only).
fn put(mem: &LoomMem, off: usize, v: u16, o: Ordering) {
    mem.u16(off).v.store(v, o)
}
fn get(mem: &LoomMem, off: usize, o: Ordering) -> u16 {
    mem.u16(off).v.load(o)
}
fn put_u32(mem: &LoomMem, off: usize, v: u32) {
    put(mem, off, v as u16, Relaxed);
    put(mem, off + 2, (v >> 16) as u16, Relaxed);
}
fn get_u32(mem: &LoomMem, off: usize) -> u32 {
    u32::from(get(mem, off, Relaxed)) | u32::from(get(mem, off + 2, Relaxed)) << 16
}

/// The guest memory the chain walk checks addresses against: one page at BUF.
fn table() -> Arc<MemTable> {
    let guest = Region::memfd("loom-guest", 4096, false).unwrap();
    let fd = guest.fd().unwrap().try_clone_to_owned().unwrap();
    let d = RegionDesc {
        guest_phys_addr: BUF,
        memory_size: 4096,
        userspace_addr: 0x7f00_0000_0000,
        mmap_offset: 0,
    };
    Arc::new(MemTable::new(&[d], vec![File::from(fd)], None).unwrap())
}

fn chain_addr(k: u16) -> u64 {
    BUF + 256 * u64::from(k)
}
fn chain_len(k: u16) -> u32 {
    LEN + u32::from(k)
}
/// The bytes the backend says it wrote into chain k's buffer (its used length): not the
/// buffer's length, so a used entry read before the backend wrote it shows.
fn written(k: u16) -> u32 {
    10 + u32::from(k)
}

/// The backend's side: waits for chains, takes them all in one burst (checking that each
/// descriptor reads as the driver wrote it), hands each back used with its length, and
/// publishes the burst.
fn device<V: Vring>(ring: &V, table: &MemTable, start: u16) {
    let mut pieces: Vec<Piece> = Vec::new();
    let mut taken = Vec::new();
    while taken.is_empty() {
        let mut cur = ring.cursor(start).expect("a good index");
        while let Next::Chain(chain, walked) =
            ring.next(table, &mut cur, Dir::Writable, &mut pieces)
        {
            taken.push((chain, walked));
        }
        if taken.is_empty() {
            thread::yield_now();
        }
    }
    let mut used = ring.used_at(start);
    for (k, (chain, walked)) in taken.into_iter().enumerate() {
        let k = k as u16;
        let total = walked.expect("the descriptor reads as the driver wrote it");
        assert_eq!(
            total,
            chain_len(k),
            "chain {k}'s length as the driver wrote it"
        );
        let (region, off) = table.gpa(chain_addr(k), 1).expect("inside the guest");
        assert_eq!(
            (pieces[k as usize].region, pieces[k as usize].off),
            (region, off),
            "chain {k}'s buffer as the driver wrote it"
        );
        ring.put_used(&mut used, chain, written(k));
    }
    ring.publish(&mut used);
}

fn split_model(weak: bool) {
    let table = table();
    loom::model(move || {
        let mem = Arc::new(LoomMem::new(weak));
        let ring = SplitRing::over(mem.clone(), SIZE, SPLIT_DESC, SPLIT_AVAIL, SPLIT_USED);
        // The indices start where the model starts them (a ring that ran before).
        put(&mem, SPLIT_AVAIL + 2, START, Relaxed);
        put(&mem, SPLIT_USED + 2, START, Relaxed);
        let table = table.clone();
        let dev = thread::spawn(move || device(&ring, &table, START));

        // The driver: each chain one device-writable descriptor (id = its slot), its avail
        // entry, then (write barrier) avail.idx for the whole burst.
        let mask = SIZE - 1;
        for k in 0..CHAINS {
            let id = START.wrapping_add(k) & mask;
            let d = SPLIT_DESC + 16 * id as usize;
            let addr = chain_addr(k);
            for w in 0..4 {
                put(&mem, d + 2 * w, (addr >> (16 * w)) as u16, Relaxed);
            }
            put_u32(&mem, d + 8, chain_len(k));
            put(&mem, d + 12, DESC_F_WRITE, Relaxed);
            put(&mem, d + 14, 0, Relaxed);
            put(&mem, SPLIT_AVAIL + 4 + 2 * id as usize, id, Relaxed);
        }
        put(&mem, SPLIT_AVAIL + 2, START.wrapping_add(CHAINS), Release);

        // used.idx, then (read barrier) the entries.
        let end = START.wrapping_add(CHAINS);
        while get(&mem, SPLIT_USED + 2, Acquire) != end {
            thread::yield_now();
        }
        for k in 0..CHAINS {
            let slot = START.wrapping_add(k) & mask;
            let e = SPLIT_USED + 4 + 8 * slot as usize;
            assert_eq!(get_u32(&mem, e), u32::from(slot), "used entry {k}'s id");
            assert_eq!(get_u32(&mem, e + 4), written(k), "used entry {k}'s length");
        }
        dev.join().unwrap();
    });
}

/// A packed slot's flags when the driver makes it available with wrap counter `wrap` (a
/// device-writable buffer), and when the device has used it.
fn avail_flags(wrap: bool) -> u16 {
    DESC_F_WRITE | if wrap { DESC_F_AVAIL } else { DESC_F_USED }
}
fn is_used(flags: u16, wrap: bool) -> bool {
    (flags & DESC_F_AVAIL != 0) == wrap && (flags & DESC_F_USED != 0) == wrap
}

fn packed_model(weak: bool) {
    let table = table();
    loom::model(move || {
        let mem = Arc::new(LoomMem::new(weak));
        let ring = PackedRing::over(mem.clone(), SIZE, PACKED_DESC, PACKED_DRIVER, PACKED_DEVICE);
        let table = table.clone();
        let dev = thread::spawn(move || device(&ring, &table, PACKED_START));

        // The driver: chain k in slot (start + k), wrapping with its counter; each slot's
        // address, length and id, then (write barrier) its flags, the first chain's last, so
        // the backend finds the whole batch when it finds the first (as a batching driver
        // does; one chain at a time, the backend could take them in two bursts).
        let slot_of = |k: u16| {
            let i = (PACKED_START & !WRAP) + k;
            if i >= SIZE {
                (i - SIZE, false)
            } else {
                (i, true)
            }
        };
        for k in (0..CHAINS).rev() {
            let (slot, wrap) = slot_of(k);
            let d = PACKED_DESC + 16 * slot as usize;
            let addr = chain_addr(k);
            for w in 0..4 {
                put(&mem, d + 2 * w, (addr >> (16 * w)) as u16, Relaxed);
            }
            put_u32(&mem, d + 8, chain_len(k));
            put(&mem, d + 12, 100 + k, Relaxed);
            put(&mem, d + 14, avail_flags(wrap), Release);
        }

        // The first slot's flags, then (read barrier) its entry; the burst came whole, so
        // every other slot of it is used too.
        let (first, wrap) = slot_of(0);
        while !is_used(
            get(&mem, PACKED_DESC + 16 * first as usize + 14, Acquire),
            wrap,
        ) {
            thread::yield_now();
        }
        for k in 0..CHAINS {
            let (slot, wrap) = slot_of(k);
            let d = PACKED_DESC + 16 * slot as usize;
            assert!(
                is_used(get(&mem, d + 14, Acquire), wrap),
                "slot {slot} of the burst is used once its head is"
            );
            assert_eq!(get(&mem, d + 12, Relaxed), 100 + k, "used entry {k}'s id");
            assert_eq!(get_u32(&mem, d + 8), written(k), "used entry {k}'s length");
        }
        dev.join().unwrap();
    });
}

#[test]
fn split_chains_and_used_entries_are_seen_whole() {
    split_model(false);
}

#[test]
fn packed_chains_and_the_used_burst_are_seen_whole() {
    packed_model(false);
}

#[test]
#[should_panic(expected = "as the driver wrote it")]
fn control_split_without_acquire_and_release_is_caught() {
    split_model(true);
}

#[test]
#[should_panic(expected = "as the driver wrote it")]
fn control_packed_without_acquire_and_release_is_caught() {
    packed_model(true);
}
