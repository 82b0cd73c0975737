//! The chain walker: receives whole frames from a window, walking each frame's descriptors from
//! its first slot to the one without NEXT (`specs/memif.md` §6). Both rx roles and every kind of
//! receive use it; what differs is only where a slot's bytes are ([`Source`]).
//!
//! The walk is bounded by the window: a frame whose last available slot still says NEXT is a
//! protocol error ("Chained buffer runs past head/tail"), detected here and nowhere else. Each
//! descriptor is read once into a local and handed to the source, which validates it before it
//! touches any byte.

use memnic_ethdev::{Mbuf, PoolCache, QueueStats};
use memnic_shm::{Region, VolatileSlice};

use crate::error::{DataError, PeerCounter};
use crate::ring::{Desc, Regions, Ring, DESC_FLAG_NEXT};
use crate::window::Window;
use crate::MAX_FRAME_LEN;

/// How many slots ahead of the copy their buffers are prefetched (measured: 8 beat 1 by 10-30%
/// at 64 and 256 bytes, and is no worse at 1518), unless the burst's frames are short
/// ([`SHORT_PREFETCH_FRAMES`]).
pub(crate) const PREFETCH_FRAMES: u16 = 8;

/// How many slots ahead of the copy their buffers are prefetched in a burst of one-line
/// frames (as far as its first descriptor says, which the copy reads first anyway), and the
/// client then asks for one line of each buffer, not more (it does not read a descriptor
/// before the copy: that read would wait on the server's line).
///
/// Every 2-KiB slot's line 0 falls in one of two L1 sets, so lines asked for far ahead fight
/// over a few ways, and each asked for waits in a fill buffer: the client's four lines eight
/// slots ahead are 32 fetches in flight, three of four for nothing at 64 B. One-line frames
/// have few lines to fetch and a short copy to hide the wait behind, so they are asked for
/// further ahead. In-process flip on the Intel Xeon host of session 44 (the receiver counted,
/// B/A p20/p50/p80):
///
/// ```text
///   our client <- our server, 64 B   one line 16 ahead  1.18/1.19/1.20, 1.11/1.12/1.13, 1.10/1.13/1.15
///                                    two lines 16 ahead 1.18/1.20/1.20, 1.03/1.06/1.06
///                                    four lines 16 / 12 / 24 ahead  1.09 and 0.99 / 1.02 / 1.03
///                                    one line 16 ahead for every size: 512 B 0.89, 1518 B 0.97
///   our client <- DPDK's server, 64 B  one line 16 ahead  1.00/1.01/1.01, 0.99/0.99/1.01
///   our server <- our client, 64 B   16 ahead 1.06/1.08/1.09, 12 ahead 1.02/1.04/1.05
///                            512 B   16 ahead 0.90/0.91/0.93 (so longer frames keep 8)
///                           1518 B   16 ahead 0.99/0.99/1.02
///   our server <- DPDK's client, 64 B  16 ahead 1.04/1.04/1.05, 12 ahead 1.00/1.01/1.05
/// ```
///
/// The rule as it stands against the build before it, `bench memif --peer both --dir s2c
/// --sizes 64 --interleave`, whole runs alternating (session 44; Mpps p50, mean of 4
/// rounds): our client <- our server 32.4 -> 39.0 (1.07-1.24 -> 1.32-1.41 of DPDK's pair),
/// our client <- DPDK's server 25.8 -> 25.4, the one cell it costs (-1%; -2% and -4% in two
/// earlier sittings of 3 and 2 rounds, within their noise). C2S at 64 B, our server <- DPDK's
/// client 25.4 -> 25.9 and 26.8 (two rounds), and `ab-builds.sh` ours <- ours 64 B
/// 1.04/1.02/1.01, 512 B 1.01/1.02/1.00, 1518 B 1.00/0.99/0.98. Lost against it: one line
/// twelve ahead (37.1 and 24.7 in the same rounds), two lines sixteen ahead (36.1 and 23.8).
pub(crate) const SHORT_PREFETCH_FRAMES: u16 = 16;

/// The longest frame [`SHORT_PREFETCH_FRAMES`] takes as one-line.
const SHORT_FRAME: u32 = 64;

/// The longest frame of which the client's receive asks for [`MID_PREFETCH_LINES`] lines
/// ahead of its copy; of a longer one (as far as the burst's first descriptor says: the client
/// reads no descriptor ahead), [`PREFETCH_LINES`], as the server's receive does.
///
/// Four lines ahead left the copy of a long frame waiting on the rest, one fetch from the
/// server's core after another. In-process flip on the Intel Xeon host of session 50 (our
/// server txonly -> our client rxonly, the client counted, B/A p20/p50/p80), eight lines /
/// four: 768 B 1.07/1.12/1.15, 1024 B 1.12/1.12/1.13, 1280 B 1.11/1.12/1.13, 1518 B
/// 1.09/1.10/1.12 (7.07 -> 7.79 Mpps; before the server asked for long frames ahead,
/// `writer::prefetch_next`: 1.01/1.02/1.03 and 1.03/1.06/1.08), 512 B 0.98/0.99/1.01 and
/// 0.99/1.02/1.03 (so not up to 512 B); twelve and sixteen lines level with eight at 1024 and
/// 1518 B (0.98-1.00 at p50); from DPDK's server (which writes without asking) 1518 B
/// 0.99/1.00/1.01, 1024 B 1.00/1.02/1.02. Two lines at 128 B (the frame's own) against four
/// were within the noise (our server 0.97/0.99/1.00 in favour of two, DPDK's 1.01/1.02/1.03
/// in favour of four): left at four.
pub(crate) const LONG_FRAME: u32 = 512;

/// How many lines of a frame's buffer the client's receive asks for ahead of its copy, for
/// frames of more than a line up to [`LONG_FRAME`].
const MID_PREFETCH_LINES: usize = 4;

/// Where the bytes of a slot are, for one kind of receive.
pub(crate) trait Source {
    /// The peer counter that bounds the window (named in a chain-past-end error).
    const END: PeerCounter;

    /// Zero copy: a frame's segments are the buffers parked in its slots ([`Source::parked`]);
    /// otherwise its bytes are copied into buffers of the pool.
    const PARKED: bool = false;

    /// A hint: start fetching the buffer of `slot` (never fails, never faults): its first
    /// `lines` lines, as far as the burst's first descriptor says (a source that reads the
    /// slot's own descriptor may go by that instead).
    fn prefetch(&self, ring: &Ring, slot: u16, lines: usize);

    /// What must hold of `d` before anything is taken for its slot (checked for every slot; a
    /// frame's first before a buffer is allocated for it).
    #[inline(always)]
    fn check(&self, _slot: u16, _d: Desc) -> Result<(), DataError> {
        Ok(())
    }

    /// Adds the segment in `slot` (its descriptor `d`, read once and checked) to the frame `m`.
    /// `keep` becomes false when the frame cannot be completed (the pool ran dry in it); with
    /// `keep` false, only validates `d` and releases the slot.
    fn add(
        &mut self,
        m: &mut Mbuf,
        slot: u16,
        d: Desc,
        keep: &mut bool,
        cache: &mut PoolCache,
    ) -> Result<(), DataError>;

    /// Zero copy: the buffer parked in `slot`, holding the `d.length` bytes the peer wrote.
    #[inline(always)]
    fn parked(&mut self, slot: u16, _d: Desc, _: &mut PoolCache) -> Result<Mbuf, DataError> {
        Err(DataError::EmptySlot { slot })
    }
}

/// Receives up to `max` whole frames from `win` into `pkts`; returns the slots consumed. On an
/// error the frames already pushed, the one it met the error in and the burst's empty buffers
/// are in `pkts` (the caller drops them).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn receive<S: Source>(
    src: &mut S,
    ring: &Ring,
    win: &Window,
    pkts: &mut Vec<Mbuf>,
    max: usize,
    cache: &mut PoolCache,
    stats: &mut QueueStats,
) -> Result<u16, DataError> {
    let avail = win.avail;
    let start = pkts.len();
    let mut used: u16 = 0;
    // Counted only if the whole burst is good: the caller discards every frame of a burst
    // that ends in a protocol violation.
    let mut bytes = 0u64;
    // Buffers the peer published are finished: pull the next `ahead` over from its core ahead of
    // the copies, so several transfers overlap (one ahead left the copy waiting on each). Short
    // frames go further ahead (a hint only: the loop reads this descriptor again and checks it).
    let first_len = if avail > 0 {
        ring.read_desc(win.slot(0)).length
    } else {
        0
    };
    let short = first_len <= SHORT_FRAME;
    let lines = lines_ahead(first_len);
    let ahead = if short {
        SHORT_PREFETCH_FRAMES
    } else {
        PREFETCH_FRAMES
    };
    let mut pf_next: u16 = 0;
    while pf_next < avail.min(ahead) {
        src.prefetch(ring, win.slot(pf_next), lines);
        pf_next += 1;
    }
    // Copy mode: a buffer for each slot the burst may take (up to `max`), allocated in one go
    // onto `pkts`, where each frame is built in the first one not yet taken (allocating per
    // frame cost 6-11% of the rate). A chain's further slots hand one each back to the cache,
    // where the copy takes its next segment from; a frame that finds none left allocates its
    // own, and the ones left over are freed at the end.
    let mut frames = 0usize;
    let mut dropped = 0usize;
    if !S::PARKED {
        cache.alloc_up_to(pkts, usize::from(avail).min(max));
    }
    while used < avail && frames + dropped < max {
        let first = used;
        let slot = win.slot(used);
        let d = ring.read_desc(slot);
        used += 1;
        // Keep `ahead` slots' buffers on their way (one more per slot taken).
        if pf_next < avail {
            src.prefetch(ring, win.slot(pf_next), lines);
            pf_next += 1;
        }
        // Copies stop at the longest frame a port takes: a longer one (a descriptor may say
        // anything up to its region's size) is walked to its end without a copy, dropped and
        // counted as an error; without the cap one burst could copy gigabytes and drain the
        // pool.
        let mut len = d.length as usize;
        let mut too_long = !S::PARKED && len > MAX_FRAME_LEN;
        let mut keep = !too_long;
        if S::PARKED {
            pkts.push(src.parked(slot, d, cache)?);
        } else {
            src.check(slot, d)?;
            // The set-aside buffers ran out (chains took theirs): one more, unless the pool ran
            // dry, when this frame and the rest wait for the next burst.
            if pkts.len() == start + frames && cache.alloc_up_to(pkts, 1) == 0 {
                stats.nombuf += 1;
                used = first;
                break;
            }
            src.add(&mut pkts[start + frames], slot, d, &mut keep, cache)?;
        }
        let mut flags = d.flags;
        while flags & DESC_FLAG_NEXT != 0 {
            if used == avail {
                // A chain must be published whole.
                return Err(chain_past_end(S::END, win.slot(first), win.end));
            }
            let slot = win.slot(used);
            let d = ring.read_desc(slot);
            used += 1;
            if pf_next < avail {
                src.prefetch(ring, win.slot(pf_next), lines);
                pf_next += 1;
            }
            if !S::PARKED && pkts.len() > start + frames + 1 {
                let spare = pkts.pop().expect("a spare buffer");
                cache.free(spare);
            }
            len = len.saturating_add(d.length as usize);
            if !S::PARKED && keep && len > MAX_FRAME_LEN {
                too_long = true;
                keep = false;
            }
            src.check(slot, d)
                .and_then(|_| src.add(&mut pkts[start + frames], slot, d, &mut keep, cache))?;
            flags = d.flags;
        }
        if keep {
            bytes += pkts[start + frames].len() as u64;
            frames += 1;
        } else {
            if too_long {
                stats.errors += 1;
            } else {
                stats.nombuf += 1; // the pool ran dry in the middle of a chain: dropped
            }
            let m = pkts.remove(start + frames);
            cache.free(m);
            // A dropped frame counts toward `max` as well: a burst takes at most `max` frames.
            dropped += 1;
        }
    }
    while pkts.len() > start + frames {
        let spare = pkts.pop().expect("a buffer no frame took");
        cache.free(spare);
    }
    stats.bytes += bytes;
    Ok(used)
}

/// How many lines of each buffer a burst whose first frame is `first_len` bytes long asks
/// for ahead of its copy (when its source does not read each slot's descriptor).
#[inline(always)]
fn lines_ahead(first_len: u32) -> usize {
    if first_len <= SHORT_FRAME {
        1
    } else if first_len > LONG_FRAME {
        PREFETCH_LINES
    } else {
        MID_PREFETCH_LINES
    }
}

#[cold]
#[inline(never)]
fn chain_past_end(counter: PeerCounter, first: u16, end: u16) -> DataError {
    DataError::ChainPastEnd {
        counter,
        first,
        end,
    }
}

/// How many of a frame's first lines the server's receive asks for ahead of its copy
/// ([`prefetch_buffer`], [`PREFETCH_FRAMES`] slots ahead), and the client's for frames longer
/// than [`LONG_FRAME`].
///
/// Eight (was four, from the AMD host's sittings). A/B in one sitting on the Intel Xeon host of
/// session 39 (`bench memif --peer both --interleave`, three alternating runs each, Mpps p50,
/// four / eight lines): our server <- our client 512 B 17.50 17.09 17.34 / 17.46 18.28 18.37,
/// 1518 B 8.69 8.91 8.68 / 9.83 9.83 9.95 (1.14 1.14 1.15 / 1.35 1.36 1.32 of DPDK's pair);
/// our server <- DPDK's client 512 B 12.40 12.54 12.79 / 12.42 13.11 13.31, 1518 B 7.68 7.11
/// 7.76 / 7.80 7.92 7.92. Frames of one line (64 B) are not changed by it.
pub(crate) const PREFETCH_LINES: usize = 8;

/// Prefetches the first [`PREFETCH_LINES`] lines of the buffer a descriptor points at.
#[inline(always)]
fn prefetch_buffer(regions: &Regions, d: Desc) {
    if let Some(r) = regions.0.get(d.region as usize) {
        let lines = (d.length as usize).div_ceil(64).min(PREFETCH_LINES);
        for line in 0..lines {
            r.prefetch(d.offset as usize + line * 64);
        }
    }
}

/// Server (copy, as always): the bytes are where the client's descriptor says, in one of the
/// regions it sent; the descriptor is checked against them.
pub(crate) struct FromRegions<'a> {
    pub regions: &'a Regions,
    /// Flush each frame's buffer lines from our caches once they are copied out, as the rx
    /// queue's `FlushTuner` chooses: the peer's next plain store to the buffer then fetches the
    /// line from memory, not from this core, which in this machine's slow state (a far core)
    /// can be most of a frame's cost; in the fast state it can cost. The static rule before
    /// (flush frames of at most 128 B from a peer that did not name itself ours) measured, in
    /// an in-process flip (our side rxonly, flushed / not, p20/p50/p80):
    ///
    /// ```text
    ///   C2S our server, DPDK's client  64 B  1.09/2.25/2.46 (slow state 6.1 -> 15.0 Mpps, fast 18.9 -> 19.9)
    ///                                 128 B  0.91/0.99/1.96 (slow state 5.8 -> 13.3 Mpps, fast 19.0 -> 18.8)
    ///       our server, our client     64 B  0.89/0.96/1.03, 128 B 0.87/0.94/1.01
    ///   S2C our client, DPDK's server  64 B  1.12/2.19/2.31 (slow state 6.0 -> 13.6, fast 19.9 -> 20.2)
    ///                                 128 B  1.92/2.07/2.17 (slow state 5.7 -> 12.0)
    ///       our client, our server     64 B  0.86/0.94/1.00
    ///   C2S our server, DPDK's client 512 B  0.46/0.48/0.97 (fast 17.2 -> 7.9), 1518 B 0.44/0.45/0.46
    /// ```
    ///
    /// and the tuner (every size, every peer) against that rule, C2S (our server rxonly):
    ///
    /// ```text
    ///   DPDK's client  64 B 0.95/1.00/1.04   512 B 1.23/1.29/1.31 (slow 5.2 -> 6.6)
    ///                1518 B 0.95/2.45/2.59 (slow 1.4 -> 3.7, fast 15.1 -> 14.4)
    ///   our client     64 B 0.91/0.99/1.02 (fast 41.2 -> 39.8)   512 B 1.10/1.38/1.47 (slow 7.5 -> 10.4)
    ///                1518 B 0.98/1.20/1.39
    /// ```
    pub flush: bool,
}

impl Source for FromRegions<'_> {
    const END: PeerCounter = PeerCounter::Head;

    #[inline(always)]
    fn prefetch(&self, ring: &Ring, slot: u16, _lines: usize) {
        // A hint only: an out-of-range offset is ignored. (The descriptor says how many lines.)
        prefetch_buffer(self.regions, ring.read_desc(slot));
    }

    #[inline(always)]
    fn add(
        &mut self,
        m: &mut Mbuf,
        slot: u16,
        d: Desc,
        keep: &mut bool,
        cache: &mut PoolCache,
    ) -> Result<(), DataError> {
        let Some(src) = self.regions.window(&d) else {
            return Err(outside_region(slot, d));
        };
        // A frame larger than one of our buffers continues in chained segments.
        *keep = *keep && m.extend_from(&src, cache);
        if self.flush && *keep {
            src.flush_lines();
        }
        Ok(())
    }
}

#[cold]
#[inline(never)]
pub(crate) fn outside_region(slot: u16, d: Desc) -> DataError {
    DataError::OutsideRegion {
        slot,
        region: d.region,
        offset: d.offset,
        length: d.length,
    }
}

/// Client, copy mode: the bytes are in the slot's buffer of our own layout in region 0; only the
/// descriptor's length is taken from the ring (its region and offset are ignored).
pub(crate) struct FromLayout<'a> {
    pub region: &'a Region,
    /// Where slot 0's buffer starts, and the buffer size.
    pub base: usize,
    pub bsize: u32,
    pub mask: u16,
    /// Flush each frame's buffer lines once copied out (see [`FromRegions::flush`]).
    pub flush: bool,
}

impl<'a> FromLayout<'a> {
    #[inline(always)]
    fn offset(&self, slot: u16) -> usize {
        self.base + (slot & self.mask) as usize * self.bsize as usize
    }

    /// The bytes of `slot`: `d.length` of them (checked: at most `bsize`) from the slot's own
    /// buffer.
    #[inline(always)]
    fn bytes(&self, slot: u16, d: Desc) -> VolatileSlice<'a> {
        self.region
            .slice(self.offset(slot), d.length as usize)
            .expect("our own layout: region 0 holds every slot's buffer")
    }
}

impl Source for FromLayout<'_> {
    const END: PeerCounter = PeerCounter::Tail;

    #[inline(always)]
    fn prefetch(&self, _: &Ring, slot: u16, lines: usize) {
        let at = self.offset(slot);
        for line in 0..lines {
            self.region.prefetch(at + line * 64);
        }
    }

    #[inline(always)]
    fn check(&self, slot: u16, d: Desc) -> Result<(), DataError> {
        if d.length > self.bsize {
            return Err(too_long(slot, d.length, self.bsize));
        }
        Ok(())
    }

    #[inline(always)]
    fn add(
        &mut self,
        m: &mut Mbuf,
        slot: u16,
        d: Desc,
        keep: &mut bool,
        cache: &mut PoolCache,
    ) -> Result<(), DataError> {
        let bytes = self.bytes(slot, d);
        *keep = *keep && m.extend_from(&bytes, cache);
        if self.flush && *keep {
            bytes.flush_lines();
        }
        Ok(())
    }
}

#[cold]
#[inline(never)]
fn too_long(slot: u16, length: u32, capacity: u32) -> DataError {
    DataError::TooLong {
        slot,
        length,
        capacity,
    }
}

/// Client, zero copy: the server wrote straight into the pool buffer we parked in the slot; it
/// goes up without a copy, and a chain's buffers become the packet's segments.
pub(crate) struct FromParked<'a> {
    pub parked: &'a mut [Option<Mbuf>],
    pub mask: u16,
}

impl Source for FromParked<'_> {
    const END: PeerCounter = PeerCounter::Tail;
    const PARKED: bool = true;

    #[inline(always)]
    fn prefetch(&self, _: &Ring, _: u16, _: usize) {}

    #[inline(always)]
    fn parked(&mut self, slot: u16, d: Desc, cache: &mut PoolCache) -> Result<Mbuf, DataError> {
        self.buffer(slot, d, cache)
    }

    #[inline(always)]
    fn add(
        &mut self,
        m: &mut Mbuf,
        slot: u16,
        d: Desc,
        keep: &mut bool,
        cache: &mut PoolCache,
    ) -> Result<(), DataError> {
        let seg = self.buffer(slot, d, cache)?;
        // A chain in zero copy: the buffers become the packet's segments.
        if !*keep {
            cache.free(seg);
        } else if let Err(seg) = m.chain(seg) {
            *keep = false;
            cache.free(seg);
        }
        Ok(())
    }
}

impl FromParked<'_> {
    /// The buffer parked in `slot`, holding the `d.length` bytes the server wrote into it.
    #[inline(always)]
    fn buffer(&mut self, slot: u16, d: Desc, cache: &mut PoolCache) -> Result<Mbuf, DataError> {
        let Some(mut m) = self
            .parked
            .get_mut((slot & self.mask) as usize)
            .and_then(Option::take)
        else {
            return Err(DataError::EmptySlot { slot });
        };
        if !m.set_len(d.length as usize) {
            let capacity = m.capacity() as u32;
            cache.free(m);
            return Err(too_long(slot, d.length, capacity));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One line of a one-line frame, four of a frame up to 512 B, eight of a longer one.
    #[test]
    fn longer_frames_are_asked_for_further() {
        let asked: Vec<usize> = [0, 60, 64, 65, 128, 512, 513, 1024, 1518, 9000]
            .map(lines_ahead)
            .to_vec();
        assert_eq!(asked, [1, 1, 1, 4, 4, 4, 8, 8, 8, 8]);
    }
}
