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
//! measures: every [`CYCLE`] it runs one [`WINDOW`] the other way between two windows its own
//! way, and changes its way when the other moved [`MARGIN`] more frames than the mean of the
//! two around it. A peer whose buffers are not written again soon shows no difference, and the
//! queue keeps the way it has (at first: no flush).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::QueueStats;

/// What a receive queue does about flushing (the drivers' `rx_flush`/`rx-flush` devarg).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlushMode {
    /// Try both ways while traffic runs and keep the one that moves more frames.
    #[default]
    Auto,
    /// Always flush.
    On,
    /// Never flush.
    Off,
}

impl FromStr for FlushMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(FlushMode::Auto),
            "on" | "1" | "yes" => Ok(FlushMode::On),
            "off" | "0" | "no" => Ok(FlushMode::Off),
            _ => Err("expected auto, on or off".into()),
        }
    }
}

impl fmt::Display for FlushMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlushMode::Auto => "auto",
            FlushMode::On => "on",
            FlushMode::Off => "off",
        })
    }
}

/// How often the queue tries the other way.
pub const CYCLE: Duration = Duration::from_millis(64);
/// How long each of the three windows of a trial lasts (the rest of the cycle keeps the
/// current way). At 5 Mpps a window counts 5,000 frames.
pub const WINDOW: Duration = Duration::from_millis(1);
/// How much more the other way must move (over the mean of the windows around its own) to
/// be taken.
pub const MARGIN: f64 = 0.05;
/// A trial whose window moved fewer frames than this says nothing (a quiet ring: neither
/// way matters).
pub const MIN_FRAMES: u64 = 500;
/// Polls between two looks at the clock (an idle poll costs tens of ns, a clock read ~25).
const CHECK_EVERY: u32 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The current way, until the cycle's trial starts.
    Steady,
    /// The current way, counted.
    Before,
    /// The other way, counted.
    Trial,
    /// The current way again, counted.
    After,
}

/// One rx queue's choice, and the trial under way.
#[derive(Debug)]
pub struct FlushTuner {
    /// Whether trials run ([`FlushMode::Auto`]).
    auto: bool,
    flush: bool,
    phase: Phase,
    since: Option<Instant>,
    frames: u64,
    polls: u32,
    /// Frames per second of the window before the trial, and of the trial.
    before: f64,
    trial: f64,
    /// Times the queue changed its way, and frames taken while it flushed (statistics).
    switches: u64,
    flushed: u64,
}

impl Default for FlushTuner {
    fn default() -> Self {
        FlushTuner::new(FlushMode::Auto)
    }
}

impl FlushTuner {
    pub fn new(mode: FlushMode) -> FlushTuner {
        FlushTuner {
            auto: mode == FlushMode::Auto,
            flush: mode == FlushMode::On,
            phase: Phase::Steady,
            since: None,
            frames: 0,
            polls: 0,
            before: 0.0,
            trial: 0.0,
            switches: 0,
            flushed: 0,
        }
    }

    /// Whether this poll's frames are flushed once copied.
    #[inline(always)]
    pub fn flush(&self) -> bool {
        self.flush
    }

    /// How many times the queue changed its way.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// Puts the tuner's statistics into the queue's counters (`flushed`, `flush_switches`).
    #[inline(always)]
    pub fn record(&self, stats: &mut QueueStats) {
        stats.flushed = self.flushed;
        stats.flush_switches = self.switches;
    }

    /// Counts a poll (empty ones too: the clock is read every few polls) and the `frames` it
    /// took, which were flushed if [`FlushTuner::flush`] said so when it began.
    #[inline(always)]
    pub fn polled(&mut self, frames: u16) {
        if self.flush {
            self.flushed += u64::from(frames);
        }
        self.frames += u64::from(frames);
        self.polls += 1;
        if self.auto && self.polls >= CHECK_EVERY {
            self.polls = 0;
            self.tick(Instant::now());
        }
    }

    /// Moves the trial on when its phase is over at `now`.
    #[inline(never)]
    pub fn tick(&mut self, now: Instant) {
        let Some(since) = self.since else {
            self.since = Some(now);
            self.frames = 0;
            return;
        };
        let took = now.saturating_duration_since(since);
        let length = match self.phase {
            Phase::Steady => CYCLE.saturating_sub(WINDOW * 3),
            _ => WINDOW,
        };
        if took < length {
            return;
        }
        // A window overruns by up to a few polls: a rate, not a count, is compared.
        let rate = self.frames as f64 / took.as_secs_f64();
        let enough = self.frames >= MIN_FRAMES;
        self.phase = match self.phase {
            Phase::Steady => Phase::Before,
            Phase::Before => {
                self.before = if enough { rate } else { f64::NAN };
                self.flush = !self.flush;
                Phase::Trial
            }
            Phase::Trial => {
                self.trial = if enough { rate } else { f64::NAN };
                self.flush = !self.flush;
                Phase::After
            }
            Phase::After => {
                let own = (self.before + rate) / 2.0;
                // NaN (a quiet window) compares false: the way stays.
                if enough && self.trial > own * (1.0 + MARGIN) {
                    self.flush = !self.flush;
                    self.switches += 1;
                }
                Phase::Steady
            }
        };
        self.since = Some(now);
        self.frames = 0;
    }
}

/// A port's extended counters for its receive queues' flushing, summed over `rx` (each
/// queue's counters): frames flushed, and changes of way.
pub fn xstats(rx: impl IntoIterator<Item = QueueStats>) -> [(&'static str, u64); 2] {
    let (mut flushed, mut switches) = (0, 0);
    for q in rx {
        flushed += q.flushed;
        switches += q.flush_switches;
    }
    [
        ("rx_flushed_packets", flushed),
        ("rx_flush_switches", switches),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the tuner for `ms` milliseconds of a ring whose frontend sends `with` frames per
    /// millisecond while we flush and `without` while we do not, polled every 10 us (clock
    /// read at every tick: the test drives `tick` itself). Returns the share of the time
    /// spent flushing in the last half.
    fn run(t: &mut FlushTuner, start: &mut Instant, ms: u64, with: u64, without: u64) -> f64 {
        let mut flushing = 0u64;
        let steps = ms * 100;
        for i in 0..steps {
            let per_ms = if t.flush() { with } else { without };
            // 10 us of frames, added as whole frames on average.
            t.frames += per_ms / 100;
            *start += Duration::from_micros(10);
            t.tick(*start);
            if i >= steps / 2 && t.flush() {
                flushing += 1;
            }
        }
        flushing as f64 / (steps - steps / 2) as f64
    }

    #[test]
    fn takes_the_way_that_moves_more_frames_and_follows_a_change() {
        let mut t = FlushTuner::default();
        let mut now = Instant::now();
        // Flushing doubles the rate (the slow state): the queue flushes but for its trials.
        let share = run(&mut t, &mut now, 1000, 10_000, 5_000);
        assert!(share > 0.9, "flushing {share} of the time");
        assert_eq!(t.switches(), 1);
        // Now flushing costs 20%: it stops.
        let share = run(&mut t, &mut now, 1000, 14_000, 17_500);
        assert!(share < 0.1, "flushing {share} of the time");
        assert_eq!(t.switches(), 2);
    }

    #[test]
    fn keeps_its_way_when_both_move_the_same_or_the_ring_is_quiet() {
        let mut t = FlushTuner::default();
        let mut now = Instant::now();
        let share = run(&mut t, &mut now, 2000, 10_000, 10_200);
        assert!(share < 0.1, "flushing {share} of the time");
        // A gain below the margin is not taken either.
        let share = run(&mut t, &mut now, 2000, 10_300, 10_000);
        assert!(share < 0.1, "flushing {share} of the time");
        // Too few frames to judge, though flushing would double them.
        let share = run(&mut t, &mut now, 2000, 200, 100);
        assert!(share < 0.1, "flushing {share} of the time");
        assert_eq!(t.switches(), 0);
    }

    #[test]
    fn on_and_off_never_try_the_other_way() {
        for (mode, flush) in [(FlushMode::On, true), (FlushMode::Off, false)] {
            let mut t = FlushTuner::new(mode);
            let end = Instant::now() + CYCLE * 2;
            let mut polls = 0;
            while Instant::now() < end {
                t.polled(32);
                polls += 1;
                assert_eq!(t.flush(), flush, "{mode}");
            }
            // Every frame counted as flushed, or none.
            let mut stats = QueueStats::default();
            t.record(&mut stats);
            assert_eq!(stats.flushed, if flush { 32 * polls } else { 0 }, "{mode}");
            assert_eq!(stats.flush_switches, 0);
            assert_eq!(
                xstats([stats, stats]),
                [
                    ("rx_flushed_packets", 2 * stats.flushed),
                    ("rx_flush_switches", 0)
                ]
            );
        }
        assert_eq!("auto".parse(), Ok(FlushMode::Auto));
        assert_eq!("on".parse(), Ok(FlushMode::On));
        assert_eq!("0".parse(), Ok(FlushMode::Off));
        assert_eq!(
            "sometimes".parse::<FlushMode>(),
            Err("expected auto, on or off".to_string())
        );
    }

    #[test]
    fn polls_read_the_clock_and_run_trials() {
        let mut t = FlushTuner::default();
        let end = Instant::now() + CYCLE * 3;
        let mut tried = false;
        while Instant::now() < end {
            t.polled(32);
            tried |= t.flush();
        }
        // Every cycle tries the other way for a window.
        assert!(tried);
    }
}
