//! memif rings in shared memory (`specs/memif.md` §4–§5, §8): the 128-byte header (cookie,
//! flags, head, tail) and 16-byte descriptors, reached only through bounds-checked accessors.
//!
//! head is written by the client and tail by the server, in both ring types. Every value read
//! from a ring is untrusted: counters are checked against the ring size, descriptors against the
//! regions, before anything is copied.
//!
//! The two steps of the head/tail protocol, [`acquire`] (read the peer's counter) and
//! [`publish`] (store our own), are generic over [`Counter`], so the loom model in
//! `tests/loom_ring.rs` runs these very steps, and the window check of [`crate::window`], on
//! loom's atomics.

use std::sync::atomic::{
    AtomicU16,
    Ordering::{self, Acquire, Relaxed, Release},
};
use std::sync::Arc;

use memnic_shm::{Region, VolatileSlice};

pub use crate::msg::{
    COOKIE as RING_COOKIE, DESC_FLAG_NEXT, MAX_LOG2_RING_SIZE, RING_FLAG_MASK_INT,
};

pub const RING_HDR: usize = 128;
pub const DESC_SIZE: usize = 16;
const COOKIE_OFF: usize = 0;
const FLAGS_OFF: usize = 4;
const HEAD_OFF: usize = 6;
const TAIL_OFF: usize = 64;

/// Bytes of a ring of 2^log2 slots.
pub const fn ring_bytes(log2: u8) -> usize {
    RING_HDR + DESC_SIZE * (1 << log2)
}

/// A ring counter (head or tail): the `u16` in shared memory here, loom's atomic in the model.
pub trait Counter {
    fn load(&self, order: Ordering) -> u16;
    fn store(&self, value: u16, order: Ordering);
}

impl Counter for AtomicU16 {
    #[inline(always)]
    fn load(&self, order: Ordering) -> u16 {
        AtomicU16::load(self, order)
    }
    #[inline(always)]
    fn store(&self, value: u16, order: Ordering) {
        AtomicU16::store(self, value, order)
    }
}

/// Reads the peer's counter (once per burst: see [`crate::window::Window`]).
#[inline(always)]
pub fn acquire(peer: &impl Counter) -> u16 {
    // Acquire pairs with the peer's Release in `publish`: the descriptors and buffers it wrote
    // (as producer), or its last reads of the slots it handed back (as consumer), happen before
    // our reads and writes of those slots.
    peer.load(Acquire)
}

/// Publishes our counter: the slots up to `value` are the peer's now.
#[inline(always)]
pub fn publish(own: &impl Counter, value: u16) {
    // Release pairs with the peer's Acquire in `acquire`: our descriptor and buffer writes (as
    // producer), or our reads of the slots we hand back (as consumer), happen before the peer
    // sees the new value.
    own.store(value, Release);
}

/// One descriptor, read once into a local.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Desc {
    pub flags: u16,
    pub region: u16,
    pub length: u32,
    pub offset: u32,
}

impl Desc {
    /// The two 64-bit words the ring holds for it: flags, region and length; then offset and
    /// the metadata field, which we always write as zero.
    #[inline(always)]
    fn words(&self) -> (u64, u64) {
        (
            self.flags as u64 | (self.region as u64) << 16 | (self.length as u64) << 32,
            self.offset as u64,
        )
    }
}

/// Why a ring could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("ring size 2^{0} is above the limit 2^14")]
    TooLarge(u8),
    #[error("ring at offset {offset:#x} ({bytes} bytes) does not fit in its {len}-byte region")]
    OutOfRegion {
        offset: usize,
        bytes: usize,
        len: usize,
    },
    #[error("ring at offset {0:#x} is not 16-byte aligned")]
    Misaligned(usize),
    #[error("wrong ring cookie {0:#x} (expected 0x3e31f20)")]
    Cookie(u32),
}

/// A ring inside a region.
#[derive(Clone)]
pub struct Ring {
    region: Arc<Region>,
    off: usize,
    log2: u8,
}

impl Ring {
    /// A view of the ring at `off`, checked to lie inside `region` (cookie not checked).
    pub fn new(region: Arc<Region>, off: usize, log2: u8) -> Result<Ring, RingError> {
        if log2 > MAX_LOG2_RING_SIZE {
            return Err(RingError::TooLarge(log2));
        }
        let bytes = ring_bytes(log2);
        if !off.is_multiple_of(16) {
            return Err(RingError::Misaligned(off));
        }
        match off.checked_add(bytes) {
            Some(end) if end <= region.len() => Ok(Ring { region, off, log2 }),
            _ => Err(RingError::OutOfRegion {
                offset: off,
                bytes,
                len: region.len(),
            }),
        }
    }

    /// As [`Ring::new`], and the cookie must match (the server checks rings it is given).
    pub fn checked(region: Arc<Region>, off: usize, log2: u8) -> Result<Ring, RingError> {
        let r = Ring::new(region, off, log2)?;
        // Relaxed: the cookie was written before the client sent the ring over the socket.
        let c = r.region.u32(off + COOKIE_OFF).load(Relaxed);
        if c != RING_COOKIE {
            return Err(RingError::Cookie(c));
        }
        Ok(r)
    }

    /// Lays out a fresh ring: cookie, flags 0, head = tail = 0 (the client, at setup).
    pub fn init(&self) {
        self.region
            .fill(self.off, RING_HDR, 0)
            .expect("checked in new");
        // Relaxed: published to the server by the socket message that announces the ring.
        self.region
            .u32(self.off + COOKIE_OFF)
            .store(RING_COOKIE, Relaxed);
    }

    pub fn size(&self) -> u16 {
        // 2^14 at most, so it fits; a 2^16 ring is never accepted.
        1u16 << self.log2
    }

    pub fn mask(&self) -> u16 {
        self.size() - 1
    }

    pub fn log2(&self) -> u8 {
        self.log2
    }

    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    pub fn offset(&self) -> usize {
        self.off
    }

    #[inline(always)]
    pub fn head(&self) -> &AtomicU16 {
        self.region.u16(self.off + HEAD_OFF)
    }

    #[inline(always)]
    pub fn tail(&self) -> &AtomicU16 {
        self.region.u16(self.off + TAIL_OFF)
    }

    #[inline(always)]
    pub fn flags(&self) -> &AtomicU16 {
        self.region.u16(self.off + FLAGS_OFF)
    }

    #[inline(always)]
    fn desc_off(&self, slot: u16) -> usize {
        self.off + RING_HDR + (slot & self.mask()) as usize * DESC_SIZE
    }

    /// Reads descriptor `slot` (masked) once.
    #[inline(always)]
    pub fn read_desc(&self, slot: u16) -> Desc {
        let o = self.desc_off(slot);
        // Relaxed: descriptors are ordered by the Acquire load of the peer's counter that made
        // this slot ours (head or tail), done by the caller before this read.
        let a = self.region.u64(o).load(Relaxed);
        let b = self.region.u64(o + 8).load(Relaxed);
        Desc {
            flags: a as u16,
            region: (a >> 16) as u16,
            length: (a >> 32) as u32,
            offset: b as u32,
        }
    }

    /// Writes descriptor `slot` (masked); metadata is zero.
    #[inline(always)]
    pub fn write_desc(&self, slot: u16, d: Desc) {
        let o = self.desc_off(slot);
        let (a, b) = d.words();
        // Relaxed: published by the caller's Release store of its counter (head or tail).
        self.region.u64(o).store(a, Relaxed);
        self.region.u64(o + 8).store(b, Relaxed);
    }

    /// Writes descriptor `slot` (masked) unless it already holds `d`: a client in copy mode
    /// fills each slot with the same buffer every lap, and frames of one length leave its
    /// descriptor as it was. Left alone, the descriptor line stays shared with the server
    /// instead of being taken back for the store and fetched again by its next read: one
    /// line transfer fewer per four frames each way. What we compare is only a hint (the
    /// server may change the slot at any time, as it may after a store), and nothing of ours is
    /// read back from it. A/B in one sitting (variant flipped every 250 ms in one process,
    /// ratio of adjacent windows p20/p50/p80, our client txonly): our server 64 B
    /// 1.02/1.05/1.10 and 0.99/1.04/1.08, 512 B 1.07/1.10/1.13, 1518 B 0.95/1.02/1.08; DPDK's
    /// server 64 B 0.93/1.04/1.17 and 1.01/1.05/1.09, 512 B 0.96/1.02/1.10, 1518 B
    /// 0.99/1.06/1.18.
    #[inline(always)]
    pub fn write_desc_if_changed(&self, slot: u16, d: Desc) {
        let o = self.desc_off(slot);
        // Relaxed: a hint, compared only (the store, when there is one, is published as in
        // `write_desc`).
        let now = (
            self.region.u64(o).load(Relaxed),
            self.region.u64(o + 8).load(Relaxed),
        );
        if now != d.words() {
            self.write_desc(slot, d);
        }
    }

    /// Writes only the length and flags of descriptor `slot` (the server filling a client slot).
    #[inline(always)]
    pub fn write_len_flags(&self, slot: u16, length: u32, flags: u16) {
        let o = self.desc_off(slot);
        // Relaxed: published by the caller's Release store of tail.
        self.region.u32(o + 4).store(length, Relaxed);
        self.region.u16(o).store(flags, Relaxed);
    }
}

/// The regions of one connection: index → mapping. Descriptors are checked against it.
#[derive(Clone, Default)]
pub struct Regions(pub Vec<Arc<Region>>);

impl Regions {
    /// The region and offset a descriptor points at, if `len` bytes from there lie inside it.
    #[inline(always)]
    pub fn locate(&self, region: u16, offset: u32, len: u32) -> Option<&Region> {
        let r = self.0.get(region as usize)?;
        let end = (offset as usize).checked_add(len as usize)?;
        (end <= r.len()).then_some(&**r)
    }

    /// The bytes descriptor `d` points at, if they lie wholly inside one of the regions.
    #[inline(always)]
    pub fn window(&self, d: &Desc) -> Option<VolatileSlice<'_>> {
        let r = self.0.get(d.region as usize)?;
        r.slice(d.offset as usize, d.length as usize).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(len: usize) -> Arc<Region> {
        Arc::new(Region::private(len, false).unwrap())
    }

    #[test]
    fn a_descriptor_the_peer_changed_is_written_again() {
        let r = Ring::new(region(1 << 16), 0, 4).unwrap();
        let d = Desc {
            flags: 0,
            region: 0,
            length: 60,
            offset: 0x1000,
        };
        r.write_desc_if_changed(5, d);
        assert_eq!(r.read_desc(5), d);
        let o = RING_HDR + 5 * DESC_SIZE;
        // Each word the peer may scribble on: flags, region, length, offset, metadata.
        for (at, val) in [(0, 1u64), (2, 7), (4, 0x4000), (8, 0x2000), (12, 9)] {
            r.region()
                .write_bytes(o + at, &val.to_le_bytes()[..2])
                .unwrap();
            r.write_desc_if_changed(5, d);
            let mut raw = [0u8; 16];
            r.region().read_bytes(o, &mut raw).unwrap();
            assert_eq!(r.read_desc(5), d, "field at {at} restored");
            assert_eq!(&raw[12..], &[0; 4], "metadata zero after a change at {at}");
        }
        // The same descriptor again: left as it is.
        r.write_desc_if_changed(5, d);
        assert_eq!(r.read_desc(5), d);
    }

    #[test]
    fn layout_matches_the_spec() {
        assert_eq!(ring_bytes(8), 4224);
        assert_eq!(ring_bytes(10), 16512);
        let r = Ring::new(region(1 << 16), 128, 4).unwrap();
        r.init();
        r.head().store(0x1234, Relaxed);
        r.tail().store(0x5678, Relaxed);
        r.flags().store(RING_FLAG_MASK_INT, Relaxed);
        let mut raw = [0u8; 128];
        r.region().read_bytes(128, &mut raw).unwrap();
        assert_eq!(
            u32::from_le_bytes(raw[0..4].try_into().unwrap()),
            RING_COOKIE
        );
        assert_eq!(u16::from_le_bytes([raw[4], raw[5]]), 1, "flags at 4");
        assert_eq!(u16::from_le_bytes([raw[6], raw[7]]), 0x1234, "head at 6");
        assert_eq!(u16::from_le_bytes([raw[64], raw[65]]), 0x5678, "tail at 64");
        r.write_desc(
            3 + 16,
            Desc {
                flags: 1,
                region: 2,
                length: 0xabcd,
                offset: 0x1000,
            },
        );
        let mut d = [0u8; 16];
        r.region().read_bytes(128 + 128 + 3 * 16, &mut d).unwrap();
        assert_eq!(
            d,
            [1, 0, 2, 0, 0xcd, 0xab, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0],
            "slot masked, packed layout"
        );
        assert_eq!(r.read_desc(3).length, 0xabcd);
        r.write_len_flags(3, 77, 0);
        assert_eq!(
            r.read_desc(3),
            Desc {
                flags: 0,
                region: 2,
                length: 77,
                offset: 0x1000
            }
        );
    }

    #[test]
    fn bad_rings_are_refused() {
        let reg = region(8192);
        assert_eq!(
            Ring::new(reg.clone(), 0, 15).err(),
            Some(RingError::TooLarge(15))
        );
        assert!(matches!(
            Ring::new(reg.clone(), 8192 - 64, 2),
            Err(RingError::OutOfRegion { .. })
        ));
        assert!(matches!(
            Ring::new(reg.clone(), usize::MAX - 10, 0),
            Err(RingError::Misaligned(_))
        ));
        assert!(matches!(
            Ring::new(reg.clone(), 3, 0),
            Err(RingError::Misaligned(3))
        ));
        assert_eq!(
            Ring::checked(reg.clone(), 0, 4).err(),
            Some(RingError::Cookie(0))
        );
        Ring::new(reg.clone(), 0, 4).unwrap().init();
        assert!(Ring::checked(reg, 0, 4).is_ok());
    }

    #[test]
    fn descriptors_are_located_only_inside_regions() {
        let regs = Regions(vec![region(4096), region(8192)]);
        assert!(regs.locate(0, 0, 4096).is_some());
        assert!(regs.locate(0, 1, 4096).is_none());
        assert!(regs.locate(1, 8000, 192).is_some());
        assert!(regs.locate(2, 0, 1).is_none(), "no such region");
        assert!(regs.locate(1, u32::MAX, u32::MAX).is_none(), "no overflow");
        let d = |region, offset, length| Desc {
            flags: 0,
            region,
            length,
            offset,
        };
        assert_eq!(regs.window(&d(1, 8000, 192)).map(|w| w.len()), Some(192));
        assert!(regs.window(&d(0, 1, 4096)).is_none());
        assert!(regs.window(&d(2, 0, 1)).is_none(), "no such region");
        assert!(
            regs.window(&d(1, u32::MAX, u32::MAX)).is_none(),
            "no overflow"
        );
    }
}
