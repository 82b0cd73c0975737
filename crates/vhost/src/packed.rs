//! The packed virtqueue (virtio 1.x §2.8, VIRTIO_F_RING_PACKED), device side: one ring of
//! descriptors that the driver makes available and the device hands back as used in place,
//! each side tracking a wrap counter, and two event suppression areas (the driver's, which we
//! read before calling it; ours, which asks it not to kick while we poll).
//!
//! The areas are located and bounds-checked once, when the ring is set up; every index after
//! that is below the queue size, so it stays inside them. A slot is available to us when its
//! AVAIL flag equals our wrap counter and its USED flag does not; a chain is the run of slots
//! up to the first without NEXT, and its buffer id is that last slot's.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;

use memnic_shm::Region;

use crate::chain::{walk_packed, Dir, Piece};
use crate::mem::MemTable;
use crate::split::MAX_QUEUE_SIZE;
use crate::vring::{
    need_event, Area, Broken, Chain, Next, RingAddrs, RingError, RingMemory, RingWord, Vring,
};

pub const DESC_F_AVAIL: u16 = 1 << 7;
pub const DESC_F_USED: u16 = 1 << 15;
/// Event suppression flags (`struct pvirtq_event_suppress`).
pub const EVENT_F_ENABLE: u16 = 0;
pub const EVENT_F_DISABLE: u16 = 1;
pub const EVENT_F_DESC: u16 = 2;
/// Bit 15 of a position: the wrap counter.
pub const WRAP: u16 = 1 << 15;

/// One packed descriptor, copied out of the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedDesc {
    pub addr: u64,
    pub len: u32,
    pub id: u16,
    pub flags: u16,
}

impl PackedDesc {
    /// Parses the 16 little-endian bytes of a ring or indirect-table entry.
    #[inline(always)]
    pub fn parse(b: &[u8; 16]) -> PackedDesc {
        PackedDesc {
            addr: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            len: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            id: u16::from_le_bytes([b[12], b[13]]),
            flags: u16::from_le_bytes([b[14], b[15]]),
        }
    }

    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.id.to_le_bytes());
        b[14..16].copy_from_slice(&self.flags.to_le_bytes());
        b
    }
}

/// Whether a slot with `flags` is available to a device whose wrap counter is `wrap`.
#[inline(always)]
pub fn is_avail(flags: u16, wrap: bool) -> bool {
    (flags & DESC_F_AVAIL != 0) == wrap && (flags & DESC_F_USED != 0) != wrap
}

/// Whether a driver whose event suppression structure reads `off_wrap` and `flags` wants a
/// call for the used position (slot and wrap counter) moving from `old` to `new` on a ring of
/// `size` slots: DISABLE never, ENABLE always, DESC (EVENT_IDX) when the move passed the slot
/// and wrap counter it names.
#[inline(always)]
pub fn wants_call_for(
    size: u16,
    off_wrap: u16,
    flags: u16,
    old: u16,
    new: u16,
    event_idx: bool,
) -> bool {
    if !event_idx || flags != EVENT_F_DESC {
        return flags != EVENT_F_DISABLE;
    }
    // Into one window of 2 × size: `old` a lap back when the burst wrapped, the event a lap
    // back when its wrap counter is not ours.
    let new_idx = new & !WRAP;
    let mut old_idx = old & !WRAP;
    if new_idx <= old_idx {
        old_idx = old_idx.wrapping_sub(size);
    }
    let mut off = off_wrap & !WRAP;
    if (off_wrap & WRAP) != (new & WRAP) {
        off = off.wrapping_sub(size);
    }
    need_event(off, new_idx, old_idx)
}

/// A packed ring located in guest memory (a [`Region`] of the frontend's, or, in the loom
/// model, loom's atomics: [`RingMemory`]).
#[derive(Debug)]
pub struct PackedRing<M = Region> {
    size: u16,
    desc: Area<M>,
    driver: Area<M>,
    device: Area<M>,
}

impl<M> Clone for PackedRing<M> {
    fn clone(&self) -> Self {
        PackedRing {
            size: self.size,
            desc: self.desc.clone(),
            driver: self.driver.clone(),
            device: self.device.clone(),
        }
    }
}

/// Where the next chain is: a slot and the wrap counter.
#[derive(Debug, Clone, Copy)]
pub struct PackedCursor {
    idx: u16,
    wrap: bool,
}

/// Where the next used entry goes, and the burst's used entries not yet written: they wait for
/// `publish` (or a full shadow), which writes them together, ids and lengths first, then the
/// flags, the burst's first entry's last, so the driver sees the whole burst at once. Written
/// together, each cache line of the ring goes to our core once; written one by one between
/// the frames' copies, a line the driver polls goes back and forth once per entry.
#[derive(Debug)]
pub struct PackedUsed {
    at: PackedCursor,
    /// The burst's first entry: its slot and flags, stored last.
    head: Option<(u16, u16)>,
    shadow: [UsedEntry; SHADOW],
    n: usize,
}

/// A used entry waiting in the shadow: its slot, buffer id, length and flags.
#[derive(Debug, Clone, Copy, Default)]
struct UsedEntry {
    slot: u16,
    id: u16,
    len: u32,
    flags: u16,
}

/// Used entries a burst keeps before it writes them: a burst of frames that take one chain
/// each (a longer burst writes them 32 at a time).
const SHADOW: usize = 32;

impl PackedRing {
    /// Locates the areas of a ring of `size` slots (any size from 1 to 32768: packed rings
    /// need no power of two): the descriptors 16-byte aligned, the event areas 4-byte aligned,
    /// each whole in one region.
    pub fn new(mem: &MemTable, size: u32, a: RingAddrs) -> Result<PackedRing, RingError> {
        if size == 0 || size > MAX_QUEUE_SIZE {
            return Err(RingError::BadPackedSize(size));
        }
        Ok(PackedRing {
            size: size as u16,
            desc: Area::locate(mem, "descriptor", a.desc, 16 * size as u64, 16)?,
            driver: Area::locate(mem, "driver event", a.avail, 4, 4)?,
            device: Area::locate(mem, "device event", a.used, 4, 4)?,
        })
    }
}

impl<M: RingMemory> PackedRing<M> {
    /// A ring of `size` slots whose descriptors start at offset `desc` of `map` and whose
    /// driver and device event areas start at `driver` and `device`, checked as
    /// [`PackedRing::new`] checks a frontend's (1 to 32768 slots, each area aligned and inside
    /// `map`): for models of the ring on other memory than a frontend's.
    pub fn over(
        map: Arc<M>,
        size: u16,
        desc: usize,
        driver: usize,
        device: usize,
    ) -> Result<PackedRing<M>, RingError> {
        if size == 0 || u32::from(size) > MAX_QUEUE_SIZE {
            return Err(RingError::BadPackedSize(size.into()));
        }
        Ok(PackedRing {
            size,
            desc: Area::within(&map, "descriptor", desc, 16 * u64::from(size), 16)?,
            driver: Area::within(&map, "driver event", driver, 4, 4)?,
            device: Area::within(&map, "device event", device, 4, 4)?,
        })
    }

    #[inline(always)]
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Checks a position from SET_VRING_BASE: its index must be a slot of the ring.
    pub fn check_pos(&self, pos: u16) -> Result<(), RingError> {
        if pos & !WRAP >= self.size {
            return Err(RingError::BadBase {
                pos,
                size: self.size,
            });
        }
        Ok(())
    }

    #[inline(always)]
    fn slot_off(&self, i: u16) -> usize {
        debug_assert!(i < self.size);
        self.desc.off + 16 * i as usize
    }

    /// Slot `i`'s flags. Acquire pairs with the driver's write barrier (a Release) between
    /// writing a chain's descriptors and its head's flags.
    #[inline(always)]
    pub fn flags(&self, i: u16) -> u16 {
        self.desc.map.u16(self.slot_off(i) + 14).load(Acquire)
    }

    /// Slot `i` (`i < size`), copied out once.
    #[inline(always)]
    pub fn desc(&self, i: u16) -> PackedDesc {
        PackedDesc::parse(&self.desc.map.read_desc(self.slot_off(i)))
    }

    /// The index after `i`, `n` slots on, and whether it wrapped.
    #[inline(always)]
    fn advance(&self, c: PackedCursor, n: u16) -> PackedCursor {
        let i = c.idx as u32 + n as u32;
        if i >= self.size as u32 {
            PackedCursor {
                idx: (i - self.size as u32) as u16,
                wrap: !c.wrap,
            }
        } else {
            PackedCursor {
                idx: i as u16,
                wrap: c.wrap,
            }
        }
    }

    /// Writes the shadow's entries into their slots: ids and lengths, then every flag but the
    /// burst head's (which [`Vring::publish`] stores last).
    #[inline(always)]
    fn write_used(&self, u: &mut PackedUsed) {
        let m = &self.desc.map;
        let head = u.head.map(|(idx, _)| idx);
        for e in &u.shadow[..u.n] {
            let off = self.slot_off(e.slot);
            m.u32(off + 8).store(e.len, Relaxed);
            m.u16(off + 12).store(e.id, Relaxed);
        }
        for e in &u.shadow[..u.n] {
            if Some(e.slot) != head {
                // Release: pairs with the driver's read barrier after it sees a used slot; the
                // entry's id and length, and the plain stores into its buffers, come first.
                // Streamed frames are fenced before the burst's head flag, which the driver
                // reads before it looks at this slot.
                m.u16(self.slot_off(e.slot) + 14).store(e.flags, Release);
            }
        }
        u.n = 0;
    }

    /// The driver's event suppression area: (off_wrap, flags). Relaxed: read after
    /// `notify_fence`.
    #[inline(always)]
    fn driver_event(&self) -> (u16, u16) {
        let m = &self.driver.map;
        (
            m.u16(self.driver.off).load(Relaxed),
            m.u16(self.driver.off + 2).load(Relaxed),
        )
    }

    /// Our event suppression flags: a hint the driver reads after its own full barrier.
    fn set_device_flags(&self, flags: u16) {
        self.device
            .map
            .u16(self.device.off + 2)
            .store(flags, Relaxed);
    }
}

fn pos_of(c: PackedCursor) -> u16 {
    c.idx | if c.wrap { WRAP } else { 0 }
}

impl<M: RingMemory> Vring for PackedRing<M> {
    /// Eight. A/B in one sitting as for the split ring (our txonly -> virtio-user rxonly,
    /// p20/p50/p80 over 8): 32 at 64 B 0.77/0.86/1.01; 16 at 64 B 0.83/0.85/0.88, at 512 B
    /// 0.98/1.08/1.18; 4 at 64 B 0.74/0.89/0.99.
    const ENQ_BATCH: usize = 8;
    /// The split ring's 128 bytes, while they move more (always streamed, as the split ring's
    /// were once, 64 B lost 0.81/0.85/0.96 in a session on the AMD host). A fresh DPDK virtio-user frontend
    /// posts its buffers in address order (its pool's, kept by the last-in first-out cache as
    /// long as every burst is a full 32), and while that order lasts a plain store of each
    /// frame's line waits for the driver's core to give it up: timed per frame inside a batch
    /// of eight (a build with clock reads), the first two took 28 and 35 ns and each of the
    /// other six ~150 ns, in turn, though all eight were prefetched for writing (the driver
    /// reads each frame's first line for its multicast counters; our guess, unproven, is that
    /// its hardware prefetcher follows that stride into the lines we write next). Plain stores
    /// stayed at 5.0-5.3 Mpps for as long as 95 % of the buffers followed their predecessor at
    /// the same distance, up to a whole 6-s run, and went to 15-25 once the order had
    /// scrambled; streamed, the same frames went at 12-14 in that build whatever the order,
    /// and plain stores won in scrambled order in some states (a session before: streamed lost
    /// 0.81/0.85/0.96). Neither way wins everywhere, so the queue's tuner tries both. Runs
    /// alternating (our txonly -> virtio-user rxonly, packed 64 B, 9-s runs, its Rx-pps every 2
    /// s; off / auto / on): plain stores began at 5.9-7.3 Mpps in 4 of 6 runs (one held 6.0 for
    /// 6 s), tuned and always streamed in none (13.1-22.4 and 15.3-23.2); frames sent per run,
    /// mean of 6, 130 M / 157 M / 159 M. Flipped every second within runs (with the clock
    /// reads; tuned / plain, p20/p50/p80): steady 0.97/1.00/1.12, 0.99/1.02/1.02,
    /// 1.00/1.00/1.00, 0.97/0.99/1.03, 1.00/1.00/1.02, and the first tuned second after a
    /// plain one at 5.0-5.2 ran at 12.6-13.9.
    const STREAM_TUNED: usize = 128;
    /// Four lines. In-process flip (virtio-user txonly -> our rxonly, B/A of adjacent 1-s
    /// windows p20/p50/p80, B = four lines, A = the first only; Mpps of A's windows): 512 B
    /// 1.01/1.07/1.13 (13.2), 1.10/1.12/1.12 (9.4); 768 B 1.02/1.07/1.12; 1024 B
    /// 1.18/1.20/1.21; 1518 B 1.07/1.09/1.14 (7.5), 1.09/1.11/1.12 (7.7). Against four (B/A):
    /// two lines 512 B 1.00/1.03/1.05 and 0.95/1.03/1.07, 1024 B 0.97/1.02/1.08, 1518 B
    /// 0.91/0.97/1.05 and 0.93/0.96/1.00; three 512 B 0.98/1.00/1.08, 1518 B 0.94/1.00/1.03;
    /// six 512 B 0.92/0.97/1.04, 1518 B 0.89/0.95/0.98; eight 1518 B 0.87/0.92/0.95.
    const DEQ_FETCH_LONG: usize = 256;
    /// Six lines: 1024 bytes left 512-640-B frames at 6-8 Mpps in this machine's slow state,
    /// slower per frame than 768-1024-B ones (the cause is not known). In-process flip (our
    /// txonly -> virtio-user rxonly, B/A of adjacent 1-s windows p20/p50/p80, B = 384 bytes,
    /// A = 1024; Mpps of A's windows): 512 B 1.06/1.23/1.53 (slow 6.2-7.1 -> 9.4-10.8, fast
    /// 12.3-13.7 level), 640 B 1.22/1.24/1.28 (8.1), 768 B 0.98/1.00/1.01, 1024 B
    /// 0.96/0.98/1.02, 1518 B 0.96/0.99/1.04. Four lines (268 bytes with the header): 512 B
    /// 1.30/1.37/1.45 and 1.11/1.36/1.44 (the fast windows level), 640 B 1.05/1.12/1.14, but
    /// 384 B 0.93/0.94/0.96, 768 B 0.91/0.92/0.95, 1024 B 0.87/0.90/0.90.
    const ENQ_FETCH: usize = 384;
    type Cursor = PackedCursor;
    type Used = PackedUsed;

    #[inline(always)]
    fn cursor(&self, pos: u16) -> Result<PackedCursor, Broken> {
        // Checked when the ring was installed, and kept below the size since.
        debug_assert!(pos & !WRAP < self.size);
        Ok(PackedCursor {
            idx: pos & !WRAP,
            wrap: pos & WRAP != 0,
        })
    }

    /// The slots' lines, four 16-byte slots a line: the driver wrote them when it made the
    /// chains available, and we write the used entries into the same slots. In-process flip
    /// (our txonly -> virtio-user rxonly, B/A of adjacent 1-s windows p20/p50/p80, with / without):
    /// 64 B 1.00/1.02/1.05, 1.04/1.04/1.06, 1.04/1.05/1.07, 1.05/1.05/1.07 (18-19 Mpps; level in
    /// three runs at 25: 25.0 / 25.0), 512 B 1.00/1.02/1.04, 1.00/1.04/1.07, 0.83/1.00/1.01,
    /// 1518 B 0.79/0.99/1.00, 0.86/1.00/1.01, 0.99/1.01/1.06 (the p20s: a change of state
    /// inside a pair of windows). Dequeue asking for its next batch's slots the same way (for
    /// reading) was level: 64 B p50 0.99-1.01, 512 B 1.01-1.18, 1518 B 1.00-1.06.
    #[inline(always)]
    fn prefetch_batch(&self, cur: &PackedCursor, this: bool, next: bool) {
        let batch = Self::ENQ_BATCH as u32;
        let (from, to) = (
            if this { 0 } else { batch },
            if next { 2 * batch } else { batch },
        );
        for ahead in (from..to).step_by(4) {
            let i = (u32::from(cur.idx) + ahead) % u32::from(self.size);
            self.desc.map.prefetch_write(self.slot_off(i as u16));
        }
    }

    /// The slots past `cur` while they are available, each slot's buffer taken as a frame's
    /// first (it is, for the one-descriptor chains of DPDK's virtio PMD and Linux's
    /// virtio-net). DPDK's virtio-user posts a packed ring's tx buffers in no order their
    /// addresses follow (288 buffers 4 KB apart, in runs broken by jumps over 2.2 MB, where
    /// its split ring's follow one another 4 KB down; printed from a debug build), so nothing
    /// but this asks for the next frames' lines before their copies start. In-process flip
    /// (virtio-user txonly -> our rxonly, one lcore each, 2-s blocks, B/A of each B block
    /// against its two A neighbours, B = the next eight frames' first
    /// lines; 12 runs of 40 s, blocks by the rate of their A neighbours): 1518 B slow state
    /// (A below 9 Mpps) 1.01/1.06/1.10 (n = 88), 9-11 Mpps 1.05/1.05/1.07 (n = 6), 11-13 Mpps
    /// 0.94/0.96/0.99 (n = 10: a loss there); 512 B 0.99/1.00/1.00 (9.2), 0.99/1.04/1.10
    /// (7.3); 64 B 1.00/1.01/1.03 (10.0), 0.97/1.00/1.11 (11.2). Four frames instead of eight:
    /// 1518 B 1.04/1.09/1.11 slow (n = 16), 0.96/0.97/0.98 at 11-13 (n = 7); to L2 instead of
    /// L1: 0.99/1.04/1.09 slow (n = 30); only within a burst: 1.02/1.03/1.07 (n = 16); only
    /// while the flush tuner flushes: 0.96/1.04/1.10 slow (n = 61), 0.99/1.01/1.05 at 9-13
    /// Mpps (n = 18).
    #[inline(always)]
    fn prefetch_ahead(&self, mem: &MemTable, cur: &PackedCursor, hdr_len: usize, n: u16) {
        for k in 0..n.min(self.size) {
            let c = self.advance(*cur, k);
            if !is_avail(self.flags(c.idx), c.wrap) {
                return;
            }
            let d = self.desc(c.idx);
            if let Some((region, off)) = mem.gpa(d.addr.wrapping_add(hdr_len as u64), 1) {
                mem.map(region).prefetch(off);
            }
        }
    }

    #[inline(always)]
    fn cursor_pos(c: &PackedCursor) -> u16 {
        pos_of(*c)
    }

    #[inline(always)]
    fn next(
        &self,
        mem: &MemTable,
        cur: &mut PackedCursor,
        dir: Dir,
        pieces: &mut Vec<Piece>,
    ) -> Next {
        if !is_avail(self.flags(cur.idx), cur.wrap) {
            return Next::Empty;
        }
        match walk_packed(self, mem, cur.idx, dir, pieces) {
            Ok((chain, walked)) => {
                *cur = self.advance(*cur, chain.descs);
                Next::Chain(chain, walked)
            }
            Err(b) => Next::Broken(b),
        }
    }

    #[inline(always)]
    fn used_at(&self, pos: u16) -> PackedUsed {
        PackedUsed {
            at: self.cursor(pos).expect("packed cursors never fail"),
            head: None,
            shadow: [UsedEntry::default(); SHADOW],
            n: 0,
        }
    }

    #[inline(always)]
    fn used_pos(u: &PackedUsed) -> u16 {
        pos_of(u.at)
    }

    /// The entry goes in the slot where the chain started (in order, as we copy), with AVAIL
    /// and USED both equal to our wrap counter and WRITE when we wrote into it; it waits in the
    /// shadow until [`Vring::publish`].
    #[inline(always)]
    fn put_used(&self, u: &mut PackedUsed, chain: Chain, len: u32) {
        let mut flags = if u.at.wrap {
            DESC_F_AVAIL | DESC_F_USED
        } else {
            0
        };
        if len > 0 {
            flags |= crate::split::DESC_F_WRITE;
        }
        if u.n == SHADOW {
            self.write_used(u);
        }
        u.shadow[u.n] = UsedEntry {
            slot: u.at.idx,
            id: chain.id,
            len,
            flags,
        };
        u.n += 1;
        u.head.get_or_insert((u.at.idx, flags));
        u.at = self.advance(u.at, chain.descs);
    }

    /// One used descriptor at the run's first slot, with the last buffer's id; the used
    /// position skips every slot of the run.
    #[inline(always)]
    fn put_used_run(&self, u: &mut PackedUsed, last: Chain, chains: u16, descs: u16) {
        if chains == 0 {
            return;
        }
        self.put_used(u, Chain { id: last.id, descs }, 0);
    }

    #[inline(always)]
    fn publish(&self, u: &mut PackedUsed) {
        self.write_used(u);
        if let Some((idx, flags)) = u.head.take() {
            // Release: pairs with the driver's read barrier after it sees this slot used; the
            // burst's other entries and every byte written into its buffers come first.
            self.desc
                .map
                .u16(self.slot_off(idx) + 14)
                .store(flags, Release);
        }
    }

    /// The driver's event suppression (see [`wants_call_for`]).
    #[inline(always)]
    fn wants_call(&self, old: u16, new: u16, event_idx: bool) -> bool {
        let (off_wrap, flags) = self.driver_event();
        wants_call_for(self.size, off_wrap, flags, old, new, event_idx)
    }

    #[inline(always)]
    fn calls_off(&self, _event_idx: bool) -> bool {
        self.driver_event().1 == EVENT_F_DISABLE
    }

    fn disable_kicks(&self) {
        self.set_device_flags(EVENT_F_DISABLE);
    }

    fn enable_kicks(&self, _pos: u16, _event_idx: bool) {
        self.set_device_flags(EVENT_F_ENABLE);
    }

    fn has_avail(&self, pos: u16) -> bool {
        let c = self.cursor(pos).expect("packed cursors never fail");
        is_avail(self.flags(c.idx), c.wrap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_follows_the_wrap_counter() {
        assert!(is_avail(DESC_F_AVAIL, true));
        assert!(!is_avail(DESC_F_AVAIL | DESC_F_USED, true));
        assert!(!is_avail(0, true));
        assert!(is_avail(DESC_F_USED, false));
        assert!(!is_avail(DESC_F_AVAIL | DESC_F_USED, false));
        assert!(!is_avail(0, false));
    }

    /// A ring over other memory is checked as a frontend's: its size, and each area aligned
    /// and inside the memory.
    #[test]
    fn a_ring_over_memory_is_checked_as_a_frontends() {
        let map = Arc::new(Region::memfd("over", 4096, false).unwrap());
        let over = |size, desc, driver, device| {
            PackedRing::over(map.clone(), size, desc, driver, device).map(|r| r.size())
        };
        assert_eq!(over(8, 0, 128, 132).unwrap(), 8);
        assert!(matches!(
            over(0, 0, 128, 132),
            Err(RingError::BadPackedSize(0))
        ));
        assert!(matches!(
            over(257, 0, 128, 132),
            Err(RingError::Unmapped { .. })
        ));
        assert!(matches!(
            over(8, 8, 136, 140),
            Err(RingError::Misaligned { .. })
        ));
        assert!(matches!(
            over(8, 0, 4094, 132),
            Err(RingError::Misaligned { .. })
        ));
        assert!(matches!(
            over(8, 0, 128, 4096),
            Err(RingError::Unmapped { .. })
        ));

        let split = |size, desc, avail, used| {
            crate::split::SplitRing::over(map.clone(), size, desc, avail, used).map(|r| r.size())
        };
        assert_eq!(split(8, 0, 128, 256).unwrap(), 8);
        assert!(matches!(split(6, 0, 128, 256), Err(RingError::BadSize(6))));
        assert!(matches!(
            split(8, 0, 128, 4032),
            Err(RingError::Unmapped { .. })
        ));
        assert!(matches!(
            split(8, 0, 128, 258),
            Err(RingError::Misaligned { .. })
        ));
        assert!(matches!(
            split(8, 0, usize::MAX - 1, 256),
            Err(RingError::Unmapped { .. })
        ));
    }
}
