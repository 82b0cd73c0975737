//! The slot writer: splits one frame over consecutive slots, NEXT on every descriptor but the
//! last (`specs/memif.md` §6), for both tx roles. What differs is only the buffer behind a slot
//! ([`Dest`]): the client's own layout, or the buffer a client's descriptor offers a server.
//!
//! A frame is written whole or not at all: if it needs more slots than the window has room for,
//! nothing is published and the frame stays with the caller (DPDK's roll-back to the first slot).

use memnic_ethdev::Mbuf;
use memnic_shm::{Region, VolatileSlice};

use crate::chain::outside_region;
use crate::error::DataError;
use crate::ring::{Desc, Regions, Ring, DESC_FLAG_NEXT};

/// The buffer behind a slot, for one kind of transmit.
pub(crate) trait Dest<'a> {
    /// Where `slot`'s bytes go: its whole buffer (its length is the capacity).
    fn buffer(&self, slot: u16) -> Result<VolatileSlice<'a>, DataError>;
    /// Records that `slot` holds `len` bytes, with `flags` (NEXT or 0).
    fn finish(&self, slot: u16, len: u32, flags: u16);
}

/// Writes `m` into the slots `at, at + 1, …`, using at most `room` of them. Returns how many it
/// used, or None when `room` is too few (the slots written are not published).
#[inline(always)]
pub(crate) fn write_frame<'a>(
    dst: &impl Dest<'a>,
    m: &Mbuf,
    at: u16,
    room: u16,
) -> Result<Option<u16>, DataError> {
    let len = m.len();
    let mut done = 0usize;
    let mut slots: u16 = 0;
    loop {
        if slots == room {
            return Ok(None);
        }
        let slot = at.wrapping_add(slots);
        let buf = dst.buffer(slot)?;
        let k = (len - done).min(buf.len());
        if k == 0 && len > done {
            return Err(no_room(slot, len - done));
        }
        m.copy_out_to(done, &buf.subslice(0, k).expect("k <= buffer length"));
        done += k;
        slots += 1;
        let flags = if done < len { DESC_FLAG_NEXT } else { 0 };
        dst.finish(slot, k as u32, flags);
        if flags == 0 {
            return Ok(Some(slots));
        }
    }
}

#[cold]
#[inline(never)]
fn no_room(slot: u16, left: usize) -> DataError {
    DataError::NoRoom {
        slot,
        left: left as u32,
    }
}

/// Client, copy mode: each slot's buffer of our own layout in region 0; the whole descriptor is
/// (re)written where it differs from ours, so nothing the server wrote into it is used.
pub(crate) struct ToLayout<'a> {
    pub ring: &'a Ring,
    pub region: &'a Region,
    /// Where slot 0's buffer starts, and the buffer size.
    pub base: usize,
    pub bsize: u32,
}

impl ToLayout<'_> {
    #[inline(always)]
    pub fn offset(&self, slot: u16) -> usize {
        self.base + (slot & self.ring.mask()) as usize * self.bsize as usize
    }

    /// Slots a frame of `len` bytes needs (a zero-length frame still takes one).
    #[inline(always)]
    pub fn slots_for(&self, len: usize) -> usize {
        len.div_ceil(self.bsize as usize).max(1)
    }
}

impl<'a> Dest<'a> for ToLayout<'a> {
    #[inline(always)]
    fn buffer(&self, slot: u16) -> Result<VolatileSlice<'a>, DataError> {
        Ok(self
            .region
            .slice(self.offset(slot), self.bsize as usize)
            .expect("our own layout: region 0 holds every slot's buffer"))
    }

    #[inline(always)]
    fn finish(&self, slot: u16, len: u32, flags: u16) {
        self.ring.write_desc_if_changed(
            slot,
            Desc {
                flags,
                region: 0,
                length: len,
                // Region 0's layout was checked to fit u32 offsets at connect.
                offset: self.offset(slot) as u32,
            },
        );
    }
}

/// Server: the buffer the client's descriptor offers (its region, offset and length as the
/// capacity), checked against the regions; only length and flags are written back.
pub(crate) struct ToDescriptors<'a> {
    pub ring: &'a Ring,
    pub regions: &'a Regions,
}

impl<'a> Dest<'a> for ToDescriptors<'a> {
    #[inline(always)]
    fn buffer(&self, slot: u16) -> Result<VolatileSlice<'a>, DataError> {
        let d = self.ring.read_desc(slot);
        self.regions
            .window(&d)
            .ok_or_else(|| outside_region(slot, d))
    }

    #[inline(always)]
    fn finish(&self, slot: u16, len: u32, flags: u16) {
        self.ring.write_len_flags(slot, len, flags);
    }
}
