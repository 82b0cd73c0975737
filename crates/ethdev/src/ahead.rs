//! Whether a transmit queue asks for its peer's buffer lines ahead of its copy in shared
//! state instead of exclusive, decided by trying both ways while traffic runs
//! ([`AheadTuner`]).
//!
//! A sender that asks for the next frames' destination lines before it writes them (memif's
//! write-ahead) can ask for ownership (`prefetchw`: the line leaves the peer's cache at once,
//! and the store finds it ours) or for a copy (`prefetcht0`: the peer keeps the line until the
//! store takes it). Which moves more frames depends on the peer's receive, which the sender
//! cannot see: on the Intel Xeon host of sessions 44-45, into a receiver that prefetches the
//! buffers ahead of its copy (ours) ownership won at 256 B by 1.06-1.15x and at 1518 B by
//! 1.06-1.12x, and into one that does not (DPDK's memif receive) a copy won by 1.10-1.18x at
//! 64 to 512 B and into DPDK's server at 1518 B, and was level into its client at 1518 B
//! (in-process flip of 250-ms windows, the sender counted).
//!
//! The difference between the ways grows over tens of milliseconds after a change (a copy into
//! DPDK's server at 1518 B: 0.91 in 2-ms windows, 1.33 in 250-ms ones), so these trials are
//! long and must win twice in a row ([`AHEAD_TRIALS`]); a queue whose ways move the same keeps
//! the way it has (at first: ownership, what the write-ahead did before the tuner).

use std::time::Duration;

use crate::tuner::{Counted, Mode, Trials, Tuner};
use crate::QueueStats;

/// What a transmit queue does about asking in shared state (memif's `tx-ahead-shared`
/// devarg: `on` always, `off` never, `auto` tuned).
pub type AheadMode = Mode;

/// How the write-ahead's way is tried: windows of 32 ms, taken after two wins in a row, every
/// half second, the cycle doubling with each lost trial up to 4 s (a trial the other way costs
/// up to a quarter of its window's frames, exclusive into DPDK's server at 1518 B being 1/1.34
/// of shared, and its way takes a while to settle again). The back-off against a fixed 512-ms
/// cycle, whole 10-s runs alternating: into DPDK's server at 1518 B (where shared wins and the
/// trials of ownership lose) 1.00, 1.02, 1.04, 0.98, 1.08, 1.02 run by run (6.19 -> 6.35 Mpps
/// mean); into ours at 1518 B (trials of shared lose) level, 8.63 -> 8.48 over five runs that
/// swung 7.4-9.1, the trials' share of frames 5.7% -> 1.2%. Cycles of multiples of 64 ms keep
/// the trial in the middle of the stream tuner's 64-ms cycles, so neither tuner's windows
/// straddle the other's change of way. Tried in session 45 (the share of frames asked for in
/// shared state over 8-s runs, our memif client into DPDK's server): 64-ms cycles with 2-ms
/// windows and three wins in a row took shared at 512 B (77%) but not at 1518 B (34%, 81%, 47%
/// in three runs, with 3 to 8 switches each); 256-ms cycles of 16-ms windows switched once at
/// 1518 B, but 4 s in. Fixed 512-ms cycles of these windows took shared at 512 and 1518 B
/// within one to five seconds (47-88% of each 10-s run, one switch) and stayed with ownership
/// into our receivers (5-7%: the trials' share) but for one run of ten, in the machine's slow
/// state (our server <- our client at 1518 B, three switches).
pub const AHEAD_TRIALS: Trials = Trials {
    cycle: Duration::from_millis(512),
    longest_cycle: Duration::from_millis(4096),
    window: Duration::from_millis(32),
    votes: 2,
    offset: Duration::from_millis(400),
    margin: crate::tuner::MARGIN,
};

/// One tx queue's choice how to ask for its peer's buffer lines ahead, and the frames whose
/// lines it asked for in shared state.
#[derive(Debug)]
pub struct AheadTuner(Counted);

impl Default for AheadTuner {
    fn default() -> Self {
        AheadTuner::new(AheadMode::Auto)
    }
}

impl AheadTuner {
    pub fn new(mode: AheadMode) -> AheadTuner {
        AheadTuner(Counted::new(Tuner::with_trials(mode, AHEAD_TRIALS)))
    }

    /// Whether this burst asks for its lines in shared state.
    #[inline(always)]
    pub fn shared(&self) -> bool {
        self.0.on()
    }

    /// Counts a burst (empty ones too) that sent `frames`, asked for in shared state if
    /// [`AheadTuner::shared`] said so when it began.
    #[inline(always)]
    pub fn polled(&mut self, frames: u16) {
        self.0.polled_all(frames);
    }

    /// Puts the tuner's statistics into the queue's counters (`shared_ahead`,
    /// `ahead_switches`).
    #[inline(always)]
    pub fn record(&self, stats: &mut QueueStats) {
        (stats.shared_ahead, stats.ahead_switches) = self.0.counts();
    }
}

/// A port's extended counters for its transmit queues' write-ahead, summed over `tx` (each
/// queue's counters): frames whose lines were asked for in shared state, and changes of way.
pub fn xstats(tx: impl IntoIterator<Item = QueueStats>) -> [(&'static str, u64); 2] {
    crate::tuner::xstats_pair(
        tx,
        |q| (q.shared_ahead, q.ahead_switches),
        ["tx_shared_ahead_packets", "tx_ahead_switches"],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_was_asked_for_shared_and_sums_the_queues() {
        for (mode, shared) in [(AheadMode::On, true), (AheadMode::Off, false)] {
            let mut t = AheadTuner::new(mode);
            assert_eq!(t.shared(), shared);
            t.polled(32);
            t.polled(0);
            t.polled(8);
            let mut stats = QueueStats::default();
            t.record(&mut stats);
            let want = if shared { 40 } else { 0 };
            assert_eq!((stats.shared_ahead, stats.ahead_switches), (want, 0));
            let other = QueueStats {
                shared_ahead: 8,
                ahead_switches: 3,
                ..Default::default()
            };
            assert_eq!(
                xstats([stats, other]),
                [
                    ("tx_shared_ahead_packets", want + 8),
                    ("tx_ahead_switches", 3)
                ]
            );
        }
        assert!(
            !AheadTuner::default().shared(),
            "auto starts with ownership"
        );
    }
}
