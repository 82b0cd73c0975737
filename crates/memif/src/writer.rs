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

/// How many lines of a burst's first destination buffers are asked for in exclusive state
/// before its copy starts ([`ToLayout::prefetch_burst`]).
///
/// The server read each buffer last, so each line comes back from its core; a store that
/// waits for its line holds every later store behind it, and the copy alone kept about one
/// fetch in flight (perf of our client at 64 B, this AMD EPYC's slow state: 81% of its time in
/// `tx_burst`, 63% of that on one store, the store buffer full). Asked for together, the
/// fetches overlap. A/B in one sitting (in-process flip of ~250-ms windows, our client txonly
/// -> server rxonly, ratio up front / next frame only, p20/p50/p80):
///
/// ```text
///           our server            DPDK's server
///   64 B    1.10/1.18/1.26        1.13/1.19/1.25
///  128 B    0.95/1.11/1.35        1.04/1.22/1.33
///  256 B    1.01/1.09/1.13        0.94/1.01/1.13
///  512 B    0.93/1.02/1.10        0.90/1.00/1.12   (two frames)
/// ```
///
/// 1518-B frames (24 lines) are not asked for up front: the path is as before. Lost: 32
/// lines (64 B 1.20/1.21 at p50, but 128 B 0.85/0.95, 256 B 0.94/0.99; with 1518-B frames
/// asked for up front too, 1518 B 0.98/0.98); a window kept 16 frames ahead as the copy went
/// (64 B 1.14 over 8 frames ahead, which was 1.15/1.13 over the next frame only), and 32 ahead
/// over 16 (1.03/1.04), but the window's bookkeeping per frame cost 1518 B 0.84-0.96.
pub(crate) const WRITE_AHEAD_LINES: usize = 16;

impl ToLayout<'_> {
    /// Asks for the buffers of the burst's first frames (`pkts`, from slot `head`, with `free`
    /// slots of room the server handed back) in exclusive state: as many whole frames as fit
    /// in [`WRITE_AHEAD_LINES`] lines and the room, when at least two do. Returns how many;
    /// the copy loop asks for each later frame as the one before it is copied.
    #[inline(always)]
    pub fn prefetch_burst(&self, pkts: &[Mbuf], head: u16, free: u16) -> usize {
        let (mut lines, mut slots, mut frames) = (0, 0, 0);
        for m in pkts {
            let (l, s) = (self.first_lines(m.len()), self.slots_for(m.len()));
            if lines + l > WRITE_AHEAD_LINES || slots + s > usize::from(free) {
                break;
            }
            lines += l;
            slots += s;
            frames += 1;
        }
        if frames < 2 {
            return 0;
        }
        let mut slot = head;
        for m in &pkts[..frames] {
            self.prefetch_frame(slot, m.len());
            slot = slot.wrapping_add(self.slots_for(m.len()) as u16);
        }
        frames
    }

    /// Asks for the lines a frame of `len` bytes fills in `slot`'s buffer (its first slot's,
    /// for a frame longer than a buffer) in exclusive state.
    #[inline(always)]
    pub fn prefetch_frame(&self, slot: u16, len: usize) {
        let at = self.offset(slot);
        for line in 0..self.first_lines(len) {
            self.region.prefetch_write(at + line * 64);
        }
    }

    /// The lines a frame of `len` bytes fills in its first slot.
    #[inline(always)]
    fn first_lines(&self, len: usize) -> usize {
        len.min(self.bsize as usize).div_ceil(64).max(1)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// How many of a burst's first frames are asked for up front: whole frames within the line
    /// budget and the room, and none when fewer than two fit (a 1518-B burst keeps the
    /// next-frame-only path).
    #[test]
    fn a_burst_asks_for_whole_frames_within_the_line_budget_and_the_room() {
        let region = Region::private(1 << 22, false).unwrap();
        let ring = Ring::new(Arc::new(Region::private(1 << 16, false).unwrap()), 0, 10).unwrap();
        let to = ToLayout {
            ring: &ring,
            region: &region,
            base: 0,
            bsize: 2048,
        };
        let pool = memnic_test_support::pool("write-ahead", 64, 9000);
        let burst = |lens: &[usize]| -> Vec<Mbuf> {
            lens.iter()
                .map(|&l| {
                    let mut m = pool.alloc().unwrap();
                    m.append(l).unwrap();
                    m
                })
                .collect()
        };
        let asked = |lens: &[usize], free: u16| to.prefetch_burst(&burst(lens), 1020, free);
        let budget = WRITE_AHEAD_LINES;
        assert_eq!(asked(&[64; 32], 1024), budget, "one line a frame");
        assert_eq!(asked(&[64; 4], 1024), 4, "the burst's frames");
        assert_eq!(asked(&[128; 32], 1024), budget / 2, "two lines a frame");
        assert_eq!(asked(&[64; 32], 5), 5, "the room");
        assert_eq!(asked(&[512; 32], 1024), budget / 8, "whole frames only");
        assert_eq!(asked(&[1518; 32], 1024), 0, "one frame fits: none");
        assert_eq!(asked(&[64; 32], 1), 0, "room for one: none");
        assert_eq!(
            asked(&[64, 4000, 64], 1024),
            0,
            "a long frame's first slot is 32 lines"
        );

        // Buffers of 256 bytes: a 600-B frame takes three slots, and four lines of the first.
        let small = ToLayout { bsize: 256, ..to };
        let asked = |lens: &[usize], free: u16| small.prefetch_burst(&burst(lens), 0, free);
        assert_eq!(asked(&[64, 600, 64, 64], 5), 3, "slots counted per frame");
        assert_eq!(
            asked(&[64, 600, 64, 64], 3),
            0,
            "the long frame does not fit the room"
        );
        assert_eq!(asked(&[256; 8], 1024), 4, "four lines a frame");
    }
}
