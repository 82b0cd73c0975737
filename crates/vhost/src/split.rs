//! The split virtqueue (virtio 1.x §2.7), device side: the descriptor table, the available ring
//! (driver → device) and the used ring (device → driver), each an area of guest memory the
//! frontend named by its own virtual address (SET_VRING_ADDR).
//!
//! The areas are located and bounds-checked once, when the ring is set up; after that every
//! offset is computed from an index masked by the queue size, so it stays inside the areas.
//! Every value read from the rings is the guest's and is checked where it is used (descriptor
//! indices and addresses in `chain`, avail.idx against the queue size in `queue`).

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;

use memnic_shm::Region;

use crate::chain::{walk, Dir, Piece};
use crate::mem::MemTable;
pub use crate::vring::{need_event, RingAddrs, RingError};
use crate::vring::{Area, Broken, Chain, Next, RingMemory, RingWord, Vring};

pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;
pub const DESC_F_INDIRECT: u16 = 4;
/// avail.flags: the driver asks for no interrupts (the device's calls).
pub const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// used.flags: the device asks for no notifications (the driver's kicks).
pub const USED_F_NO_NOTIFY: u16 = 1;
/// Largest queue size virtio allows.
pub const MAX_QUEUE_SIZE: u32 = 32768;

/// One descriptor, copied out of the guest's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

impl Desc {
    /// Parses the 16 little-endian bytes of a table entry.
    #[inline(always)]
    pub fn parse(b: &[u8; 16]) -> Desc {
        Desc {
            addr: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            len: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            flags: u16::from_le_bytes([b[12], b[13]]),
            next: u16::from_le_bytes([b[14], b[15]]),
        }
    }

    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..16].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

/// A split ring located in guest memory (a [`Region`] of the frontend's, or, in the loom model,
/// loom's atomics: [`RingMemory`]).
#[derive(Debug)]
pub struct SplitRing<M = Region> {
    size: u16,
    desc: Area<M>,
    avail: Area<M>,
    used: Area<M>,
}

impl<M> Clone for SplitRing<M> {
    fn clone(&self) -> Self {
        SplitRing {
            size: self.size,
            desc: self.desc.clone(),
            avail: self.avail.clone(),
            used: self.used.clone(),
        }
    }
}

impl SplitRing {
    /// Locates the areas of a ring of `size` entries; each must lie whole in one region and be
    /// aligned as the spec requires (descriptor table 16, available ring 2, used ring 4). The
    /// event-index words at the end of both rings are always included.
    pub fn new(mem: &MemTable, size: u32, a: RingAddrs) -> Result<SplitRing, RingError> {
        if size == 0 || size > MAX_QUEUE_SIZE || !size.is_power_of_two() {
            return Err(RingError::BadSize(size));
        }
        let n = size as u64;
        Ok(SplitRing {
            // 32768 fits: 1 << 15; a u16 of 0 would mean 65536, never allowed here.
            size: size as u16,
            desc: Area::locate(mem, "descriptor", a.desc, 16 * n, 16)?,
            avail: Area::locate(mem, "available", a.avail, 6 + 2 * n, 2)?,
            used: Area::locate(mem, "used", a.used, 6 + 8 * n, 4)?,
        })
    }
}

impl<M: RingMemory> SplitRing<M> {
    /// A ring of `size` entries whose areas start at offsets `desc`, `avail` and `used` of
    /// `map`, checked as [`SplitRing::new`] checks a frontend's (the size a power of two up to
    /// 32768, each area aligned and inside `map`): for models of the ring on other memory than
    /// a frontend's.
    pub fn over(
        map: Arc<M>,
        size: u16,
        desc: usize,
        avail: usize,
        used: usize,
    ) -> Result<SplitRing<M>, RingError> {
        if size == 0 || u32::from(size) > MAX_QUEUE_SIZE || !size.is_power_of_two() {
            return Err(RingError::BadSize(size.into()));
        }
        let n = u64::from(size);
        Ok(SplitRing {
            size,
            desc: Area::within(&map, "descriptor", desc, 16 * n, 16)?,
            avail: Area::within(&map, "available", avail, 6 + 2 * n, 2)?,
            used: Area::within(&map, "used", used, 6 + 8 * n, 4)?,
        })
    }

    #[inline(always)]
    pub fn size(&self) -> u16 {
        self.size
    }

    #[inline(always)]
    fn mask(&self, i: u16) -> usize {
        (i & (self.size - 1)) as usize
    }

    /// avail.idx. Acquire pairs with the driver's write barrier (a Release, in C11 terms)
    /// between writing ring entries and descriptors and publishing the index.
    #[inline(always)]
    pub fn avail_idx(&self) -> u16 {
        self.avail.map.u16(self.avail.off + 2).load(Acquire)
    }

    /// avail.flags (Relaxed: read after `notify_fence`, which orders it).
    #[inline(always)]
    pub fn avail_flags(&self) -> u16 {
        self.avail.map.u16(self.avail.off).load(Relaxed)
    }

    /// Entry `i` (mod size) of the available ring: a chain head, unchecked. Relaxed: read
    /// after the Acquire of `avail_idx` that covers it.
    #[inline(always)]
    pub fn avail_head(&self, i: u16) -> u16 {
        self.avail
            .map
            .u16(self.avail.off + 4 + 2 * self.mask(i))
            .load(Relaxed)
    }

    /// used_event (EVENT_IDX): the used index after which the driver wants an interrupt.
    /// Relaxed: read after `notify_fence`.
    #[inline(always)]
    pub fn used_event(&self) -> u16 {
        self.avail
            .map
            .u16(self.avail.off + 4 + 2 * self.size as usize)
            .load(Relaxed)
    }

    /// Descriptor `i` of the table (`i < size`, checked by the caller), copied out once.
    #[inline(always)]
    pub fn desc(&self, i: u16) -> Desc {
        debug_assert!(i < self.size);
        Desc::parse(&self.desc.map.read_desc(self.desc.off + 16 * self.mask(i)))
    }

    /// Writes used element `i` (mod size), unless it already holds `id` and `len`. Relaxed:
    /// published by `publish_used`'s Release (an element left alone holds what the driver
    /// already saw, or wrote itself).
    ///
    /// A driver that hands its buffers out in the same order every lap (DPDK's virtio PMD,
    /// with or without IN_ORDER) gets the same element at the same place each lap when frames
    /// keep their length; storing it again took the line back from the driver's core, whose
    /// next read of it fetched it again. A/B in one sitting (in-process flip of ~250-ms
    /// windows, ratio compare/store p20/p50/p80): our txonly -> virtio-user rxonly split 64 B
    /// 0.98/1.04/1.12 and 0.97/1.03/1.10 (in_order=0: 0.97/1.03/1.10), 512 B 1.03/1.11/1.20;
    /// virtio-user txonly -> our rxonly split 64 B level (1.00, in_order=0 1.01, at p50).
    #[inline(always)]
    pub fn set_used_elem(&self, i: u16, id: u16, len: u32) {
        let off = self.used.off + 4 + 8 * self.mask(i);
        let (id_word, len_word) = (self.used.map.u32(off), self.used.map.u32(off + 4));
        if id_word.load(Relaxed) != u32::from(id) {
            id_word.store(u32::from(id), Relaxed);
        }
        if len_word.load(Relaxed) != len {
            len_word.store(len, Relaxed);
        }
    }

    /// used.idx. Release pairs with the driver's read barrier after it reads the index: the
    /// elements and the bytes written into its buffers are visible before the index.
    #[inline(always)]
    pub fn publish_used(&self, idx: u16) {
        self.used.map.u16(self.used.off + 2).store(idx, Release);
    }

    /// used.idx as the ring holds it (the device's own value, unless the guest scribbled).
    pub fn used_idx(&self) -> u16 {
        self.used.map.u16(self.used.off + 2).load(Relaxed)
    }

    /// used.flags (NO_NOTIFY asks the driver not to kick). Relaxed: a hint; the driver reads
    /// it after its own full barrier.
    pub fn set_used_flags(&self, flags: u16) {
        self.used.map.u16(self.used.off).store(flags, Relaxed);
    }

    /// avail_event (EVENT_IDX): the avail index after which the device wants a kick.
    pub fn set_avail_event(&self, idx: u16) {
        self.used
            .map
            .u16(self.used.off + 4 + 8 * self.size as usize)
            .store(idx, Relaxed);
    }
}

/// Where the next chain is: the avail index, and avail.idx as this burst read it.
#[derive(Debug, Clone, Copy)]
pub struct SplitCursor {
    next: u16,
    end: u16,
}

impl<M: RingMemory> Vring for SplitRing<M> {
    /// The whole burst. A/B in one sitting (in-process flip of ~250-ms windows, our txonly ->
    /// virtio-user rxonly, ratio 32/8 p20/p50/p80): 64 B 0.97/1.20/1.30 and 1.03/1.21/1.27
    /// (slow state 6.5 -> 6.8, median 6.9 -> 8.4 Mpps), 512 B 1.14/1.26/1.54, 1518 B
    /// 1.06 at p50; 16 instead of 32: 64 B 0.90, 1518 B 0.99 at p50.
    const ENQ_BATCH: usize = 32;
    /// Two lines, while they move more. DPDK's virtio PMD reads each frame's first bytes (its
    /// multicast counters), so every frame's line is shared when the next lap writes it, and a
    /// plain store waits for the other core to give it up: on the AMD EPYC host of the early
    /// sessions a perf of the slow state put the copy's stores first, and leaving the copy out
    /// (a diagnostic) took 64 B from 6.5 to 15.6 Mpps. Streamed, the stores wait for nothing.
    /// A/B there (in-process flip of ~250-ms windows, our txonly -> virtio-user rxonly,
    /// streamed/plain p20/p50/p80): 64 B 1.16/2.00/2.13 (slow state 7.2 -> 14.8 Mpps, fast
    /// 19.9 -> 23.4) and 1.06/1.14/1.19 (fast), 128 B 1.21/1.40/1.48; longer frames lose
    /// memory bandwidth: 256 B 0.82/1.16/1.23 (fast state 23.5 -> 19.0), 512 B 0.78/0.95/1.09,
    /// 1518 B 0.18/0.20/0.23. On the Intel Xeon host of session 39 streaming lost, so the
    /// queue's tuner tries both (it was always on): `bench vhost --rings split --dirs enq
    /// --interleave`, `--devargs tx-stream=on` (as before) against the tuned default,
    /// alternating, three runs each, Mpps p50 (over DPDK's backend): 64 B on 20.63 20.07 19.90
    /// (1.34 1.31 1.34), tuned 23.79 23.90 24.33 (1.57 1.63 1.67); 128 B on 20.62 20.14 19.99
    /// (1.40 1.39 1.42), tuned 22.95 23.18 23.68 (1.61 1.61 1.74).
    const STREAM_TUNED: usize = 128;
    /// The line of the frame's first byte only (as before, also where the frame starts
    /// mid-line): four lines, as the packed ring takes, lost here (in-process flip as for the
    /// packed ring's, four lines / one, p20/p50/p80: 512 B 0.96/0.98/1.00, 768 B
    /// 0.95/0.98/1.00, 1024 B 0.95/0.97/1.00, 1518 B 0.98/0.99/1.00).
    const DEQ_FETCH_LONG: usize = 1;
    /// 1024 bytes: the packed ring's six lines were level to behind here (in-process flip as
    /// for the packed ring's, 384 / 1024 bytes: 512 B 0.98/0.99/0.99, 640 B 0.95/0.98/1.00,
    /// 1518 B 0.96/0.99/1.00; four lines 512 B 0.92/0.99/1.01, 1518 B 0.85/0.88/1.01).
    const ENQ_FETCH: usize = 1024;
    type Cursor = SplitCursor;
    type Used = u16;

    /// Reads avail.idx once: more than the queue size ahead of us is a broken ring.
    #[inline(always)]
    fn cursor(&self, pos: u16) -> Result<SplitCursor, Broken> {
        let end = self.avail_idx();
        if end.wrapping_sub(pos) > self.size {
            return Err(Broken::AvailJump);
        }
        Ok(SplitCursor { next: pos, end })
    }

    #[inline(always)]
    fn cursor_pos(c: &SplitCursor) -> u16 {
        c.next
    }

    #[inline(always)]
    fn next(
        &self,
        mem: &MemTable,
        cur: &mut SplitCursor,
        dir: Dir,
        pieces: &mut Vec<Piece>,
    ) -> Next {
        if cur.next == cur.end {
            return Next::Empty;
        }
        let head = self.avail_head(cur.next);
        cur.next = cur.next.wrapping_add(1);
        let walked = walk(self, mem, head, dir, pieces);
        Next::Chain(Chain { id: head, descs: 1 }, walked)
    }

    #[inline(always)]
    fn used_at(&self, pos: u16) -> u16 {
        pos
    }

    #[inline(always)]
    fn used_pos(u: &u16) -> u16 {
        *u
    }

    #[inline(always)]
    fn put_used(&self, u: &mut u16, chain: Chain, len: u32) {
        self.set_used_elem(*u, chain.id, len);
        *u = u.wrapping_add(1);
    }

    /// The one entry goes where the run's last one would (a driver that reads the entry
    /// before used.idx finds it); used.idx moves by the whole run.
    #[inline(always)]
    fn put_used_run(&self, u: &mut u16, last: Chain, chains: u16, _descs: u16) {
        if chains == 0 {
            return;
        }
        self.set_used_elem(u.wrapping_add(chains - 1), last.id, 0);
        *u = u.wrapping_add(chains);
    }

    #[inline(always)]
    fn publish(&self, u: &mut u16) {
        self.publish_used(*u);
    }

    /// EVENT_IDX: whether used.idx passed used_event; else avail.flags' NO_INTERRUPT.
    #[inline(always)]
    fn wants_call(&self, old: u16, new: u16, event_idx: bool) -> bool {
        if event_idx {
            need_event(self.used_event(), new, old)
        } else {
            self.avail_flags() & AVAIL_F_NO_INTERRUPT == 0
        }
    }

    #[inline(always)]
    fn calls_off(&self, event_idx: bool) -> bool {
        !event_idx && self.avail_flags() & AVAIL_F_NO_INTERRUPT != 0
    }

    fn disable_kicks(&self) {
        self.set_used_flags(USED_F_NO_NOTIFY);
    }

    /// used.flags 0, or (EVENT_IDX) avail_event at our index.
    fn enable_kicks(&self, pos: u16, event_idx: bool) {
        if event_idx {
            // With EVENT_IDX the stale avail_event left after we poll again costs at most one
            // kick per 65536 chains.
            self.set_avail_event(pos);
        } else {
            self.set_used_flags(0);
        }
    }

    fn has_avail(&self, pos: u16) -> bool {
        self.avail_idx() != pos
    }
}
