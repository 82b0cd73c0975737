//! What the burst loops need from a virtqueue, split or packed (virtio 1.x §2.7, §2.8): take
//! the next chain the driver made available, hand chains back as used, publish them in one
//! store per burst, and decide whether the driver wants a call.
//!
//! A ring's position is one `u16`, as vhost-user carries it in SET/GET_VRING_BASE: a split
//! ring's free-running avail index, or a packed ring's index with its wrap counter in bit 15.
//! The burst loops work on cursors (`Copy`), so a burst can look ahead and go back.

use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::Arc;

use memnic_shm::Region;

use crate::chain::{ChainError, Dir, Piece};
use crate::mem::MemTable;
use crate::notify::Suppression;
use crate::packed::PackedRing;
use crate::split::SplitRing;

/// The frontend's addresses of a ring's three areas (its virtual addresses). Packed rings put
/// the driver event suppression area in `avail` and the device's in `used`, as vhost-user does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingAddrs {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

/// Why a ring could not be set up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    #[error("queue size {0} is not a power of two from 1 to 32768")]
    BadSize(u32),
    #[error("queue size {0} is not from 1 to 32768")]
    BadPackedSize(u32),
    #[error("ring position {pos:#x} is past the queue size {size}")]
    BadBase { pos: u16, size: u16 },
    #[error("the {area} area at {addr:#x} ({len} bytes) is not inside one memory region")]
    Unmapped {
        area: &'static str,
        addr: u64,
        len: u64,
    },
    #[error("the {area} area at {addr:#x} is not {align}-byte aligned")]
    Misaligned {
        area: &'static str,
        addr: u64,
        align: u64,
    },
    /// The address is aligned, but its region's `mmap_offset` (or address) puts it at a
    /// misaligned offset of our mapping, where the ring's words cannot be accessed atomically.
    #[error("the {area} area at {addr:#x} lies at offset {off:#x} of its region's file, which is not {align}-byte aligned (the region's mmap_offset does not match its address)")]
    MisalignedInRegion {
        area: &'static str,
        addr: u64,
        off: usize,
        align: u64,
    },
}

/// Guest memory as a ring reaches it: its 16- and 32-bit words, each access with the ordering
/// it names, and a descriptor copied out once. The backend's rings run on the frontend's
/// mapped [`Region`]s (whose words are std's atomics); the loom model of the handoff
/// (`tests/loom_handoff.rs`) runs the same ring code on loom's atomics. Offsets are the ring's
/// own, inside the areas checked at set-up.
pub trait RingMemory {
    type Word16: RingWord<u16>;
    type Word32: RingWord<u32>;
    fn u16(&self, off: usize) -> &Self::Word16;
    fn u32(&self, off: usize) -> &Self::Word32;
    /// How many bytes the memory holds (the areas of a ring must lie inside).
    fn bytes(&self) -> usize;
    /// The 16 bytes of a descriptor at `off`, copied out once.
    fn read_desc(&self, off: usize) -> [u8; 16];
    /// A hint: the line at `off` is written soon.
    fn prefetch_write(&self, _off: usize) {}
}

/// One word of guest memory: an atomic load or store with the ordering the ring names.
pub trait RingWord<T> {
    fn load(&self, o: Ordering) -> T;
    fn store(&self, v: T, o: Ordering);
}

impl RingWord<u16> for AtomicU16 {
    #[inline(always)]
    fn load(&self, o: Ordering) -> u16 {
        AtomicU16::load(self, o)
    }
    #[inline(always)]
    fn store(&self, v: u16, o: Ordering) {
        AtomicU16::store(self, v, o)
    }
}

impl RingWord<u32> for AtomicU32 {
    #[inline(always)]
    fn load(&self, o: Ordering) -> u32 {
        AtomicU32::load(self, o)
    }
    #[inline(always)]
    fn store(&self, v: u32, o: Ordering) {
        AtomicU32::store(self, v, o)
    }
}

impl RingMemory for Region {
    type Word16 = AtomicU16;
    type Word32 = AtomicU32;
    #[inline(always)]
    fn u16(&self, off: usize) -> &AtomicU16 {
        Region::u16(self, off)
    }
    #[inline(always)]
    fn u32(&self, off: usize) -> &AtomicU32 {
        Region::u32(self, off)
    }
    fn bytes(&self) -> usize {
        Region::len(self)
    }
    #[inline(always)]
    fn read_desc(&self, off: usize) -> [u8; 16] {
        let mut b = [0u8; 16];
        self.read_bytes(off, &mut b)
            .expect("the ring was checked at set-up");
        b
    }
    #[inline(always)]
    fn prefetch_write(&self, off: usize) {
        Region::prefetch_write(self, off)
    }
}

/// Where a ring area is: its mapping and offset, checked once at set-up.
#[derive(Debug)]
pub(crate) struct Area<M = Region> {
    pub map: Arc<M>,
    pub off: usize,
}

impl<M> Clone for Area<M> {
    fn clone(&self) -> Self {
        Area {
            map: self.map.clone(),
            off: self.off,
        }
    }
}

impl Area {
    /// Locates `len` bytes at the frontend's virtual address `addr`: aligned to `align`, whole
    /// inside one region, and aligned within our mapping too (which starts at a page: the
    /// ring's words are accessed as atomics of their size).
    pub fn locate(
        mem: &MemTable,
        area: &'static str,
        addr: u64,
        len: u64,
        align: u64,
    ) -> Result<Area, RingError> {
        if !addr.is_multiple_of(align) {
            return Err(RingError::Misaligned { area, addr, align });
        }
        let (map, off) = mem
            .uva(addr, len)
            .ok_or(RingError::Unmapped { area, addr, len })?;
        if !(off as u64).is_multiple_of(align) {
            return Err(RingError::MisalignedInRegion {
                area,
                addr,
                off,
                align,
            });
        }
        Ok(Area {
            map: map.clone(),
            off,
        })
    }
}

impl<M: RingMemory> Area<M> {
    /// `len` bytes at offset `off` of `map`: aligned to `align` and inside it (for rings on
    /// memory other than a frontend's, where the offset stands for the address).
    pub fn within(
        map: &Arc<M>,
        area: &'static str,
        off: usize,
        len: u64,
        align: u64,
    ) -> Result<Area<M>, RingError> {
        let addr = off as u64;
        if !addr.is_multiple_of(align) {
            return Err(RingError::Misaligned { area, addr, align });
        }
        if addr
            .checked_add(len)
            .is_none_or(|end| end > map.bytes() as u64)
        {
            return Err(RingError::Unmapped { area, addr, len });
        }
        Ok(Area {
            map: map.clone(),
            off,
        })
    }
}

/// A chain as the ring knows it: the id the used entry returns, and (packed) how many ring
/// slots it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    pub id: u16,
    pub descs: u16,
}

/// What the ring had at a cursor.
#[derive(Debug)]
pub enum Next {
    /// Nothing the driver has made available.
    Empty,
    /// A chain, walked into the pieces: its total length, or why it is refused. The cursor
    /// moved past it.
    Chain(Chain, Result<u32, ChainError>),
    /// The ring cannot be followed any further.
    Broken(Broken),
}

/// Why a queue stopped using its ring until the control thread installs it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    #[error("avail.idx moved by more than the queue size")]
    AvailJump,
    #[error("a packed chain that does not end within the queue")]
    EndlessChain,
}

/// The most frames an enqueue batch places before it copies any ([`Vring::ENQ_BATCH`]).
pub const MAX_ENQ_BATCH: usize = 32;

/// A virtqueue layout, device side. Everything it reads from the ring is the guest's.
pub trait Vring {
    /// Frames an enqueue burst places before it copies any (at most [`MAX_ENQ_BATCH`]): their
    /// chains are walked first and their buffers prefetched for writing, then the frames are
    /// copied one after another, so the misses on the driver's lines (descriptors it rewrote,
    /// a frame's first line, which DPDK's virtio PMD reads for its multicast and broadcast
    /// counters) overlap instead of queueing one behind another. Each ring measured its own
    /// (see the impls).
    const ENQ_BATCH: usize;
    /// The longest frame an enqueue batch writes with streaming stores
    /// ([`memnic_shm::Region::write_bytes_streaming`], one store fence before the burst is
    /// published) while the queue's tuner finds that this moves more frames
    /// (`memnic_ethdev::stream`); 0 for none. Each ring measured its own (see the impls).
    const STREAM_TUNED: usize;
    /// Bytes of a dequeued frame longer than the whole-frame prefetch (`PREFETCH_WHOLE` in
    /// `queue`) asked for when its chain is taken: its first line to L1, the rest to L2. Each
    /// ring measured its own (see the impls).
    const DEQ_FETCH_LONG: usize;
    /// Bytes of a frame (after its header) whose lines in the guest's buffer an enqueue batch
    /// asks for in exclusive state before it copies; the frame's first two lines only (the
    /// hardware prefetcher was to follow) left a 512-B copy's stores waiting for the other
    /// lines one after another. A/B in one sitting (our txonly -> virtio-user rxonly, 3 rounds
    /// alternating, Mpps p20/p50/p80, two lines / up to 1024 bytes): packed 512 B
    /// 9.20/9.88/9.99 / 13.71/14.60/15.60, split 512 B 10.27/10.39/10.48 / 15.43/15.54/17.03;
    /// 1518 B level (packed 10.22 / 10.18, split 11.06 / 11.00 at p50), 64 B level. At
    /// 1024-B frames (2 rounds, single runs) 11.5-12.1 -> 12.9-13.3 split, 10.9-11.2 -> 12.3-12.5
    /// packed; the whole of a 1518-B frame was level. Each ring measured its own since (see
    /// the impls).
    const ENQ_FETCH: usize;

    /// Where the next available chain is.
    type Cursor: Copy;
    /// Where the next used entry goes, and what it takes to publish the burst's entries.
    type Used;

    /// A cursor at position `pos`; fails when the driver broke the ring.
    fn cursor(&self, pos: u16) -> Result<Self::Cursor, Broken>;
    fn cursor_pos(c: &Self::Cursor) -> u16;
    /// The chain at `cur`, its buffers going `dir` appended to `pieces` (see [`crate::chain::walk`]).
    fn next(
        &self,
        mem: &MemTable,
        cur: &mut Self::Cursor,
        dir: Dir,
        pieces: &mut Vec<Piece>,
    ) -> Next;

    fn used_at(&self, pos: u16) -> Self::Used;
    fn used_pos(u: &Self::Used) -> u16;
    /// Writes the used entry for `chain` (`len` bytes written into it); it is not visible to
    /// the driver before [`Vring::publish`].
    fn put_used(&self, u: &mut Self::Used, chain: Chain, len: u32);
    /// IN_ORDER: hands back `chains` chains taken in order, the last of them `last`, taking
    /// `descs` ring slots in all, none written into (a tx ring's): one used entry says it
    /// all (virtio 1.x §2.7.9.1, §2.8.21.3 "in-order").
    fn put_used_run(&self, u: &mut Self::Used, last: Chain, chains: u16, descs: u16);
    /// Makes every entry put since `used_at` visible, with one Release store.
    fn publish(&self, u: &mut Self::Used);

    /// After `publish` and `notify_fence`: whether the driver wants a call for the used
    /// position moving from `old` to `new`.
    fn wants_call(&self, old: u16, new: u16, event_idx: bool) -> bool;
    /// Whether the driver turned every call off (packed: DISABLE; split without EVENT_IDX:
    /// NO_INTERRUPT; never with EVENT_IDX, whose split ring has no such state). Relaxed: a
    /// look before or after `notify_fence`, as the caller needs.
    fn calls_off(&self, event_idx: bool) -> bool;
    /// Asks the driver not to kick (we poll).
    fn disable_kicks(&self);
    /// Asks the driver to kick once it makes a chain available at `pos`.
    fn enable_kicks(&self, pos: u16, event_idx: bool);
    /// Whether a chain is available at `pos` (after `enable_kicks` and `notify_fence`).
    fn has_avail(&self, pos: u16) -> bool;
    /// Asks for the ring's lines that an enqueue batch at `cur` reads and then writes, for
    /// writing: with `this`, the batch's own; with `next`, the next batch's (their misses then
    /// overlap this batch's copies). By default nothing (the split ring: not measured).
    #[inline(always)]
    fn prefetch_batch(&self, _cur: &Self::Cursor, _this: bool, _next: bool) {}
    /// Asks for the line where the frame of each of the next `n` chains the driver has made
    /// available past `cur` starts (`hdr_len` bytes into its first buffer), without taking
    /// them: a dequeue batch does this before it copies its own frames, so the misses on the
    /// next batch's first lines overlap these copies. A prefetch is a hint: a slot that is
    /// not a chain's head, or an address in no region, costs a wasted line at worst. By
    /// default nothing (the split ring, whose driver posts its buffers in address order:
    /// not measured).
    #[inline(always)]
    fn prefetch_ahead(&self, _mem: &MemTable, _cur: &Self::Cursor, _hdr_len: usize, _n: u16) {}
}

/// A ring of either layout (VIRTIO_F_RING_PACKED says which).
#[derive(Debug, Clone)]
pub enum Ring {
    Split(SplitRing),
    Packed(PackedRing),
}

impl Ring {
    pub fn size(&self) -> u16 {
        match self {
            Ring::Split(r) => r.size(),
            Ring::Packed(r) => r.size(),
        }
    }
}

/// The full fence between publishing used entries and reading whether the driver wants a call
/// (or between asking for kicks and looking at the ring again): a store→load order, which only
/// SeqCst gives. It pairs with the driver's full barrier between re-enabling interrupts (or
/// publishing a chain) and re-reading the ring (or our event area), so either side sees the
/// other's store.
#[inline(always)]
pub fn notify_fence() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// A ring in the guest's memory as the notification steps ([`crate::notify`]) see it.
pub(crate) struct OnGuest<'a, V> {
    pub ring: &'a V,
    pub event_idx: bool,
}

impl<V: Vring> Suppression for OnGuest<'_, V> {
    #[inline(always)]
    fn calls_off(&self) -> bool {
        self.ring.calls_off(self.event_idx)
    }
    #[inline(always)]
    fn wants_call(&self, old: u16, new: u16) -> bool {
        self.ring.wants_call(old, new, self.event_idx)
    }
    #[inline(always)]
    fn enable_kicks(&self, pos: u16) {
        self.ring.enable_kicks(pos, self.event_idx)
    }
    #[inline(always)]
    fn has_avail(&self, pos: u16) -> bool {
        self.ring.has_avail(pos)
    }
    #[inline(always)]
    fn fence(&self) {
        notify_fence()
    }
}

/// virtio's `vring_need_event`: whether moving an index from `old` to `new` passes `event`
/// (the driver asked to be told once the index passes `event`).
#[inline(always)]
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Runs `$body` with `$r` bound to the ring of whichever layout `$ring` is, so the burst loops
/// are compiled once per layout and never branch on it per chain.
#[macro_export]
#[doc(hidden)]
macro_rules! on_ring {
    ($ring:expr, $r:ident => $body:expr) => {
        match $ring {
            $crate::vring::Ring::Split($r) => $body,
            $crate::vring::Ring::Packed($r) => $body,
        }
    };
}
