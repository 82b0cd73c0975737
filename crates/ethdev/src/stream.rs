//! Whether a transmit queue writes short frames into its peer's buffers with streaming stores,
//! decided by trying both ways while traffic runs ([`StreamTuner`]).
//!
//! The peer read each buffer last (it copied the frame out), so a plain store first takes the
//! line back from the peer's core. A streaming store takes nothing: the line goes to memory,
//! and the peer's next read of it misses there. Which costs less depends on the machine and on
//! the peer: on the AMD EPYC host of the early sessions, in its slow state, the plain store's
//! wait was most of a short frame's cost (streaming: memif 64 B 2.86x); on the Intel Xeon host
//! of session 38 a reader that does not prefetch (DPDK's memif receive) waited on memory
//! instead, and plain stores were faster (our memif client into DPDK's server, 64 B: 1.05-1.11x
//! of DPDK's own pair plain, 0.71-0.76x streamed). Neither side can see which holds, so each
//! queue tries both ways ([`crate::tuner::Tuner`]; at first: plain stores). A transmit queue
//! measures what its peer takes: once the ring is full it sends only as fast as the peer
//! frees slots.

use crate::tuner::{Counted, Mode, Tuner};
use crate::QueueStats;

/// What a transmit queue does about streaming (the drivers' `tx-stream` devarg).
pub type StreamMode = Mode;

/// One tx queue's choice whether to stream its short frames, and the frames it streamed.
#[derive(Debug, Default)]
pub struct StreamTuner(Counted);

impl StreamTuner {
    pub fn new(mode: StreamMode) -> StreamTuner {
        StreamTuner(Counted::new(Tuner::new(mode)))
    }

    /// Whether this burst writes its short frames with streaming stores.
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.0.on()
    }

    /// Counts a burst (empty ones too) that sent `frames`, `streamed` of them with streaming
    /// stores.
    #[inline(always)]
    pub fn polled(&mut self, frames: u16, streamed: u32) {
        self.0.polled(frames, streamed);
    }

    /// Puts the tuner's statistics into the queue's counters (`tuned`: the frames streamed;
    /// `tuner_switches`).
    #[inline(always)]
    pub fn record(&self, stats: &mut QueueStats) {
        (stats.tuned, stats.tuner_switches) = self.0.counts();
    }
}

/// A port's extended counters for its transmit queues' streaming, summed over `tx` (each
/// queue's counters): frames streamed, and changes of way.
pub fn xstats(tx: impl IntoIterator<Item = QueueStats>) -> [(&'static str, u64); 2] {
    crate::tuner::xstats_pair(
        tx,
        |q| (q.tuned, q.tuner_switches),
        ["tx_streamed_packets", "tx_stream_switches"],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_was_streamed_and_sums_the_queues() {
        for (mode, on) in [(StreamMode::On, true), (StreamMode::Off, false)] {
            let mut t = StreamTuner::new(mode);
            assert_eq!(t.on(), on);
            t.polled(32, 20);
            t.polled(0, 0);
            t.polled(32, 12);
            let mut stats = QueueStats::default();
            t.record(&mut stats);
            assert_eq!((stats.tuned, stats.tuner_switches), (32, 0), "{mode}");
            let other = QueueStats {
                tuned: 8,
                tuner_switches: 3,
                ..Default::default()
            };
            assert_eq!(
                xstats([stats, other]),
                [("tx_streamed_packets", 40), ("tx_stream_switches", 3)]
            );
        }
        assert!(
            !StreamTuner::default().on(),
            "auto starts with plain stores"
        );
    }
}
