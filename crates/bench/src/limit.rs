//! The bare-ring limit probe: what two threads pinned to the pair's two CPUs reach when they do
//! nothing but move frames through a slot ring in shared memory, with the copies per frame of
//! the pair under test and nothing else (no descriptors beyond the ring's two indices, no
//! mbufs, no pools, no statistics). Measured in the same sitting as the pairs, alternating with
//! them, it is the ceiling each pair's rate is a fraction of (issue "Speed", goal 3).
//!
//! * The ring: [`SLOTS`] slots of [`SLOT`] bytes; the producer's index and the consumer's each
//!   on a line of its own (two lines apart, so the adjacent-line prefetcher does not pair them).
//! * The producer fills a burst of [`BURST`] slots, then publishes its index once (Release);
//!   the consumer takes what the index shows, a burst at most, then publishes its own (Release).
//!   Each side re-reads the other's index (Acquire) only when its cached copy says stop.
//! * While it copies a frame longer than a line, the producer asks for the next slot's lines
//!   for writing (PREFETCHW), as our memif client does (`prefetch_next`): the consumer read
//!   them last, and a copy that waits for each line in turn holds every later store behind
//!   it. Without it the probe was no ceiling above 64 B (the pairs beat it). A/B in one
//!   sitting (in-process flip of 250-ms windows, ratio with/without p20/p50/p80): two copies
//!   512 B 1.63/1.70/1.78 and 1.62/1.70/1.80, 1518 B 0.98/1.05/1.16 (fast state) and
//!   1.07/1.43/1.67 (slow state 1.8 -> 2.9 Mpps); 64 B 0.90/0.97/1.01 and 0.92/0.99/1.04,
//!   so not for one line; one copy 1518 B level (1.00).
//! * With two copies the consumer asks for the slots ahead of its copy as our memif receive
//!   asks for its buffers (`Ahead`: one line sixteen slots ahead up to 64 B, four lines eight
//!   ahead up to 512 B, eight lines beyond), within what the producer published. Asking for
//!   the next slot only was level (512 B 1.02, 1518 B 1.03); once our memif client asked for
//!   eight lines of long frames (session 50) our S2C pair ran past the probe at 1518 B (8.72
//!   against 8.24 Mpps). Whole runs alternating, three each, Mpps without / with: 64 B 61.4,
//!   60.0, 59.8 / 57.7, 62.7, 60.0; 512 B 22.9, 23.8, 22.0 / 23.5, 23.8, 24.0; 1518 B 9.9,
//!   8.2, 8.7 / 9.8, 9.6, 9.6. With one copy it does not: asking for the next slot lost there
//!   (1518 B 0.68).
//! * With two copies, frames of up to 128 B go into their slots with streaming stores and one
//!   store fence before the index while a `StreamTuner` finds that this moves more frames, as
//!   our memif tx writes them (`STREAM_MAX` there, with its A/B): a ceiling has to use what
//!   the pairs use. Streamed slots are not asked for ahead (a streaming store fetches no line;
//!   asking pulled them over from the consumer for nothing): 128 B 1.54/1.77/2.02 (flip, not
//!   asked/asked p20/p50/p80; 18.2 -> 33.7 Mpps), as memif's tx (`streams` there).
//! * Two copies (`copies = 2`: memif copy mode, MEMNIC, memnic-tester): the producer copies the
//!   whole frame from a private buffer into the slot and the consumer copies it out into
//!   another. One copy (`copies = 1`: vhost, where the frontend writes only the frame's headers
//!   into its buffer and the backend copies the frame once): the producer writes the frame's
//!   first line, the consumer copies the whole frame out.
//! * MEMNIC's own ring ([`Shape::MemnicSlots`], the limit of MEMNIC's pairs and the tester's):
//!   1024 slots of 4 KiB, each handed over through its status word with the PMD's own steps
//!   (`memnic_pmd::slot`): claimed when FREE, written (up to 128 B streamed past the first
//!   line while that pays, as the PMD's tx tunes it), published FILLED; the consumer takes the run of FILLED slots, asks for each
//!   frame's second line, copies them out and hands them back FREE, and after an empty poll
//!   that followed a run holds off as the PMD's rx does. It shows what the wire format costs against the index
//!   ring: every frame's handshake is a line of its own that both sides write.
//! * The consumer flushes the lines the producer writes again (the whole frame with two copies,
//!   its first line with one; a MEMNIC slot's lines past the first) from its caches after the
//!   copy while a `FlushTuner` finds that this moves more frames, as the pairs' rx queues do
//!   (`memnic_ethdev::flush`): in this machine's slow state the pairs passed the probe without
//!   it (MEMNIC 512 B 8.2-9.4 Mpps against 5.2, 1518 B 3.6 against 2.3).
//! * A scaling run (N queue pairs) has a limit per N: N rings side by side, each with its own
//!   producer and consumer on the CPUs of one queue pair, their counts summed. What the
//!   machine gives N bare rings at once (shared caches, memory bandwidth, the hypervisor) is
//!   what N queue pairs are a fraction of, not N times one ring alone.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memnic_ethdev::flush::FlushTuner;
use memnic_ethdev::stream::{StreamMode, StreamTuner};
use memnic_pmd::layout::{MAX_PACKET_SIZE, NR_PACKET, SLOT_DATA, SLOT_LEN, SLOT_STATUS};
use memnic_pmd::slot;
use memnic_shm::Region;

use crate::stats::{window_rates, Stamp};

/// Slots in the ring (a memif ring's default size).
pub const SLOTS: usize = 1024;
/// Bytes a slot holds (a memif buffer's default size); a larger frame (the tester's jumbo
/// sizes) gets slots of its size rounded up to whole lines.
pub const SLOT: usize = 2048;
/// Frames a side moves before it publishes its index.
pub const BURST: usize = 32;
/// Where the producer's index and the consumer's are, and where the slots start.
const HEAD: usize = 0;
const TAIL: usize = 128;
const DATA: usize = 4096;
/// How often the consumer's count is stamped (window_rates makes ~2-s windows of it).
const STAMP_EVERY: Duration = Duration::from_secs(1);
/// A cache line.
const LINE: usize = 64;
/// The longest frame the producer writes with streaming stores (one store fence before it
/// publishes) while its tuner streams, as memif's tx and the vhost split ring's enqueue do up
/// to 128 B.
const STREAM_MAX: usize = 128;
/// The largest frame the probe moves.
pub const MAX_FRAME: usize = 16384;

/// The ring the probe's two threads move frames through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// [`SLOTS`] slots of [`SLOT`] bytes and two indices, each published once a burst.
    Indices,
    /// MEMNIC's own ring: [`NR_PACKET`] slots of 4 KiB, each with its status word, claimed and
    /// handed back one by one (two copies only).
    MemnicSlots,
}

/// Runs the probe for `seconds`, one ring per pair of `cpus` side by side (a scaling run's N
/// queue pairs: N rings, each its own producer and consumer), the producer on each pair's
/// second CPU and the consumer on its first (the pairs' receiver side); returns the window
/// rates of all consumers together in frames per second, stamped by `clock`.
pub fn run(
    cpus: &[(usize, usize)],
    copies: u8,
    shape: Shape,
    size: usize,
    seconds: u64,
    clock: Instant,
) -> Result<Vec<f64>, String> {
    probe(cpus, copies, shape, size, |count| {
        let mut stamps = Vec::new();
        let start = Instant::now();
        let end = start + Duration::from_secs(seconds);
        let mut next = start;
        while next <= end {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            stamps.push(Stamp {
                secs: clock.elapsed().as_secs_f64(),
                count: count(),
            });
            next += STAMP_EVERY;
        }
        window_rates(&stamps, clock.elapsed().as_secs_f64())
    })
}

/// One window of the probe on one pair of CPUs (`--interleave`): `warmup` of frames, then the
/// rate over `window`, in frames per second.
pub fn window(
    cpus: (usize, usize),
    copies: u8,
    shape: Shape,
    size: usize,
    warmup: Duration,
    window: Duration,
) -> Result<f64, String> {
    probe(&[cpus], copies, shape, size, |count| {
        std::thread::sleep(warmup);
        let (t0, c0) = (Instant::now(), count());
        std::thread::sleep(window);
        let (t1, c1) = (Instant::now(), count());
        (c1 - c0) as f64 / (t1 - t0).as_secs_f64()
    })
}

/// One ring's two threads; each returns what it checked.
struct Ring {
    producer: std::thread::JoinHandle<Result<(), String>>,
    consumer: std::thread::JoinHandle<Result<(u64, u64), String>>,
}

/// Runs a producer and a consumer per pair of CPUs while `measure` samples the consumers'
/// count (all rings together), then stops them and checks what each consumer read.
fn probe<T>(
    cpus: &[(usize, usize)],
    copies: u8,
    shape: Shape,
    size: usize,
    measure: impl FnOnce(&dyn Fn() -> u64) -> T,
) -> Result<T, String> {
    if size == 0 || size > MAX_FRAME {
        return Err(format!(
            "the limit probe takes frames of 1 to {MAX_FRAME} bytes, not {size}"
        ));
    }
    if shape == Shape::MemnicSlots && (copies < 2 || size > MAX_PACKET_SIZE - SLOT_DATA) {
        return Err(format!(
            "the MEMNIC-shaped limit probe copies frames twice and takes 1 to {} bytes, not {size} with {copies} cop{}",
            MAX_PACKET_SIZE - SLOT_DATA,
            if copies == 1 { "y" } else { "ies" }
        ));
    }
    let slot = SLOT.max(size.next_multiple_of(LINE));
    // One copy: the producer writes the frame's first line only (its headers).
    let written = if copies >= 2 { size } else { size.min(LINE) };
    let frame = Frame {
        size,
        written,
        // One copy models virtio-user's header writes, which are plain stores.
        streamable: copies >= 2 && written <= STREAM_MAX,
        ahead: (copies >= 2).then(|| Ahead::for_size(size)),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Vec<Arc<AtomicU64>> = cpus.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut rings = Vec::new();
    let mut started = Ok(());
    for (&pair, count) in cpus.iter().zip(&counts) {
        match start_ring(pair, shape, slot, frame, &stop, count) {
            Ok(r) => rings.push(r),
            Err(e) => {
                started = Err(e);
                break;
            }
        }
    }
    // Relaxed: counters each consumer stores after a burst.
    let measured = started.map(|()| measure(&|| counts.iter().map(|c| c.load(Relaxed)).sum()));
    // Relaxed: the threads poll the flag; nothing else is ordered by it.
    stop.store(true, Relaxed);
    let panicked = |_| "a limit probe thread panicked".to_string();
    // Every frame's last byte is the pattern's, or zero where the producer did not write it.
    let last = if written == size { (size - 1) as u8 } else { 0 };
    for ring in rings {
        ring.producer.join().map_err(panicked)??;
        let (frames, sum) = ring.consumer.join().map_err(panicked)??;
        if sum != frames.wrapping_mul(u64::from(last)) {
            return Err(format!(
                "the limit probe read {frames} frames whose last bytes sum to {sum}, not {frames} x {last}"
            ));
        }
    }
    measured
}

/// What the probe moves: frames of `size` bytes, of which the producer writes `written`
/// (with streaming stores while they are `streamable` and its tuner finds that this pays);
/// the consumer asks for the slots ahead of its copy as `ahead` says.
#[derive(Clone, Copy, Debug)]
struct Frame {
    size: usize,
    written: usize,
    streamable: bool,
    ahead: Option<Ahead>,
}

/// How many of each slot's first lines the consumer asks for ahead of its copy, how many
/// slots ahead, as our memif receive asks for its buffers (`memnic_memif`'s `chain.rs`:
/// `SHORT_PREFETCH_FRAMES`, `PREFETCH_FRAMES`, `LONG_FRAME`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ahead {
    lines: usize,
    slots: u64,
}

impl Ahead {
    fn for_size(size: usize) -> Ahead {
        match size {
            ..=64 => Ahead {
                lines: 1,
                slots: 16,
            },
            65..=512 => Ahead { lines: 4, slots: 8 },
            _ => Ahead { lines: 8, slots: 8 },
        }
    }

    /// Asks for the lines of the slot the ring's `at`th frame goes in (slots of `slot` bytes).
    fn ask(self, ring: &Region, slot: usize, at: u64) {
        let base = DATA + (at as usize % SLOTS) * slot;
        for line in 0..self.lines {
            ring.prefetch(base + line * LINE);
        }
    }
}

/// Starts one ring: its producer pinned to `cpus.1`, its consumer to `cpus.0`.
fn start_ring(
    cpus: (usize, usize),
    shape: Shape,
    slot: usize,
    frame: Frame,
    stop: &Arc<AtomicBool>,
    count: &Arc<AtomicU64>,
) -> Result<Ring, String> {
    let len = match shape {
        Shape::Indices => DATA + SLOTS * slot,
        Shape::MemnicSlots => DATA + NR_PACKET * MAX_PACKET_SIZE,
    };
    let ring =
        Arc::new(Region::private(len, false).map_err(|e| format!("the limit probe's ring: {e}"))?);
    let producer = {
        let (ring, stop) = (ring.clone(), stop.clone());
        std::thread::Builder::new()
            .name("limit-producer".into())
            .spawn(move || -> Result<(), String> {
                memnic_shm::cpu::pin_current_thread(cpus.1).map_err(|e| e.to_string())?;
                match shape {
                    Shape::Indices => produce(&ring, slot, &stop, frame.written, frame.streamable),
                    Shape::MemnicSlots => produce_slots(&ring, &stop, frame.written),
                }
                Ok(())
            })
            .map_err(|e| format!("cannot start the limit probe's producer: {e}"))?
    };
    let consumer = {
        let (stop, count) = (stop.clone(), count.clone());
        std::thread::Builder::new()
            .name("limit-consumer".into())
            .spawn(move || -> Result<(u64, u64), String> {
                memnic_shm::cpu::pin_current_thread(cpus.0).map_err(|e| e.to_string())?;
                Ok(match shape {
                    Shape::Indices => consume(&ring, slot, &stop, &count, frame),
                    Shape::MemnicSlots => consume_slots(&ring, &stop, &count, frame.size),
                })
            })
            .map_err(|e| format!("cannot start the limit probe's consumer: {e}"))
    };
    match consumer {
        Ok(consumer) => Ok(Ring { producer, consumer }),
        Err(e) => {
            // Relaxed: as in probe; the producer alone is running and sees it.
            stop.store(true, Relaxed);
            let _ = producer.join();
            Err(e)
        }
    }
}

/// The producer: bursts of `written`-byte frames into free slots, with streaming stores while
/// they are `streamable` and a `StreamTuner` finds that this moves more frames.
fn produce(ring: &Region, slot: usize, stop: &AtomicBool, written: usize, streamable: bool) {
    let frame: Vec<u8> = (0..slot).map(|i| i as u8).collect();
    let (mut head, mut tail) = (0u64, 0u64);
    let room = (SLOTS - BURST) as u64;
    let mut tuner = stream_tuner(streamable);
    while !stop.load(Relaxed) {
        if head - tail > room {
            // Acquire: pairs with the consumer's Release of its index; the slots it freed were
            // read before.
            tail = ring.u64(TAIL).load(Acquire);
            if head - tail > room {
                tuner.polled(0, 0);
                std::hint::spin_loop();
                continue;
            }
        }
        let stream = tuner.on();
        for i in 0..BURST as u64 {
            let at = DATA + ((head + i) as usize % SLOTS) * slot;
            if !stream && written > LINE && i + 1 < BURST as u64 {
                let next = DATA + ((head + i + 1) as usize % SLOTS) * slot;
                for line in (0..written).step_by(LINE) {
                    ring.prefetch_write(next + line);
                }
            }
            if stream {
                ring.write_bytes_streaming(at, &frame[..written])
            } else {
                ring.write_bytes(at, &frame[..written])
            }
            .expect("slots lie inside the ring");
        }
        head += BURST as u64;
        if stream {
            memnic_shm::store_fence();
        }
        tuner.polled(BURST as u16, 0);
        // Release: pairs with the consumer's Acquire; the burst's frames come first.
        ring.u64(HEAD).store(head, Release);
    }
}

/// A producer's choice whether to stream (`memnic_ethdev::stream`): tried while traffic runs
/// for frames that may stream, never for the others.
fn stream_tuner(streamable: bool) -> StreamTuner {
    StreamTuner::new(if streamable {
        StreamMode::Auto
    } else {
        StreamMode::Off
    })
}

/// The consumer: copies each frame out; returns the frames it took and the sum of their last
/// bytes (read from the copies, so no copy can be left out). As the pairs' rx queues do, it
/// flushes the `written` bytes the producer writes again from its caches after the copy while
/// a `FlushTuner` finds that this moves more frames (`memnic_ethdev::flush`).
fn consume(
    ring: &Region,
    slot: usize,
    stop: &AtomicBool,
    count: &AtomicU64,
    frame: Frame,
) -> (u64, u64) {
    let Frame {
        size,
        written,
        ahead,
        ..
    } = frame;
    let mut buf = vec![0u8; slot];
    let (mut head, mut tail) = (0u64, 0u64);
    let mut sum = 0u64;
    let mut tuner = FlushTuner::default();
    while !stop.load(Relaxed) {
        if tail == head {
            // Acquire: pairs with the producer's Release; its frames are written before.
            head = ring.u64(HEAD).load(Acquire);
            if tail == head {
                tuner.polled(0);
                std::hint::spin_loop();
                continue;
            }
        }
        let n = (head - tail).min(BURST as u64);
        let flush = tuner.flush();
        // The first slots ahead at once, then one more per frame copied: only slots the
        // producer has published (asking for one it still writes would take its lines).
        if let Some(a) = ahead {
            for k in 0..a.slots.min(head - tail) {
                a.ask(ring, slot, tail + k);
            }
        }
        for i in 0..n {
            if let Some(a) = ahead.filter(|a| tail + i + a.slots < head) {
                a.ask(ring, slot, tail + i + a.slots);
            }
            let at = DATA + ((tail + i) as usize % SLOTS) * slot;
            ring.read_bytes(at, &mut buf[..size])
                .expect("slots lie inside the ring");
            sum = sum.wrapping_add(u64::from(buf[size - 1]));
            if flush {
                flush_lines(ring, at, written);
            }
        }
        tuner.polled(n as u16);
        tail += n;
        // Release: pairs with the producer's Acquire; the frames were read before the slots
        // are handed back.
        ring.u64(TAIL).store(tail, Release);
        // Relaxed: a counter the bench samples.
        count.store(tail, Relaxed);
    }
    (tail, sum)
}

/// The MEMNIC-shaped producer: bursts of `written`-byte frames into the slots of a MEMNIC ring
/// (`NR_PACKET` slots of 4 KiB: status, length, data), each slot claimed by seeing it FREE and
/// published FILLED, as the `memnic` PMD's single-producer tx does (`slot` steps, frames of up
/// to 128 B written past the slot's first line with streaming stores and fenced per burst
/// while a `StreamTuner` finds that this pays, others with plain stores while the next slot's
/// lines are asked for).
fn produce_slots(ring: &Region, stop: &AtomicBool, written: usize) {
    let frame: Vec<u8> = (0..MAX_PACKET_SIZE).map(|i| i as u8).collect();
    let mut tuner = stream_tuner(written <= STREAM_MAX);
    let mut idx = 0usize;
    let mut filled = [0usize; BURST];
    while !stop.load(Relaxed) {
        let stream = tuner.on();
        let mut n = 0;
        while n < BURST {
            let at = DATA + idx * MAX_PACKET_SIZE;
            if !slot::claim_single(ring.u32(at + SLOT_STATUS)) {
                break;
            }
            // Relaxed: published by the Release store in `slot::publish`.
            ring.u32(at + SLOT_LEN).store(written as u32, Relaxed);
            let first = written.min(LINE - SLOT_DATA);
            ring.write_bytes(at + SLOT_DATA, &frame[..first])
                .expect("slots lie inside the ring");
            if written > first {
                if stream {
                    // A streaming store writes 16 aligned bytes: up to the next boundary.
                    let end = (SLOT_DATA + written).next_multiple_of(16) - SLOT_DATA;
                    ring.write_bytes_streaming(at + SLOT_DATA + first, &frame[first..end])
                } else {
                    ring.write_bytes(at + SLOT_DATA + first, &frame[first..written])
                }
                .expect("slots lie inside the ring");
            }
            if !stream && n + 1 < BURST {
                // The next slot's lines asked for while this one is written, as the index
                // ring's producer does (the PMD's tx does it up to 1024 B): flip A/B of this
                // probe, asked/not p20/p50/p80, 512 B 1.58/1.67/1.69, 1518 B 1.00/1.76/1.78.
                let next = DATA + ((idx + 1) % NR_PACKET) * MAX_PACKET_SIZE;
                for line in (0..SLOT_DATA + written).step_by(LINE) {
                    ring.prefetch_write(next + line);
                }
            }
            filled[n] = at;
            n += 1;
            idx = (idx + 1) % NR_PACKET;
            if !stream {
                slot::publish(ring.u32(at + SLOT_STATUS));
            }
        }
        if stream && n > 0 {
            memnic_shm::store_fence();
            for &at in &filled[..n] {
                slot::publish(ring.u32(at + SLOT_STATUS));
            }
        }
        tuner.polled(n as u16, 0);
        if n == 0 {
            std::hint::spin_loop();
        }
    }
}

/// The MEMNIC-shaped consumer: the run of FILLED slots (a burst at most), each frame's second
/// line asked for, each copied out (and its lines past the first flushed while a `FlushTuner`
/// finds that this pays), then all handed back FREE, and after a poll that found none
/// following a run of frames the PMD's hold-off (`memnic_pmd::DEFAULT_RX_HOLDOFF`), as the
/// `memnic` PMD's rx does; returns what [`consume`] returns.
fn consume_slots(ring: &Region, stop: &AtomicBool, count: &AtomicU64, size: usize) -> (u64, u64) {
    let mut buf = vec![0u8; MAX_PACKET_SIZE];
    let (mut idx, mut taken, mut sum) = (0usize, 0u64, 0u64);
    // Frames the last poll took.
    let mut last = 0;
    let mut tuner = FlushTuner::default();
    while !stop.load(Relaxed) {
        let mut n = 0;
        while n < BURST
            && slot::is_filled(ring.u32(DATA + ((idx + n) % NR_PACKET) * MAX_PACKET_SIZE))
        {
            n += 1;
        }
        tuner.polled(n as u16);
        if n == 0 {
            // The PMD's rx hold-off after a run: leave the slot the producer is writing alone
            // a while.
            if last >= 2 {
                let until = Instant::now() + memnic_pmd::DEFAULT_RX_HOLDOFF;
                while Instant::now() < until && !stop.load(Relaxed) {
                    std::hint::spin_loop();
                }
            }
            last = 0;
            continue;
        }
        last = n;
        let flush = tuner.flush();
        // Each frame's second line asked for before the copies, as the PMD's rx does.
        if SLOT_DATA + size > LINE {
            for k in 0..n {
                ring.prefetch(DATA + ((idx + k) % NR_PACKET) * MAX_PACKET_SIZE + LINE);
            }
        }
        for k in 0..n {
            let at = DATA + ((idx + k) % NR_PACKET) * MAX_PACKET_SIZE;
            // Relaxed: after the Acquire in `slot::is_filled`.
            let len = (ring.u32(at + SLOT_LEN).load(Relaxed) as usize).min(size);
            ring.read_bytes(at + SLOT_DATA, &mut buf[..len])
                .expect("slots lie inside the ring");
            sum = sum.wrapping_add(u64::from(buf[size - 1]));
            if flush && SLOT_DATA + len > LINE {
                flush_lines(ring, at + LINE, SLOT_DATA + len - LINE);
            }
        }
        for k in 0..n {
            slot::release(ring.u32(DATA + ((idx + k) % NR_PACKET) * MAX_PACKET_SIZE + SLOT_STATUS));
        }
        idx = (idx + n) % NR_PACKET;
        taken += n as u64;
        // Relaxed: a counter the bench samples.
        count.store(taken, Relaxed);
    }
    (taken, sum)
}

/// Flushes the lines of `len` bytes at `at` from every cache.
fn flush_lines(ring: &Region, at: usize, len: usize) {
    if let Ok(s) = ring.slice(at, len) {
        s.flush_lines();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames move and are counted: the probe checks the bytes it copied out (run fails when
    /// they are not the producer's) and its windows count frames; an oversized frame is one
    /// sentence.
    #[test]
    fn the_probe_moves_frames_and_counts_them() {
        let cpus = memnic_shm::cpu::allowed_cpus();
        let pair = (cpus[0], *cpus.get(1).unwrap_or(&cpus[0]));
        let rates = run(&[pair], 2, Shape::Indices, 64, 3, Instant::now()).unwrap();
        assert!(!rates.is_empty(), "no window in 3 s");
        assert!(rates.iter().all(|&r| r > 1e5), "{rates:?}");
        assert!(
            run(&[pair], 1, Shape::Indices, 4088, 3, Instant::now()).is_ok(),
            "a jumbo frame"
        );
        // Two rings side by side (a scaling run's x2), their counts summed.
        let two = run(
            &[pair, (pair.1, pair.0)],
            2,
            Shape::Indices,
            64,
            3,
            Instant::now(),
        )
        .unwrap();
        assert!(!two.is_empty() && two.iter().all(|&r| r > 1e5), "{two:?}");
        let w = window(
            pair,
            2,
            Shape::Indices,
            64,
            Duration::from_millis(50),
            Duration::from_millis(300),
        );
        assert!(w.unwrap() > 1e5, "one window of the probe counts frames");
        assert!(
            run(&[pair], 1, Shape::Indices, MAX_FRAME + 1, 3, Instant::now())
                .unwrap_err()
                .contains("takes frames of 1 to")
        );
        // MEMNIC's own ring, up to the largest frame a slot holds; none past it, none with one
        // copy.
        for size in [64, 4088] {
            let rates = run(&[pair], 2, Shape::MemnicSlots, size, 3, Instant::now()).unwrap();
            assert!(
                !rates.is_empty() && rates.iter().all(|&r| r > 1e5),
                "{size}: {rates:?}"
            );
        }
        for (copies, size) in [(2, 4089), (1, 64)] {
            let e = run(&[pair], copies, Shape::MemnicSlots, size, 3, Instant::now());
            assert!(e.unwrap_err().contains("MEMNIC-shaped"), "{copies} {size}");
        }
    }
}
