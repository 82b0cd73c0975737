//! Whether a transmit queue pushes the first lines of the frames it wrote with plain stores
//! out of its core's caches to the cache the cores share, decided by trying both ways while
//! traffic runs ([`DemoteTuner`]).
//!
//! A frame written with plain stores sits in the writer's core until the peer reads it, and
//! that read fetches each line from the writer's core. After a CLDEMOTE
//! (`memnic_shm::VolatileSlice::demote_lines`) the read finds the line in the shared cache
//! instead. A receive that waits on each line in turn (DPDK's memif receive, which does not
//! prefetch) gains; one that asks for its buffers far ahead (ours) gains nothing and the
//! writer pays for each demoted line. On the Intel Xeon host of session 50 (CLDEMOTE, 2
//! vCPUs; in-process flip of 250-ms windows, the sender counted, demoted / plain p20/p50/p80),
//! whole frames:
//!
//! ```text
//!                                      64 B            128 B           256 B
//!   our server -> DPDK's client (S2C)  1.14/1.17/1.20  1.14/1.16/1.21  1.03/1.05/1.07
//!   our client -> DPDK's server (C2S)  1.16/1.17/1.19  1.25/1.27/1.29  1.13/1.34/1.37
//!   our server -> our client           0.96/1.00/1.02  0.94/0.96/0.98  0.56/0.57/0.58
//!   our client -> our server           0.83/0.85/0.86  0.86/0.87/0.90  0.64/0.65/0.66
//! ```
//!
//! and at 512 and 1518 B whole frames lost into either (0.43-0.77 at p50), but their first
//! lines won into DPDK's (the receive's first misses of a frame; its hardware prefetcher
//! covers the rest). First 256 B: our server -> DPDK's client 512 B 1.04/1.06/1.09, 1024 B
//! 1.05/1.07/1.11, 1518 B 0.98/1.00/1.22 and 1.07/1.11/1.12; our client -> DPDK's server
//! 512 B 1.00/1.01/1.06, 1518 B 1.12/1.16/1.18; into ours 1518 B 0.86/0.87/0.88 (S2C) and
//! 0.92/0.94/0.96 (C2S). First 64 B: 1518 B into DPDK's client 1.01/1.03/1.05; first 512 B
//! 1.03/1.06/1.07 there, 1024 B 0.99/1.01/1.03, into DPDK's server 1518 B 0.98/1.01/1.03.
//! So the way tried is the first [`DEMOTE_BYTES`] of every frame written with plain stores
//! ([`crate::tuner::Tuner`]; at first: none demoted). Where the CPU has no CLDEMOTE both ways
//! are the same, and the queue keeps the way it has.

use std::time::Duration;

use crate::tuner::{Counted, Mode, Trials, Tuner};
use crate::QueueStats;

/// What a transmit queue does about demoting (memif's `tx-demote` devarg).
pub type DemoteMode = Mode;

/// How many of each frame's first bytes a transmit queue demotes while its tuner says so.
pub const DEMOTE_BYTES: usize = 256;

/// How demoting is tried: as the write-ahead's way ([`crate::ahead::AHEAD_TRIALS`]: 32-ms
/// windows, two wins in a row, every 512 ms, the wait doubling after each lost trial up to
/// 4 s), but in another part of the cycle. The gain builds up over a ring's worth of frames
/// (the peer reads what was written a ring ago): with the stream tuner's 1-ms windows every
/// 64 ms, our server into DPDK's client at 1518 B demoted 1% of its frames (its trials)
/// where demoting all of them moved 6.48 Mpps against 5.65 (whole 10-s runs).
pub const DEMOTE_TRIALS: Trials = Trials {
    cycle: Duration::from_millis(512),
    longest_cycle: Duration::from_millis(4096),
    window: Duration::from_millis(32),
    votes: 2,
    offset: Duration::from_millis(144),
    margin: DEMOTE_MARGIN,
};

/// How much more demoted frames must move in a trial than plain ones around it: 3%, not the
/// 5% of [`crate::tuner::MARGIN`]. Where the gain is real it can be small: our server into
/// DPDK's client at 64 B (session 51, Intel Xeon host), demoted / plain in an in-process flip
/// 1.02/1.04/1.09 (32-ms windows, p20/p50/p80) and 1.00/1.02/1.04 (250 ms); the tuner's
/// trials found +1.9 to +6.5% over the windows around them (12 trials in two runs, 8 of them
/// above +3.9%), its wins past 5% never two in a row, and it kept its frames plain (2%
/// demoted: the trials). With 3% it took the way in that sitting's runs; into our own
/// receivers, where demoting loses or is level, four 5-s runs each way at 64 B demoted 1.4-1.7%
/// of their frames (the trials) and switched never. The two wins in a row
/// ([`DEMOTE_TRIALS`]) keep the noise out: the windows around a trial differ by 0.4-2.4%.
pub const DEMOTE_MARGIN: f64 = 0.03;

/// One tx queue's choice whether to demote its frames' first lines, and the frames it demoted.
#[derive(Debug)]
pub struct DemoteTuner(Counted);

impl Default for DemoteTuner {
    fn default() -> Self {
        DemoteTuner::new(DemoteMode::Auto)
    }
}

impl DemoteTuner {
    pub fn new(mode: DemoteMode) -> DemoteTuner {
        DemoteTuner(Counted::new(Tuner::with_trials(mode, DEMOTE_TRIALS)))
    }

    /// How many of each frame's first bytes this burst demotes: [`DEMOTE_BYTES`] while the
    /// tuner says so, else 0.
    #[inline(always)]
    pub fn demote_bytes(&self) -> usize {
        if self.0.on() {
            DEMOTE_BYTES
        } else {
            0
        }
    }

    /// Counts a burst (empty ones too) that sent `frames`, `demoted` of them demoted.
    #[inline(always)]
    pub fn polled(&mut self, frames: u16, demoted: u32) {
        self.0.polled(frames, demoted);
    }

    /// Puts the tuner's statistics into the queue's counters (`demoted`, `demote_switches`).
    #[inline(always)]
    pub fn record(&self, stats: &mut QueueStats) {
        (stats.demoted, stats.demote_switches) = self.0.counts();
    }
}

/// A port's extended counters for its transmit queues' demoting, summed over `tx` (each
/// queue's counters): frames demoted, and changes of way.
pub fn xstats(tx: impl IntoIterator<Item = QueueStats>) -> [(&'static str, u64); 2] {
    crate::tuner::xstats_pair(
        tx,
        |q| (q.demoted, q.demote_switches),
        ["tx_demoted_packets", "tx_demote_switches"],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_was_demoted_and_sums_the_queues() {
        for (mode, bytes) in [(DemoteMode::On, DEMOTE_BYTES), (DemoteMode::Off, 0)] {
            let mut t = DemoteTuner::new(mode);
            assert_eq!(t.demote_bytes(), bytes);
            t.polled(32, 20);
            t.polled(0, 0);
            t.polled(32, 12);
            let mut stats = QueueStats::default();
            t.record(&mut stats);
            assert_eq!((stats.demoted, stats.demote_switches), (32, 0), "{mode}");
            let other = QueueStats {
                demoted: 8,
                demote_switches: 3,
                ..Default::default()
            };
            assert_eq!(
                xstats([stats, other]),
                [("tx_demoted_packets", 40), ("tx_demote_switches", 3)]
            );
        }
        assert_eq!(
            DemoteTuner::default().demote_bytes(),
            0,
            "auto starts without"
        );
    }
}
