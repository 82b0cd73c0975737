//! The `ping` forwarding mode's bookkeeping: one burst of numbered frames out at a time, each
//! frame's round trip timed when it comes back through a reflector (a peer forwarding in
//! `macswap` or `io` mode), the next burst sent once the whole burst is back.
//!
//! A burst that has not come back whole within [`PING_TIMEOUT`] is given up on: its missing
//! frames count as lost and the next burst goes. Frames that come back and are not the burst's
//! outstanding ones (late, duplicated, or another sender's) count as stale.

use std::time::{Duration, Instant};

use crate::rtt::RoundTrips;

/// How long a burst may take to come back whole before its missing frames count as lost.
pub const PING_TIMEOUT: Duration = Duration::from_millis(100);

/// The burst out, and every round trip so far.
#[derive(Debug, Default)]
pub(crate) struct Pinger {
    pub rtt: RoundTrips,
    /// The sequence number of the burst's first frame.
    first: u64,
    /// Per frame of the burst, in sequence order: when the tx queue took it (None: not yet),
    /// and whether it came back.
    out: Vec<(Option<Instant>, bool)>,
    /// Frames of the burst not back yet.
    missing: usize,
    /// When the burst's first frame was taken.
    since: Option<Instant>,
}

impl Pinger {
    /// Whether no burst is out: the next may be built.
    pub fn idle(&self) -> bool {
        self.out.is_empty()
    }

    /// A burst of `n` frames numbered from `first` is built and about to be offered.
    pub fn start(&mut self, first: u64, n: usize) {
        self.first = first;
        self.out.clear();
        self.out.resize(n, (None, false));
        self.missing = n;
        self.since = None;
    }

    /// The tx queue took the burst's frames `seqs` at `at` (the time read just before it was
    /// offered them).
    pub fn taken(&mut self, seqs: std::ops::Range<u64>, at: Instant) {
        for seq in seqs {
            if let Some(f) = self.frame(seq) {
                f.0 = Some(at);
                self.rtt.sent += 1;
            }
        }
        self.since.get_or_insert(at);
    }

    /// Frame `seq` came back at `now`: its round trip is recorded if it is one of the burst's
    /// outstanding frames, or it counts as stale.
    pub fn returned(&mut self, seq: u64, now: Instant) {
        match self.frame(seq) {
            Some((Some(at), back @ false)) => {
                *back = true;
                let rtt = now.saturating_duration_since(*at);
                self.missing -= 1;
                self.rtt.record(rtt);
            }
            _ => self.rtt.stale += 1,
        }
    }

    /// Ends the burst if it is back whole, or gives it up (its missing frames lost) once
    /// [`PING_TIMEOUT`] has passed since it went out; `now` is read only while frames are
    /// missing.
    pub fn settle(&mut self, now: impl FnOnce() -> Instant) {
        if self.out.is_empty() {
            return;
        }
        if self.missing > 0 {
            let Some(since) = self.since else {
                return; // not sent yet: nothing to wait for
            };
            if now().saturating_duration_since(since) < PING_TIMEOUT {
                return;
            }
            // Frames the tx queue never took were never sent: not lost.
            let unsent = self.out.iter().filter(|f| f.0.is_none()).count();
            self.rtt.lost += (self.missing - unsent) as u64;
        }
        self.out.clear();
    }

    fn frame(&mut self, seq: u64) -> Option<&mut (Option<Instant>, bool)> {
        let i = usize::try_from(seq.checked_sub(self.first)?).ok()?;
        self.out.get_mut(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_ends_when_every_frame_is_back_and_each_round_trip_is_timed() {
        let mut p = Pinger::default();
        let t0 = Instant::now();
        p.start(10, 2);
        assert!(!p.idle());
        p.taken(10..12, t0);
        p.returned(10, t0 + Duration::from_micros(2));
        p.settle(|| t0 + Duration::from_micros(2));
        assert!(!p.idle(), "one frame is still out");
        p.returned(10, t0 + Duration::from_micros(3)); // a duplicate
        p.returned(11, t0 + Duration::from_micros(4));
        p.settle(|| unreachable!("nothing is missing: no clock read"));
        assert!(p.idle());
        let s = p.rtt.summary();
        assert_eq!((s.count, s.sent, s.lost, s.stale), (2, 2, 0, 1));
        assert_eq!((s.min_ns, s.max_ns), (2_000, 4_000));
    }

    #[test]
    fn a_burst_not_back_in_time_is_given_up_and_its_late_frames_are_stale() {
        let mut p = Pinger::default();
        let t0 = Instant::now();
        p.start(0, 3);
        p.settle(|| t0 + PING_TIMEOUT * 2);
        assert!(!p.idle(), "nothing sent yet: no timeout runs");
        p.taken(0..2, t0); // the third was not taken
        p.returned(0, t0 + Duration::from_micros(5));
        p.settle(|| t0 + PING_TIMEOUT / 2);
        assert!(!p.idle());
        p.settle(|| t0 + PING_TIMEOUT);
        assert!(p.idle());
        p.start(3, 1);
        p.returned(1, t0 + PING_TIMEOUT * 2); // the lost one, late
        p.returned(99, t0 + PING_TIMEOUT * 2); // never sent
        let s = p.rtt.summary();
        assert_eq!((s.count, s.sent, s.lost, s.stale), (1, 2, 1, 2));
    }
}
