//! The numbers: window rates from stamped counter lines, percentiles, the order runs take, and
//! the detector of this machine's two-state swing.
//!
//! A run's receiver prints its cumulative packet count every stats period; the bench stamps each
//! line with its own clock as the line arrives (DPDK's stats thread prints late when it shares a
//! CPU, and only every other second: `peers/dpdk.md` §9). The rate of a window is the packets
//! between two stamped lines over the time between their stamps.

/// One periodic counter line: the bench's clock (seconds since the bench began) when the line
/// arrived, and the cumulative count it showed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stamp {
    pub secs: f64,
    pub count: u64,
}

/// The shortest window. Our testpmd prints every second and DPDK's every two: lines closer than
/// this are merged, so both make windows of about two seconds (and two lines that arrive in one
/// burst never make a window of a few microseconds).
pub const MIN_WINDOW_S: f64 = 1.5;

/// The fast and slow states differ by more than this (p80 over p20 of a variant's windows):
/// the bench warns that medians mix the states.
pub const SWING_WARN: f64 = 1.5;

/// Below this many windows a variant's p80/p20 says nothing.
pub const SWING_MIN_WINDOWS: usize = 5;

/// The packet rates (per second) of the windows of one run.
///
/// Windows start at the first stamp that shows packets (traffic began before that line, so the
/// window after it is all traffic) and end with the last stamp before `until` (when the bench
/// began stopping the pair). A window closes at the first stamp at least [`MIN_WINDOW_S`] after
/// it opened. A count that goes back (a peer's disconnect reset it) ends the run's windows.
pub fn window_rates(stamps: &[Stamp], until: f64) -> Vec<f64> {
    let mut rates = Vec::new();
    let Some(first) = stamps.iter().position(|s| s.count > 0) else {
        return rates;
    };
    let mut open = stamps[first];
    for s in &stamps[first + 1..] {
        if s.secs > until || s.count < open.count {
            break;
        }
        let secs = s.secs - open.secs;
        if secs >= MIN_WINDOW_S {
            rates.push((s.count - open.count) as f64 / secs);
            open = *s;
        }
    }
    rates
}

/// The `q` quantile (0..=1) of `values`, linearly interpolated between the two nearest ranks;
/// `None` when there are none.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let last = v.len().checked_sub(1)?;
    let pos = q.clamp(0.0, 1.0) * last as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

/// The ratio of each window of `a` to the window of `b` taken nearest in time (`--interleave`:
/// `(times, rates)` each, index for index), where that window counted anything. Windows
/// seconds apart share the machine's state far more often than runs minutes apart do.
pub fn paired_ratios(a: (&[f64], &[f64]), b: (&[f64], &[f64])) -> Vec<f64> {
    a.0.iter()
        .zip(a.1)
        .filter_map(|(&t, &rate)| {
            let nearest =
                b.0.iter()
                    .zip(b.1)
                    .min_by(|x, y| (x.0 - t).abs().total_cmp(&(y.0 - t).abs()))?;
            (*nearest.1 > 0.0).then(|| rate / nearest.1)
        })
        .collect()
}

/// One cell's windows in brief.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    pub p20: f64,
    pub p50: f64,
    pub p80: f64,
    pub min: f64,
    pub max: f64,
    pub windows: usize,
}

impl Summary {
    /// `None` when there are no windows.
    pub fn of(values: &[f64]) -> Option<Summary> {
        Some(Summary {
            p20: percentile(values, 0.2)?,
            p50: percentile(values, 0.5)?,
            p80: percentile(values, 0.8)?,
            min: percentile(values, 0.0)?,
            max: percentile(values, 1.0)?,
            windows: values.len(),
        })
    }
}

/// The order of the variants in the `turn`th cell: each cell starts with the next variant in
/// turn, so two variants run A B, B A, A B, ... and three run A B C, B C A, C A B: each sees
/// the same mix of the machine's states, and none always runs first or right after another.
pub fn order(variants: usize, turn: usize) -> Vec<usize> {
    (0..variants).map(|k| (turn + k) % variants).collect()
}

/// How far one variant's windows swung: p80 over p20 of all its windows, each window divided by
/// the median of its own cell first (so frame sizes and cases pool); cells with one window are
/// left out.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Swing {
    /// p80/p20 of the normalised windows; `None` with fewer than [`SWING_MIN_WINDOWS`] windows,
    /// infinite when the slow windows counted nothing.
    pub p80_over_p20: Option<f64>,
    pub windows: usize,
}

/// The swing of one variant, from the windows of each of its cells.
pub fn swing<'a>(cells: impl IntoIterator<Item = &'a [f64]>) -> Swing {
    let mut pooled = Vec::new();
    for w in cells {
        // A cell's only window equals its median: no evidence of any swing.
        if w.len() < 2 {
            continue;
        }
        match percentile(w, 0.5) {
            Some(m) if m > 0.0 => pooled.extend(w.iter().map(|r| r / m)),
            _ => {}
        }
    }
    let ratio = (pooled.len() >= SWING_MIN_WINDOWS)
        .then(|| {
            let (p20, p80) = (percentile(&pooled, 0.2)?, percentile(&pooled, 0.8)?);
            Some(if p20 > 0.0 { p80 / p20 } else { f64::INFINITY })
        })
        .flatten();
    Swing {
        p80_over_p20: ratio,
        windows: pooled.len(),
    }
}

/// True when any variant swung by more than [`SWING_WARN`].
pub fn swung(swings: &[Swing]) -> bool {
    swings
        .iter()
        .any(|s| s.p80_over_p20.is_some_and(|r| r > SWING_WARN))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamps(v: &[(f64, u64)]) -> Vec<Stamp> {
        v.iter()
            .map(|&(secs, count)| Stamp { secs, count })
            .collect()
    }

    /// Each window is divided by the other variant's nearest in time, before or after it, and
    /// a window that counted nothing divides nothing.
    #[test]
    fn paired_ratios_take_the_nearest_window() {
        let a = ([1.0, 5.0, 9.5], [12.0, 30.0, 7.0]);
        let b = ([-3.0, 0.0, 5.5, 9.0], [50.0, 10.0, 20.0, 0.0]);
        assert_eq!(paired_ratios((&a.0, &a.1), (&b.0, &b.1)), [1.2, 1.5]);
        assert!(paired_ratios((&a.0, &a.1), (&[], &[])).is_empty());
    }

    #[test]
    fn windows_start_with_traffic_and_stop_at_until() {
        // Idle lines before traffic, then 10 Mpps for 2 s, then 5 Mpps for 2 s; the line at 9.0
        // comes after the bench began stopping the pair.
        let s = stamps(&[
            (0.0, 0),
            (1.0, 0),
            (2.0, 3_000_000),
            (4.0, 23_000_000),
            (6.0, 33_000_000),
            (9.0, 90_000_000),
        ]);
        assert_eq!(window_rates(&s, 8.0), vec![10e6, 5e6]);
        // With `until` before the second window's end only the first is whole.
        assert_eq!(window_rates(&s, 5.0), vec![10e6]);
    }

    #[test]
    fn one_second_lines_merge_into_two_second_windows() {
        // Our testpmd prints every second; its windows come out as long as DPDK's.
        let s = stamps(&[
            (10.0, 1),
            (11.0, 1_000_001),
            (12.0, 4_000_001),
            (13.0, 5_000_001),
            (14.0, 6_000_001),
        ]);
        assert_eq!(window_rates(&s, 100.0), vec![2e6, 1e6]);
    }

    #[test]
    fn lines_that_arrive_together_do_not_make_a_window() {
        // A late stats thread: two lines 1 ms apart, then one 2 s later.
        let s = stamps(&[(1.0, 100), (1.001, 200_100), (3.001, 4_000_100)]);
        let r = window_rates(&s, 10.0);
        assert_eq!(r.len(), 1);
        assert!((r[0] - 4_000_000.0 / 2.001).abs() < 1e-6, "{r:?}");
    }

    #[test]
    fn a_counter_reset_ends_the_windows() {
        // DPDK's memif PMD zeroes its counters when the peer disconnects.
        let s = stamps(&[(0.0, 10), (2.0, 2_000_010), (4.0, 0), (6.0, 1_000_000)]);
        assert_eq!(window_rates(&s, 10.0), vec![1e6]);
    }

    #[test]
    fn no_traffic_no_windows() {
        assert!(window_rates(&stamps(&[(0.0, 0), (2.0, 0), (4.0, 0)]), 10.0).is_empty());
        assert!(window_rates(&[], 10.0).is_empty());
    }

    #[test]
    fn stalls_inside_the_run_are_kept() {
        let s = stamps(&[(0.0, 5), (2.0, 5), (4.0, 2_000_005)]);
        assert_eq!(window_rates(&s, 10.0), vec![0.0, 1e6]);
    }

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v = [50.0, 10.0, 40.0, 20.0, 30.0];
        assert_eq!(percentile(&v, 0.0), Some(10.0));
        assert_eq!(percentile(&v, 0.5), Some(30.0));
        assert_eq!(percentile(&v, 1.0), Some(50.0));
        // Rank 0.2 * 4 = 0.8: between 10 and 20.
        assert!((percentile(&v, 0.2).unwrap() - 18.0).abs() < 1e-9);
        assert!((percentile(&v, 0.8).unwrap() - 42.0).abs() < 1e-9);
        assert_eq!(percentile(&[7.0], 0.8), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn summary_of_a_two_state_cell() {
        // Five slow windows at 12, five fast at 45 (Mpps): the median falls between the states,
        // p20 and p80 each sit in one.
        let mut v = vec![12.0; 5];
        v.extend([45.0; 5]);
        let s = Summary::of(&v).unwrap();
        assert_eq!(
            (s.p20, s.p80, s.min, s.max, s.windows),
            (12.0, 45.0, 12.0, 45.0, 10)
        );
        assert!((s.p50 - 28.5).abs() < 1e-9);
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn order_alternates_across_cells() {
        let runs: Vec<usize> = (0..4).flat_map(|turn| order(2, turn)).collect();
        assert_eq!(runs, vec![0, 1, 1, 0, 0, 1, 1, 0]);
        let runs: Vec<Vec<usize>> = (0..3).map(|turn| order(3, turn)).collect();
        assert_eq!(runs, vec![vec![0, 1, 2], vec![1, 2, 0], vec![2, 0, 1]]);
        assert_eq!(order(1, 5), vec![0]);
    }

    #[test]
    fn swing_sees_two_states_across_sizes() {
        // Two cells (64 B, 1518 B) whose windows flip between a fast and a slow state 2x apart.
        let small = [40.0, 20.0, 40.0, 20.0, 40.0, 20.0];
        let large = [8.0, 4.0, 8.0, 4.0, 8.0, 4.0];
        let s = swing([&small[..], &large[..]]);
        assert_eq!(s.windows, 12);
        assert!((s.p80_over_p20.unwrap() - 2.0).abs() < 1e-9, "{s:?}");
        assert!(swung(&[s]));
    }

    #[test]
    fn steady_windows_are_no_swing() {
        let a = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8];
        let s = swing([&a[..]]);
        assert!(s.p80_over_p20.unwrap() < 1.05, "{s:?}");
        assert!(!swung(&[s]));
    }

    #[test]
    fn swing_needs_enough_windows() {
        let a = [10.0, 30.0, 10.0];
        let s = swing([&a[..]]);
        assert_eq!(s.p80_over_p20, None);
        assert_eq!(s.windows, 3);
        assert!(!swung(&[s]));
    }

    #[test]
    fn cells_of_one_window_are_no_evidence() {
        // One window per cell, each normalised to 1 by itself: that says nothing of a swing.
        let cells = [[40.0], [12.0], [45.0], [11.0], [44.0], [13.0]];
        let s = swing(cells.iter().map(|c| &c[..]));
        assert_eq!(s.p80_over_p20, None);
        assert_eq!(s.windows, 0);
    }

    #[test]
    fn zero_slow_windows_are_an_infinite_swing() {
        let a = [0.0, 0.0, 10.0, 10.0, 10.0, 0.0];
        let s = swing([&a[..]]);
        assert_eq!(s.p80_over_p20, Some(f64::INFINITY));
        assert!(swung(&[s]));
    }
}
