//! `memnic abflip-report`: reads the log of an in-process A/B run (`memnic_ethdev::abflip`),
//! one window a line ("A 20.412", "B 20.760": variant and Mpps), and compares each B window
//! with the mean of the A windows on either side of it, which share its machine state.

use crate::stats::{percentile, Summary};

/// What a log says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// B over the mean of its two A neighbours, one per B window that has both.
    pub ratios: Summary,
    /// The median rate of each variant's windows, in Mpps.
    pub a_p50: f64,
    pub b_p50: f64,
}

/// Reads `log`, leaving out its first `skip` windows (the start: links coming up, tuners
/// settling). A line that is not a window is an error naming it.
pub fn report(log: &str, skip: usize) -> Result<Report, String> {
    let mut windows = Vec::new();
    for (i, line) in log.lines().enumerate() {
        let parsed = line.split_once(' ').and_then(|(v, r)| {
            let b = match v {
                "A" => false,
                "B" => true,
                _ => return None,
            };
            let rate = r.trim().parse::<f64>().ok().filter(|r| r.is_finite())?;
            Some((b, rate))
        });
        windows.push(parsed.ok_or_else(|| {
            format!(
                "line {} is not a window (\"A <Mpps>\" or \"B <Mpps>\"): {line:?}",
                i + 1
            )
        })?);
    }
    let total = windows.len();
    let windows = windows.get(skip..).unwrap_or_default();
    let ratios: Vec<f64> = windows
        .windows(3)
        .filter_map(|w| match w {
            [(false, before), (true, b), (false, after)] if before + after > 0.0 => {
                Some(b / ((before + after) / 2.0))
            }
            _ => None,
        })
        .collect();
    let rates = |variant: bool| -> Vec<f64> {
        windows
            .iter()
            .filter(|w| w.0 == variant)
            .map(|w| w.1)
            .collect()
    };
    let none =
        || format!("no B window with A windows on both sides after the first {skip} (of {total})");
    Ok(Report {
        ratios: Summary::of(&ratios).ok_or_else(none)?,
        a_p50: percentile(&rates(false), 0.5).ok_or_else(none)?,
        b_p50: percentile(&rates(true), 0.5).ok_or_else(none)?,
    })
}

/// The report as a line: `n=31 B/A p20/p50/p80 1.011/1.019/1.034  A p50 20.49  B p50 20.99 Mpps`.
pub fn line(r: &Report) -> String {
    format!(
        "n={} B/A p20/p50/p80 {:.3}/{:.3}/{:.3}  A p50 {:.2}  B p50 {:.2} Mpps",
        r.ratios.windows, r.ratios.p20, r.ratios.p50, r.ratios.p80, r.a_p50, r.b_p50
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_b_window_is_compared_with_its_two_a_neighbours() {
        // After the skipped two: A 10, B 12, A 14 -> 12/12 = 1.0; B 18, A 10 -> 18/12 = 1.5;
        // the last B has no A after it.
        let log = "A 99\nB 1\nA 10\nB 12\nA 14\nB 18\nA 10\nB 30\n";
        let r = report(log, 2).unwrap();
        assert_eq!(r.ratios.windows, 2);
        assert!((r.ratios.min - 1.0).abs() < 1e-9, "{r:?}");
        assert!((r.ratios.max - 1.5).abs() < 1e-9, "{r:?}");
        assert!((r.a_p50 - 10.0).abs() < 1e-9, "A windows 10, 14, 10: {r:?}");
        assert!((r.b_p50 - 18.0).abs() < 1e-9, "B windows 12, 18, 30: {r:?}");
        assert!(line(&r).starts_with("n=2 B/A p20/p50/p80 1.100/1.250/1.400"));
    }

    #[test]
    fn a_bad_line_or_no_pair_is_one_sentence() {
        assert_eq!(
            report("A 1\nB two\n", 0).unwrap_err(),
            "line 2 is not a window (\"A <Mpps>\" or \"B <Mpps>\"): \"B two\""
        );
        assert!(report("A 1\nB 2\nA 3\n", 3)
            .unwrap_err()
            .starts_with("no B window with A windows on both sides"));
        assert!(report("", 0).is_err());
    }
}
