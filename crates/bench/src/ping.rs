//! `memnic bench ping`: round trips through a reflector. Our testpmd pings
//! (`--forward-mode=ping`: a burst of numbered frames out, the next once all are back, each
//! frame's round trip timed) and a reflector sends every frame back (`macswap`): ours, or DPDK's
//! testpmd on memif; over vhost-user our backend pings and DPDK's virtio-user reflects. Runs alternate the reflectors over the rounds; each run's percentiles
//! come from the pinger's own histogram (`--json`), and the table gives their median over the
//! rounds.

use std::path::PathBuf;
use std::time::Duration;

use crate::plan::Impl;
use crate::runs::{self, Ctx, Dpdk, Launch, Ours};
use crate::stats;

/// The most frames one ping may have: our testpmd's largest burst.
const MAX_BURST: usize = 32;

#[derive(clap::Args, Debug)]
pub struct PingArgs {
    /// Transports, comma-separated: memif (our client pings, the server reflects), memnic (our
    /// MEMNIC guest pings, the host reflects), vhost (our vhost-user backend pings, DPDK's
    /// virtio-user reflects)
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "memif,memnic,vhost"
    )]
    transports: Vec<Transport>,
    /// Reflectors, comma-separated: memnic (our testpmd: memif, MEMNIC), dpdk (DPDK's testpmd:
    /// memif, and virtio-user over vhost; DPDK 22.11 has no MEMNIC driver)
    #[arg(long, value_enum, value_delimiter = ',', default_value = "memnic,dpdk")]
    reflectors: Vec<Reflector>,
    /// Frames per ping, comma-separated (1 to 32): the next burst goes once all are back
    #[arg(long, value_delimiter = ',', default_value = "1,4,32")]
    bursts: Vec<usize>,
    /// Frame sizes, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "64,1518")]
    sizes: Vec<u32>,
    /// Rounds: each runs every reflector at every size and burst once, alternating them
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds of pinging per run
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// A,B: the reflector's CPU and the pinger's (default: the first two this process may use)
    #[arg(long)]
    cpus: Option<String>,
    /// Devargs added to every port of ours, `KEY=VALUE,...` (for example `rx-holdoff-ns=0`
    /// on memif or `rx_holdoff_ns=0` on MEMNIC)
    #[arg(long)]
    devargs: Option<String>,
    /// Print the results as JSON rows instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Memif,
    Memnic,
    Vhost,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reflector {
    Memnic,
    Dpdk,
}

/// One pair of a transport and its reflector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Variant {
    transport: Transport,
    reflector: Impl,
}

impl Variant {
    fn transport_name(self) -> &'static str {
        match self.transport {
            Transport::Memif => "memif",
            Transport::Memnic => "memnic",
            Transport::Vhost => "vhost",
        }
    }
}

/// What the flags ask for.
#[derive(Debug)]
struct PingPlan {
    variants: Vec<Variant>,
    bursts: Vec<usize>,
    sizes: Vec<u32>,
    rounds: usize,
    seconds: u64,
    /// (reflector, pinger)
    cpus: (usize, usize),
    devargs: Option<String>,
    json: bool,
}

/// Checks the flags; every failure is one sentence naming the flag.
fn plan(a: PingArgs, allowed: &[usize]) -> Result<PingPlan, String> {
    let mut variants = Vec::new();
    for &transport in &a.transports {
        for &r in &a.reflectors {
            let reflector = match r {
                Reflector::Memnic => Impl::Memnic,
                Reflector::Dpdk => Impl::Dpdk,
            };
            // DPDK 22.11 has no MEMNIC driver, and we have no virtio frontend.
            let none = match transport {
                Transport::Memif => false,
                Transport::Memnic => reflector == Impl::Dpdk,
                Transport::Vhost => reflector == Impl::Memnic,
            };
            if none {
                continue;
            }
            let v = Variant {
                transport,
                reflector,
            };
            if !variants.contains(&v) {
                variants.push(v);
            }
        }
    }
    if variants.is_empty() {
        return Err("no reflector for these transports: ours reflects over memif and memnic, DPDK's over memif and vhost (DPDK 22.11 has no MEMNIC driver, and we have no virtio frontend)".into());
    }
    let mut bursts = a.bursts;
    if let Some(bad) = bursts.iter().find(|b| !(1..=MAX_BURST).contains(*b)) {
        return Err(format!("--bursts: {bad} is outside 1..={MAX_BURST} frames"));
    }
    bursts.sort_unstable();
    bursts.dedup();
    let mut sizes = a.sizes;
    if let Some(bad) = sizes.iter().find(|s| !(60..=1518).contains(*s)) {
        return Err(format!("--sizes: {bad} is outside 60..=1518 bytes"));
    }
    sizes.sort_unstable();
    sizes.dedup();
    if a.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    if a.seconds == 0 {
        return Err("--seconds must be at least 1".into());
    }
    let sides = crate::plan::sides(a.cpus.as_deref(), allowed, 1)?;
    Ok(PingPlan {
        variants,
        bursts,
        sizes,
        rounds: a.rounds,
        seconds: a.seconds,
        cpus: (sides.0[0], sides.1[0]),
        devargs: a.devargs,
        json: a.json,
    })
}

/// One run's round trips (as the pinger's `--json` reports them), in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Trips {
    count: u64,
    lost: u64,
    stale: u64,
    min: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

/// Reads the round trips of our testpmd's `--json` report.
fn trips_of(json: &str) -> Result<Trips, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("the pinger's report is not JSON: {e}"))?;
    let r = &v["round_trips"];
    let n = |k: &str| {
        r[k].as_u64()
            .ok_or_else(|| format!("the pinger's report has no round_trips.{k}: {json}"))
    };
    let us = |k: &str| n(k).map(|ns| ns as f64 / 1e3);
    Ok(Trips {
        count: n("count")?,
        lost: n("lost")?,
        stale: n("stale")?,
        min: us("min_ns")?,
        p50: us("p50_ns")?,
        p90: us("p90_ns")?,
        p99: us("p99_ns")?,
        p999: us("p999_ns")?,
        max: us("max_ns")?,
    })
}

/// One run: the listening side started (and ready), then the other; the pinger pings for
/// `--seconds`; its report.
fn run(ctx: &Ctx, p: &PingPlan, v: Variant, burst: usize, size: u32) -> Result<Trips, String> {
    let launch = Launch {
        devargs: p.devargs.as_deref(),
        per_pair: false,
        interleave: false,
    };
    let (a, b) = p.cpus;
    // Our vhost-user backend pings from its start, before DPDK's virtio-user (about a second
    // to start here) has connected: it gets that much longer.
    let secs = p.seconds
        + if v.transport == Transport::Vhost {
            3
        } else {
            0
        };
    let (burst_s, secs_s) = (burst.to_string(), secs.to_string());
    let ping_flags = ["--burst", &burst_s, "--duration", &secs_s, "--json"];
    let (reflector_vdev, pinger_vdev) = match v.transport {
        Transport::Memif => {
            let sock = ctx.sock(0).display().to_string();
            (
                format!("memif0,role=server,socket={sock}"),
                format!("memif0,role=client,socket={sock}"),
            )
        }
        Transport::Memnic => {
            let path = ctx.shm_name(0, 0);
            (
                format!("memnic0,path={path},role=host"),
                format!("memnic0,path={path},role=guest"),
            )
        }
        Transport::Vhost => {
            let sock = ctx.sock(0).display().to_string();
            (
                format!("net_virtio_user0,path={sock},queues=1"),
                format!("vhost0,iface={sock}"),
            )
        }
    };
    // Our testpmd on `cpu` with the one port `vdev`.
    let our_side = |name: &str, cpu: &usize, vdev: String, mode, extra| {
        runs::ours(
            ctx,
            &launch,
            &format!("{} {name}", v.transport_name()),
            Ours {
                cpus: std::slice::from_ref(cpu),
                vdevs: vec![vdev],
                queues: 1,
                mode,
                size,
                extra,
            },
        )
    };
    let reflector = match (v.reflector, v.transport) {
        (Impl::Memnic, _) => our_side("reflector", &a, reflector_vdev, "macswap", &[]),
        (Impl::Dpdk, Transport::Vhost) => runs::dpdk(
            ctx,
            &launch,
            "virtio-user reflector",
            Dpdk {
                side: "frontend",
                slot: 0,
                cpu: a,
                mem: "1024",
                eal: &["--single-file-segments"],
                vdev: reflector_vdev,
                mode: "macswap",
                size,
                app: &["--no-flush-rx"],
            },
        ),
        (Impl::Dpdk, _) => runs::dpdk(
            ctx,
            &launch,
            "memif reflector",
            Dpdk {
                side: "server",
                slot: 0,
                cpu: a,
                mem: "512",
                eal: &[],
                vdev: format!("net_{reflector_vdev},socket-abstract=no"),
                mode: "macswap",
                size,
                app: &[],
            },
        ),
    };
    let pinger = our_side("pinger", &b, pinger_vdev, "ping", &ping_flags);
    // The side that listens starts first: a memif server or MEMNIC host (the reflector), our
    // vhost-user backend (the pinger).
    let pinger_first = v.transport == Transport::Vhost;
    let (first, second) = if pinger_first {
        (&pinger, &reflector)
    } else {
        (&reflector, &pinger)
    };
    ctx.remove_files();
    let started = first.spawn(ctx)?;
    let result = started
        .wait_for("start its port", runs::START_LIMIT, |s| s.ready)
        .and_then(|()| {
            let other = second.spawn(ctx)?;
            let pinging = if pinger_first { &started } else { &other };
            let done = pinging.wait_for(
                "report its round trips",
                runs::START_LIMIT + Duration::from_secs(secs),
                |s| s.json.is_some(),
            );
            let json = pinging.seen(|s| s.json.clone());
            other.stop(runs::STOP_LIMIT);
            done?;
            trips_of(&json.unwrap_or_default())
        });
    started.stop(runs::STOP_LIMIT);
    ctx.remove_files();
    result
}

/// A row of the table: one variant at one size and burst, over the rounds.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    size: u32,
    burst: usize,
    transport: &'static str,
    reflector: &'static str,
    runs: usize,
    /// Round trips in all runs; frames lost (not back within 100 ms of their burst), and
    /// stale (back after that, duplicated, or not ours).
    round_trips: u64,
    lost: u64,
    stale: u64,
    /// Each the median over the runs of that run's figure, microseconds.
    min_us: f64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    p999_us: f64,
    /// The largest of any run.
    max_us: f64,
    /// memif: this reflector's p50 over our reflector's in the same cell (DPDK's row).
    #[serde(skip_serializing_if = "Option::is_none")]
    p50_over_ours: Option<f64>,
}

fn median(runs: &[Trips], f: impl Fn(&Trips) -> f64) -> f64 {
    let v: Vec<f64> = runs.iter().map(f).collect();
    stats::percentile(&v, 0.5).unwrap_or(0.0)
}

fn rows(p: &PingPlan, res: &[Vec<Vec<Vec<Trips>>>]) -> Vec<Row> {
    let mut rows = Vec::new();
    for (si, &size) in p.sizes.iter().enumerate() {
        for (bi, &burst) in p.bursts.iter().enumerate() {
            let first = rows.len();
            for (vi, v) in p.variants.iter().enumerate() {
                let runs = &res[si][bi][vi];
                rows.push(Row {
                    size,
                    burst,
                    transport: v.transport_name(),
                    reflector: v.reflector.name(),
                    runs: runs.len(),
                    round_trips: runs.iter().map(|t| t.count).sum(),
                    lost: runs.iter().map(|t| t.lost).sum(),
                    stale: runs.iter().map(|t| t.stale).sum(),
                    min_us: median(runs, |t| t.min),
                    p50_us: median(runs, |t| t.p50),
                    p90_us: median(runs, |t| t.p90),
                    p99_us: median(runs, |t| t.p99),
                    p999_us: median(runs, |t| t.p999),
                    max_us: runs.iter().map(|t| t.max).fold(0.0, f64::max),
                    p50_over_ours: None,
                });
            }
            // DPDK's reflector against ours, over the same transport in the same cell.
            for i in first..rows.len() {
                if rows[i].reflector != Impl::Dpdk.name() {
                    continue;
                }
                let ours = rows[first..]
                    .iter()
                    .find(|r| r.transport == rows[i].transport && r.reflector != rows[i].reflector)
                    .map(|r| r.p50_us);
                rows[i].p50_over_ours = ours.filter(|&o| o > 0.0).map(|o| rows[i].p50_us / o);
            }
        }
    }
    rows
}

fn table(p: &PingPlan, rows: &[Row]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "memnic bench ping: round trips through a reflector (macswap) on CPU {}, our testpmd pinging (--forward-mode=ping) on CPU {}",
        p.cpus.0, p.cpus.1
    );
    let _ = writeln!(
        s,
        "{} round(s) x {} s per run, runs alternating; us: the median over the runs of each run's figure (max: the largest); burst: frames per ping, the next sent once all are back",
        p.rounds, p.seconds
    );
    let _ = writeln!(
        s,
        " size burst  transport reflector      p50      p90      p99    p99.9      min       max  round trips  lost stale  p50/ours"
    );
    let _ = writeln!(s, "{}", "-".repeat(118));
    for r in rows {
        let _ = writeln!(
            s,
            "{:>5} {:>5}  {:<9} {:<9} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.1} {:>12} {:>5} {:>5}  {}",
            r.size,
            r.burst,
            r.transport,
            r.reflector,
            r.p50_us,
            r.p90_us,
            r.p99_us,
            r.p999_us,
            r.min_us,
            r.max_us,
            r.round_trips,
            r.lost,
            r.stale,
            r.p50_over_ours
                .map_or(String::new(), |x| format!("{x:.2}"))
        );
    }
    s
}

/// Runs `memnic bench ping`; `ours` is the memnic binary (this process's own).
pub fn main(a: PingArgs, ours: PathBuf) -> Result<(), String> {
    let p = plan(a, &memnic_shm::cpu::allowed_cpus())?;
    let dpdk = p.variants.iter().any(|v| v.reflector == Impl::Dpdk);
    let ctx = Ctx::with(
        dpdk.then_some("apt-get install dpdk-dev librte-net-memif23), or use --reflectors memnic to run ours alone"),
        false,
        ours,
    )?;
    // res[size][burst][variant]: the runs' round trips.
    let mut res = vec![vec![vec![Vec::new(); p.variants.len()]; p.bursts.len()]; p.sizes.len()];
    let mut turn = 0;
    for round in 1..=p.rounds {
        for (si, &size) in p.sizes.iter().enumerate() {
            for (bi, &burst) in p.bursts.iter().enumerate() {
                for vi in stats::order(p.variants.len(), turn) {
                    let v = p.variants[vi];
                    let t = run(&ctx, &p, v, burst, size).map_err(|e| {
                        format!(
                            "ping round {round}, {size} B, burst {burst}, {} through {}'s reflector: {e}",
                            v.transport_name(),
                            v.reflector.name()
                        )
                    })?;
                    res[si][bi][vi].push(t);
                }
                turn += 1;
            }
        }
    }
    let rows = rows(&p, &res);
    if p.json {
        let j = serde_json::json!({
            "bench": "ping",
            "date": crate::date::today(),
            "cpus": [p.cpus.0, p.cpus.1],
            "rounds": p.rounds,
            "seconds": p.seconds,
            "rows": rows,
        });
        println!("{j}");
    } else {
        print!("{}", table(&p, &rows));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        a: PingArgs,
    }

    fn plan_of(line: &str) -> Result<PingPlan, String> {
        let args = std::iter::once("ping").chain(line.split_whitespace());
        plan(Cli::parse_from(args).a, &[0, 1])
    }

    #[test]
    fn dpdk_reflects_over_memif_only_and_bad_flags_are_one_sentence() {
        let p = plan_of("").unwrap();
        let names: Vec<_> = p
            .variants
            .iter()
            .map(|v| (v.transport_name(), v.reflector.name()))
            .collect();
        assert_eq!(
            names,
            [
                ("memif", "memnic"),
                ("memif", "dpdk"),
                ("memnic", "memnic"),
                ("vhost", "dpdk")
            ]
        );
        assert_eq!(
            (p.bursts, p.sizes, p.cpus),
            (vec![1, 4, 32], vec![64, 1518], (0, 1))
        );
        for (line, says) in [
            ("--transports memnic --reflectors dpdk", "no reflector"),
            (
                "--transports vhost --reflectors memnic",
                "no virtio frontend",
            ),
            ("--bursts 0", "--bursts: 0 is outside 1..=32"),
            ("--bursts 33", "--bursts: 33"),
            ("--sizes 59", "--sizes: 59"),
            ("--rounds 0", "--rounds"),
            ("--seconds 0", "--seconds"),
            ("--cpus 0,0", "both sides"),
        ] {
            let e = plan_of(line).unwrap_err();
            assert!(e.contains(says), "{line}: {e}");
            assert!(
                !e.trim_end_matches('.').contains(". "),
                "{line}: one sentence: {e}"
            );
        }
    }

    #[test]
    fn rows_take_each_figure_s_median_and_compare_dpdk_with_ours() {
        let p = plan_of("--transports memif --bursts 4 --sizes 64").unwrap();
        let t = |p50: f64, lost: u64| Trips {
            count: 100,
            lost,
            stale: lost,
            min: p50 / 2.0,
            p50,
            p90: p50 * 1.5,
            p99: p50 * 2.0,
            p999: p50 * 3.0,
            max: p50 * 10.0,
        };
        // [size][burst][variant]: ours, then DPDK's.
        let res = vec![vec![vec![
            vec![t(1.0, 0), t(3.0, 0), t(2.0, 1)],
            vec![t(4.0, 0), t(5.0, 0), t(3.0, 0)],
        ]]];
        let rows = rows(&p, &res);
        assert_eq!(rows.len(), 2);
        let (ours, dpdk) = (&rows[0], &rows[1]);
        assert_eq!((ours.reflector, dpdk.reflector), ("memnic", "dpdk"));
        assert_eq!((ours.p50_us, ours.p99_us, ours.max_us), (2.0, 4.0, 30.0));
        assert_eq!(
            (ours.runs, ours.round_trips, ours.lost, ours.stale),
            (3, 300, 1, 1)
        );
        assert_eq!(ours.p50_over_ours, None);
        assert_eq!(dpdk.p50_over_ours, Some(2.0));
        let text = table(&p, &rows);
        assert!(text.contains("p50/ours"), "{text}");
        assert_eq!(text.lines().count(), 4 + rows.len(), "{text}");
    }

    #[test]
    fn the_pinger_s_report_is_read_in_microseconds() {
        let j = r#"{"mode":"ping","round_trips":{"count":7,"sent":8,"lost":1,"stale":0,"min_ns":500,"mean_ns":900,"p50_ns":800,"p90_ns":1000,"p99_ns":2000,"p999_ns":3000,"max_ns":4000}}"#;
        let t = trips_of(j).unwrap();
        assert_eq!((t.count, t.lost, t.stale), (7, 1, 0));
        assert_eq!((t.min, t.p50, t.p999, t.max), (0.5, 0.8, 3.0, 4.0));
        let e = trips_of(r#"{"mode":"ping"}"#).unwrap_err();
        assert!(e.contains("round_trips.count"), "{e}");
    }
}
