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

/// How the transmit asks for a destination line ahead of its copy ([`prefetch_burst`],
/// [`prefetch_next`]). Which moves more frames depends on how the peer receives, so each tx
/// queue's [`AheadTuner`](memnic_ethdev::ahead::AheadTuner) chooses (`tx-ahead-shared`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ahead {
    /// In exclusive state (`prefetchw`): the line leaves the peer's cache at once, and the
    /// store finds it ours.
    Exclusive,
    /// In shared state (`prefetcht0`): the peer keeps its copy until the store takes it.
    Shared,
}

impl Ahead {
    /// The longest frame a server asks for one frame ahead ([`prefetch_next`]): in exclusive
    /// state every frame, in shared state up to 512 B (see [`prefetch_next`] for both).
    #[inline(always)]
    fn server_next_frame_max(self) -> usize {
        match self {
            Ahead::Exclusive => usize::MAX,
            Ahead::Shared => SERVER_SHARED_NEXT_MAX,
        }
    }

    #[inline(always)]
    fn ask(self, region: &Region, offset: usize) {
        match self {
            Ahead::Exclusive => region.prefetch_write(offset),
            Ahead::Shared => region.prefetch(offset),
        }
    }
}

/// The buffer behind a slot, for one kind of transmit.
pub(crate) trait Dest<'a> {
    /// Where `slot`'s bytes go: its whole buffer (its length is the capacity).
    fn buffer(&self, slot: u16) -> Result<VolatileSlice<'a>, DataError>;
    /// Records that `slot` holds `len` bytes, with `flags` (NEXT or 0).
    fn finish(&self, slot: u16, len: u32, flags: u16);
    /// The lines a frame of `len` bytes fills in its first slot, and the slots it takes (as far
    /// as this side knows before it reads the descriptors).
    fn extent(&self, len: usize) -> (usize, usize);
    /// A hint: asks for the lines a frame of `len` bytes fills in `slot`'s buffer (its first
    /// slot's) the way the transmit chose ([`Ahead`]); never fails, never faults.
    fn prefetch_frame(&self, slot: u16, len: usize);
    /// The longest frame whose buffer is asked for one frame ahead ([`prefetch_next`]).
    fn next_frame_max(&self) -> usize;
}

/// How many lines of a burst's first destination buffers are asked for before its copy
/// starts ([`prefetch_burst`]; figures below in exclusive state, [`Ahead::Exclusive`]).
///
/// The peer read each buffer last, so each line comes back from its core; a store that waits
/// for its line holds every later store behind it, so the copy alone keeps about one fetch in
/// flight (perf of our client at 64 B, this AMD EPYC's slow state: 81% of its time in
/// `tx_burst`, 63% of that on one store, the store buffer full). Asked for together, the
/// fetches overlap. A/B in one sitting (in-process flip of ~250-ms windows, txonly -> rxonly,
/// ratio up front / as before, p20/p50/p80):
///
/// ```text
///           our client -> our server      -> DPDK's server
///   64 B    1.10/1.18/1.26                1.13/1.19/1.25
///  128 B    0.95/1.11/1.35                1.04/1.22/1.33
///  256 B    1.01/1.09/1.13                0.94/1.01/1.13
///  512 B    0.93/1.02/1.10                0.90/1.00/1.12   (two frames up front: not kept)
///           our server -> our client      -> DPDK's client
///   64 B    1.03/1.07/1.14                0.94/1.05/1.17
///  128 B    1.04/1.07/1.11                1.02/1.07/1.11
///  256 B    0.99/1.02/1.05                0.96/1.03/1.10
///  512 B    0.89/0.98/1.05                0.94/0.99/1.06   (two frames up front: not kept)
/// ```
///
/// Confirmed on the final code at 64 B: client 0.96/1.14/1.22 (our server) and 1.03/1.16/1.32
/// (DPDK's), server 0.99/1.04/1.11 (our client) and 0.91/1.04/1.12 (DPDK's); 1518 B, which
/// is not asked for up front, 0.86/1.00/1.12 and 0.94/0.99/1.09.
///
/// Lost (client): 32 lines (64 B 1.20/1.21 at p50, but 128 B 0.85/0.95, 256 B 0.94/0.99); a
/// window kept 16 frames ahead as the copy went (64 B 1.14 over 8 frames ahead, which was
/// 1.15/1.13 over the next frame only; 32 ahead over 16 1.03/1.04), whose bookkeeping per frame
/// cost 1518 B 0.84-0.96.
pub(crate) const WRITE_AHEAD_LINES: usize = 16;

/// The fewest frames asked for up front (frames of up to 256 bytes): with fewer, the copy
/// goes as before (see [`WRITE_AHEAD_LINES`] for 512 B).
const WRITE_AHEAD_MIN_FRAMES: usize = 4;

/// Asks for the destination buffers of the burst's first frames (`pkts`, from slot `at`, with
/// `room` slots the peer handed over) the way `dst` asks ([`Ahead`]): as many whole frames as fit in
/// [`WRITE_AHEAD_LINES`] lines and the room, when at least [`WRITE_AHEAD_MIN_FRAMES`] do.
/// Returns how many frames need nothing more from [`prefetch_next`]: those asked for, or the
/// whole burst when every frame streams (streaming stores fetch no line, so there is nothing
/// to ask for, up front or a frame ahead). Only slots within the room are touched.
///
/// A burst of streamed frames answered at once, before the planning loop and the per-frame
/// look ahead, in-process flip (our client txonly -> our server rxonly, 2-s blocks, B/A
/// p20/p50/p80, fast state): 64 B 1.00/1.02/1.02 (four runs of 40 s, n=33, each run
/// 1.01-1.03 at p50); 512 B (unchanged but for one look per burst) 0.96/0.99/1.00 (n=12),
/// slow state 0.99/1.00/1.04. Skipping both steps outright (an upper bound, not a rule) was
/// 1.04/1.06/1.08.
#[inline(always)]
pub(crate) fn prefetch_burst<'a>(
    dst: &impl Dest<'a>,
    pkts: &[Mbuf],
    at: u16,
    room: u16,
    stream_max: usize,
) -> usize {
    if pkts.iter().all(|m| streams(m, stream_max)) {
        return pkts.len();
    }
    // Each frame takes a line at least, so the budget bounds the frames too.
    let mut first_slot = [0u16; WRITE_AHEAD_LINES];
    let (mut lines, mut slots, mut frames) = (0, 0, 0);
    for m in pkts {
        let (l, s) = dst.extent(m.len());
        if lines + l > WRITE_AHEAD_LINES || slots + s > usize::from(room) {
            break;
        }
        first_slot[frames] = slots as u16;
        lines += l;
        slots += s;
        frames += 1;
    }
    if frames < WRITE_AHEAD_MIN_FRAMES {
        return 0;
    }
    for (m, &k) in pkts.iter().zip(&first_slot[..frames]) {
        if !streams(m, stream_max) {
            dst.prefetch_frame(at.wrapping_add(k), m.len());
        }
    }
    frames
}

/// While `pkts[sent]` is copied, asks for the next frame's buffer (its first slot at `next`,
/// which `fits` in the room) the way `dst` asks ([`Ahead`]): for frames past the `asked` that
/// [`prefetch_burst`] took care of, up to `dst.next_frame_max()` bytes. Each store of the copy
/// otherwise waits for its line to come back from the peer's core, one after another.
///
/// The limit differs by role. The client's writes into its own layout (C2S) are asked for at
/// every size: without them above 512 B, 1024 B 0.67/0.65 and 1518 B 0.73/0.56 at p50 (our
/// server/DPDK's). The server's into the client's buffers (S2C) are asked for at every size in
/// exclusive state and up to [`SERVER_SHARED_NEXT_MAX`] in shared state
/// (`Ahead::server_next_frame_max`). On the AMD EPYC host of the early sessions, asked for in
/// exclusive state (in-process flip, ratio with / without, p20/p50/p80), they won up to 512 B
/// and lost above,
///
/// ```text
///           our server -> our client      -> DPDK's client
///  128 B    1.02/1.07/1.13                1.06/1.13/1.19
///  256 B    1.27/1.41/1.49                1.09/1.20/1.37
///  512 B    1.67/1.79/1.85                1.70/1.76/1.83
/// 1024 B    0.82/0.93/1.30                1.25/1.36/1.65   (8 lines of it: 0.98 and 0.97)
/// 1518 B    0.84/0.89/0.96                0.87/0.95/1.03   (8 lines of it: 0.93 and 1.20)
/// ```
///
/// so the server stopped at 512 B in exclusive state and asked for every frame in shared state
/// (the Intel Xeon host of session 45, 1518 B, asked ahead / not: shared into DPDK's client
/// 1.19/1.20/1.28, into ours 0.95/1.04/1.16; exclusive 0.96/1.00/1.06 and 0.99/1.04/1.08).
/// On the Intel Xeon host of session 50 the long frames went the other way: in exclusive state
/// they won into our client (flip, our server txonly counted, every size / up to 512 B) 768 B
/// 1.33/1.36/1.47, 1024 B 1.19/1.23/1.24, 1518 B 1.16/1.19/1.21 (6.10 -> 7.23 Mpps), with the
/// client's eight lines ahead ([`crate::chain::LONG_FRAME`]) 1024 B 1.31/1.33/1.38 and 1518 B
/// 1.19/1.21/1.23, and were level into DPDK's client (whole 10-s runs alternating, 1518 B,
/// Mpps of 1-s windows: 5.42-5.80 against 5.05-5.99), while shared asks of 1518-B frames
/// halved the rate into both (DPDK's client 2.65-3.12 against 5.11-6.20; ours, session 49,
/// 2.94 and 3.23 against 6.33 and 6.67). So the tuner's two ways are the two that can win on
/// either host: ownership at every size, a copy up to 512 B (where it won into DPDK's receive
/// by 1.10-1.18, `memnic_ethdev::ahead`) and nothing beyond.
#[inline(always)]
pub(crate) fn prefetch_next<'a, D: Dest<'a>>(
    dst: &D,
    pkts: &[Mbuf],
    (sent, asked): (usize, usize),
    next: u16,
    fits: bool,
    stream_max: usize,
) {
    if sent + 1 < asked || !fits {
        return;
    }
    if let Some(m) = pkts
        .get(sent + 1)
        .filter(|m| m.len() <= dst.next_frame_max() && !streams(m, stream_max))
    {
        dst.prefetch_frame(next, m.len());
    }
}

/// The longest frame a server asks for one frame ahead in shared state ([`prefetch_next`]).
const SERVER_SHARED_NEXT_MAX: usize = 512;

/// Slots past a burst whose buffers [`prefetch_following`] asks for: eight.
const FOLLOWING_SLOTS: u16 = 8;

/// After a burst is published, asks for the first line of the next [`FOLLOWING_SLOTS`] slots'
/// buffers (from `at`, within the `room` this side knows of) the way `dst` asks ([`Ahead`]),
/// so that their fetches from the peer's core run while the caller builds its next burst,
/// not only once that burst's copy starts ([`prefetch_burst`] asks for them again, and finds
/// them here). For a burst that wrote with plain stores only: a streamed one fetches nothing.
///
/// perf of our client txonly at 64 B (the Intel Xeon host of session 49): the C2S ring was
/// empty at nearly every look (the server keeps up: the sender is the pair's bound), and 40%
/// of the client's samples waited in `tx_burst` on its stores' lines (the prefetches of the
/// write-ahead stalled on full fill buffers, and the fence before the call check on the store
/// buffer). In-process flip (250-ms windows, our client txonly -> our server rxonly, the client
/// counted, B/A p20/p50/p80, asked / not), 64 B:
///
/// ```text
///   plain stores (tx-stream=off)  8 slots  1.08/1.09/1.11  1.05/1.07/1.08
///                                 4 slots  1.01/1.03/1.06   12 slots 1.06/1.07/1.10
///                                16 slots  1.03/1.05/1.07  1.05/1.06/1.08
///                                24 slots  1.00/1.01/1.02   32 slots 1.03/1.04/1.05
///   tuned (tx-stream=auto)        8 slots  1.08/1.09/1.14  1.06/1.07/1.10
/// ```
///
/// and level at 128 B 1.00/1.02/1.03, 256 B 0.99/1.01/1.04, 512 B 1.00/1.01/1.03, 1518 B
/// 0.99/1.00/1.03, and into DPDK's server at 64 B (its receive is that pair's bound)
/// 0.98/1.00/1.01 tuned, 1.00/1.01/1.02 plain. The rule as it stands, flipped the same way:
/// 64 B 1.08/1.11/1.12, 256 B 0.99/1.01/1.04, 1518 B 1.00/1.01/1.03; into DPDK's server 64 B
/// 0.97/1.00/1.01, 1518 B 0.99/1.01/1.02. The server's transmit (S2C) asking the same way
/// was level (our server -> our client, the server counted: 64 B 1.00/1.01/1.02 and
/// 1.00/1.01/1.03, 256 B 1.00/1.01/1.03, 1518 B 1.02/1.03/1.04): not done there.
#[inline(always)]
pub(crate) fn prefetch_following<'a>(dst: &impl Dest<'a>, at: u16, room: u16) {
    for k in 0..FOLLOWING_SLOTS.min(room) {
        dst.prefetch_frame(at.wrapping_add(k), 1);
    }
}

/// The longest frame written with streaming stores (`VolatileSlice::write_streaming`) while the
/// queue's [`StreamTuner`](memnic_ethdev::stream::StreamTuner) streams (`tx-stream`); the
/// caller fences them (`memnic_shm::store_fence`) before it publishes its counter.
///
/// The peer read each buffer last (it copied the frame out), so a plain store waits for the
/// line to come back from its core; streamed, the store waits for nothing and the reader's miss
/// goes to memory. Which is faster depends on the host and the peer, so each queue tries both.
/// On the AMD EPYC host of the early sessions the plain store's wait was most of a small
/// frame's cost in its slow state. A/B in one sitting there (in-process flip of ~250-ms
/// windows, txonly -> rxonly, streamed/plain p20/p50/p80):
///
/// ```text
///   C2S, our client -> our server      64 B  1.21/2.86/2.99 (slow state 8.9 -> 26.3 Mpps)
///        our client -> DPDK's server   64 B  0.96/1.04/2.87 (slow state 8.3 -> 23.1)
///        our client -> our server     128 B  1.59/1.65/1.69 (8.3 -> 13.8)
///                                     256 B  0.91/0.93/0.96 (memory bandwidth: not streamed)
///   S2C, our server -> our client      64 B  1.32/1.57/2.64 (slow state 6.9 -> 18.1)
/// ```
///
/// On the Intel Xeon host of session 38 (one state) streaming lost: our client into DPDK's
/// server at 64 B 18.2-18.8 Mpps streamed, 26.2-27.1 plain (DPDK's receive copies without
/// prefetching, and 68% of its samples waited on the first load of a streamed frame); into
/// our server 32.4-33.2 streamed, 33.8-36.2 plain.
pub(crate) const STREAM_MAX: usize = 128;

/// Whether [`write_frame`] writes `m` with streaming stores (frames up to `stream_max` bytes:
/// [`STREAM_MAX`] while the queue streams, else 0), which fetch no line first: asking for its
/// buffer ahead ([`prefetch_burst`], [`prefetch_next`]) only pulls the lines over from the peer
/// for nothing. A/B (in-process flip, not asked/asked p20/p50/p80):
///
/// ```text
///   C2S our client -> our server     64 B  1.03/1.12/1.27    128 B 1.78/1.92/2.01
///       our client -> DPDK's server  64 B  0.99/1.04/1.10    128 B 1.01/1.17/1.41
///   S2C our server -> our client     64 B  0.97/1.07/1.15    128 B 1.54/1.72/1.81
/// ```
#[inline(always)]
fn streams(m: &Mbuf, stream_max: usize) -> bool {
    streamed_bytes(m, stream_max).is_some()
}

/// The bytes [`write_frame`] writes with streaming stores: a one-segment frame of private
/// memory, up to `stream_max` bytes (none when it is 0).
#[inline(always)]
fn streamed_bytes(m: &Mbuf, stream_max: usize) -> Option<&[u8]> {
    m.frame_slice()
        .filter(|s| stream_max > 0 && s.len() <= stream_max)
}

/// How a burst writes its short frames, as the queue's tuners chose, and how many it wrote
/// each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShortWrites {
    /// Frames of up to this many bytes go with streaming stores ([`STREAM_MAX`] while the
    /// queue streams, else 0).
    pub stream_max: usize,
    /// The first this many bytes of each frame written with plain stores are demoted to the
    /// shared cache once written (`memnic_ethdev::demote::DEMOTE_BYTES` while the queue
    /// demotes, else 0).
    pub demote_bytes: usize,
    /// Frames written with streaming stores (the caller fences before it publishes them).
    pub streamed: u32,
    /// Frames demoted (their first `demote_bytes`).
    pub demoted: u32,
}

/// Writes `m` into the slots `at, at + 1, …`, using at most `room` of them. Returns how many it
/// used, or None when `room` is too few (the slots written are not published). Writes a frame
/// of up to `short.stream_max` bytes with streaming stores, demotes the first
/// `short.demote_bytes` of one written with plain stores, and counts either in `short`.
#[inline(always)]
pub(crate) fn write_frame<'a>(
    dst: &impl Dest<'a>,
    m: &Mbuf,
    (at, room): (u16, u16),
    short: &mut ShortWrites,
) -> Result<Option<u16>, DataError> {
    let len = m.len();
    if let Some(src) = streamed_bytes(m, short.stream_max).filter(|_| room > 0) {
        let buf = dst.buffer(at)?;
        if buf.len() >= len {
            buf.write_streaming(0, src).expect("len <= buffer length");
            dst.finish(at, len as u32, 0);
            short.streamed += 1;
            return Ok(Some(1));
        }
    }
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
        let piece = buf.subslice(0, k).expect("k <= buffer length");
        m.copy_out_to(done, &piece);
        if done < short.demote_bytes {
            let first = k.min(short.demote_bytes - done);
            piece.subslice(0, first).expect("first <= k").demote_lines();
        }
        done += k;
        slots += 1;
        let flags = if done < len { DESC_FLAG_NEXT } else { 0 };
        dst.finish(slot, k as u32, flags);
        if flags == 0 {
            short.demoted += u32::from(short.demote_bytes > 0);
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
    /// How the buffers' lines are asked for ahead of the copy.
    pub ahead: Ahead,
}

impl ToLayout<'_> {
    #[inline(always)]
    pub fn offset(&self, slot: u16) -> usize {
        self.base + (slot & self.ring.mask()) as usize * self.bsize as usize
    }

    /// Slots a frame of `len` bytes needs (a zero-length frame still takes one).
    #[inline(always)]
    pub fn slots_for(&self, len: usize) -> usize {
        // No division for the common frame that fits one buffer (a `div` per frame showed in
        // perf of the client's tx at 64 B).
        if len <= self.bsize as usize {
            return 1;
        }
        len.div_ceil(self.bsize as usize)
    }

    /// The lines a frame of `len` bytes fills in its first slot.
    #[inline(always)]
    fn first_lines(&self, len: usize) -> usize {
        len.min(self.bsize as usize).div_ceil(64).max(1)
    }
}

impl<'a> Dest<'a> for ToLayout<'a> {
    #[inline(always)]
    fn next_frame_max(&self) -> usize {
        usize::MAX
    }

    #[inline(always)]
    fn buffer(&self, slot: u16) -> Result<VolatileSlice<'a>, DataError> {
        Ok(self
            .region
            .slice(self.offset(slot), self.bsize as usize)
            .expect("our own layout: region 0 holds every slot's buffer"))
    }

    #[inline(always)]
    fn extent(&self, len: usize) -> (usize, usize) {
        (self.first_lines(len), self.slots_for(len))
    }

    #[inline(always)]
    fn prefetch_frame(&self, slot: u16, len: usize) {
        let at = self.offset(slot);
        for line in 0..self.first_lines(len) {
            self.ahead.ask(self.region, at + line * 64);
        }
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
    /// How the buffers' lines are asked for ahead of the copy.
    pub ahead: Ahead,
}

impl<'a> Dest<'a> for ToDescriptors<'a> {
    #[inline(always)]
    fn next_frame_max(&self) -> usize {
        self.ahead.server_next_frame_max()
    }

    #[inline(always)]
    fn buffer(&self, slot: u16) -> Result<VolatileSlice<'a>, DataError> {
        let d = self.ring.read_desc(slot);
        self.regions
            .window(&d)
            .ok_or_else(|| outside_region(slot, d))
    }

    /// One slot a frame: the buffers' sizes are in descriptors not read yet (a frame that
    /// takes more only makes the hint land on a later slot of the window).
    #[inline(always)]
    fn extent(&self, len: usize) -> (usize, usize) {
        (len.div_ceil(64).max(1), 1)
    }

    /// The descriptor is read (copied) for the hint only; `buffer` reads and checks it again.
    #[inline(always)]
    fn prefetch_frame(&self, slot: u16, len: usize) {
        let d = self.ring.read_desc(slot);
        if let Some(r) = self.regions.0.get(usize::from(d.region)) {
            let lines = len.min(d.length as usize).div_ceil(64);
            for line in 0..lines {
                self.ahead.ask(r, d.offset as usize + line * 64);
            }
        }
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

    fn burst(pool: &memnic_ethdev::Mempool, lens: &[usize]) -> Vec<Mbuf> {
        lens.iter()
            .map(|&l| {
                let mut m = pool.alloc().unwrap();
                m.append(l).unwrap();
                m
            })
            .collect()
    }

    /// How many of a burst's first frames are asked for up front: whole frames within the line
    /// budget and the room, and none when fewer than four fit (512-B and 1518-B bursts keep
    /// the next-frame-only path).
    #[test]
    fn a_burst_asks_for_whole_frames_within_the_line_budget_and_the_room() {
        let region = Region::private(1 << 22, false).unwrap();
        let ring = Ring::new(Arc::new(Region::private(1 << 16, false).unwrap()), 0, 10).unwrap();
        let to = ToLayout {
            ring: &ring,
            region: &region,
            base: 0,
            bsize: 2048,
            ahead: Ahead::Exclusive,
        };
        let pool = memnic_test_support::pool("write-ahead", 64, 9000);
        let asked = |lens: &[usize], free: u16| {
            prefetch_burst(&to, &burst(&pool, lens), 1020, free, STREAM_MAX)
        };
        // Frames past STREAM_MAX (shorter ones stream and are never asked for).
        let budget = WRITE_AHEAD_LINES;
        assert_eq!(asked(&[192; 32], 1024), budget / 3, "three lines a frame");
        assert_eq!(asked(&[192; 4], 1024), 4, "the burst's frames");
        assert_eq!(asked(&[192; 3], 1024), 0, "three frames: none");
        assert_eq!(asked(&[256; 32], 1024), budget / 4, "four lines a frame");
        assert_eq!(asked(&[192; 32], 4), 4, "the room");
        assert_eq!(asked(&[192; 32], 3), 0, "room for three: none");
        assert_eq!(asked(&[512; 32], 1024), 0, "two frames fit: none");
        assert_eq!(asked(&[1518; 32], 1024), 0, "one frame fits: none");
        assert_eq!(
            asked(&[192, 192, 192, 192, 4000], 1024),
            4,
            "a long frame's first slot is 32 lines: the ones before it"
        );
        assert_eq!(
            asked(&[64, 64, 64, 192, 64], 1024),
            5,
            "streamed frames count a line each in a burst that has others"
        );
        assert_eq!(
            asked(&[64; 32], 3),
            32,
            "frames that all stream: the whole burst"
        );

        // Buffers of 256 bytes: a 600-B frame takes three slots, and four lines of the first.
        let small = ToLayout { bsize: 256, ..to };
        let asked = |lens: &[usize], free: u16| {
            prefetch_burst(&small, &burst(&pool, lens), 0, free, STREAM_MAX)
        };
        assert_eq!(
            asked(&[64, 600, 64, 64, 64], 6),
            4,
            "slots counted per frame"
        );
        assert_eq!(
            asked(&[64, 600, 64, 64, 64], 5),
            0,
            "the room ends at the fourth frame"
        );
    }

    /// Records the frames it is asked to prefetch; nothing else is used.
    struct Asked<const MAX: usize>(std::cell::RefCell<Vec<(u16, usize)>>);

    impl<'a, const MAX: usize> Dest<'a> for Asked<MAX> {
        fn next_frame_max(&self) -> usize {
            MAX
        }
        fn buffer(&self, _: u16) -> Result<VolatileSlice<'a>, DataError> {
            unreachable!("only hints are asked for")
        }
        fn finish(&self, _: u16, _: u32, _: u16) {}
        fn extent(&self, len: usize) -> (usize, usize) {
            (len.div_ceil(64), 1)
        }
        fn prefetch_frame(&self, slot: u16, len: usize) {
            self.0.borrow_mut().push((slot, len));
        }
    }

    /// After a burst, the first line of the next eight slots is asked for, from the slot the
    /// burst stopped at, round the ring's end, and never past the room this side knows of.
    #[test]
    fn the_slots_after_a_burst_are_asked_for_within_the_room() {
        let asked = |at: u16, room: u16| {
            let d = Asked::<512>(Default::default());
            prefetch_following(&d, at, room);
            d.0.into_inner()
        };
        let slots = |v: Vec<(u16, usize)>| {
            assert!(v.iter().all(|&(_, len)| len == 1), "one line each: {v:?}");
            v.into_iter().map(|(s, _)| s).collect::<Vec<_>>()
        };
        assert_eq!(slots(asked(100, 1024)), (100..108).collect::<Vec<_>>());
        assert_eq!(slots(asked(100, 3)), [100, 101, 102], "the room");
        assert_eq!(slots(asked(100, 0)), [0u16; 0], "a full ring: none");
        assert_eq!(
            slots(asked(u16::MAX - 1, 1024)),
            [u16::MAX - 1, u16::MAX, 0, 1, 2, 3, 4, 5],
            "counters wrap"
        );
    }

    /// The next frame is asked for while one is copied: not one the burst asked for already,
    /// not past the room or the burst, and on the server's side in exclusive state not above
    /// 512 bytes.
    #[test]
    fn the_next_frame_is_asked_for_within_the_room_and_the_role_s_limit() {
        let pool = memnic_test_support::pool("write-next", 64, 9000);
        let pkts = burst(&pool, &[64, 64, 512, 1518, 64]);
        let run = |d: &dyn Fn(usize, usize, u16, bool)| {
            for sent in 0..pkts.len() {
                d(sent, 2, 100 + sent as u16 + 1, sent != 3);
            }
        };
        let client = Asked::<{ usize::MAX }>(Default::default());
        run(&|sent, asked, next, fits| {
            prefetch_next(&client, &pkts, (sent, asked), next, fits, STREAM_MAX)
        });
        // Sent 0: frame 1 was asked for with the burst; sent 3: no room for frame 4; sent 4:
        // the burst's last.
        assert_eq!(client.0.take(), [(102, 512), (103, 1518)]);
        let server = Asked::<512>(Default::default());
        run(&|sent, asked, next, fits| {
            prefetch_next(&server, &pkts, (sent, asked), next, fits, STREAM_MAX)
        });
        assert_eq!(
            server.0.take(),
            [(102, 512)],
            "1518 B is past the server's limit"
        );
        // The server's limit holds in shared state only.
        assert_eq!(
            (
                Ahead::Exclusive.server_next_frame_max(),
                Ahead::Shared.server_next_frame_max()
            ),
            (usize::MAX, 512)
        );
    }

    /// Frames written with streaming stores (one segment, up to `STREAM_MAX` while the queue
    /// streams) are asked for neither with the burst nor one ahead; longer ones and a chained
    /// one of the same length are, and every frame is while the queue writes plain.
    #[test]
    fn streamed_frames_are_not_asked_for() {
        let pool = memnic_test_support::pool("write-streamed", 64, 9000);
        let mut pkts = burst(&pool, &[64, STREAM_MAX, STREAM_MAX + 1, 32]);
        let mut tail = pool.alloc().unwrap();
        tail.append(32).unwrap();
        assert!(pkts[3].chain(tail).is_ok());
        let d = Asked::<{ usize::MAX }>(Default::default());
        assert_eq!(prefetch_burst(&d, &pkts, 10, 100, STREAM_MAX), 4);
        assert_eq!(d.0.take(), [(12, STREAM_MAX + 1), (13, 64)]);
        for sent in 0..pkts.len() {
            prefetch_next(
                &d,
                &pkts,
                (sent, 0),
                100 + sent as u16 + 1,
                true,
                STREAM_MAX,
            );
        }
        assert_eq!(d.0.take(), [(102, STREAM_MAX + 1), (103, 64)]);

        // A burst whose frames all stream: nothing is asked for, and the answer (the whole
        // burst) leaves nothing for the look ahead either.
        let small = burst(&pool, &[64, STREAM_MAX, 60]);
        let asked = prefetch_burst(&d, &small, 10, 100, STREAM_MAX);
        assert_eq!(asked, 3);
        for sent in 0..small.len() {
            prefetch_next(
                &d,
                &small,
                (sent, asked),
                100 + sent as u16 + 1,
                true,
                STREAM_MAX,
            );
        }
        assert_eq!(d.0.take(), []);

        // While the queue writes with plain stores (`stream_max` 0), short frames are asked
        // for as any other: up front and one ahead.
        assert_eq!(prefetch_burst(&d, &pkts, 10, 100, 0), 4);
        assert_eq!(
            d.0.take(),
            [(10, 64), (11, STREAM_MAX), (12, STREAM_MAX + 1), (13, 64)]
        );
        let asked = prefetch_burst(&d, &small, 10, 100, 0);
        assert_eq!(
            (asked, d.0.take()),
            (0, vec![]),
            "three frames: none up front"
        );
        for sent in 0..small.len() {
            prefetch_next(&d, &small, (sent, asked), 100 + sent as u16 + 1, true, 0);
        }
        assert_eq!(d.0.take(), [(101, STREAM_MAX), (102, 60)]);
    }

    /// The server's side: one slot a frame as far as it knows (the client's buffer sizes are in
    /// descriptors it reads only for the hint), bounded by the window of slots it was handed.
    #[test]
    fn a_server_burst_asks_for_frames_within_the_window() {
        let ring = Ring::new(Arc::new(Region::private(1 << 16, false).unwrap()), 0, 10).unwrap();
        let regions = Regions(vec![Arc::new(Region::private(1 << 22, false).unwrap())]);
        let to = ToDescriptors {
            ring: &ring,
            regions: &regions,
            ahead: Ahead::Exclusive,
        };
        let pool = memnic_test_support::pool("write-ahead-server", 64, 9000);
        let asked = |lens: &[usize], room: u16| {
            prefetch_burst(&to, &burst(&pool, lens), 1020, room, STREAM_MAX)
        };
        // 192 B: three lines each, five frames within the sixteen lines.
        assert_eq!(asked(&[192; 32], 1024), WRITE_AHEAD_LINES / 3);
        assert_eq!(asked(&[192; 32], 4), 4, "the window");
        assert_eq!(asked(&[256; 32], 1024), WRITE_AHEAD_LINES / 4);
        assert_eq!(asked(&[1518; 32], 1024), 0);
        // Frames that all stream need nothing, up front or ahead: the whole burst.
        assert_eq!(asked(&[64; 32], 6), 32);
    }
}
