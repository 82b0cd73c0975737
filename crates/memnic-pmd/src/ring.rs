//! Burst loops over one MEMNIC ring, shared by the host and the guest (`memnic` variant).
//!
//! Everything read from the ring is untrusted: `status` is only ever compared with FILLED/FREE,
//! `len` is read once, checked against the private frame size and the buffer, then used.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use memnic_ethdev::flush::FlushTuner;
use memnic_ethdev::holdoff::Holdoff;
use memnic_ethdev::stream::StreamTuner;
use memnic_ethdev::{Mbuf, PoolCache, QueueStats, MAX_BURST};
use memnic_shm::Region;

use crate::layout::{next, slot_off, Dir, MAX_JUMBO_FRAME_LEN, NR_PACKET, SLOT_DATA, SLOT_LEN};
use crate::slot;

/// What a producer does with a frame longer than the agreed frame size.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Oversize {
    /// Stop the burst and leave it with the caller (the guest PMD).
    Stop,
    /// Drop and count it (the host).
    Drop,
}

/// How long a receiver leaves its ring alone after a poll that found it empty, when the poll
/// before took a run of frames (the sender is streaming), unless the port's `rx_holdoff_ns`
/// devarg says otherwise ([`memnic_ethdev::holdoff`]).
///
/// The next slot a caught-up receiver polls is the one the sender is writing: each poll takes
/// the slot's first line (status, length and the frame's first bytes) away from the sender in
/// the middle of its stores, and the sender waits to take it back, once for the frame and again
/// for the status. A receiver that looks again only after a few microseconds lets the sender
/// write a run of slots undisturbed and then takes the whole run. The price is latency for a
/// frame that arrives in those microseconds; a frame that comes alone (a request, a ping) is
/// followed by no hold-off: in-process ping-pong of 64-B frames host <-> guest, round trip
/// p50/p99 1.96/2.60 us without hold-off, 6.23/12.24 us holding off after every empty poll,
/// 1.90/2.44 us holding off only after a run (that rule against holding after every empty poll
/// in the flip below: 0.97-1.03 at p50, 64-1518 B, both ways). A peer answering in bursts still
/// met a hold on every exchange (`testpmd --forward-mode=ping --burst 4`: 5.5 us at p50 against
/// 1.0 us), so a hold after which at most one burst waited now starts a quiet spell without
/// holds (`memnic_ethdev::holdoff`). A/B in one sitting (in-process flip of
/// 1-s windows, testpmd txonly -> rxonly over one region, 24-30 s a cell, ratio of each window
/// to its neighbours; the receiver holding off 2 or 5 us / not at all, p20/p50/p80):
///
/// ```text
///    64 B  host->guest 2 us 1.05/1.08/1.11 (27.0 -> 29.4 Mpps), 5 us 1.30/1.47/1.52 (14.8 -> 21.6)
///          guest->host 5 us 1.08/1.30/1.64 (17.1 -> 23.3)
///   512 B  host->guest 5 us 1.15/1.37/1.38, guest->host 1.05/1.38/1.50 (fast state 19.2 -> 27.0)
///  1518 B  host->guest 5 us 1.01/1.24/1.40, guest->host 0.94/1.17/1.56
/// ```
///
/// Against each other: 3 us and 10 us level at 64 B (0.99-1.07 both ways); at 1518 B in the
/// slow state 10 us 1.18 host->guest and 1.00 guest->host over 3 us, 1 us 0.94 guest->host.
/// The rule as kept (5 us, only after a run) against none, in another sitting:
///
/// ```text
///    64 B  host->guest 1.41/1.44/1.53 (15.7 -> 22.4 Mpps), guest->host 1.06/1.12/1.44
///   512 B  host->guest 1.03/1.38/1.56 (3.8 -> 5.2), guest->host 1.07/1.27/1.45
/// ```
pub const DEFAULT_RX_HOLDOFF: Duration = Duration::from_micros(5);

/// Receives up to `max` frames from ring `dir` starting at `*idx`, unless `hold` says the ring
/// is to be left alone a while longer after an empty poll that followed a run.
///
/// Batched: find the run of FILLED slots (independent loads, so their cache misses overlap),
/// allocate buffers for the whole run at once, copy, then hand all slots back. A slot with a bad length is counted in
/// `errors` and handed back empty. While `tuner` says so, each copied frame's lines past the
/// slot's first are flushed from our caches ([`flush_copied`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn receive(
    region: &Region,
    dir: Dir,
    idx: &mut usize,
    framesz: u32,
    cache: &mut PoolCache,
    pkts: &mut Vec<Mbuf>,
    max: usize,
    st: &mut QueueStats,
    hold: &mut Holdoff,
    tuner: &mut FlushTuner,
) -> usize {
    if hold.holding() {
        tuner.polled(0);
        tuner.record(st);
        return 0;
    }
    let max = max.min(MAX_BURST);
    let first = *idx;
    // No prefetch ahead here: the slots past the FILLED frontier are the ones the host is
    // writing, and pulling them into this core's cache makes the host wait for them back
    // (measured: prefetching 8 slots ahead cost about a quarter of the 64-byte rate).
    let mut n = 0;
    while n < max {
        if !slot::is_filled(region.u32(slot_off(dir, first + n))) {
            break;
        }
        n += 1;
    }
    // Whether more waited than this poll could take: the slot past the last one it may take is
    // looked at only when that judges a hold (it is the line the sender may be writing).
    let left =
        n == max && hold.judging() && slot::is_filled(region.u32(slot_off(dir, first + max)));
    hold.polled(n, left);
    hold.record(st);
    if n == 0 {
        tuner.polled(0);
        tuner.record(st);
        return 0;
    }
    let flush = tuner.flush();
    // The run's frames are finished: fetch each one's second line (the status read brought
    // the first), so the copies' misses overlap instead of stalling one after another. A/B:
    // 64 B +45%, 512 and 1518 B +9%; fetching up to the fourth line too lost 20% at 512 B.
    for k in 0..n {
        let off = slot_off(dir, first + k);
        // Relaxed: a hint only; the copy below reads the length again after the Acquire.
        if SLOT_DATA + region.u32(off + SLOT_LEN).load(Relaxed) as usize > 64 {
            region.prefetch(off + 64);
        }
    }
    let start = pkts.len();
    let got = cache.alloc_up_to(pkts, n);
    if got < n {
        no_buffers(st, n - got);
        n = got;
    }
    let mut out = start;
    for k in 0..n {
        let off = slot_off(dir, first + k);
        // Relaxed: ordered after the Acquire load in `is_filled` of this slot (C1).
        let len = region.u32(off + SLOT_LEN).load(Relaxed);
        let m = &mut pkts[out];
        if len == 0 || len > framesz {
            bad_length(st);
            continue;
        }
        // Small frames are copied rounded up to 32 bytes (both the slot and the buffer have
        // the room): fixed-size vector moves instead of a memcpy call.
        let n = padded(len as usize, m.capacity());
        // A private buffer is filled straight from the slot (one bounds check); any other
        // through a window.
        let filled = match m.fill_slice(len as usize, n) {
            Some(dst) => region.read_bytes(off + SLOT_DATA, dst).is_ok(),
            None => {
                matches!(region.slice(off + SLOT_DATA, n), Ok(s) if m.fill_from(&s, len as usize))
            }
        };
        if !filled {
            bad_length(st);
            continue;
        }
        if flush {
            flush_copied(region, off, len);
        }
        st.bytes += len as u64;
        out += 1;
    }
    for k in 0..n {
        slot::release(region.u32(slot_off(dir, first + k)));
    }
    *idx = (first + n) % NR_PACKET;
    while pkts.len() > out {
        let m = pkts.pop().expect("len > out >= 0");
        cache.free(m);
    }
    let got = out - start;
    st.packets += got as u64;
    // At most MAX_BURST (512) frames.
    tuner.polled(got as u16);
    tuner.record(st);
    got
}

/// Flushes a slot's lines past its first (which holds the status word we write next) up to the
/// end of its `len`-byte frame from every cache, once the frame is copied out: the producer's
/// next plain stores to them (frames past [`STREAM_MAX`], or all while it does not stream) then
/// fetch them from memory,
/// not from this core. Done while the rx queue's `FlushTuner` finds that it moves more frames:
/// in this machine's slow state (far cores) it does, in the fast state it costs. In-process
/// flip, tuned / never, p20/p50/p80, testpmd txonly -> rxonly over one region, 30 s each:
///
/// ```text
///   guest->host 1518 B  2.60/2.67/2.77 (slow state 1.3 -> 3.5 Mpps); 0.96/0.98/0.99 (fast)
///   host->guest 1518 B  0.94/2.44/2.65 (slow 1.4 -> 3.4, fast 14.8 -> 13.9); 0.95/0.97/0.98 (fast)
///   guest->host  512 B  0.97/1.00/1.96 (slow 4.4 -> 8.9, fast 28.3 -> 27.5)
///   host->guest   64 B  0.97/0.99/1.01 (fast 24.0 -> 23.8)
/// ```
///
/// with the tuner's trial windows at 2 ms; at 1 ms (kept) the fast state's cost fell to
/// 0.97/0.99/1.00 (host->guest 1518 B and 512 B) and guest->host 1518 B gained 1.03/1.88/2.17.
#[inline(always)]
fn flush_copied(region: &Region, off: usize, len: u32) {
    let end = SLOT_DATA + len as usize;
    if end > 64 {
        if let Ok(s) = region.slice(off + 64, end - 64) {
            s.flush_lines();
        }
    }
}

/// `len` rounded up to 32 for frames of up to 128 bytes, if the buffer has the room (slots have
/// 4088 bytes, so they always do).
#[inline(always)]
fn padded(len: usize, capacity: usize) -> usize {
    let n = len.next_multiple_of(32);
    if len <= 128 && n <= capacity {
        n
    } else {
        len
    }
}

#[cold]
#[inline(never)]
pub(crate) fn no_buffers(st: &mut QueueStats, n: usize) {
    st.nombuf += n as u64;
}

#[cold]
#[inline(never)]
pub(crate) fn bad_length(st: &mut QueueStats) {
    st.errors += 1;
}

#[cold]
#[inline(never)]
fn oversize(st: &mut QueueStats) {
    st.drops += 1;
}

/// The longest frame whose slot is written with streaming stores past its first line
/// ([`stream_slot`]) while the tx queue's `StreamTuner` streams (`tx_stream`); the burst's
/// streamed slots are fenced (`memnic_shm::store_fence`) and then published together.
///
/// The consumer read each slot last, so a plain store waits for the line to come back from its
/// core; streamed, the consumer's read of it misses to memory instead. Which costs less
/// depends on the host (`memnic_ethdev::stream`), so each tx queue tries both. On the AMD EPYC
/// host of the early sessions, in its slow state (a far core), the plain store's wait was most
/// of a small frame's cost. A/B in one sitting there (in-process flip of ~250-ms windows, testpmd txonly -> rxonly, both sides
/// flipping; streamed/plain p20/p50/p80 of adjacent windows):
///
/// ```text
///    64 B  guest->host 1.05/1.14/2.07 (slow state 6.4 -> 13.0 Mpps), host->guest 1.09/1.96/2.28
///   128 B  guest->host 2.21/2.38/2.64 (5.8 -> 13.6), host->guest 1.22/2.41/2.60 (fast 17.9 -> 21.8)
///   256 B  guest->host 0.88/1.05/2.98, host->guest 0.81/0.90/2.59 (fast state 16.7 -> 14.2)
///   512 B  guest->host 0.65/2.85/3.34 (fast 14.1 -> 9.3), host->guest 2.77/3.14/3.32 (slow 2.8 -> 8.8)
/// ```
///
/// memnic-tester's `memnic` variant (the guest's tx into slots the emulated host never reads):
/// 64 B 1.49/1.55/1.59 (5.2 -> 8.0 Mpps), 128 B 0.93/1.55/1.62.
///
/// From 256 B the fast state loses (this VM's memory bandwidth), so only up to 128 B.
/// Streaming the first line too (status and length with the frame, then the status line
/// stored again to publish) lost to plain first lines 0.72 in the slow state (9.6 against
/// 13.5 Mpps at 64 B): publishing then fetches the line back from memory.
pub(crate) const STREAM_MAX: usize = 128;

/// Transmits frames from the front of `pkts` into ring `dir` as its only producer: a slot is
/// claimed by seeing it FREE, no compare-and-swap. Sent buffers are freed after the copy loop.
/// Returns how many frames were taken (sent, or dropped as oversize under [`Oversize::Drop`]).
/// While `tuner` says so, frames of up to [`STREAM_MAX`] bytes go into their slots with
/// streaming stores ([`stream_slot`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn transmit_single(
    region: &Region,
    dir: Dir,
    idx: &mut usize,
    framesz: u32,
    cache: &mut PoolCache,
    pkts: &mut Vec<Mbuf>,
    on_oversize: Oversize,
    st: &mut QueueStats,
    tuner: &mut StreamTuner,
) -> usize {
    let stream_max = if tuner.on() { STREAM_MAX } else { 0 };
    let n = pkts.len().min(MAX_BURST);
    let mut i = *idx;
    let mut taken = 0;
    let mut sent = 0u64;
    let mut bytes = 0u64;
    // Slots written with streaming stores and not yet published: the run of `nstreamed`
    // slots before `i` (each frame taken advances `i` by one slot, an oversize one by none).
    let mut nstreamed = 0;
    // Frames the burst streamed, for the tuner's counters.
    let mut streamed_in_all = 0u32;
    while taken < n {
        let m = &pkts[taken];
        let len = m.len() as u32;
        if len > framesz {
            if on_oversize == Oversize::Stop {
                break;
            }
            oversize(st);
            taken += 1;
            continue;
        }
        let off = slot_off(dir, i);
        if !slot::claim_single(region.u32(off)) {
            break; // ring full
        }
        let src = if streams(len as usize, stream_max) {
            m.as_slice_padded(streamed_len(len))
        } else {
            None
        };
        match src {
            Some(src) => {
                stream_slot(region, off, len, src);
                nstreamed += 1;
                streamed_in_all += 1;
            }
            None => {
                // Published in order: the streamed slots before this one go first.
                publish_streamed(region, dir, i, nstreamed);
                nstreamed = 0;
                prefetch_next_slot(region, dir, i, pkts.get(taken + 1), stream_max);
                write_slot(region, off, m);
                slot::publish(region.u32(off));
            }
        }
        i = next(i);
        taken += 1;
        sent += 1;
        bytes += len as u64;
    }
    publish_streamed(region, dir, i, nstreamed);
    // A whole burst of short frames went with plain stores, so the ring had room: the next
    // slots' status lines on their way while the caller builds its next burst. (After a
    // burst the ring cut short, the slots ahead are the consumer's, still to be read.)
    if taken == n && taken > 0 && streamed_in_all == 0 && bytes <= (FOLLOWING_MAX * taken) as u64 {
        prefetch_following(region, dir, i);
    }
    *idx = i;
    st.packets += sent;
    st.bytes += bytes;
    cache.free_front(pkts, taken);
    // The tuner judges by what the consumer takes: a full ring sends only as it frees slots.
    tuner.polled(taken as u16, streamed_in_all);
    tuner.record(st);
    taken
}

/// Slots past a burst whose first lines [`prefetch_following`] asks for: eight.
const FOLLOWING_SLOTS: usize = 8;
/// The longest mean frame of a burst after which [`prefetch_following`] asks.
const FOLLOWING_MAX: usize = 128;

/// After a whole burst written with plain stores, asks (PREFETCHW) for the first line of the
/// next [`FOLLOWING_SLOTS`] slots from `i`, their status and length words: the consumer
/// wrote each status FREE last, so the next burst's claim of each slot otherwise waits for
/// that line to come back from its core, one slot after another ([`prefetch_next_slot`]
/// asks one frame ahead only). As memif's client asks for its next burst's buffers
/// (`memnic_memif`'s `writer::prefetch_following`). In-process flip on the Intel Xeon host of
/// session 49 (250-ms windows, testpmd txonly -> rxonly, the sender counted, B/A
/// p20/p50/p80, asked / not): 64 B host->guest 1.02/1.02/1.04 and 1.03/1.04/1.05, guest->host
/// 1.04/1.06/1.07 and 1.04/1.05/1.06; four slots 1.01/1.02/1.03 and 1.02/1.02/1.03, sixteen
/// 1.02/1.04/1.04 and 1.03/1.06/1.07; 512 B 1.00/1.01/1.02 and 1.00/1.00/1.02, 1518 B
/// 1.00/1.02/1.03 and 0.99/1.01/1.03 (host->guest and guest->host).
///
/// Only after bursts of short frames (at most [`FOLLOWING_MAX`] bytes on average): with every
/// burst, memnic-tester's `memnic` variant lost at 1518 B (whole 3-s runs alternating the
/// builds, five each: 3.04 against 3.18 Mpps mean, each pair lower); as it stands, three
/// runs each, 64 B 15.28/14.77/14.88 against 14.69/14.19/14.48 Mpps, 1518 B 3.27/3.19/3.17
/// against 2.98/3.15/3.12.
#[inline(always)]
fn prefetch_following(region: &Region, dir: Dir, i: usize) {
    for k in 0..FOLLOWING_SLOTS {
        region.prefetch_write(slot_off(dir, i + k));
    }
}

/// Whether a frame of `len` bytes goes into its slot with streaming stores, up to `stream_max`
/// bytes ([`STREAM_MAX`] while the queue streams, else 0: none).
#[inline(always)]
fn streams(len: usize, stream_max: usize) -> bool {
    stream_max > 0 && len <= stream_max
}

/// The longest next frame whose slot is asked for ([`prefetch_next_slot`]).
///
/// The consumer read each slot last, so every line of a plain copy into it waits for the line
/// to come back from the consumer's core, and each waiting store holds the ones behind it.
/// Asked for (PREFETCHW) while the frame before is copied, the lines are on their way
/// together. A/B in one sitting (in-process flip of 1-s windows, testpmd txonly -> rxonly,
/// 24 s a cell, asked/not p20/p50/p80):
///
/// ```text
///    512 B  host->guest 1.79/1.82/1.91 (slow state 3.8 -> 7.0 Mpps), guest->host 1.07/1.13/1.69
///   1024 B  host->guest 1.41/1.44/1.45 (2.2 -> 3.2), guest->host 1.79/1.83/1.85 (1.9 -> 3.6)
///   1518 B  host->guest 0.93/0.93/0.95 (fast state 15.4 -> 14.1), guest->host 0.88/0.94/1.47
/// ```
///
/// At 1518 B the slow state gains (1.8 -> 2.6 Mpps) and the fast state loses; capped at the
/// first 512 or 1024 bytes it lost or swung (0.54-1.27). So not past 1024 B on that AMD EPYC
/// host. The bare MEMNIC ring of the limit probe gained as much (512 B 1.58/1.67/1.69, 1518 B
/// 1.00/1.76/1.78). Longer frames: see [`PREFETCH_LONG_BYTES`].
pub(crate) const PREFETCH_NEXT_MAX: usize = 1024;

/// How much of the next slot (its header included) is asked for when the next frame is longer
/// than [`PREFETCH_NEXT_MAX`]: its first lines only, the hardware prefetcher following the
/// copy for the rest. On the Intel Xeon host of session 40 (in-process flip of 250-ms
/// windows, B/A p20/p50/p80, B = the first 512 bytes, A = nothing): memnic-tester's `memnic`
/// variant 1518 B 1.03/1.05/1.07 and 1.04/1.05/1.06, 1280 B 1.05/1.06/1.07; testpmd txonly ->
/// rxonly, host->guest 1518 B 1.01/1.04/1.11, 1280 B 1.03/1.07/1.09, guest->host 1518 B
/// 1.00/1.04/1.05, 1280 B 0.85/1.01/1.11. The whole slot instead (B = whole, tester 1518 B):
/// 0.87/0.99/1.02.
pub(crate) const PREFETCH_LONG_BYTES: usize = 512;

/// While a frame is copied into slot `i` with plain stores, asks for the lines of the next
/// slot that the next frame (if it is copied the same way, not streamed under `stream_max`)
/// will be written into: all of them up to [`PREFETCH_NEXT_MAX`] bytes, else the first
/// [`PREFETCH_LONG_BYTES`].
#[inline(always)]
fn prefetch_next_slot(
    region: &Region,
    dir: Dir,
    i: usize,
    next_frame: Option<&Mbuf>,
    stream_max: usize,
) {
    let Some(m) = next_frame.filter(|m| !streams(m.len(), stream_max)) else {
        return;
    };
    let off = slot_off(dir, next(i));
    let end = if m.len() <= PREFETCH_NEXT_MAX {
        SLOT_DATA + m.len()
    } else {
        PREFETCH_LONG_BYTES
    };
    for line in (0..end).step_by(64) {
        region.prefetch_write(off + line);
    }
}

/// Writes `m`'s length and bytes into the claimed slot at `off` with plain stores; the caller
/// publishes it.
#[inline(always)]
fn write_slot(region: &Region, off: usize, m: &Mbuf) {
    let len = m.len() as u32;
    // Relaxed: published by the Release store in `publish` (P1).
    region.u32(off + SLOT_LEN).store(len, Relaxed);
    // Small frames are copied rounded up to 32 bytes where both buffers have the room. A
    // private buffer is written straight from its slice (the common case, and the cheapest:
    // one bounds check, no window over our own memory); anything else through windows.
    let copied = match m.as_slice_padded(padded(len as usize, m.capacity())) {
        Some(src) => region.write_bytes(off + SLOT_DATA, src).is_ok(),
        None => matches!(
            region.slice(
                off + SLOT_DATA,
                padded(len as usize, MAX_JUMBO_FRAME_LEN as usize),
            ),
            Ok(d) if m.copy_padded_to(&d)
        ),
    };
    assert!(copied, "len <= framesz <= slot room");
}

/// Writes a frame of `len` (up to [`STREAM_MAX`]) bytes and its length into the claimed slot
/// at `off`, from `src`, the frame's buffer up to [`streamed_len`]: the slot's first line
/// (length and the frame's first 56 bytes; the status is left FREE) with plain stores, the rest
/// with streaming stores, whose lines are then written without being fetched from the
/// consumer. The caller fences and publishes it ([`publish_streamed`]). (Through a stack copy
/// of the slot instead of the buffer's own padding: 0.92 and 0.94 at 64 B, level at 128 B.)
#[inline(always)]
fn stream_slot(region: &Region, off: usize, len: u32, src: &[u8]) {
    // Relaxed: published by the Release store in `publish` (P1).
    region.u32(off + SLOT_LEN).store(len, Relaxed);
    let first = src.len().min(64 - SLOT_DATA);
    region
        .write_bytes(off + SLOT_DATA, &src[..first])
        .expect("a slot holds 4096 bytes");
    if src.len() > first {
        region
            .write_bytes_streaming(off + SLOT_DATA + first, &src[first..])
            .expect("a slot holds 4096 bytes");
    }
}

/// How many bytes of a frame of `len` bytes [`stream_slot`] writes: up to the slot's next
/// 16-byte boundary (a streaming store writes 16 aligned bytes).
#[inline(always)]
fn streamed_len(len: u32) -> usize {
    (SLOT_DATA + len as usize).next_multiple_of(16) - SLOT_DATA
}

/// Fences the stores of the `n` streamed slots before slot `end` of ring `dir`, then
/// publishes them in order.
#[inline(always)]
fn publish_streamed(region: &Region, dir: Dir, end: usize, n: usize) {
    if n == 0 {
        return;
    }
    // The streaming stores are weakly ordered: the fence puts them before the Release stores of
    // `publish` (P1), which alone would not order them.
    memnic_shm::store_fence();
    for k in (1..=n).rev() {
        slot::publish(region.u32(slot_off(dir, end + NR_PACKET - k)));
    }
}
