//! The chart: Mpps against frame size, one line per series at the median of its windows, a
//! shaded p20–p80 band (the slow and the fast state) and min–max bars, written as SVG text.

use std::fmt::Write;

use crate::stats::Summary;

pub const WIDTH: f64 = 980.0;
pub const HEIGHT: f64 = 560.0;
/// The plot area; the legend sits right of it.
pub const PLOT_LEFT: f64 = 80.0;
pub const PLOT_RIGHT: f64 = 660.0;
pub const PLOT_TOP: f64 = 110.0;
pub const PLOT_BOTTOM: f64 = 480.0;
/// The first and last frame size sit this far inside the plot area.
pub const X_PAD: f64 = 30.0;

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
const DASHES: [&str; 4] = ["", "7 4", "2 3", "9 3 2 3"];

/// One cell's figures at one frame size.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub size: u32,
    pub summary: Summary,
}

/// One line of the chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    /// Picks the colour (one per variant).
    pub color: usize,
    /// Picks the dash pattern (one per case).
    pub dash: usize,
    pub points: Vec<Point>,
}

#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    /// Under the title, wrapped to the page (three lines at most).
    pub subtitle: String,
    /// Under the legend, wrapped to its column (the machine's swing).
    pub notes: Vec<Note>,
    /// The measured frame sizes: the x axis's ticks.
    pub sizes: Vec<u32>,
    pub series: Vec<Series>,
}

/// A remark on the chart; a warning is drawn in red.
#[derive(Debug, Clone)]
pub struct Note {
    pub text: String,
    pub warning: bool,
}

/// The top of the y axis and its tick step: a round step giving about five ticks.
fn y_axis(max: f64) -> (f64, f64) {
    if !(max > 0.0 && max.is_finite()) {
        return (1.0, 0.2);
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

/// Where things go on the page.
struct Scale {
    log_min: f64,
    log_max: f64,
    y_top: f64,
}

impl Scale {
    fn x(&self, size: u32) -> f64 {
        let (l, r) = (PLOT_LEFT + X_PAD, PLOT_RIGHT - X_PAD);
        if self.log_max <= self.log_min {
            return (l + r) / 2.0;
        }
        l + (f64::from(size).log2() - self.log_min) / (self.log_max - self.log_min) * (r - l)
    }

    fn y(&self, mpps: f64) -> f64 {
        PLOT_BOTTOM - mpps.max(0.0) / self.y_top * (PLOT_BOTTOM - PLOT_TOP)
    }
}

/// Text fit for an SVG text node or attribute.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// About this many characters of 12-px text fit across the page, and in the legend's column.
const SUBTITLE_CHARS: usize = 130;
const NOTE_CHARS: usize = 40;

/// `text` in lines of at most `width` characters, broken between words (a longer word stands
/// alone on its line).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

fn num(v: f64) -> String {
    format!("{v:.1}")
}

/// A tick label: no more decimals than the step needs.
fn tick_label(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The whole SVG document.
pub fn render(c: &Chart) -> String {
    let max = c
        .series
        .iter()
        .flat_map(|s| &s.points)
        .map(|p| p.summary.max)
        .filter(|m| m.is_finite())
        .fold(0.0, f64::max);
    let (y_top, step) = y_axis(max);
    let logs = c.sizes.iter().map(|&s| f64::from(s.max(1)).log2());
    let scale = Scale {
        log_min: logs.clone().fold(f64::INFINITY, f64::min),
        log_max: logs.fold(f64::NEG_INFINITY, f64::max),
        y_top,
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="13">
<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>
<text class="title" x="{PLOT_LEFT}" y="34" font-size="18" font-weight="bold">{}</text>"##,
        escape(&c.title),
    );
    for (i, line) in wrap(&c.subtitle, SUBTITLE_CHARS).iter().take(3).enumerate() {
        let _ = writeln!(
            s,
            r##"<text class="subtitle" x="{PLOT_LEFT}" y="{}" font-size="12" fill="#444">{}</text>"##,
            56 + 16 * i,
            escape(line)
        );
    }
    axes(&mut s, c, &scale, step);
    let n = c.series.len() as f64;
    for (i, series) in c.series.iter().enumerate() {
        // Side by side at one size, the min–max bars of the series do not cover each other.
        let nudge = (i as f64 - (n - 1.0) / 2.0) * 4.0;
        draw_series(&mut s, series, &scale, nudge);
    }
    legend(&mut s, c);
    s.push_str("</svg>\n");
    s
}

fn axes(s: &mut String, c: &Chart, scale: &Scale, step: f64) {
    s.push_str("<g class=\"axes\" stroke=\"#333\">\n");
    let mut v = 0.0;
    while v <= scale.y_top + step / 2.0 {
        let y = num(scale.y(v));
        let _ = writeln!(
            s,
            r##"<line class="grid" x1="{PLOT_LEFT}" y1="{y}" x2="{PLOT_RIGHT}" y2="{y}" stroke="#ddd"/>
<text class="ytick" x="{}" y="{y}" dy="4" text-anchor="end" stroke="none">{}</text>"##,
            PLOT_LEFT - 8.0,
            tick_label(v, step)
        );
        v += step;
    }
    for &size in &c.sizes {
        let x = num(scale.x(size));
        let _ = writeln!(
            s,
            r#"<line x1="{x}" y1="{PLOT_BOTTOM}" x2="{x}" y2="{}"/>
<text class="xtick" x="{x}" y="{}" text-anchor="middle" stroke="none">{size}</text>"#,
            PLOT_BOTTOM + 5.0,
            PLOT_BOTTOM + 20.0
        );
    }
    let _ = writeln!(
        s,
        r#"<line x1="{PLOT_LEFT}" y1="{PLOT_BOTTOM}" x2="{PLOT_RIGHT}" y2="{PLOT_BOTTOM}"/>
<line x1="{PLOT_LEFT}" y1="{PLOT_TOP}" x2="{PLOT_LEFT}" y2="{PLOT_BOTTOM}"/>
<text class="xlabel" x="{}" y="{}" text-anchor="middle" stroke="none">frame size, bytes (log scale)</text>
<text class="ylabel" x="24" y="{}" text-anchor="middle" stroke="none" transform="rotate(-90 24 {})">Mpps</text>
</g>"#,
        (PLOT_LEFT + PLOT_RIGHT) / 2.0,
        PLOT_BOTTOM + 44.0,
        (PLOT_TOP + PLOT_BOTTOM) / 2.0,
        (PLOT_TOP + PLOT_BOTTOM) / 2.0
    );
}

fn draw_series(s: &mut String, series: &Series, scale: &Scale, nudge: f64) {
    let color = COLORS[series.color % COLORS.len()];
    let dash = DASHES[series.dash % DASHES.len()];
    let mut pts: Vec<&Point> = series.points.iter().collect();
    pts.sort_by_key(|p| p.size);
    let _ = writeln!(
        s,
        r#"<g class="series" data-label="{}">"#,
        escape(&series.label)
    );
    if let [only] = pts[..] {
        let x = scale.x(only.size);
        let (y80, y20) = (scale.y(only.summary.p80), scale.y(only.summary.p20));
        let _ = writeln!(
            s,
            r#"<rect class="band" x="{}" y="{}" width="16" height="{}" fill="{color}" fill-opacity="0.18"/>"#,
            num(x - 8.0),
            num(y80),
            num(y20 - y80)
        );
    } else if !pts.is_empty() {
        let upper = pts
            .iter()
            .map(|p| format!("{},{}", num(scale.x(p.size)), num(scale.y(p.summary.p80))));
        let lower = pts
            .iter()
            .rev()
            .map(|p| format!("{},{}", num(scale.x(p.size)), num(scale.y(p.summary.p20))));
        let d: Vec<String> = upper.chain(lower).collect();
        let _ = writeln!(
            s,
            r#"<path class="band" d="M {} Z" fill="{color}" fill-opacity="0.18" stroke="none"/>"#,
            d.join(" L ")
        );
    }
    for p in &pts {
        let x = num(scale.x(p.size) + nudge);
        let (lo, hi) = (num(scale.y(p.summary.min)), num(scale.y(p.summary.max)));
        let _ = writeln!(
            s,
            r#"<line class="range" x1="{x}" y1="{lo}" x2="{x}" y2="{hi}" stroke="{color}" stroke-width="1.2"/>"#
        );
    }
    if pts.len() > 1 {
        let line: Vec<String> = pts
            .iter()
            .map(|p| format!("{},{}", num(scale.x(p.size)), num(scale.y(p.summary.p50))))
            .collect();
        let dash_attr = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        let _ = writeln!(
            s,
            r#"<polyline class="median" points="{}" fill="none" stroke="{color}" stroke-width="2.2"{dash_attr}/>"#,
            line.join(" ")
        );
    }
    for p in &pts {
        let m = &p.summary;
        let _ = writeln!(
            s,
            r#"<circle class="point" cx="{}" cy="{}" r="3.5" fill="{color}" data-size="{}" data-p50="{}"><title>{}, {} B: median {:.2} Mpps, p20–p80 {:.2}–{:.2}, min–max {:.2}–{:.2}, {} windows</title></circle>"#,
            num(scale.x(p.size)),
            num(scale.y(m.p50)),
            p.size,
            m.p50,
            escape(&series.label),
            p.size,
            m.p50,
            m.p20,
            m.p80,
            m.min,
            m.max,
            m.windows
        );
    }
    s.push_str("</g>\n");
}

fn legend(s: &mut String, c: &Chart) {
    let x = PLOT_RIGHT + 24.0;
    let mut y = PLOT_TOP + 6.0;
    s.push_str("<g class=\"legend\">\n");
    for series in &c.series {
        let color = COLORS[series.color % COLORS.len()];
        let dash = DASHES[series.dash % DASHES.len()];
        let label = if series.points.is_empty() {
            format!("{} (no windows)", series.label)
        } else {
            series.label.clone()
        };
        let _ = writeln!(
            s,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{color}" stroke-width="2.2" stroke-dasharray="{dash}"/>
<text class="legend-label" x="{}" y="{}">{}</text>"#,
            x + 28.0,
            x + 36.0,
            y + 4.0,
            escape(&label)
        );
        y += 22.0;
    }
    y += 12.0;
    let _ = writeln!(
        s,
        r##"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="#555" stroke-width="2.2"/>
<text x="{}" y="{}" font-size="12">median (p50) of the windows</text>
<rect x="{x}" y="{}" width="28" height="12" fill="#555" fill-opacity="0.18"/>
<text x="{}" y="{}" font-size="12">p20–p80 (slow–fast state)</text>
<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#555" stroke-width="1.2"/>
<text x="{}" y="{}" font-size="12">min–max</text>"##,
        x + 28.0,
        x + 36.0,
        y + 4.0,
        y + 16.0,
        x + 36.0,
        y + 26.0,
        x + 14.0,
        y + 36.0,
        x + 14.0,
        y + 52.0,
        x + 36.0,
        y + 48.0
    );
    y += 80.0;
    for note in &c.notes {
        let (class, color) = if note.warning {
            ("warning", "#b00000")
        } else {
            ("note", "#444")
        };
        for line in wrap(&note.text, NOTE_CHARS) {
            let _ = writeln!(
                s,
                r##"<text class="{class}" x="{x}" y="{y}" font-size="12" fill="{color}">{}</text>"##,
                escape(&line)
            );
            y += 16.0;
        }
        y += 6.0;
    }
    s.push_str("</g>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(p20: f64, p50: f64, p80: f64, min: f64, max: f64) -> Summary {
        Summary {
            p20,
            p50,
            p80,
            min,
            max,
            windows: 6,
        }
    }

    fn chart() -> Chart {
        Chart {
            title: "memif txonly -> rxonly <copy> & more".into(),
            subtitle: "line: median".into(),
            notes: vec![
                Note {
                    text: "swing 2.00x".into(),
                    warning: false,
                },
                Note {
                    text: "this machine swung between two states: compare p80 with p80".into(),
                    warning: true,
                },
            ],
            sizes: vec![64, 256, 1024],
            series: vec![
                Series {
                    label: "dpdk<-dpdk".into(),
                    color: 0,
                    dash: 0,
                    points: vec![
                        Point {
                            size: 64,
                            summary: summary(4.0, 5.0, 6.0, 2.0, 10.0),
                        },
                        Point {
                            size: 256,
                            summary: summary(3.0, 4.0, 5.0, 2.5, 7.5),
                        },
                        Point {
                            size: 1024,
                            summary: summary(1.0, 2.5, 3.0, 0.5, 4.0),
                        },
                    ],
                },
                Series {
                    label: "memnic<-memnic".into(),
                    color: 1,
                    dash: 1,
                    points: vec![Point {
                        size: 64,
                        summary: summary(5.0, 7.5, 8.0, 1.0, 9.0),
                    }],
                },
                Series {
                    label: "none".into(),
                    color: 2,
                    dash: 0,
                    points: vec![],
                },
            ],
        }
    }

    fn attr(n: roxmltree::Node, a: &str) -> f64 {
        n.attribute(a)
            .unwrap_or_else(|| panic!("no {a}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn well_formed_with_the_expected_elements() {
        let text = render(&chart());
        let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        let class = |c: &str| {
            doc.descendants()
                .filter(|n| n.attribute("class") == Some(c))
                .count()
        };
        assert_eq!(class("title"), 1);
        assert_eq!(class("series"), 3);
        // A line needs two points: the one-point series has its point, bar and band only.
        assert_eq!(class("median"), 1);
        assert_eq!(class("point"), 4);
        assert_eq!(class("range"), 4);
        assert_eq!(class("band"), 2);
        assert_eq!(class("xtick"), 3);
        assert_eq!(class("legend-label"), 3);
        let title = doc
            .descendants()
            .find(|n| n.attribute("class") == Some("title"))
            .unwrap();
        assert_eq!(title.text(), Some("memif txonly -> rxonly <copy> & more"));
        let labels: Vec<&str> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("legend-label"))
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(
            labels,
            ["dpdk<-dpdk", "memnic<-memnic", "none (no windows)"]
        );
    }

    #[test]
    fn points_sit_where_the_values_say() {
        let text = render(&chart());
        let doc = roxmltree::Document::parse(&text).unwrap();
        // The largest value is 10: the axis runs 0..10, so 5 Mpps is halfway up the plot area.
        let ticks: Vec<&str> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("ytick"))
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(ticks, ["0", "2", "4", "6", "8", "10"]);
        let pts: Vec<(f64, f64, f64)> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("point"))
            .map(|n| (attr(n, "data-size"), attr(n, "cx"), attr(n, "cy")))
            .collect();
        let y = |mpps: f64| PLOT_BOTTOM - mpps / 10.0 * (PLOT_BOTTOM - PLOT_TOP);
        // Sizes on a log scale: 64 at the left, 1024 at the right, 256 halfway.
        let (left, right) = (PLOT_LEFT + X_PAD, PLOT_RIGHT - X_PAD);
        let expect = [
            (64.0, left, y(5.0)),
            (256.0, (left + right) / 2.0, y(4.0)),
            (1024.0, right, y(2.5)),
            (64.0, left, y(7.5)),
        ];
        assert_eq!(pts.len(), expect.len());
        for (got, want) in pts.iter().zip(expect) {
            assert_eq!(got.0, want.0);
            assert!((got.1 - want.1).abs() < 0.11, "x {got:?} vs {want:?}");
            assert!((got.2 - want.2).abs() < 0.11, "y {got:?} vs {want:?}");
        }
        assert!((y(5.0) - (PLOT_TOP + PLOT_BOTTOM) / 2.0).abs() < 1e-9);
        // The band runs along p80 and back along p20.
        let band = doc
            .descendants()
            .find(|n| n.attribute("class") == Some("band"))
            .unwrap();
        let d = band.attribute("d").unwrap();
        let first = format!("M {},{}", num(left), num(y(6.0)));
        assert!(d.starts_with(&first), "{d} vs {first}");
        assert!(
            d.contains(&format!("{},{}", num(right), num(y(1.0)))),
            "{d}"
        );
    }

    #[test]
    fn an_empty_chart_still_renders() {
        let c = Chart {
            title: "t".into(),
            subtitle: String::new(),
            notes: vec![],
            sizes: vec![64],
            series: vec![],
        };
        let text = render(&c);
        roxmltree::Document::parse(&text).expect("well-formed XML");
    }

    #[test]
    fn long_text_wraps_between_words() {
        assert_eq!(
            wrap("compare p80 with p80 and p20 with p20", 12),
            ["compare p80", "with p80 and", "p20 with p20"]
        );
        assert_eq!(wrap("a-very-long-word b", 4), ["a-very-long-word", "b"]);
        assert!(wrap("  ", 10).is_empty());
        let text = render(&chart());
        let doc = roxmltree::Document::parse(&text).unwrap();
        let text_of = |class: &str| -> Vec<String> {
            doc.descendants()
                .filter(|n| n.attribute("class") == Some(class))
                .filter_map(|n| n.text().map(String::from))
                .collect()
        };
        assert_eq!(text_of("note"), ["swing 2.00x"]);
        assert_eq!(
            text_of("warning"),
            [
                "this machine swung between two states:",
                "compare p80 with p80"
            ]
        );
    }

    #[test]
    fn y_axis_steps_are_round() {
        assert_eq!(y_axis(10.0), (10.0, 2.0));
        assert_eq!(y_axis(23.4), (25.0, 5.0));
        let (top, step) = y_axis(0.7);
        assert!(
            (top - 0.8).abs() < 1e-9 && (step - 0.2).abs() < 1e-9,
            "{top} {step}"
        );
        assert_eq!(y_axis(0.0), (1.0, 0.2));
        assert_eq!(y_axis(f64::NAN), (1.0, 0.2));
    }
}
