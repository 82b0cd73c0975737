//! `memnic bench` end to end: short runs (no speed asserted) whose JSON rows and SVG chart are
//! checked for sense, and the refusals (bad flags, no DPDK) as one sentence with exit code 2.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::dpdk::have_dpdk;
use common::{bin, memnic, Proc, Stdin};

/// A file under /tmp removed on drop.
struct TmpFile(String);

impl TmpFile {
    fn new(tag: &str) -> TmpFile {
        let p = format!("/tmp/memnic-bench-test-{tag}-{}.svg", std::process::id());
        let _ = std::fs::remove_file(&p);
        TmpFile(p)
    }
}

impl Drop for TmpFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A refusal: exit 2 and one line on stderr, which it returns.
fn refused_in_a_sentence(out: &Output) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

fn succeeded(out: &Output) {
    assert!(
        out.status.success(),
        "memnic bench failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        stdout(out),
        stderr(out)
    );
}

/// Runs `memnic bench ARGS` to completion (`limit` at most).
fn bench(args: &[&str], limit: Duration) -> Output {
    bench_with_pid(args, limit).1
}

/// The same, with the bench's process id.
fn bench_with_pid(args: &[&str], limit: Duration) -> (u32, Output) {
    let mut cmd = Command::new(bin());
    cmd.arg("bench").args(args);
    let p = Proc::spawn(cmd, Stdin::Null);
    let pid = p.pid();
    (pid, p.wait(limit))
}

/// The JSON report of a bench that succeeded.
fn json_of_bench(out: &Output) -> serde_json::Value {
    succeeded(out);
    serde_json::from_str(&stdout(out)).expect("JSON on stdout")
}

/// Checks the rows of a JSON report: one per variant at each size, each with windows and
/// quantiles in order; returns them.
fn check_rows(
    json: &serde_json::Value,
    variants: &[&str],
    sizes: &[u64],
) -> Vec<serde_json::Value> {
    let rows = json["rows"].as_array().expect("rows").clone();
    assert_eq!(rows.len(), variants.len() * sizes.len(), "{json}");
    for r in &rows {
        assert!(variants.contains(&r["variant"].as_str().unwrap()), "{r}");
        assert!(sizes.contains(&r["size"].as_u64().unwrap()), "{r}");
        assert!(
            r["windows"].as_u64().unwrap() >= 1,
            "every run gives a window: {r}"
        );
        let q = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
        // (A window may be empty: on a loaded machine a side can miss its CPU for seconds.)
        assert!(q("min") >= 0.0, "{r}");
        assert!(
            q("min") <= q("p20")
                && q("p20") <= q("p50")
                && q("p50") <= q("p80")
                && q("p80") <= q("max"),
            "{r}"
        );
    }
    assert!(
        rows.iter().any(|r| r["max"].as_f64().unwrap() > 0.0),
        "packets moved: {json}"
    );
    assert_eq!(
        json["swing"].as_array().unwrap().len(),
        variants.len(),
        "{json}"
    );
    rows
}

/// Checks the chart: well-formed SVG with one series (and one point per size) per variant, the
/// title naming the bench.
fn check_svg(path: &str, bench: &str, variants: &[&str], sizes: usize) {
    let text = std::fs::read_to_string(path).expect("the SVG was written");
    let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let of_class = |c: &str| {
        doc.descendants()
            .filter(move |n| n.attribute("class") == Some(c))
            .collect::<Vec<_>>()
    };
    let title = of_class("title")[0].text().unwrap_or_default().to_string();
    assert!(title.contains(&format!("memnic bench {bench}")), "{title}");
    let series: Vec<&str> = of_class("series")
        .iter()
        .filter_map(|n| n.attribute("data-label"))
        .collect();
    assert_eq!(series, variants);
    assert_eq!(of_class("point").len(), variants.len() * sizes);
}

#[test]
fn poll_bench_memnic_json_and_svg() {
    let svg = TmpFile::new("memnic");
    let out = bench(
        &[
            "memnic",
            "--sizes",
            "64",
            "--rounds",
            "1",
            "--seconds",
            "3",
            "--json",
            "--svg",
            &svg.0,
        ],
        Duration::from_secs(120),
    );
    let json = json_of_bench(&out);
    assert_eq!(json["bench"], "memnic");
    let variants = [
        "host->guest",
        "guest->host",
        "limit (MEMNIC slots)",
        "limit (2 copies)",
    ];
    let rows = check_rows(&json, &variants, &[64]);
    assert!(rows.iter().all(|r| r["baseline"].is_null()), "{json}");
    // Each direction's fraction of MEMNIC's own bare ring measured beside it (the ring of two
    // indices runs beside it for the table); none for the limits.
    let p50 = |label: &str| {
        rows.iter()
            .find(|r| r["variant"] == label)
            .and_then(|r| r["p50"].as_f64())
            .unwrap_or_else(|| panic!("no p50 of {label}: {json}"))
    };
    for r in &rows {
        let of_limit = r["of_limit_p50"].as_f64();
        if r["variant"].as_str().unwrap().starts_with("limit") {
            assert_eq!(of_limit, None, "{r}");
        } else {
            let want = r["p50"].as_f64().unwrap() / p50("limit (MEMNIC slots)");
            assert!(
                of_limit.is_some_and(|f| f > 0.0 && (f - want).abs() < 1e-3),
                "{r} against {want}"
            );
        }
    }
    check_svg(&svg.0, "memnic", &variants, 1);
}

#[test]
fn poll_bench_memif_against_dpdk_table_and_svg() {
    if !have_dpdk() {
        return;
    }
    let svg = TmpFile::new("memif");
    let (pid, out) = bench_with_pid(
        &[
            "memif",
            "--peer",
            "dpdk",
            "--sizes",
            "64",
            "--rounds",
            "1",
            "--seconds",
            "3",
            "--svg",
            &svg.0,
        ],
        Duration::from_secs(180),
    );
    succeeded(&out);
    let table = stdout(&out);
    // A row per pair, ours with its ratio to DPDK's and both with their fraction of the
    // limit, the limit's own row, and the swing line.
    let row = |pair: &str| {
        table
            .lines()
            // (The heading names DPDK's pair and the limit too, with one space before.)
            .find(|l| l.contains(&format!("  {pair}  ")))
            .unwrap_or_else(|| panic!("no row of {pair}:\n{table}"))
    };
    let numbers = |line: &str, n: usize| {
        let last = line.split_whitespace().rev().take(n).collect::<Vec<_>>();
        last.iter().all(|r| r.parse::<f64>().is_ok_and(|r| r > 0.0))
    };
    let ours = row("memnic<-memnic");
    assert!(
        numbers(ours, 6),
        "ratios to DPDK and of the limit at p20/p50/p80: {ours}"
    );
    assert!(numbers(row("dpdk<-dpdk"), 3), "{table}");
    assert!(
        row("limit (2 copies)").ends_with(" 1"),
        "one window: {table}"
    );
    assert!(table.contains("swing: p80/p20"), "{table}");
    check_svg(
        &svg.0,
        "memif",
        &["dpdk<-dpdk", "memnic<-memnic", "limit (2 copies)"],
        1,
    );
    assert_no_dpdk_runtime_dirs(pid);
}

/// DPDK's runtime directories (named by the bench's --file-prefix) are gone with the bench.
fn assert_no_dpdk_runtime_dirs(pid: u32) {
    let ours = format!("memnic-bench-{pid}-");
    let left: Vec<String> = std::fs::read_dir("/var/run/dpdk")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&ours))
        .collect();
    assert!(left.is_empty(), "left behind in /var/run/dpdk: {left:?}");
}

/// --interleave: the four memif pairs (DPDK's and ours in every role) kept at their prompts,
/// each forwarding in turn; every pair gets one window a turn, the three beside DPDK's pair
/// their ratios to it, and nothing outlives the bench.
#[test]
fn poll_bench_memif_interleaved_with_dpdk_at_its_prompt() {
    if !have_dpdk() {
        return;
    }
    let (pid, out) = bench_with_pid(
        &[
            "memif",
            "--peer",
            "both",
            "--interleave",
            "--sizes",
            "64",
            "--rounds",
            "1",
            "--seconds",
            "3",
            "--json",
        ],
        Duration::from_secs(240),
    );
    let json = json_of_bench(&out);
    let variants = [
        "dpdk<-dpdk",
        "memnic<-memnic",
        "memnic<-dpdk",
        "dpdk<-memnic",
        "limit (2 copies)",
    ];
    assert_eq!(json["interleave"], true, "{json}");
    let rows = check_rows(&json, &variants, &[64]);
    for r in &rows {
        assert_eq!(r["windows"], 3, "a window per turn: {r}");
        assert!(
            r["min"].as_f64().unwrap() > 0.0,
            "every window moved frames: {r}"
        );
        let label = r["variant"].as_str().unwrap();
        let has = |k: &str| r[k].as_f64().is_some_and(|x| x > 0.0);
        assert_eq!(
            has("ratio_p50"),
            !["dpdk<-dpdk", "limit (2 copies)"].contains(&label),
            "{r}"
        );
        assert_eq!(has("of_limit_p50"), label != "limit (2 copies)", "{r}");
    }
    assert_no_dpdk_runtime_dirs(pid);
    let running = Command::new("pgrep")
        .args(["-f", &format!("memnic-bench-{pid}-")])
        .output()
        .expect("pgrep");
    assert!(
        running.stdout.is_empty(),
        "processes outlived the bench: {}",
        String::from_utf8_lossy(&running.stdout)
    );
}

#[test]
fn poll_bench_tester_in_process() {
    let out = bench(
        &[
            "tester",
            "--variants",
            "memnic",
            "--sizes",
            "64",
            "--rounds",
            "1",
            "--seconds",
            "3",
            "--json",
        ],
        Duration::from_secs(60),
    );
    let json = json_of_bench(&out);
    check_rows(
        &json,
        &["memnic", "limit (MEMNIC slots)", "limit (2 copies)"],
        &[64],
    );
}

/// `bench ping`: memif and MEMNIC through our reflector, memif and vhost-user through DPDK's,
/// each row's percentiles in order, DPDK's memif row compared with ours.
#[test]
fn poll_bench_ping_round_trips_through_ours_and_dpdk_s_reflectors() {
    let out = bench(
        &[
            "ping",
            "--bursts",
            "1,4",
            "--sizes",
            "64",
            "--rounds",
            "1",
            "--seconds",
            "1",
            "--json",
        ],
        Duration::from_secs(180),
    );
    let json = json_of_bench(&out);
    assert_eq!(json["bench"], "ping", "{json}");
    let rows = json["rows"].as_array().expect("rows");
    let cells: Vec<(u64, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["burst"].as_u64().unwrap(),
                r["transport"].as_str().unwrap(),
                r["reflector"].as_str().unwrap(),
            )
        })
        .collect();
    let mut want = vec![];
    for burst in [1, 4] {
        want.extend([
            (burst, "memif", "memnic"),
            (burst, "memif", "dpdk"),
            (burst, "memnic", "memnic"),
            (burst, "vhost", "dpdk"),
        ]);
    }
    assert_eq!(cells, want, "{json}");
    for r in rows {
        let us = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
        assert!(r["round_trips"].as_u64().unwrap() > 10_000, "{r}");
        assert!(
            0.0 < us("min_us")
                && us("min_us") <= us("p50_us")
                && us("p50_us") <= us("p90_us")
                && us("p90_us") <= us("p99_us")
                && us("p99_us") <= us("p999_us")
                && us("p999_us") <= us("max_us"),
            "{r}"
        );
        if r["reflector"] == "memnic" {
            // Our reflector sends every frame back (DPDK's may drop a burst as its link
            // comes up: the row shows it).
            assert_eq!(r["lost"], 0, "{r}");
            assert!(r["p50_over_ours"].is_null(), "{r}");
        } else if r["transport"] == "vhost" {
            // DPDK's virtio-user reflects; there is no reflector of ours to compare with.
            assert!(r["p50_over_ours"].is_null(), "{r}");
        } else {
            let ours = rows
                .iter()
                .find(|o| {
                    o["burst"] == r["burst"]
                        && o["reflector"] == "memnic"
                        && o["transport"] == "memif"
                })
                .unwrap();
            let want = us("p50_us") / ours["p50_us"].as_f64().unwrap();
            assert!(
                (r["p50_over_ours"].as_f64().unwrap() - want).abs() < 1e-9,
                "{r}"
            );
        }
    }
}

#[test]
fn bad_flags_are_one_sentence_and_exit_2() {
    for args in [
        &["memnic", "--seconds", "1"][..],
        &["memnic", "--sizes", "20"],
        &["memif", "--peer", "vpp"],
        &["memnic", "--cpus", "0,0"],
        &["vhost", "--rings", "round"],
        &["ping", "--bursts", "64"],
        &["ping", "--transports", "memnic", "--reflectors", "dpdk"],
        &["ping", "--transports", "vhost", "--reflectors", "memnic"],
    ] {
        let mut full = vec!["bench"];
        full.extend_from_slice(args);
        let out = memnic(&full);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("memnic: ") || first.starts_with("error: "),
            "{args:?}: {err}"
        );
        assert!(stdout(&out).is_empty(), "{args:?}");
    }
}

#[test]
fn without_dpdk_the_refusal_names_the_packages() {
    let empty = std::env::temp_dir().join(format!("memnic-bench-nopath-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    for (bench, packages) in [
        ("memif", "apt-get install dpdk-dev librte-net-memif23"),
        (
            "vhost",
            "apt-get install dpdk-dev librte-net-vhost23 librte-net-virtio23",
        ),
    ] {
        let mut cmd = Command::new(bin());
        cmd.args(["bench", bench, "--rounds", "1"])
            .env("PATH", &empty);
        let out = Proc::spawn(cmd, Stdin::Null).wait(Duration::from_secs(30));
        let err = refused_in_a_sentence(&out);
        assert!(err.contains("dpdk-testpmd is not installed"), "{err}");
        assert!(err.contains(packages), "{err}");
    }
    let _ = std::fs::remove_dir(&empty);
}

/// `memnic abflip-report`: a log's B windows against their A neighbours, one line; a missing
/// or malformed log is one sentence and exit 2.
#[test]
fn abflip_report_reads_a_log_and_refuses_a_bad_one_in_a_sentence() {
    let dir = std::env::temp_dir().join(format!("memnic-abflip-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.log");
    // With --skip 0: B 12 between A 10 and A 14 (1.0), B 18 between A 14 and A 10 (1.5).
    std::fs::write(&good, "A 10\nB 12\nA 14\nB 18\nA 10\n").unwrap();
    let out = memnic(&["abflip-report", good.to_str().unwrap(), "--skip", "0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        "n=2 B/A p20/p50/p80 1.100/1.250/1.400  A p50 10.00  B p50 15.00 Mpps"
    );
    let bad = dir.join("bad.log");
    std::fs::write(&bad, "A 10\nB fast\n").unwrap();
    let missing = dir.join("missing.log");
    for (log, says) in [(&bad, "line 2 is not a window"), (&missing, "cannot read")] {
        let err = refused_in_a_sentence(&memnic(&["abflip-report", log.to_str().unwrap()]));
        assert!(err.starts_with("memnic: abflip-report: "), "{err}");
        assert!(err.contains(says), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
