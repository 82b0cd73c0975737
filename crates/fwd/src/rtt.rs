//! Round trips measured by the `ping` forwarding mode: a histogram of their times, and the
//! frames that did not come back.
//!
//! The histogram is log-linear: exact below 64 ns, then 64 buckets per power of two (each
//! within 1.6% of the times it holds), so one fixed table covers nanoseconds to minutes and
//! merges by adding counts.

use std::time::Duration;

/// Buckets below this are one nanosecond wide.
const EXACT: u64 = 64;
/// Buckets per power of two above [`EXACT`] (64: 6 bits of the time after its top bit).
const SUB_BITS: u32 = 6;
/// Times from 2^40 ns (18 minutes) on share one last bucket.
const TOP_BIT: u32 = 40;
const BUCKETS: usize = (EXACT as usize) * (TOP_BIT - SUB_BITS + 1) as usize + 1;

/// Round trips of one stream (or of several, merged).
#[derive(Clone)]
pub struct RoundTrips {
    counts: Box<[u64; BUCKETS]>,
    /// Round trips recorded.
    pub count: u64,
    sum_ns: u128,
    min_ns: u64,
    max_ns: u64,
    /// Frames sent by the pinger.
    pub sent: u64,
    /// Frames that had not come back when their burst was given up on (see `ping`'s timeout).
    pub lost: u64,
    /// Frames that came back but were not the pinger's outstanding ones: from a burst given up
    /// on, duplicated, or someone else's.
    pub stale: u64,
}

impl Default for RoundTrips {
    fn default() -> Self {
        RoundTrips {
            counts: Box::new([0; BUCKETS]),
            count: 0,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            sent: 0,
            lost: 0,
            stale: 0,
        }
    }
}

impl std::fmt::Debug for RoundTrips {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoundTrips")
            .field("summary", &self.summary())
            .finish()
    }
}

/// The bucket a time of `ns` falls in.
fn bucket(ns: u64) -> usize {
    if ns < EXACT {
        return ns as usize;
    }
    let top = (63 - ns.leading_zeros()).min(TOP_BIT);
    if top == TOP_BIT {
        return BUCKETS - 1;
    }
    let shift = top - SUB_BITS;
    (EXACT as usize) * (shift as usize + 1) + ((ns >> shift) - EXACT) as usize
}

/// The middle of bucket `i`'s times (the time itself below [`EXACT`]).
fn bucket_value(i: usize) -> u64 {
    let e = EXACT as usize;
    if i < e {
        return i as u64;
    }
    let shift = (i / e - 1) as u32;
    let low = (EXACT + (i % e) as u64) << shift;
    low + ((1u64 << shift) >> 1)
}

/// What a [`RoundTrips`] says, in nanoseconds (zeros when none was recorded).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct RttSummary {
    pub count: u64,
    pub sent: u64,
    pub lost: u64,
    pub stale: u64,
    pub min_ns: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

impl RoundTrips {
    /// Records one round trip.
    pub fn record(&mut self, rtt: Duration) {
        let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(ns)] += 1;
        self.count += 1;
        self.sum_ns += u128::from(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds `o`'s round trips and frames to these.
    pub fn merge(&mut self, o: &RoundTrips) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.count += o.count;
        self.sum_ns += o.sum_ns;
        self.min_ns = self.min_ns.min(o.min_ns);
        self.max_ns = self.max_ns.max(o.max_ns);
        self.sent += o.sent;
        self.lost += o.lost;
        self.stale += o.stale;
    }

    /// The time at quantile `q` (0..=1) of the recorded round trips: the middle of its bucket,
    /// kept within the smallest and largest recorded.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        // The rank of the round trip at q, 1-based: the first bucket whose running count
        // reaches it holds it.
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_value(i).clamp(self.min_ns, self.max_ns);
            }
        }
        self.max_ns
    }

    pub fn summary(&self) -> RttSummary {
        let none = self.count == 0;
        RttSummary {
            count: self.count,
            sent: self.sent,
            lost: self.lost,
            stale: self.stale,
            min_ns: if none { 0 } else { self.min_ns },
            mean_ns: if none {
                0
            } else {
                (self.sum_ns / u128::from(self.count)) as u64
            },
            p50_ns: self.quantile(0.50),
            p90_ns: self.quantile(0.90),
            p99_ns: self.quantile(0.99),
            p999_ns: self.quantile(0.999),
            max_ns: self.max_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_within_two_percent() {
        let mut last = 0;
        for ns in 0..(1u64 << 20) {
            let b = bucket(ns);
            assert!(
                b == last || b == last + 1,
                "{ns} ns jumps from bucket {last} to {b}"
            );
            last = b;
            let v = bucket_value(b) as f64;
            assert!(
                (v - ns as f64).abs() <= ns as f64 * 0.016 + 0.5,
                "{ns} ns reads back as {v}"
            );
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket((1 << TOP_BIT) - 1), BUCKETS - 2);
    }

    #[test]
    fn quantiles_of_a_known_spread() {
        let mut r = RoundTrips::default();
        // 1000 round trips of 1..=1000 us.
        for us in 1..=1000u64 {
            r.record(Duration::from_micros(us));
        }
        let s = r.summary();
        let near = |got: u64, us: u64| (got as f64 - us as f64 * 1e3).abs() <= us as f64 * 16.0;
        assert!(near(s.p50_ns, 500), "{s:?}");
        assert!(near(s.p90_ns, 900), "{s:?}");
        assert!(near(s.p99_ns, 990), "{s:?}");
        assert!(near(s.p999_ns, 999), "{s:?}");
        assert_eq!((s.min_ns, s.max_ns, s.count), (1_000, 1_000_000, 1000));
        assert_eq!(s.mean_ns, 500_500);
    }

    #[test]
    fn merging_adds_the_round_trips_and_frames() {
        let (mut a, mut b) = (RoundTrips::default(), RoundTrips::default());
        a.record(Duration::from_nanos(2_000));
        a.sent = 2;
        a.lost = 1;
        b.record(Duration::from_nanos(30));
        b.record(Duration::from_nanos(9_000));
        b.sent = 2;
        b.stale = 3;
        a.merge(&b);
        let s = a.summary();
        assert_eq!((s.count, s.sent, s.lost, s.stale), (3, 4, 1, 3));
        assert_eq!((s.min_ns, s.max_ns), (30, 9_000));
        assert_eq!(s.p50_ns, bucket_value(bucket(2_000)));
        assert_eq!(RoundTrips::default().summary(), RttSummary::default());
    }
}
