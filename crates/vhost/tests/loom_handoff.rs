//! Loom models of the data handoff between a virtio driver and our backend, both ring layouts:
//! the driver makes chains available, the backend takes them and hands them back as used, the
//! driver takes the used entries. The device side is the backend's own ring code
//! (`SplitRing`/`PackedRing` and their `Vring` steps: `cursor`, `next` with the chain walk,
//! `put_used`, `publish`) running on loom's atomics behind `RingMemory`; the driver side is the
//! spec's (Linux's `virtqueue_add_*` and `virtqueue_get_buf_*`: the descriptors, a write
//! barrier, the index or the flags; the index or the flags, a read barrier, the entries), its
//! completion side on a thread of its own (an interrupt on another CPU) that looks once. Every
//! 16-bit word of the ring is a loom atomic and starts as a poison value no step writes, so a
//! load the orderings do not order may return something stored earlier, or the poison, and
//! the model checks the values.
//!
//! What is checked: the backend reads each chain as the driver wrote it (its first buffer's
//! address and its total length come out of the walk; the packed batch whole), and the driver,
//! once it sees used.idx or the burst's head flag, reads every used entry of the burst (its
//! id, the length the backend wrote, and in the packed ring the other slot of the burst used
//! too). The split indices start just below the wrap of their `u16`; the packed burst starts
//! in the ring's last slot with a chain of two descriptors, so it wraps the ring and the wrap
//! counters, and its used id (the last descriptor's) lands in its head slot, which held
//! another. With IN_ORDER (a tx ring's burst handed back as one run, `put_used_run`) the driver
//! reads the one entry of the run: the split ring's at its last place, the packed ring's in its
//! first slot, each with the last chain's id, and nothing else of the burst written. The control (every Acquire and Release of the ring code weakened to Relaxed) must
//! be caught.
//!
//! Mutations of the ring code these models catch (each checked): avail.idx read Relaxed,
//! used.idx published Relaxed, a packed slot's flags read Relaxed, the packed burst's head flag
//! stored Relaxed, or before the other entries', the packed used id not stored. Not caught:
//! the other entries' flags stored Relaxed (the head's Release, stored after them, covers them
//! for a driver that takes used entries in order, as the spec's does); the split run's entry
//! put at the run's first place instead of its last is caught.
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
use memnic_vhost::mem::{Frontend, MemTable, RegionDesc};
use memnic_vhost::packed::{PackedRing, DESC_F_AVAIL, DESC_F_USED, WRAP};
use memnic_vhost::split::DESC_F_NEXT;
use memnic_vhost::split::{SplitRing, DESC_F_WRITE};
use memnic_vhost::vring::{Next, RingMemory, RingWord, Vring};

/// The split ring: its size, and where its indices start (just below the wrap); two chains of
/// one descriptor each, their ids the slots they sit in.
const SPLIT_SIZE: u16 = 2;
const START: u16 = 0xffff;
/// The packed ring: its size, and where the burst starts (the last slot, wrap counter 1): chain
/// 0 takes two descriptors (slots 3 and 0: it wraps the ring), chain 1 one (slot 1).
const PACKED_SIZE: u16 = 4;
const PACKED_START: u16 = (PACKED_SIZE - 1) | WRAP;
/// The chains' buffer ids (packed: the last descriptor's; the head of chain 0 holds another
/// value, so the used entry's id is the backend's to write).
const PACKED_IDS: [u16; 2] = [0x0a0a, 0x0b0b];
/// The guest's buffers (guest-physical), one page of a real memfd the walk checks them
/// against.
const BUF: u64 = 0x1000;

/// Where the rings' areas sit in the model's memory.
const SPLIT_DESC: usize = 0;
const SPLIT_AVAIL: usize = 16 * SPLIT_SIZE as usize;
const SPLIT_USED: usize = 64;
const PACKED_DESC: usize = 0;
const PACKED_DRIVER: usize = 16 * PACKED_SIZE as usize;
const PACKED_DEVICE: usize = PACKED_DRIVER + 4;
/// The model's memory, bytes; every word starts as POISON (a value no step of the protocol
/// writes), so nothing a side reads before the other wrote it passes for what it wrote.
const BYTES: usize = 128;
const POISON: u16 = 0xdead;

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
            v: AtomicU16::new(POISON),
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
    fn bytes(&self) -> usize {
        BYTES
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
    Arc::new(MemTable::new(&[d], vec![File::from(fd)], Frontend::default()).unwrap())
}

/// The bytes the backend says it wrote into chain k (its used length): not any buffer's length,
/// so a used entry read before the backend wrote it shows.
fn written(k: usize) -> u32 {
    10 + k as u32
}

/// A device-writable buffer of chain `k`: its address and length.
fn buffer(k: usize, part: u64) -> (u64, u32) {
    (
        BUF + 256 * k as u64 + 128 * part,
        100 + 10 * part as u32 + k as u32,
    )
}

/// The backend's side: waits for chains, takes what the first look finds in one burst,
/// checking each chain against `want` (its total length and first buffer, as the driver wrote
/// them), hands each back used with [`written`] (or, `in_order`, the whole burst as one run
/// none was written into, as a tx ring's with IN_ORDER), and publishes the burst.
fn device<V: Vring>(ring: &V, table: &MemTable, start: u16, want: &[(u32, u64)], in_order: bool) {
    let mut pieces: Vec<Piece> = Vec::new();
    let mut taken = Vec::new();
    while taken.is_empty() {
        let mut cur = ring.cursor(start).expect("a good index");
        loop {
            let first = pieces.len();
            match ring.next(table, &mut cur, Dir::Writable, &mut pieces) {
                Next::Chain(chain, walked) => taken.push((chain, walked, first)),
                Next::Empty => break,
                Next::Broken(b) => panic!("the ring as the driver wrote it: {b:?}"),
            }
        }
        if taken.is_empty() {
            thread::yield_now();
        }
    }
    assert_eq!(
        taken.len(),
        want.len(),
        "the whole batch, as the driver wrote it"
    );
    let mut used = ring.used_at(start);
    let chains = taken.len() as u16;
    let mut run = None;
    for (k, (chain, walked, first)) in taken.into_iter().enumerate() {
        let total = walked.expect("the descriptors read as the driver wrote them");
        let (len, addr) = want[k];
        assert_eq!(total, len, "chain {k}'s length as the driver wrote it");
        let (region, off) = table.gpa(addr, 1).expect("inside the guest");
        assert_eq!(
            (pieces[first].region, pieces[first].off),
            (region, off),
            "chain {k}'s buffer as the driver wrote it"
        );
        if in_order {
            let (_, descs) = run.unwrap_or((chain, 0));
            run = Some((chain, descs + chain.descs));
        } else {
            ring.put_used(&mut used, chain, written(k));
        }
    }
    if let Some((last, descs)) = run {
        ring.put_used_run(&mut used, last, chains, descs);
    }
    ring.publish(&mut used);
}

/// Writes a descriptor's address and length (both layouts keep them in the first 12 bytes).
fn put_buffer(mem: &LoomMem, d: usize, (addr, len): (u64, u32)) {
    for w in 0..4 {
        put(mem, d + 2 * w, (addr >> (16 * w)) as u16, Relaxed);
    }
    put_u32(mem, d + 8, len);
}

fn split_model(weak: bool, in_order: bool) {
    let table = table();
    loom::model(move || {
        let mem = Arc::new(LoomMem::new(weak));
        // A ring that ran before: its indices where the model starts them.
        put(&mem, SPLIT_AVAIL + 2, START, Relaxed);
        put(&mem, SPLIT_USED + 2, START, Relaxed);
        let mask = SPLIT_SIZE - 1;
        let end = START.wrapping_add(2);
        let want: Vec<(u32, u64)> = (0..2).map(|k| (buffer(k, 0).1, buffer(k, 0).0)).collect();
        let ring = SplitRing::over(mem.clone(), SPLIT_SIZE, SPLIT_DESC, SPLIT_AVAIL, SPLIT_USED)
            .expect("the split layout fits");
        let table = table.clone();
        let dev = thread::spawn(move || device(&ring, &table, START, &want, in_order));
        // The driver's completion side (an interrupt on another CPU): one look at used.idx,
        // then (read barrier) the entries.
        let seen = mem.clone();
        let completion = thread::spawn(move || {
            if get(&seen, SPLIT_USED + 2, Acquire) != end {
                return;
            }
            if in_order {
                // One entry for the run, at its last place, with the last chain's id.
                let entry = |k: u16| SPLIT_USED + 4 + 8 * (START.wrapping_add(k) & mask) as usize;
                let last = START.wrapping_add(1) & mask;
                assert_eq!(get_u32(&seen, entry(1)), u32::from(last), "the run's id");
                assert_eq!(get_u32(&seen, entry(1) + 4), 0, "the run's length");
                assert_eq!(get(&seen, entry(0), Relaxed), POISON, "one entry written");
                return;
            }
            for k in 0..2 {
                let slot = START.wrapping_add(k as u16) & mask;
                let e = SPLIT_USED + 4 + 8 * slot as usize;
                assert_eq!(get_u32(&seen, e), u32::from(slot), "used entry {k}'s id");
                assert_eq!(get_u32(&seen, e + 4), written(k), "used entry {k}'s length");
            }
        });

        // The driver: each chain one device-writable descriptor (id = its slot), its avail
        // entry, then (write barrier) avail.idx for both.
        for k in 0..2 {
            let id = START.wrapping_add(k as u16) & mask;
            let d = SPLIT_DESC + 16 * id as usize;
            put_buffer(&mem, d, buffer(k, 0));
            put(&mem, d + 12, DESC_F_WRITE, Relaxed);
            put(&mem, d + 14, 0, Relaxed);
            put(&mem, SPLIT_AVAIL + 4 + 2 * id as usize, id, Relaxed);
        }
        put(&mem, SPLIT_AVAIL + 2, end, Release);
        dev.join().unwrap();
        completion.join().unwrap();
    });
}

/// A packed slot's flags when the driver makes it available with wrap counter `wrap` (a
/// device-writable buffer, NEXT when the chain goes on).
fn avail_flags(wrap: bool, next: bool) -> u16 {
    DESC_F_WRITE
        | if wrap { DESC_F_AVAIL } else { DESC_F_USED }
        | if next { DESC_F_NEXT } else { 0 }
}
fn is_used(flags: u16, wrap: bool) -> bool {
    (flags & DESC_F_AVAIL != 0) == wrap && (flags & DESC_F_USED != 0) == wrap
}

fn packed_model(weak: bool, in_order: bool) {
    let table = table();
    loom::model(move || {
        let mem = Arc::new(LoomMem::new(weak));
        // A zeroed ring (no slot available) where the driver has not written yet.
        for slot in 0..PACKED_SIZE as usize {
            put(&mem, PACKED_DESC + 16 * slot + 14, 0, Relaxed);
        }
        let slot_off = |slot: u16| PACKED_DESC + 16 * slot as usize;
        // Chain 0: slots 3 (wrap 1) and 0 (wrap 0); chain 1: slot 1 (wrap 0).
        let want = vec![
            (buffer(0, 0).1 + buffer(0, 1).1, buffer(0, 0).0),
            (buffer(1, 0).1, buffer(1, 0).0),
        ];
        let ring = PackedRing::over(
            mem.clone(),
            PACKED_SIZE,
            PACKED_DESC,
            PACKED_DRIVER,
            PACKED_DEVICE,
        )
        .expect("the packed layout fits");
        let table = table.clone();
        let dev = thread::spawn(move || device(&ring, &table, PACKED_START, &want, in_order));
        // The driver's completion side: one look at the burst's first slot, then (read
        // barrier) every entry of the burst: the other slot is used too, and each holds its
        // chain's id and the written length.
        let seen = mem.clone();
        let completion = thread::spawn(move || {
            if !is_used(get(&seen, slot_off(3) + 14, Acquire), true) {
                return;
            }
            if in_order {
                // One used descriptor for the run, in its first slot, with the last chain's
                // id; the run's other slots stay as the driver made them available.
                assert_eq!(
                    get(&seen, slot_off(3) + 12, Relaxed),
                    PACKED_IDS[1],
                    "the run's id"
                );
                assert_eq!(get_u32(&seen, slot_off(3) + 8), 0, "the run's length");
                let flags = get(&seen, slot_off(1) + 14, Acquire);
                assert_eq!(flags, avail_flags(false, false), "slot 1 left available");
                return;
            }
            assert!(
                is_used(get(&seen, slot_off(1) + 14, Acquire), false),
                "slot 1 of the burst is used once its head is"
            );
            for (k, slot) in [(0, 3), (1, 1)] {
                let d = slot_off(slot);
                assert_eq!(
                    get(&seen, d + 12, Relaxed),
                    PACKED_IDS[k],
                    "used entry {k}'s id"
                );
                assert_eq!(get_u32(&seen, d + 8), written(k), "used entry {k}'s length");
            }
        });

        // The driver: each slot's address, length and id, then (write barrier) its flags, the
        // batch's first slot last, so the backend finds the whole batch when it finds the
        // first (as a batching driver does).
        let slots = [
            (3, buffer(0, 0), 0x0bad, true, true),
            (0, buffer(0, 1), PACKED_IDS[0], false, false),
            (1, buffer(1, 0), PACKED_IDS[1], false, false),
        ];
        for &(slot, buf, id, wrap, next) in slots.iter().rev() {
            let d = slot_off(slot);
            put_buffer(&mem, d, buf);
            put(&mem, d + 12, id, Relaxed);
            put(&mem, d + 14, avail_flags(wrap, next), Release);
        }
        dev.join().unwrap();
        completion.join().unwrap();
    });
}

#[test]
fn split_chains_and_used_entries_are_seen_whole() {
    split_model(false, false);
}

#[test]
fn packed_chains_and_the_used_burst_are_seen_whole() {
    packed_model(false, false);
}

#[test]
fn split_in_order_run_is_seen_whole() {
    split_model(false, true);
}

#[test]
fn packed_in_order_run_is_seen_whole() {
    packed_model(false, true);
}

#[test]
#[should_panic(expected = "as the driver wrote")]
fn control_split_without_acquire_and_release_is_caught() {
    split_model(true, false);
}

#[test]
#[should_panic(expected = "as the driver wrote")]
fn control_packed_without_acquire_and_release_is_caught() {
    packed_model(true, false);
}
