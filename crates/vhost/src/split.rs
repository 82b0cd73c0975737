//! The split virtqueue (virtio 1.x §2.7), device side: the descriptor table, the available ring
//! (driver → device) and the used ring (device → driver), each an area of guest memory the
//! frontend named by its own virtual address (SET_VRING_ADDR).
//!
//! The areas are located and bounds-checked once, when the ring is set up; after that every
//! offset is computed from an index masked by the queue size, so it stays inside the areas.
//! Every value read from the rings is the guest's and is checked where it is used (descriptor
//! indices and addresses in `chain`, avail.idx against the queue size in `queue`).

use std::sync::atomic::{
    fence,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::sync::Arc;

use memnic_shm::Region;

use crate::mem::MemTable;

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

/// The frontend's addresses of a ring's three areas (its virtual addresses).
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
}

/// Where an area is: its mapping and offset.
#[derive(Debug, Clone)]
struct Area {
    map: Arc<Region>,
    off: usize,
}

/// A split ring located in guest memory.
#[derive(Debug, Clone)]
pub struct SplitRing {
    size: u16,
    desc: Area,
    avail: Area,
    used: Area,
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
        let area = |area: &'static str, addr: u64, len: u64, align: u64| {
            if !addr.is_multiple_of(align) {
                return Err(RingError::Misaligned { area, addr, align });
            }
            let (map, off) = mem
                .uva(addr, len)
                .ok_or(RingError::Unmapped { area, addr, len })?;
            Ok(Area {
                map: map.clone(),
                off,
            })
        };
        Ok(SplitRing {
            // 32768 fits: 1 << 15; a u16 of 0 would mean 65536, never allowed here.
            size: size as u16,
            desc: area("descriptor", a.desc, 16 * n, 16)?,
            avail: area("available", a.avail, 6 + 2 * n, 2)?,
            used: area("used", a.used, 6 + 8 * n, 4)?,
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
        let mut b = [0u8; 16];
        self.desc
            .map
            .read_bytes(self.desc.off + 16 * self.mask(i), &mut b)
            .expect("the table was checked at set-up");
        Desc::parse(&b)
    }

    /// Writes used element `i` (mod size). Relaxed: published by `publish_used`'s Release.
    #[inline(always)]
    pub fn set_used_elem(&self, i: u16, id: u16, len: u32) {
        let off = self.used.off + 4 + 8 * self.mask(i);
        self.used.map.u32(off).store(id as u32, Relaxed);
        self.used.map.u32(off + 4).store(len, Relaxed);
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

    /// The full fence between publishing used.idx and reading whether the driver wants an
    /// interrupt (avail.flags or used_event): a store→load order, which only SeqCst gives.
    /// It pairs with the driver's full barrier between re-enabling interrupts and re-reading
    /// used.idx, so either it sees our index or we see its request.
    #[inline(always)]
    pub fn notify_fence(&self) {
        fence(SeqCst);
    }
}

/// virtio's `vring_need_event`: whether moving the used index from `old` to `new` passes
/// `event` (the driver asked to be told once the index passes `event`).
#[inline(always)]
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}
