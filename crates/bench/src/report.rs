//! The results: rows (one per case, size and variant), the table on stdout, the JSON, the swing
//! line and the chart.

use std::fmt::Write;

use crate::plan::Plan;
use crate::stats::{self, percentile, Summary, Swing};
use crate::svg;

/// The window rates (Mpps) of every cell: `[case][size][variant]`; with `--interleave` also
/// when each window was taken (the bench's clock, seconds, at its middle), index for index.
pub struct Results {
    pub windows: Vec<Vec<Vec<Vec<f64>>>>,
    pub at: Vec<Vec<Vec<Vec<f64>>>>,
}

impl Results {
    pub fn new(plan: &Plan) -> Results {
        let cells =
            vec![vec![vec![Vec::new(); plan.variants.len()]; plan.sizes.len()]; plan.cases.len()];
        Results {
            windows: cells.clone(),
            at: cells,
        }
    }
}

/// One variant at one size in one case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub case: String,
    pub size: u32,
    pub variant: String,
    /// Mpps at the 20th, 50th and 80th percentile of the windows, their min and max (all
    /// `null` without windows).
    pub p20: Option<f64>,
    pub p50: Option<f64>,
    pub p80: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub windows: usize,
    /// The variant this row is divided by, and the ratios at each quantile.
    pub baseline: Option<String>,
    pub ratio_p20: Option<f64>,
    pub ratio_p50: Option<f64>,
    pub ratio_p80: Option<f64>,
    /// The fraction of the bare-ring limit measured in the same sitting, at each quantile
    /// (`None` for the limit's own row, or without the probe).
    pub of_limit_p20: Option<f64>,
    pub of_limit_p50: Option<f64>,
    pub of_limit_p80: Option<f64>,
    /// Every window's rate (Mpps) in the order taken, and with `--interleave` when each was
    /// taken (the bench's clock, seconds from its start, at the window's middle; empty
    /// otherwise), index for index: the series behind the quantiles, where a run that held one
    /// state throughout, or a pair that started slow, shows as it happened.
    pub rates: Vec<f64>,
    pub at: Vec<f64>,
}

impl Row {
    pub fn summary(&self) -> Option<Summary> {
        Some(Summary {
            p20: self.p20?,
            p50: self.p50?,
            p80: self.p80?,
            min: self.min?,
            max: self.max?,
            windows: self.windows,
        })
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

pub fn rows(plan: &Plan, res: &Results) -> Vec<Row> {
    let mut rows = Vec::new();
    for (ci, case) in plan.cases.iter().enumerate() {
        for (si, &size) in plan.sizes.iter().enumerate() {
            let cell = &res.windows[ci][si];
            let at = &res.at[ci][si];
            for (vi, v) in plan.variants.iter().enumerate() {
                let s = Summary::of(&cell[vi]);
                let limit_at = plan.limit_for(vi);
                let limit = limit_at.and_then(|l| Summary::of(&cell[l]));
                let base = v.baseline.map(|b| Summary::of(&cell[b]));
                // A scaling run divides by N times the one-pair figure: 1.0 is perfect scaling.
                let pairs = if plan.per_pair {
                    f64::from(v.pairs)
                } else {
                    1.0
                };
                let per = |r: Option<f64>| r.map(|r| r / pairs);
                // Interleaved: the quantile of the ratios of windows taken nearest in time;
                // otherwise the ratio of the same quantile of each.
                let over = |other: Option<usize>, q: f64| match other {
                    Some(o) => percentile(
                        &stats::paired_ratios((&at[vi], &cell[vi]), (&at[o], &cell[o])),
                        q,
                    ),
                    None => None,
                };
                let r = |f: fn(&Summary) -> f64, q: f64| match (&base, plan.interleave) {
                    (Some(_), true) => per(over(v.baseline, q)),
                    (Some(b), false) => per(ratio(s.as_ref().map(f), b.as_ref().map(f))),
                    (None, _) => None,
                };
                // Over the limit with as many rings as the pair has queues: no division by N.
                let of_limit = |f: fn(&Summary) -> f64, q: f64| match (limit_at, plan.interleave) {
                    (None, _) => None,
                    (Some(_), true) => over(limit_at, q),
                    (Some(_), false) => ratio(s.as_ref().map(f), limit.as_ref().map(f)),
                };
                rows.push(Row {
                    case: case.label(),
                    size,
                    variant: v.label.clone(),
                    p20: s.map(|s| s.p20),
                    p50: s.map(|s| s.p50),
                    p80: s.map(|s| s.p80),
                    min: s.map(|s| s.min),
                    max: s.map(|s| s.max),
                    windows: cell[vi].len(),
                    baseline: v.baseline.map(|b| plan.variants[b].label.clone()),
                    ratio_p20: r(|s| s.p20, 0.2),
                    ratio_p50: r(|s| s.p50, 0.5),
                    ratio_p80: r(|s| s.p80, 0.8),
                    of_limit_p20: of_limit(|s| s.p20, 0.2),
                    of_limit_p50: of_limit(|s| s.p50, 0.5),
                    of_limit_p80: of_limit(|s| s.p80, 0.8),
                    rates: cell[vi].clone(),
                    at: at[vi].clone(),
                });
            }
        }
    }
    rows
}

/// Each variant's swing, over all its cells.
pub fn swings(plan: &Plan, res: &Results) -> Vec<(String, Swing)> {
    plan.variants
        .iter()
        .enumerate()
        .map(|(vi, v)| {
            let cells = res
                .windows
                .iter()
                .flat_map(|sizes| sizes.iter().map(move |vars| vars[vi].as_slice()));
            (v.label.clone(), stats::swing(cells))
        })
        .collect()
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("   -".into(), |r| format!("{r:4.2}"))
}

/// The table: a heading, one line per row, the swing lines.
pub fn table(plan: &Plan, rows: &[Row], swings: &[(String, Swing)]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "memnic bench {}: {}", plan.bench, plan.title);
    let _ = writeln!(s, "{}", plan.method);
    if plan.interleave {
        let _ = writeln!(
            s,
            "{} round(s) x {} turns; in each turn every pair (kept at its prompts) forwards for one window, in alternating order; Mpps of {}",
            plan.rounds, plan.seconds, plan.windows
        );
    } else {
        let _ = writeln!(
            s,
            "{} round(s) x {} s per run, runs alternating; Mpps of {}",
            plan.rounds, plan.seconds, plan.windows
        );
    }
    // What a ratio is a quantile of.
    let same = if plan.interleave {
        "the quantile of the ratios of each window to the other's nearest in time (seconds apart)"
    } else {
        "at the same quantile"
    };
    let _ = writeln!(
        s,
        "p20 ~ the machine's slow state, p80 ~ its fast state; n: windows{}{}",
        match plan.variants.iter().find_map(|v| v.baseline) {
            Some(_) if plan.per_pair => "; xN: N queue pairs, an lcore each per side; ratio: over N times the same pair's x1 at the same quantile (1.00: perfect scaling)".to_string(),
            Some(b) => format!("; ratio: over {}, {same}", plan.variants[b].label),
            None => String::new(),
        },
        match plan.limit {
            Some(_) if plan.per_pair => format!(
                "; of limit: the fraction of the limit xN, {same} (N bare slot rings side by side, each two threads pinned to one queue pair's CPUs, nothing else)"
            ),
            Some(l) => format!(
                "; of limit: the fraction of {}, {same} (two pinned threads moving frames through a bare slot ring, nothing else)",
                plan.variants[l].label
            ),
            None => String::new(),
        }
    );
    let case_w = rows.iter().map(|r| r.case.len()).max().unwrap_or(0);
    let var_w = rows
        .iter()
        .map(|r| r.variant.len())
        .chain([plan.variant_heading.len()])
        .max()
        .unwrap_or(0);
    let case_col = |c: &str| {
        if case_w > 0 {
            format!("{c:<case_w$}  ")
        } else {
            String::new()
        }
    };
    let has_ratios = plan.variants.iter().any(|v| v.baseline.is_some());
    let ratio_head = if has_ratios {
        "  ratio p20  p50  p80"
    } else {
        ""
    };
    let limit_head = if plan.limit.is_some() {
        "  of limit p20  p50  p80"
    } else {
        ""
    };
    let head = format!(
        "{}{:>5}  {:<var_w$}  {:>6} {:>6} {:>6}  {:>13} {:>4}{ratio_head}{limit_head}",
        case_col("case"),
        "size",
        plan.variant_heading,
        "p20",
        "p50",
        "p80",
        "min-max",
        "n"
    );
    let limit_labels: Vec<&str> = (0..plan.variants.len())
        .filter(|&vi| plan.is_limit(vi))
        .map(|vi| plan.variants[vi].label.as_str())
        .collect();
    let _ = writeln!(s, "{head}");
    let _ = writeln!(s, "{}", "-".repeat(head.len()));
    for r in rows {
        let fig = |v: Option<f64>| v.map_or("     -".into(), |v| format!("{v:6.2}"));
        let range = match (r.min, r.max) {
            (Some(a), Some(b)) => format!("{a:.2}-{b:.2}"),
            _ => "-".into(),
        };
        let mut ratios = String::new();
        if has_ratios {
            ratios = if r.baseline.is_some() {
                format!(
                    "       {} {} {}",
                    fmt_ratio(r.ratio_p20),
                    fmt_ratio(r.ratio_p50),
                    fmt_ratio(r.ratio_p80)
                )
            } else {
                // Keeps the limit column in place (the line's end is trimmed).
                " ".repeat(ratio_head.len())
            };
        }
        if plan.limit.is_some() && !limit_labels.contains(&r.variant.as_str()) {
            let _ = write!(
                ratios,
                "          {} {} {}",
                fmt_ratio(r.of_limit_p20),
                fmt_ratio(r.of_limit_p50),
                fmt_ratio(r.of_limit_p80)
            );
        }
        let line = format!(
            "{}{:>5}  {:<var_w$}  {} {} {}  {:>13} {:>4}{ratios}",
            case_col(&r.case),
            r.size,
            r.variant,
            fig(r.p20),
            fig(r.p50),
            fig(r.p80),
            range,
            r.windows
        );
        let _ = writeln!(s, "{}", line.trim_end());
    }
    s.push_str(&swing_lines(swings));
    s
}

/// What the bench saw of the machine's swing, and the warning when it swung.
pub fn swing_lines(swings: &[(String, Swing)]) -> String {
    let parts: Vec<String> = swings
        .iter()
        .map(|(v, sw)| match sw.p80_over_p20 {
            Some(r) if r.is_finite() => format!("{v} {r:.2}x (n={})", sw.windows),
            Some(_) => format!(
                "{v} unbounded: slow windows counted nothing (n={})",
                sw.windows
            ),
            None => format!("{v} too few windows to tell (n={})", sw.windows),
        })
        .collect();
    let mut s = format!(
        "swing: p80/p20 of each variant's windows (each over its cell's median): {}\n",
        parts.join(", ")
    );
    let plain: Vec<Swing> = swings.iter().map(|(_, s)| *s).collect();
    if stats::swung(&plain) {
        let worst = plain
            .iter()
            .filter_map(|s| s.p80_over_p20)
            .fold(0.0, f64::max);
        let _ = writeln!(
            s,
            "warning: this machine swung between two states (fast/slow up to {}): medians mix them; compare p80 with p80 (fast state) and p20 with p20 (slow state)",
            if worst.is_finite() {
                format!("{worst:.2}x")
            } else {
                "a full stop".into()
            }
        );
    } else if plain.iter().all(|s| s.p80_over_p20.is_some()) {
        let _ = writeln!(
            s,
            "no two-state swing seen (p80/p20 at most {}x)",
            stats::SWING_WARN
        );
    }
    s
}

/// The JSON document: the rows, the swing, and what was run.
pub fn json(plan: &Plan, rows: &[Row], swings: &[(String, Swing)], date: &str) -> String {
    #[derive(serde::Serialize)]
    struct SwingRow<'a> {
        variant: &'a str,
        p80_over_p20: Option<f64>,
        windows: usize,
    }
    let doc = serde_json::json!({
        "bench": plan.bench,
        "title": plan.title,
        "method": plan.method,
        "window": plan.windows,
        // Ratios of windows nearest in time (true) or of the same quantile of each (false).
        "interleave": plan.interleave,
        "date": date,
        "rounds": plan.rounds,
        "seconds": plan.seconds,
        "cpus": [plan.cpus.0, plan.cpus.1],
        "unit": "Mpps",
        "rows": rows,
        "swing": swings.iter().map(|(v, s)| SwingRow {
            variant: v,
            // JSON has no infinity: a slow state that counted nothing reads as a huge number.
            p80_over_p20: s.p80_over_p20.map(|r| r.min(f64::MAX)),
            windows: s.windows,
        }).collect::<Vec<_>>(),
        "swung": stats::swung(&swings.iter().map(|(_, s)| *s).collect::<Vec<_>>()),
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// The chart: one series per case and variant.
pub fn chart(plan: &Plan, rows: &[Row], swings: &[(String, Swing)], date: &str) -> svg::Chart {
    let mut series = Vec::new();
    for (ci, case) in plan.cases.iter().enumerate() {
        for (vi, v) in plan.variants.iter().enumerate() {
            let label = if plan.cases.len() > 1 {
                format!("{} {}", v.label, case.label())
            } else {
                v.label.clone()
            };
            let points = rows
                .iter()
                .filter(|r| r.case == case.label() && r.variant == v.label)
                .filter_map(|r| {
                    Some(svg::Point {
                        size: r.size,
                        summary: r.summary()?,
                    })
                })
                .collect();
            series.push(svg::Series {
                label,
                color: vi,
                dash: ci,
                points,
            });
        }
    }
    svg::Chart {
        title: format!("memnic bench {}: {} ({date})", plan.bench, plan.title),
        subtitle: format!(
            "Mpps of {}; line: median (p50), band: p20–p80, bars: min–max; {} round(s) x {} s per run, alternating; {}",
            plan.windows, plan.rounds, plan.seconds, plan.method
        ),
        notes: swing_lines(swings)
            .lines()
            .map(|l| svg::Note {
                text: l.to_string(),
                warning: l.starts_with("warning:"),
            })
            .collect(),
        sizes: plan.sizes.clone(),
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Shape;
    use crate::plan::{Case, Impl, Run, VariantSpec};

    fn plan() -> Plan {
        Plan {
            bench: "memif",
            title: "t".into(),
            method: "m".into(),
            windows: "w",
            variant_heading: "pair",
            cases: vec![Case::Only],
            sizes: vec![64, 1518],
            variants: vec![
                VariantSpec {
                    label: "dpdk<-dpdk".into(),
                    run: Run::Memif {
                        server: Impl::Dpdk,
                        client: Impl::Dpdk,
                        queues: 1,
                        server_sends: false,
                        zero_copy: false,
                    },
                    baseline: None,
                    pairs: 1,
                },
                VariantSpec {
                    label: "memnic<-memnic".into(),
                    run: Run::Memif {
                        server: Impl::Memnic,
                        client: Impl::Memnic,
                        queues: 1,
                        server_sends: false,
                        zero_copy: false,
                    },
                    baseline: Some(0),
                    pairs: 1,
                },
            ],
            per_pair: false,
            interleave: false,
            limit: None,
            rounds: 1,
            seconds: 4,
            cpus: (0, 1),
            sides: (vec![0], vec![1]),
            json: false,
            svg: None,
            quiet: true,
            devargs: None,
        }
    }

    /// The limit probe as the plan's last variant.
    fn with_limit(p: &mut Plan) {
        p.variants.push(VariantSpec {
            label: "limit (2 copies)".into(),
            run: Run::Limit {
                copies: 2,
                shape: Shape::Indices,
                rings: 1,
            },
            baseline: None,
            pairs: 1,
        });
        p.limit = Some(p.variants.len() - 1);
    }

    #[test]
    fn rows_carry_quantiles_and_ratios() {
        let p = plan();
        let mut res = Results::new(&p);
        res.windows[0][0][0] = vec![10.0, 20.0, 10.0, 20.0, 10.0, 20.0];
        res.windows[0][0][1] = vec![12.0, 30.0, 12.0, 30.0, 12.0, 30.0];
        res.windows[0][1][0] = vec![5.0];
        let rows = rows(&p, &res);
        assert_eq!(rows.len(), 4);
        let (d, m) = (&rows[0], &rows[1]);
        assert_eq!((d.size, d.variant.as_str()), (64, "dpdk<-dpdk"));
        assert_eq!((d.p20, d.p80, d.windows), (Some(10.0), Some(20.0), 6));
        assert_eq!(d.baseline, None);
        assert_eq!(d.ratio_p80, None);
        assert_eq!(m.baseline.as_deref(), Some("dpdk<-dpdk"));
        assert_eq!(m.ratio_p20, Some(1.2));
        assert_eq!(m.ratio_p80, Some(1.5));
        // 1518 B: ours has no windows, so no figures and no ratio.
        assert_eq!(
            (rows[3].p50, rows[3].ratio_p50, rows[3].windows),
            (None, None, 0)
        );
        let sw = swings(&p, &res);
        // The 1518-B cell of one window says nothing of a swing: only the 64-B windows count.
        assert_eq!(sw[0].1.windows, 6);
        let t = table(&p, &rows, &sw);
        assert!(
            t.contains("warning: this machine swung between two states"),
            "{t}"
        );
        let line = t
            .lines()
            .find(|l| l.contains("memnic<-memnic") && l.contains("  64  "))
            .unwrap();
        assert!(line.contains("12.00  21.00  30.00"), "{line}");
        assert!(line.contains("1.20 1.40 1.50"), "{line}");
    }

    /// Interleaved, a ratio is a quantile of the ratios of windows nearest in time. Ours is
    /// 1.2x DPDK's in either state, but the machine went fast between DPDK's window and ours in
    /// two of five turns: the ratio of the medians says 4.8, the median of the paired ratios
    /// 1.2; the limit, 0.8 s after ours in each turn, is always 4x ours' state.
    #[test]
    fn interleaved_rows_divide_windows_nearest_in_time() {
        let mut p = plan();
        with_limit(&mut p);
        p.interleave = true;
        let mut res = Results::new(&p);
        let dpdk = [10.0, 10.0, 10.0, 40.0, 40.0];
        let ours = [10.0, 40.0, 40.0, 40.0, 40.0];
        for k in 0..5 {
            let t = 2.0 * k as f64;
            for (vi, at, mpps) in [
                (0, t, dpdk[k]),
                (1, t + 0.8, 1.2 * ours[k]),
                (2, t + 1.6, 4.0 * ours[k]),
            ] {
                res.at[0][0][vi].push(at);
                res.windows[0][0][vi].push(mpps);
            }
        }
        let rows = rows(&p, &res);
        let r = &rows[1];
        let close = |x: Option<f64>, y: f64| x.is_some_and(|x| (x - y).abs() < 1e-9);
        assert!(close(r.p50.zip(rows[0].p50).map(|(a, b)| a / b), 4.8));
        assert!(close(r.ratio_p20, 1.2) && close(r.ratio_p50, 1.2), "{r:?}");
        assert!(close(r.ratio_p80, 4.8), "the two turns with a flip: {r:?}");
        for f in [r.of_limit_p20, r.of_limit_p50, r.of_limit_p80] {
            assert!(close(f, 0.3), "{r:?}");
        }
        // Without --interleave the same windows give the ratio of the quantiles.
        p.interleave = false;
        assert!(close(super::rows(&p, &res)[1].ratio_p50, 4.8));
        p.interleave = true;
        let t = table(&p, &rows, &swings(&p, &res));
        assert!(t.contains("nearest in time"), "{t}");
    }

    #[test]
    fn rows_carry_their_fraction_of_the_limit() {
        let mut p = plan();
        with_limit(&mut p);
        let mut res = Results::new(&p);
        res.windows[0][0][0] = vec![10.0; 6];
        res.windows[0][0][1] = vec![12.0; 6];
        res.windows[0][0][2] = vec![40.0; 6];
        let rows = rows(&p, &res);
        assert_eq!(rows.len(), 6);
        assert_eq!(
            (rows[0].of_limit_p50, rows[1].of_limit_p80),
            (Some(0.25), Some(0.3))
        );
        // The limit is neither divided by DPDK's nor by itself.
        assert_eq!((rows[2].ratio_p50, rows[2].of_limit_p50), (None, None));
        let t = table(&p, &rows, &swings(&p, &res));
        assert!(t.contains("of limit p20  p50  p80"), "{t}");
        let line = |v: &str| {
            t.lines()
                .find(|l| l.contains(v) && l.contains("  64  "))
                .unwrap()
                .to_string()
        };
        assert!(
            line("memnic<-memnic").ends_with("1.20 1.20 1.20          0.30 0.30 0.30"),
            "{t}"
        );
        assert!(
            line("dpdk<-dpdk").ends_with("          0.25 0.25 0.25"),
            "{t}"
        );
        assert!(
            line("limit (2 copies)").ends_with("40.00-40.00    6"),
            "{t}"
        );
    }

    #[test]
    fn a_scaling_run_divides_by_n_times_one_pair_and_by_the_limit_with_n_rings() {
        let mut p = plan();
        p.per_pair = true;
        let scaled = |label: &str, first: usize, run: &dyn Fn(u16) -> Run| {
            [1u16, 2, 4]
                .iter()
                .enumerate()
                .map(|(i, &n)| VariantSpec {
                    label: format!("{label} x{n}"),
                    run: run(n),
                    baseline: (i > 0).then_some(first),
                    pairs: n,
                })
                .collect::<Vec<_>>()
        };
        p.variants = scaled("memnic<-memnic", 0, &|queues| Run::Memif {
            server: Impl::Memnic,
            client: Impl::Memnic,
            queues,
            server_sends: false,
            zero_copy: false,
        });
        p.variants
            .extend(scaled("limit (2 copies)", 3, &|rings| Run::Limit {
                copies: 2,
                shape: Shape::Indices,
                rings,
            }));
        p.limit = Some(3);
        let mut res = Results::new(&p);
        for (vi, mpps) in [10.0, 17.0, 40.0, 50.0, 80.0, 100.0]
            .into_iter()
            .enumerate()
        {
            res.windows[0][0][vi] = vec![mpps; 6];
        }
        let rows = rows(&p, &res);
        // x2: 17 over 2 x 10; x4: 40 over 4 x 10.
        assert_eq!(rows[1].ratio_p50, Some(0.85));
        assert_eq!(rows[2].ratio_p50, Some(1.0));
        // Each over the limit with as many rings: 10/50, 17/80, 40/100.
        assert_eq!(rows[0].of_limit_p50, Some(0.2));
        assert_eq!(rows[1].of_limit_p50, Some(17.0 / 80.0));
        assert_eq!(rows[2].of_limit_p50, Some(0.4));
        // The limits' own scaling: 80 over 2 x 50, 100 over 4 x 50; no fraction of themselves.
        assert_eq!(rows[4].ratio_p50, Some(0.8));
        assert_eq!(rows[5].ratio_p50, Some(0.5));
        assert_eq!((rows[3].of_limit_p50, rows[5].of_limit_p50), (None, None));
        let t = table(&p, &rows, &swings(&p, &res));
        assert!(t.contains("over N times the same pair's x1"), "{t}");
        assert!(t.contains("fraction of the limit xN"), "{t}");
        let line = |v: &str| t.lines().find(|l| l.contains(v)).unwrap().to_string();
        assert!(
            line("limit (2 copies) x4").ends_with("0.50 0.50 0.50"),
            "{t}"
        );
        assert!(line("memnic<-memnic x4").ends_with("0.40 0.40 0.40"), "{t}");
    }

    #[test]
    fn json_rows_and_swing() {
        let p = plan();
        let mut res = Results::new(&p);
        res.windows[0][0][0] = vec![10.0; 6];
        res.windows[0][0][1] = vec![11.0; 6];
        let rows = rows(&p, &res);
        let sw = swings(&p, &res);
        let v: serde_json::Value =
            serde_json::from_str(&json(&p, &rows, &sw, "2026-12-01")).unwrap();
        assert_eq!(v["rows"].as_array().unwrap().len(), 4);
        assert_eq!(v["rows"][1]["p50"], 11.0);
        assert_eq!(v["rows"][1]["ratio_p50"], 1.1);
        assert_eq!(v["rows"][2]["p50"], serde_json::Value::Null);
        assert_eq!(v["swing"][0]["p80_over_p20"], 1.0);
        assert_eq!(v["swung"], false);
        assert!(table(&p, &rows, &sw).contains("no two-state swing seen"));
    }

    /// The JSON keeps each window, in the order taken, beside the quantiles; interleaved, with
    /// when it was taken.
    #[test]
    fn json_rows_carry_their_windows() {
        let mut p = plan();
        p.interleave = true;
        let mut res = Results::new(&p);
        for (k, mpps) in [6.0, 18.5, 19.0].into_iter().enumerate() {
            res.at[0][0][1].push(1.5 + 4.0 * k as f64);
            res.windows[0][0][1].push(mpps);
        }
        let rows = rows(&p, &res);
        let v: serde_json::Value =
            serde_json::from_str(&json(&p, &rows, &swings(&p, &res), "2026-12-05")).unwrap();
        let ours = &v["rows"][1];
        assert_eq!(ours["rates"], serde_json::json!([6.0, 18.5, 19.0]));
        assert_eq!(ours["at"], serde_json::json!([1.5, 5.5, 9.5]));
        assert_eq!(ours["windows"], 3);
        // A variant without windows has empty series, not missing ones.
        assert_eq!(v["rows"][3]["rates"], serde_json::json!([]));
    }
}
