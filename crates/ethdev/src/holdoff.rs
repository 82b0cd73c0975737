//! A receive queue's hold-off ([`Holdoff`]): after a poll that took a run of frames and a poll
//! that then found the ring empty, the queue leaves the ring alone for a few microseconds.
//!
//! A receiver that has caught up with a streaming sender polls the very lines the sender is
//! writing next (a MEMNIC slot's status, a memif ring's head and the descriptor line the next
//! frames go into): each look takes the line away from the sender's core in the middle of its
//! stores, and the sender waits to take it back. Held off, the sender writes a run of frames
//! undisturbed, and the next poll takes the whole run. The price is latency for a frame that
//! arrives during the hold; a frame that comes alone (a request, a ping) starts no hold, so
//! request/response traffic is not delayed. Each driver's default, with its figures:
//! `memnic_pmd::DEFAULT_RX_HOLDOFF`, `memnic_memif::DEFAULT_RX_HOLDOFF`.

use std::time::{Duration, Instant};

use crate::{Devargs, DevargsError};

/// The fewest frames a poll takes for the empty poll after it to hold off: more than one says
/// the sender is streaming; one alone is a request or a ping, whose answer must not wait.
const RUN: usize = 2;

/// The longest hold-off a devarg may ask for, 1 ms: far past any use (at 25 Mpps a ring of 1024
/// slots fills in 41 us, and a sender that finds it full drops), yet bounded.
pub const MAX_HOLDOFF_NS: u64 = 1_000_000;

/// One rx queue's hold-off.
#[derive(Debug)]
pub struct Holdoff {
    after_empty: Duration,
    until: Option<Instant>,
    /// Frames the last poll took (0: it found none).
    last: usize,
}

impl Holdoff {
    /// A hold-off of `after_empty` (zero: the queue always polls).
    pub fn new(after_empty: Duration) -> Holdoff {
        Holdoff {
            after_empty,
            until: None,
            last: 0,
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

    /// A poll (not held) took `n` frames: one that found none holds off if the one before took
    /// a run.
    #[inline(always)]
    pub fn polled(&mut self, n: usize) {
        if n == 0 && self.last >= RUN && !self.after_empty.is_zero() {
            self.until = Some(Instant::now() + self.after_empty);
        }
        self.last = n;
    }
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
        h.polled(32);
        assert!(!h.holding(), "frames keep coming: no hold");
        h.polled(0);
        assert!(h.holding(), "caught up after a run: hold");
        std::thread::sleep(Duration::from_millis(60));
        assert!(!h.holding(), "the hold is over");
        // Still empty after the hold: no new hold until another run.
        h.polled(0);
        assert!(!h.holding());
    }

    #[test]
    fn a_frame_alone_or_a_zero_hold_never_holds() {
        let mut h = Holdoff::new(Duration::from_millis(50));
        h.polled(1);
        h.polled(0);
        assert!(!h.holding(), "a request's answer must not wait");
        let mut h = Holdoff::new(Duration::ZERO);
        h.polled(32);
        h.polled(0);
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
