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
//!   so not for one line; one copy 1518 B level (1.00). The consumer asking for the next
//!   slot's lines was level (two copies 512 B 1.02, 1518 B 1.03) and lost with one copy
//!   (1518 B 0.68): it does not.
//! * With two copies, frames of up to 128 B go into their slots with streaming stores and one
//!   store fence before the index, as our memif tx writes them (`STREAM_MAX` there, with its
//!   A/B): a ceiling has to use what the pairs use. Their slots are not asked for ahead (a
//!   streaming store fetches no line; asking pulled them over from the consumer for nothing):
//!   128 B 1.54/1.77/2.02 (flip, not asked/asked p20/p50/p80; 18.2 -> 33.7 Mpps), as memif's
//!   tx (`streams` there).
//! * Two copies (`copies = 2`: memif copy mode, MEMNIC, memnic-tester): the producer copies the
//!   whole frame from a private buffer into the slot and the consumer copies it out into
//!   another. One copy (`copies = 1`: vhost, where the frontend writes only the frame's headers
//!   into its buffer and the backend copies the frame once): the producer writes the frame's
//!   first line, the consumer copies the whole frame out.
//! * A scaling run (N queue pairs) has a limit per N: N rings side by side, each with its own
//!   producer and consumer on the CPUs of one queue pair, their counts summed. What the
//!   machine gives N bare rings at once (shared caches, memory bandwidth, the hypervisor) is
//!   what N queue pairs are a fraction of, not N times one ring alone.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// publishes), as memif's tx and the vhost split ring's enqueue do up to 128 B.
const STREAM_MAX: usize = 128;
/// The largest frame the probe moves.
pub const MAX_FRAME: usize = 16384;

/// Runs the probe for `seconds`, one ring per pair of `cpus` side by side (a scaling run's N
/// queue pairs: N rings, each its own producer and consumer), the producer on each pair's
/// second CPU and the consumer on its first (the pairs' receiver side); returns the window
/// rates of all consumers together in frames per second, stamped by `clock`.
pub fn run(
    cpus: &[(usize, usize)],
    copies: u8,
    size: usize,
    seconds: u64,
    clock: Instant,
) -> Result<Vec<f64>, String> {
    probe(cpus, copies, size, |count| {
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
    size: usize,
    warmup: Duration,
    window: Duration,
) -> Result<f64, String> {
    probe(&[cpus], copies, size, |count| {
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
    size: usize,
    measure: impl FnOnce(&dyn Fn() -> u64) -> T,
) -> Result<T, String> {
    if size == 0 || size > MAX_FRAME {
        return Err(format!(
            "the limit probe takes frames of 1 to {MAX_FRAME} bytes, not {size}"
        ));
    }
    let slot = SLOT.max(size.next_multiple_of(LINE));
    // One copy: the producer writes the frame's first line only (its headers).
    let written = if copies >= 2 { size } else { size.min(LINE) };
    // One copy models virtio-user's header writes, which are plain stores.
    let stream = copies >= 2 && written <= STREAM_MAX;
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Vec<Arc<AtomicU64>> = cpus.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut rings = Vec::new();
    let mut started = Ok(());
    for (&pair, count) in cpus.iter().zip(&counts) {
        match start_ring(pair, slot, written, stream, size, &stop, count) {
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

/// Starts one ring: its producer pinned to `cpus.1`, its consumer to `cpus.0`.
fn start_ring(
    cpus: (usize, usize),
    slot: usize,
    written: usize,
    stream: bool,
    size: usize,
    stop: &Arc<AtomicBool>,
    count: &Arc<AtomicU64>,
) -> Result<Ring, String> {
    let ring = Arc::new(
        Region::private(DATA + SLOTS * slot, false)
            .map_err(|e| format!("the limit probe's ring: {e}"))?,
    );
    let producer = {
        let (ring, stop) = (ring.clone(), stop.clone());
        std::thread::Builder::new()
            .name("limit-producer".into())
            .spawn(move || -> Result<(), String> {
                memnic_shm::cpu::pin_current_thread(cpus.1).map_err(|e| e.to_string())?;
                produce(&ring, slot, &stop, written, stream);
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
                Ok(consume(&ring, slot, &stop, &count, size))
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

/// The producer: bursts of `written`-byte frames into free slots.
fn produce(ring: &Region, slot: usize, stop: &AtomicBool, written: usize, stream: bool) {
    let frame: Vec<u8> = (0..slot).map(|i| i as u8).collect();
    let (mut head, mut tail) = (0u64, 0u64);
    let room = (SLOTS - BURST) as u64;
    while !stop.load(Relaxed) {
        if head - tail > room {
            // Acquire: pairs with the consumer's Release of its index; the slots it freed were
            // read before.
            tail = ring.u64(TAIL).load(Acquire);
            if head - tail > room {
                std::hint::spin_loop();
                continue;
            }
        }
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
        // Release: pairs with the consumer's Acquire; the burst's frames come first.
        ring.u64(HEAD).store(head, Release);
    }
}

/// The consumer: copies each frame out; returns the frames it took and the sum of their last
/// bytes (read from the copies, so no copy can be left out).
fn consume(
    ring: &Region,
    slot: usize,
    stop: &AtomicBool,
    count: &AtomicU64,
    size: usize,
) -> (u64, u64) {
    let mut buf = vec![0u8; slot];
    let (mut head, mut tail) = (0u64, 0u64);
    let mut sum = 0u64;
    while !stop.load(Relaxed) {
        if tail == head {
            // Acquire: pairs with the producer's Release; its frames are written before.
            head = ring.u64(HEAD).load(Acquire);
            if tail == head {
                std::hint::spin_loop();
                continue;
            }
        }
        let n = (head - tail).min(BURST as u64);
        for i in 0..n {
            let at = DATA + ((tail + i) as usize % SLOTS) * slot;
            ring.read_bytes(at, &mut buf[..size])
                .expect("slots lie inside the ring");
            sum = sum.wrapping_add(u64::from(buf[size - 1]));
        }
        tail += n;
        // Release: pairs with the producer's Acquire; the frames were read before the slots
        // are handed back.
        ring.u64(TAIL).store(tail, Release);
        // Relaxed: a counter the bench samples.
        count.store(tail, Relaxed);
    }
    (tail, sum)
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
        let rates = run(&[pair], 2, 64, 3, Instant::now()).unwrap();
        assert!(!rates.is_empty(), "no window in 3 s");
        assert!(rates.iter().all(|&r| r > 1e5), "{rates:?}");
        assert!(
            run(&[pair], 1, 4088, 3, Instant::now()).is_ok(),
            "a jumbo frame"
        );
        // Two rings side by side (a scaling run's x2), their counts summed.
        let two = run(&[pair, (pair.1, pair.0)], 2, 64, 3, Instant::now()).unwrap();
        assert!(!two.is_empty() && two.iter().all(|&r| r > 1e5), "{two:?}");
        let w = window(
            pair,
            2,
            64,
            Duration::from_millis(50),
            Duration::from_millis(300),
        );
        assert!(w.unwrap() > 1e5, "one window of the probe counts frames");
        assert!(run(&[pair], 1, MAX_FRAME + 1, 3, Instant::now())
            .unwrap_err()
            .contains("takes frames of 1 to"));
    }
}
