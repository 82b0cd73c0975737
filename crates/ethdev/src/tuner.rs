//! A queue's choice between two ways of doing its work, made by trying the other way while
//! traffic runs ([`Tuner`]).
//!
//! Some choices depend on where the peer's core is from ours and what the peer does with the
//! lines we touch, which neither side can see and which changes every few seconds on a shared
//! machine: whether a receive queue flushes the lines it copied ([`crate::flush`]), whether a
//! vhost queue writes short frames into the guest's buffers with streaming stores. So each
//! queue measures: every [`CYCLE`] it runs one [`WINDOW`] the other way between two windows its
//! own way, and changes its way when the other moved [`MARGIN`] more frames than the mean of
//! the two around it. A queue for which both ways move the same keeps the way it has (at
//! first: off).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// What a queue does about a tuned choice (a driver's devarg: `auto`, `on` or `off`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Try both ways while traffic runs and keep the one that moves more frames.
    #[default]
    Auto,
    /// Always the other way.
    On,
    /// Never.
    Off,
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Mode::Auto),
            "on" | "1" | "yes" => Ok(Mode::On),
            "off" | "0" | "no" => Ok(Mode::Off),
            _ => Err("expected auto, on or off".into()),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Auto => "auto",
            Mode::On => "on",
            Mode::Off => "off",
        })
    }
}

/// How often the queue tries the other way.
pub const CYCLE: Duration = Duration::from_millis(64);
/// How long each of the three windows of a trial lasts by default (the rest of the cycle
/// keeps the current way). At 5 Mpps a window counts 5,000 frames.
pub const WINDOW: Duration = Duration::from_millis(1);
/// How much more the other way must move (over the mean of the windows around its own) to
/// be taken, unless a choice's trials say otherwise ([`Trials::margin`]).
pub const MARGIN: f64 = 0.05;
/// A trial whose window moved fewer frames than this says nothing (a quiet ring: neither
/// way matters).
pub const MIN_FRAMES: u64 = 500;
/// A gap this long between two looks at the clock is a pause in the traffic (a forwarding
/// loop stopped: testpmd between its `stop` and its next `start`), not polling, which looks
/// every [`CHECK_EVERY`] polls, microseconds apart; an idle ring is still polled.
pub const PAUSE: Duration = Duration::from_millis(50);
/// Polls between two looks at the clock (an idle poll costs tens of ns, a clock read ~25).
const CHECK_EVERY: u32 = 16;

/// How a tuner runs its trials. [`Trials::ONE_WINDOW`] suits a choice whose effect shows
/// within a millisecond and is large against the noise of one window; a choice whose windows
/// differ by less than their noise wants longer windows and several wins in a row
/// ([`Trials::votes`]), and a second tuner of the same queue its trials away from the
/// first's ([`Trials::offset`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Trials {
    /// How often the queue tries the other way, at first and after a trial it won.
    pub cycle: Duration,
    /// How far the cycle stretches while trials lose: each lost trial doubles it up to this
    /// (the same as `cycle`: never), and a won one brings it back.
    pub longest_cycle: Duration,
    /// How long each of the three windows of a trial lasts.
    pub window: Duration,
    /// Trials in a row the other way must win before the queue takes it.
    pub votes: u32,
    /// How far into each cycle (from the queue's first poll) the trial starts.
    pub offset: Duration,
    /// How much more the other way must move than the mean of the windows around it for the
    /// trial to win ([`MARGIN`] unless the choice's module says why not).
    pub margin: f64,
}

impl Trials {
    /// One trial of [`WINDOW`]s at the end of each cycle decides.
    pub const ONE_WINDOW: Trials = Trials {
        cycle: CYCLE,
        longest_cycle: CYCLE,
        window: WINDOW,
        votes: 1,
        offset: CYCLE.saturating_sub(WINDOW.saturating_mul(3)),
        margin: MARGIN,
    };
}

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

/// One queue's choice, and the trial under way.
#[derive(Debug)]
pub struct Tuner {
    /// Whether trials run ([`Mode::Auto`]).
    auto: bool,
    trials: Trials,
    /// The cycle now (see [`Trials::longest_cycle`]).
    cycle: Duration,
    /// Trials in a row the other way has won.
    wins: u32,
    on: bool,
    phase: Phase,
    since: Option<Instant>,
    /// The last look at the clock (see [`PAUSE`]).
    last_tick: Option<Instant>,
    frames: u64,
    polls: u32,
    /// Frames per second of the window before the trial, and of the trial.
    before: f64,
    trial: f64,
    /// Times the queue changed its way.
    switches: u64,
}

impl Default for Tuner {
    fn default() -> Self {
        Tuner::new(Mode::Auto)
    }
}

impl Tuner {
    pub fn new(mode: Mode) -> Tuner {
        Tuner::with_trials(mode, Trials::ONE_WINDOW)
    }

    pub fn with_trials(mode: Mode, trials: Trials) -> Tuner {
        Tuner {
            auto: mode == Mode::Auto,
            trials,
            cycle: trials.cycle,
            wins: 0,
            on: mode == Mode::On,
            phase: Phase::Steady,
            since: None,
            last_tick: None,
            frames: 0,
            polls: 0,
            before: 0.0,
            trial: 0.0,
            switches: 0,
        }
    }

    /// Whether this poll goes the other way (flushes, streams: the user's meaning).
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.on
    }

    /// How many times the queue changed its way.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// Counts a poll (empty ones too: the clock is read every few polls) and the `frames` it
    /// moved.
    #[inline(always)]
    pub fn polled(&mut self, frames: u16) {
        if !self.auto {
            return;
        }
        self.frames += u64::from(frames);
        self.polls += 1;
        if self.polls >= CHECK_EVERY {
            self.polls = 0;
            self.tick(Instant::now());
        }
    }

    /// When the steady part that starts at `now` (the first poll, or the first after a pause)
    /// would have begun for the trial to open at the offset: its clock starts that much
    /// earlier.
    fn steady_from(&self, now: Instant) -> Instant {
        let back = (self.cycle).saturating_sub(self.trials.offset + self.trials.window * 3);
        now.checked_sub(back).unwrap_or(now)
    }

    /// Moves the trial on when its phase is over at `now`.
    #[inline(never)]
    pub fn tick(&mut self, now: Instant) {
        let Some(since) = self.since else {
            self.since = Some(self.steady_from(now));
            self.frames = 0;
            return;
        };
        let paused = self
            .last_tick
            .is_some_and(|last| now.saturating_duration_since(last) > PAUSE);
        self.last_tick = Some(now);
        if paused {
            // Traffic stopped and started again: the cycle starts over as at the first poll,
            // its trial at the offset, once the rings have settled (the first windows after a
            // restart measure the sender filling the ring or the receiver catching up, and a
            // trial among them won or lost by that), and away from the trials of the queue's
            // other tuners, which restart with it. What the pause cut short says nothing: the
            // run of wins and the cycle stay as they were.
            if self.phase == Phase::Trial {
                self.on = !self.on;
            }
            self.phase = Phase::Steady;
            self.since = Some(self.steady_from(now));
            self.frames = 0;
            return;
        }
        let took = now.saturating_duration_since(since);
        let window = self.trials.window;
        let length = match self.phase {
            Phase::Steady => self.cycle.saturating_sub(window * 3),
            _ => window,
        };
        if took < length {
            return;
        }
        // A window overruns by up to a few polls: a rate, not a count, is compared. One
        // that ran on for twice its length had a pause in it (no polls while traffic stopped:
        // a forwarding loop sends nothing when it received nothing), and its rate is the
        // pause's, not the way's: it says nothing, as a quiet window.
        let rate = self.frames as f64 / took.as_secs_f64();
        let enough = self.frames >= MIN_FRAMES && took <= length * 2;
        self.phase = match self.phase {
            Phase::Steady => Phase::Before,
            Phase::Before => {
                self.before = if enough { rate } else { f64::NAN };
                self.on = !self.on;
                Phase::Trial
            }
            Phase::Trial => {
                self.trial = if enough { rate } else { f64::NAN };
                self.on = !self.on;
                Phase::After
            }
            Phase::After => {
                let own = (self.before + rate) / 2.0;
                // A trial with a quiet window in it (NaN: too few frames, or a stall of the
                // loop longer than two windows; a longer pause restarts the cycle above)
                // measured nothing: it neither wins nor loses, and the run of wins and the
                // cycle stay as they were.
                let measured = enough && own.is_finite() && self.trial.is_finite();
                if measured {
                    if self.trial > own * (1.0 + self.trials.margin) {
                        self.wins += 1;
                        self.cycle = self.trials.cycle;
                    } else {
                        self.wins = 0;
                        self.cycle = (self.cycle * 2).min(self.trials.longest_cycle);
                    }
                }
                if self.wins >= self.trials.votes {
                    self.on = !self.on;
                    self.switches += 1;
                    self.wins = 0;
                }
                Phase::Steady
            }
        };
        self.since = Some(now);
        self.frames = 0;
    }
}

/// A [`Tuner`] and the frames a queue moved its other way: what each tuned choice of a queue
/// keeps for its two extended counters (the choice's own module says what "the other way" is
/// and names the counters).
#[derive(Debug, Default)]
pub struct Counted {
    tuner: Tuner,
    frames: u64,
}

impl Counted {
    pub fn new(tuner: Tuner) -> Counted {
        Counted { tuner, frames: 0 }
    }

    /// Whether this poll goes the other way.
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.tuner.on()
    }

    /// Counts a poll (empty ones too) that moved `frames`, `counted` of them the other way.
    #[inline(always)]
    pub fn polled(&mut self, frames: u16, counted: u32) {
        self.frames += u64::from(counted);
        self.tuner.polled(frames);
    }

    /// Counts a poll (empty ones too) whose `frames` all went the other way if the tuner
    /// said so when it began.
    #[inline(always)]
    pub fn polled_all(&mut self, frames: u16) {
        let counted = if self.tuner.on() { frames } else { 0 };
        self.polled(frames, u32::from(counted));
    }

    /// The frames moved the other way, and the times the queue changed its way.
    #[inline(always)]
    pub fn counts(&self) -> (u64, u64) {
        (self.frames, self.tuner.switches())
    }
}

/// A port's two extended counters for one tuned choice, `names`: the queues' `counters` (its
/// frames moved the other way, its switches), each summed.
pub(crate) fn xstats_pair(
    queues: impl IntoIterator<Item = crate::QueueStats>,
    counters: impl Fn(&crate::QueueStats) -> (u64, u64),
    names: [&'static str; 2],
) -> [(&'static str, u64); 2] {
    let (frames, switches) = sums(queues, counters);
    [(names[0], frames), (names[1], switches)]
}

/// The queues' `counters` for one tuned choice (its frames moved the other way, its
/// switches), each summed: what a port's extended counters for that choice report.
pub(crate) fn sums(
    queues: impl IntoIterator<Item = crate::QueueStats>,
    counters: impl Fn(&crate::QueueStats) -> (u64, u64),
) -> (u64, u64) {
    queues.into_iter().fold((0, 0), |(frames, switches), q| {
        let (f, s) = counters(&q);
        (frames + f, switches + s)
    })
}

/// A port's extended counters for its tuned choices: its receive queues' flushing
/// ([`crate::flush::xstats`] over `rx`) and its transmit queues' streaming
/// ([`crate::stream::xstats`] over `tx`).
pub fn xstats(
    rx: impl IntoIterator<Item = crate::QueueStats>,
    tx: impl IntoIterator<Item = crate::QueueStats>,
) -> Vec<(&'static str, u64)> {
    let mut x = Vec::from(crate::flush::xstats(rx));
    x.extend(crate::stream::xstats(tx));
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the tuner for `ms` milliseconds of a ring that moves `with` frames per millisecond
    /// while the tuner is on and `without` while it is off, polled every 10 us (clock read at
    /// every tick: the test drives `tick` itself). Returns the share of the time spent on in
    /// the last half.
    fn run(t: &mut Tuner, start: &mut Instant, ms: u64, with: u64, without: u64) -> f64 {
        let mut on = 0u64;
        let steps = ms * 100;
        for i in 0..steps {
            let per_ms = if t.on() { with } else { without };
            // 10 us of frames, added as whole frames on average.
            t.frames += per_ms / 100;
            *start += Duration::from_micros(10);
            t.tick(*start);
            if i >= steps / 2 && t.on() {
                on += 1;
            }
        }
        on as f64 / (steps - steps / 2) as f64
    }

    #[test]
    fn takes_the_way_that_moves_more_frames_and_follows_a_change() {
        let mut t = Tuner::default();
        let mut now = Instant::now();
        // The other way doubles the rate (the slow state): the queue takes it but for its
        // trials.
        let share = run(&mut t, &mut now, 1000, 10_000, 5_000);
        assert!(share > 0.9, "on {share} of the time");
        assert_eq!(t.switches(), 1);
        // Now it costs 20%: the queue goes back.
        let share = run(&mut t, &mut now, 1000, 14_000, 17_500);
        assert!(share < 0.1, "on {share} of the time");
        assert_eq!(t.switches(), 2);
    }

    /// A tuner of 100-ms cycles (stretching up to `longest_cycle`), 10-ms windows, trials 40 ms
    /// into the cycle, taking the other way after two wins in a row.
    fn two_votes(longest_cycle: Duration) -> Tuner {
        Tuner::with_trials(
            Mode::Auto,
            Trials {
                cycle: Duration::from_millis(100),
                longest_cycle,
                window: Duration::from_millis(10),
                votes: 2,
                offset: Duration::from_millis(40),
                margin: MARGIN,
            },
        )
    }

    /// Trials that must win twice in a row: one win alone (a trial that caught a state swing)
    /// changes nothing, two do; the first trial starts at the offset, the next a cycle later.
    #[test]
    fn votes_take_the_other_way_only_after_wins_in_a_row() {
        let mut t = two_votes(Duration::from_millis(100));
        let mut now = Instant::now();
        t.tick(now);
        // Steps of 1 ms, 100 frames a ms either way; the other way moves `trial` a ms.
        let mut step = |t: &mut Tuner, trial: u64| {
            t.frames += if t.phase == Phase::Trial { trial } else { 100 };
            now += Duration::from_millis(1);
            t.tick(now);
        };
        let mut first_trial = None;
        for ms in 1..=100 {
            step(&mut t, 200);
            if t.on() && first_trial.is_none() {
                first_trial = Some(ms);
            }
        }
        // The trial window opens after the offset and the window before it.
        assert_eq!(first_trial, Some(50));
        assert_eq!(t.switches(), 0, "one win is not enough");
        // The next trial loses: the run of wins starts over.
        for _ in 0..100 {
            step(&mut t, 100);
        }
        assert_eq!(t.switches(), 0);
        for _ in 0..100 {
            step(&mut t, 200);
        }
        assert_eq!(t.switches(), 0, "one win again");
        for _ in 0..100 {
            step(&mut t, 200);
        }
        assert_eq!((t.switches(), t.on()), (1, true), "two wins in a row");
    }

    /// Each lost trial doubles the cycle up to the longest; a won one brings it back.
    #[test]
    fn lost_trials_stretch_the_cycle_and_a_win_shortens_it() {
        let mut t = two_votes(Duration::from_millis(400));
        let mut now = Instant::now();
        t.tick(now);
        // The ms at which each trial window opens, with the other way moving `trial` frames a
        // ms (its own way 100), for `until` ms.
        let mut trial_starts = |t: &mut Tuner, trial: u64, until: u64| {
            let mut starts = Vec::new();
            for ms in 1..=until {
                let before = t.phase;
                t.frames += if before == Phase::Trial { trial } else { 100 };
                now += Duration::from_millis(1);
                t.tick(now);
                if t.phase == Phase::Trial && before != Phase::Trial {
                    starts.push(ms);
                }
            }
            starts
        };
        // Losing trials: the next one 200 ms on, then 400, and 400 again.
        let starts = trial_starts(&mut t, 100, 1250);
        assert_eq!(starts, [50, 250, 650, 1050]);
        // A win (at 1450) brings the next trial 100 ms on; the second win switches.
        let starts = trial_starts(&mut t, 200, 350);
        assert_eq!(starts, [200, 300]);
        assert_eq!(t.switches(), 1);
    }

    /// After a pause in the traffic (a testpmd's `stop`, then `start`) the next trial comes at
    /// its offset after the restart, as after the first poll: not with the first poll (the
    /// windows right after a restart measure the ring filling, not the way), nor at the same
    /// time for every tuner of the queue.
    #[test]
    fn after_a_pause_the_trial_waits_for_the_traffic_to_settle() {
        let mut t = two_votes(Duration::from_millis(400));
        let mut now = Instant::now();
        t.tick(now);
        let mut step = |t: &mut Tuner, gap: Duration| {
            let before = t.phase;
            t.frames += if before == Phase::Trial { 200 } else { 100 };
            now += gap;
            t.tick(now);
            t.phase == Phase::Trial && before != Phase::Trial
        };
        // The first trial (at 50 ms) wins; the forwarding loop stops 70 ms in, for a second.
        for _ in 0..70 {
            step(&mut t, Duration::from_millis(1));
        }
        assert_eq!((t.wins, t.phase), (1, Phase::Steady));
        step(&mut t, Duration::from_secs(1));
        let opened = (1..=200)
            .find(|_| step(&mut t, Duration::from_millis(1)))
            .expect("a trial after the restart");
        // The offset (40 ms) and the window before the trial, as at the first poll.
        assert_eq!(opened, 50);
        for _ in 0..20 {
            step(&mut t, Duration::from_millis(1));
        }
        assert_eq!((t.switches(), t.on()), (1, true), "the second win in a row");
    }

    /// A trial whose window a stall cut through (shorter than a [`PAUSE`], longer than two
    /// windows) measured nothing: the win before it still counts towards the votes, and the
    /// cycle does not stretch.
    #[test]
    fn a_stalled_trial_keeps_the_run_of_wins_and_the_cycle() {
        let mut t = two_votes(Duration::from_millis(400));
        let mut now = Instant::now();
        t.tick(now);
        // 1-ms steps, 100 frames a ms its own way and 200 the other.
        let mut trial_starts = Vec::new();
        let mut paused = false;
        for ms in 1..=400u64 {
            let before = t.phase;
            t.frames += if before == Phase::Trial { 200 } else { 100 };
            if before == Phase::Trial && t.wins == 1 && !paused {
                // The loop stalls for 30 ms in the middle of the second trial.
                paused = true;
                now += Duration::from_millis(30);
            }
            now += Duration::from_millis(1);
            t.tick(now);
            if t.phase == Phase::Trial && before != Phase::Trial {
                trial_starts.push(ms);
            }
        }
        assert!(paused);
        // First trial at 50 (won), second at 150 (stalled: nothing), the third a 100-ms cycle
        // on (a stretched cycle would put it 200 ms on), won: two wins, the switch.
        assert_eq!(t.switches(), 1, "trials at {trial_starts:?}");
        assert!(t.on());
        assert_eq!(trial_starts[..2], [50, 150]);
        assert!(trial_starts[2] - trial_starts[1] < 150, "{trial_starts:?}");
    }

    #[test]
    fn keeps_its_way_when_both_move_the_same_or_the_ring_is_quiet() {
        let mut t = Tuner::default();
        let mut now = Instant::now();
        let share = run(&mut t, &mut now, 2000, 10_000, 10_200);
        assert!(share < 0.1, "on {share} of the time");
        // A gain below the margin is not taken either.
        let share = run(&mut t, &mut now, 2000, 10_300, 10_000);
        assert!(share < 0.1, "on {share} of the time");
        // Too few frames to judge, though the other way would double them.
        let share = run(&mut t, &mut now, 2000, 200, 100);
        assert!(share < 0.1, "on {share} of the time");
        assert_eq!(t.switches(), 0);
    }

    /// A window that spans a pause in traffic (no polls, then a burst of frames) is no
    /// measurement: its rate would be the pause's, and the trial would win against it.
    #[test]
    fn a_window_that_spans_a_pause_decides_nothing() {
        for stalled in [Phase::Before, Phase::After] {
            let mut t = Tuner::default();
            let mut now = Instant::now();
            t.tick(now);
            // The clock starts; then through the steady part of the cycle at 10 frames/us
            // either way.
            let mut step = |t: &mut Tuner, us: u64, frames: u64| {
                t.frames += frames;
                now += Duration::from_micros(us);
                t.tick(now);
            };
            while t.phase != stalled {
                step(&mut t, 10, 100);
            }
            let (on, switches) = (t.on(), t.switches());
            // The stalled window: 50 ms without a poll, then 600 frames.
            step(&mut t, 50_000, 600);
            while t.phase != Phase::Steady {
                step(&mut t, 10, 100);
            }
            assert_eq!((t.on(), t.switches()), (on, switches), "{stalled:?}");
        }
    }

    #[test]
    fn on_and_off_never_try_the_other_way() {
        for (mode, on) in [(Mode::On, true), (Mode::Off, false)] {
            let mut t = Tuner::new(mode);
            let end = Instant::now() + CYCLE * 2;
            while Instant::now() < end {
                t.polled(32);
                assert_eq!(t.on(), on, "{mode}");
            }
            assert_eq!(t.switches(), 0);
        }
        assert_eq!("auto".parse(), Ok(Mode::Auto));
        assert_eq!("on".parse(), Ok(Mode::On));
        assert_eq!("0".parse(), Ok(Mode::Off));
        assert_eq!(
            "sometimes".parse::<Mode>(),
            Err("expected auto, on or off".to_string())
        );
    }

    #[test]
    fn polls_read_the_clock_and_run_trials() {
        let mut t = Tuner::default();
        let end = Instant::now() + CYCLE * 3;
        let mut tried = false;
        while Instant::now() < end {
            t.polled(32);
            tried |= t.on();
        }
        // Every cycle tries the other way for a window.
        assert!(tried);
    }
}
