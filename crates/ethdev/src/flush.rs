//! Whether a receive queue flushes the lines it has copied out of its peer's buffers from our
//! caches, decided by trying both ways while traffic runs ([`FlushTuner`]).
//!
//! A peer that writes its next frame into a buffer we have just read (DPDK's `txonly` takes its
//! mbufs back last-in first-out and rewrites their first lines; a memif sender rewrites a slot's
//! buffer each lap of the ring) must first take those lines back from our core. Where our core
//! is far from the peer's (this machine's slow state), a line comes sooner from memory than
//! from us, and a CLFLUSHOPT after the copy (`memnic_shm::VolatileSlice::flush_lines`)
//! doubled the rate there; where the cores are near (the fast state), the same flush sends to
//! memory a line the peer could have had from a shared cache, and it wins or loses by the
//! peer and the size (each driver's figures are with its use of the tuner).
//!
//! Neither side can see which state holds, and it changes every few seconds, so each queue
//! tries both ways while traffic runs and keeps the one that moves more frames
//! ([`crate::tuner::Tuner`]). A peer whose buffers are not written again soon shows no
//! difference, and the queue keeps the way it has (at first: no flush).

use crate::tuner::{Counted, Mode, Tuner};
use crate::QueueStats;

/// What a receive queue does about flushing (the drivers' `rx_flush`/`rx-flush` devarg).
pub type FlushMode = Mode;

/// One rx queue's choice whether to flush, and the frames it flushed.
#[derive(Debug, Default)]
pub struct FlushTuner(Counted);

impl FlushTuner {
    pub fn new(mode: FlushMode) -> FlushTuner {
        FlushTuner(Counted::new(Tuner::new(mode)))
    }

    /// Whether this poll's frames are flushed once copied.
    #[inline(always)]
    pub fn flush(&self) -> bool {
        self.0.on()
    }

    /// Puts the tuner's statistics into the queue's counters (`tuned`: the frames flushed;
    /// `tuner_switches`).
    #[inline(always)]
    pub fn record(&self, stats: &mut QueueStats) {
        (stats.tuned, stats.tuner_switches) = self.0.counts();
    }

    /// Counts a poll (empty ones too) and the `frames` it took, which were flushed if
    /// [`FlushTuner::flush`] said so when it began.
    #[inline(always)]
    pub fn polled(&mut self, frames: u16) {
        self.0.polled_all(frames);
    }
}

/// A port's extended counters for its receive queues' flushing, summed over `rx` (each
/// queue's counters): frames flushed, and changes of way.
pub fn xstats(rx: impl IntoIterator<Item = QueueStats>) -> [(&'static str, u64); 2] {
    crate::tuner::xstats_pair(
        rx,
        |q| (q.tuned, q.tuner_switches),
        ["rx_flushed_packets", "rx_flush_switches"],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuner::CYCLE;
    use std::time::Instant;

    #[test]
    fn on_and_off_count_every_frame_flushed_or_none() {
        for (mode, flush) in [(FlushMode::On, true), (FlushMode::Off, false)] {
            let mut t = FlushTuner::new(mode);
            let end = Instant::now() + CYCLE * 2;
            let mut polls = 0;
            while Instant::now() < end {
                t.polled(32);
                polls += 1;
                assert_eq!(t.flush(), flush, "{mode}");
            }
            let mut stats = QueueStats::default();
            t.record(&mut stats);
            assert_eq!(stats.tuned, if flush { 32 * polls } else { 0 }, "{mode}");
            assert_eq!(stats.tuner_switches, 0);
            assert_eq!(
                xstats([stats, stats]),
                [
                    ("rx_flushed_packets", 2 * stats.tuned),
                    ("rx_flush_switches", 0)
                ]
            );
        }
    }
}
