//! A receive queue's hold-off ([`Holdoff`]): after a poll that took a run of frames and a poll
//! that then found the ring empty, the queue leaves the ring alone for a few microseconds.
//!
//! A receiver that has caught up with a streaming sender polls the very lines the sender is
//! writing next (a MEMNIC slot's status, a memif ring's head and the descriptor line the next
//! frames go into): each look takes the line away from the sender's core in the middle of its
//! stores, and the sender waits to take it back. Held off, the sender writes a run of frames
//! undisturbed, and the next poll takes the whole run.
//!
//! The price is latency for frames that arrive during the hold. A frame that comes alone (a
//! request, a ping) starts no hold; a peer that answers in bursts (a reflector, a
//! request/response partner sending several frames at a time) would meet a hold on every
//! exchange (measured with `testpmd --forward-mode=ping --burst 4` through our memif pair:
//! round trip 5.8 us at p50 against 1.1 us without holds), so each hold is judged by what
//! waited after it ([`Holdoff::polled`]: more than the first poll after it could take), and one
//! that did not pay starts a quiet spell without holds ([`FIRST_QUIET`] to [`LONGEST_QUIET`]).
//! Each driver's default, with its figures:
//! `memnic_pmd::DEFAULT_RX_HOLDOFF`, `memnic_memif::DEFAULT_RX_HOLDOFF`.
//!
//! What the verdict costs a stream: in-process flip on the Intel Xeon host of session 46
//! (250-ms windows, the receiver counted, verdict and quiet spells / holding after every run as
//! before, p20/p50/p80, 64 B, 20 s a cell, a calm sitting):
//!
//! ```text
//!   memif  our server <- our client     0.99/1.00/1.02
//!          our server <- DPDK's client  0.99/1.00/1.01
//!          our client <- our server     0.97/1.00/1.00
//!          our client <- DPDK's server  0.99/1.00/1.01
//!   MEMNIC host -> guest                0.98/1.00/1.01
//!          guest -> host                0.99/1.00/1.01
//! ```
//!
//! Streaming, 1-6% of the holds do not pay (6-s runs at 64 B, holds / unpaid: our server <- our
//! client 27,604 / 1,519, <- DPDK's client 161,928 / 812; our client <- our server 98,764 / 528,
//! <- DPDK's server 285,482 / 1,223). Lost on the way: "the first poll after the hold took more
//! than the run before it" (0.92-0.96 at p50 where DPDK's client sends: its bursts of 32 fill
//! every poll, before and after a hold alike, so all its holds were judged unpaid), and "the
//! first poll took a whole burst and the next found more" (level for streams, but a slow
//! pinger's next poll finds the peer's next answer, which its own request brought, and calls
//! the hold paid: a 20,000-frame ping of a debug build under load met 250 holds).

use std::time::{Duration, Instant};

use crate::{Devargs, DevargsError, QueueStats};

/// The fewest frames a poll takes for the empty poll after it to hold off: more than one says
/// the sender is streaming; one alone is a request or a ping, whose answer must not wait.
const RUN: usize = 2;

/// The longest hold-off a devarg may ask for, 1 ms: far past any use (at 25 Mpps a ring of 1024
/// slots fills in 41 us, and a sender that finds it full drops), yet bounded.
pub const MAX_HOLDOFF_NS: u64 = 1_000_000;

/// After a hold that gathered no more than one poll's worth of frames, no hold starts for this
/// long; each such hold in a row doubles it, up to [`LONGEST_QUIET`], and a hold that paid sets
/// it back.
pub const FIRST_QUIET: Duration = Duration::from_micros(100);

/// The longest quiet spell: a peer that answers (request/response) meets one hold in this
/// long.
pub const LONGEST_QUIET: Duration = Duration::from_millis(100);

/// One rx queue's hold-off.
#[derive(Debug)]
pub struct Holdoff {
    after_empty: Duration,
    until: Option<Instant>,
    /// Frames the last poll took (0: it found none).
    last: usize,
    /// A hold just ended: the next poll tells whether it paid.
    judging: bool,
    /// No hold starts before this (see [`FIRST_QUIET`]).
    quiet_until: Option<Instant>,
    /// The next quiet spell's length.
    quiet: Duration,
    /// Holds started, and those that did not pay.
    holds: u64,
    unpaid: u64,
}

impl Holdoff {
    /// A hold-off of `after_empty` (zero: the queue always polls).
    pub fn new(after_empty: Duration) -> Holdoff {
        Holdoff {
            after_empty,
            until: None,
            last: 0,
            judging: false,
            quiet_until: None,
            quiet: FIRST_QUIET,
            holds: 0,
            unpaid: 0,
        }
    }

    /// Whether the ring is still to be left alone (this clock read is the only cost of a held
    /// poll; none while frames keep arriving).
    #[inline(always)]
    pub fn holding(&mut self) -> bool {
        match self.until {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                self.until = None;
                false
            }
            None => false,
        }
    }

    /// Whether the next poll is the first after a hold: a driver that has to read more of its
    /// ring to say whether more frames waited than the poll could take reads it only then.
    #[inline(always)]
    pub fn judging(&self) -> bool {
        self.judging
    }

    /// A poll (not held) took `n` frames, and more than it could take were waiting
    /// (`overflowed`; only asked of the first poll after a hold, see [`Holdoff::judging`]): a poll
    /// that found none holds off if the one before took a run, unless holds are in a quiet
    /// spell.
    ///
    /// A hold pays when the sender streams: frames pile up while we hold, more than one poll
    /// takes. A peer that answers us (a reflector, a request/response partner) sends nothing
    /// more until we have answered, so the hold only delays its next request, which then waits
    /// alone: at most one burst. Such a hold starts a quiet spell. (Judged by the first poll
    /// alone: a second poll after it may find the peer's next request, which our answer in
    /// between brought.)
    #[inline(always)]
    pub fn polled(&mut self, n: usize, overflowed: bool) {
        if self.judging {
            self.judging = false;
            if overflowed {
                self.quiet = FIRST_QUIET;
            } else {
                self.unpaid += 1;
                self.quiet_until = Some(Instant::now() + self.quiet);
                self.quiet = (self.quiet * 2).min(LONGEST_QUIET);
            }
        }
        if n == 0 && self.last >= RUN && !self.after_empty.is_zero() {
            let now = Instant::now();
            if self.quiet_until.is_none_or(|q| now >= q) {
                self.quiet_until = None;
                self.until = Some(now + self.after_empty);
                self.judging = true;
                self.holds += 1;
            }
        }
        self.last = n;
    }

    /// Copies the hold counts into the queue's counters.
    #[inline(always)]
    pub fn record(&self, stats: &mut QueueStats) {
        stats.holds = self.holds;
        stats.holds_unpaid = self.unpaid;
    }
}

/// A port's extended counters for its receive queues' hold-off, summed over `rx` (each
/// queue's counters): holds started, and those that did not pay.
pub fn xstats(rx: impl IntoIterator<Item = QueueStats>) -> [(&'static str, u64); 2] {
    let (holds, unpaid) = crate::tuner::sums(rx, |q| (q.holds, q.holds_unpaid));
    [("rx_holdoffs", holds), ("rx_holdoffs_unpaid", unpaid)]
}

/// The hold-off a port's devarg `key` asks for in nanoseconds (0 to [`MAX_HOLDOFF_NS`]), or
/// `default` when it is not given.
pub fn from_devargs(
    args: &Devargs,
    key: &str,
    default: Duration,
) -> Result<Duration, DevargsError> {
    match args.get(key) {
        None => Ok(default),
        Some(v) => match v.parse::<u64>() {
            Ok(ns) if ns <= MAX_HOLDOFF_NS => Ok(Duration::from_nanos(ns)),
            _ => Err(args.bad(key, v, "expected nanoseconds from 0 to 1000000")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_poll_after_a_run_holds_off_a_while() {
        let mut h = Holdoff::new(Duration::from_millis(50));
        h.polled(32, false);
        assert!(!h.holding(), "frames keep coming: no hold");
        h.polled(0, false);
        assert!(h.holding(), "caught up after a run: hold");
        std::thread::sleep(Duration::from_millis(60));
        assert!(!h.holding(), "the hold is over");
        // Still empty after the hold: no new hold until another run.
        h.polled(0, false);
        assert!(!h.holding());
    }

    #[test]
    fn a_hold_pays_when_more_waited_after_it_than_a_poll_takes() {
        let mut h = Holdoff::new(Duration::from_millis(20));
        h.polled(8, false);
        h.polled(0, false);
        assert!(h.holding());
        std::thread::sleep(Duration::from_millis(25));
        assert!(!h.holding());
        assert!(h.judging(), "the first poll after the hold judges it");
        // A whole burst, and more waiting: the sender kept streaming while we held.
        h.polled(32, true);
        assert!(!h.judging());
        h.polled(6, false);
        h.polled(0, false);
        assert!(
            h.holding(),
            "a hold that paid leaves the next free to start"
        );
        let mut s = QueueStats::default();
        h.record(&mut s);
        assert_eq!((s.holds, s.holds_unpaid), (2, 0));
    }

    #[test]
    fn a_hold_after_which_no_more_waited_than_a_poll_takes_starts_a_quiet_spell() {
        // After the hold: a request alone; a whole burst (and nothing past it) and then the
        // peer's next request, which our answer brought; nothing.
        for after in [[4usize, 0], [32, 4], [0, 0]] {
            let mut h = Holdoff::new(Duration::from_millis(20));
            h.quiet = Duration::from_secs(60); // outlives the test
            h.polled(4, false);
            h.polled(0, false);
            assert!(h.holding(), "{after:?}");
            std::thread::sleep(Duration::from_millis(25));
            assert!(!h.holding());
            h.polled(after[0], false);
            h.polled(after[1], false);
            h.polled(0, false);
            assert!(!h.holding(), "{after:?}: quiet, no hold");
            h.polled(4, false);
            h.polled(0, false);
            assert!(!h.holding(), "{after:?}: still quiet");
            let mut s = QueueStats::default();
            h.record(&mut s);
            assert_eq!((s.holds, s.holds_unpaid), (1, 1), "{after:?}");
        }
    }

    #[test]
    fn each_unpaid_hold_in_a_row_doubles_the_quiet_spell_and_a_paid_one_resets_it() {
        let mut h = Holdoff::new(Duration::from_millis(1));
        let hold_then = |h: &mut Holdoff, overflowed: bool| {
            std::thread::sleep(LONGEST_QUIET / 50 + Duration::from_millis(2)); // past the quiet
            h.polled(4, false);
            h.polled(0, false);
            assert!(h.holding());
            std::thread::sleep(Duration::from_millis(2));
            assert!(!h.holding());
            h.polled(32, overflowed);
        };
        assert_eq!(h.quiet, FIRST_QUIET);
        hold_then(&mut h, false);
        assert_eq!(h.quiet, FIRST_QUIET * 2);
        hold_then(&mut h, false);
        assert_eq!(h.quiet, FIRST_QUIET * 4);
        hold_then(&mut h, true);
        assert_eq!(h.quiet, FIRST_QUIET, "a hold that paid");
        h.quiet = LONGEST_QUIET;
        h.judging = true;
        h.polled(0, false);
        assert_eq!(h.quiet, LONGEST_QUIET, "never past the longest");
    }

    #[test]
    fn a_frame_alone_or_a_zero_hold_never_holds() {
        let mut h = Holdoff::new(Duration::from_millis(50));
        h.polled(1, false);
        h.polled(0, false);
        assert!(!h.holding(), "a request's answer must not wait");
        let mut h = Holdoff::new(Duration::ZERO);
        h.polled(32, false);
        h.polled(0, false);
        assert!(!h.holding());
    }

    #[test]
    fn the_devarg_takes_nanoseconds_up_to_a_millisecond() {
        let keys = &["rx-holdoff-ns"];
        let parse = |s: &str| {
            from_devargs(
                &Devargs::parse(s, keys).unwrap(),
                "rx-holdoff-ns",
                Duration::from_micros(5),
            )
        };
        assert_eq!(parse("x0").unwrap(), Duration::from_micros(5));
        assert_eq!(parse("x0,rx-holdoff-ns=0").unwrap(), Duration::ZERO);
        assert_eq!(
            parse("x0,rx-holdoff-ns=1000000").unwrap(),
            Duration::from_millis(1)
        );
        for bad in ["1000001", "-1", "5us"] {
            let e = parse(&format!("x0,rx-holdoff-ns={bad}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("expected nanoseconds from 0 to 1000000"), "{e}");
        }
    }
}
