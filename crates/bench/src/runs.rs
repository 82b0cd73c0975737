//! One run: the two processes of a pair (or the tester's threads), started in order, traffic
//! awaited, `--seconds` of it measured, both stopped; its window rates in Mpps.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::parse::Counter;
use crate::plan::{Case, Impl, Plan, Ring, Run, VhostDir};
use crate::proc::Proc;
use crate::stats::window_rates;

/// DPDK's testpmd.
pub const DPDK: &str = "dpdk-testpmd";
/// The line after which DPDK's testpmd has started its port (its MAC address).
const DPDK_READY: &str = "Port 0: ";
/// The line after which ours forwards.
const OURS_READY: &str = "Press Ctrl-C to stop forwarding";
/// At a prompt (`--interleave`), either testpmd's answer to `show config fwd`, which it reads
/// once its ports are started.
pub(crate) const PROMPT_READY: &str = "packet forwarding - ports=";
/// Runs DPDK's testpmd with its stdout line-buffered: at its prompt it leaves the answers to
/// commands in stdio's buffer, which a pipe would get only at exit.
const STDBUF: &str = "stdbuf";
/// A cold start of DPDK loads every driver library: generous.
pub(crate) const START_LIMIT: Duration = Duration::from_secs(60);
/// From both sides started to the first packets counted.
pub(crate) const TRAFFIC_LIMIT: Duration = Duration::from_secs(30);
pub(crate) const STOP_LIMIT: Duration = Duration::from_secs(10);
/// After `--seconds` of traffic, how long a run waits for its first whole window.
const WINDOW_LIMIT: Duration = Duration::from_secs(10);
/// The tester's trials: one window each.
const TESTER_WINDOW: Duration = Duration::from_secs(2);

/// What every run shares: the programs, a private directory for sockets, the bench's clock.
pub struct Ctx {
    pub ours: PathBuf,
    pub dpdk: Option<PathBuf>,
    /// `stdbuf`, for DPDK at its prompt.
    stdbuf: Option<PathBuf>,
    dir: PathBuf,
    shm: String,
    pub clock: Instant,
}

impl Ctx {
    pub fn new(plan: &Plan, ours: PathBuf) -> Result<Ctx, String> {
        let dpdk_missing = plan.uses_dpdk().then(|| {
            format!(
                "apt-get install {}){}",
                plan.dpdk_packages(),
                if plan.bench == "memif" {
                    ", or use --peer memnic to run ours alone"
                } else {
                    ""
                }
            )
        });
        Ctx::with(dpdk_missing.as_deref(), plan.interleave, ours)
    }

    /// A context for runs that need DPDK's testpmd when `dpdk_missing` says what to do if it
    /// is not installed (the end of a sentence, after an opening parenthesis), and `stdbuf`
    /// too when they keep DPDK at its prompt (`interleave`).
    pub(crate) fn with(
        dpdk_missing: Option<&str>,
        interleave: bool,
        ours: PathBuf,
    ) -> Result<Ctx, String> {
        let dpdk = match dpdk_missing {
            Some(what) => {
                Some(find_in_path(DPDK).ok_or_else(|| format!("{DPDK} is not installed ({what}"))?)
            }
            None => None,
        };
        let stdbuf = if interleave && dpdk.is_some() {
            Some(find_in_path(STDBUF).ok_or_else(|| {
                format!("--interleave runs DPDK's testpmd under {STDBUF}, which is not installed (apt-get install coreutils)")
            })?)
        } else {
            None
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let tag = format!("memnic-bench-{}-{nanos}", std::process::id());
        let dir = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Ctx {
            ours,
            dpdk,
            stdbuf,
            dir,
            shm: tag,
            clock: Instant::now(),
        })
    }

    /// The socket of the pair in `slot` (its variant's index when pairs run side by side).
    pub(crate) fn sock(&self, slot: usize) -> PathBuf {
        self.dir.join(format!("bench-{slot}.sock"))
    }

    /// The name of MEMNIC device `k`'s region (under /dev/shm) for the pair in `slot`.
    pub(crate) fn shm_name(&self, slot: usize, k: usize) -> String {
        format!("{}-{slot}-{k}", self.shm)
    }

    /// The sockets and every region the runs may have left.
    pub(crate) fn remove_files(&self) {
        for slot in 0..MAX_SLOTS {
            let _ = std::fs::remove_file(self.sock(slot));
            for k in 0..usize::from(crate::plan::MAX_QUEUES) {
                let _ = std::fs::remove_file(Path::new("/dev/shm").join(self.shm_name(slot, k)));
            }
        }
    }

    fn prefix(&self, side: &str, slot: usize) -> String {
        format!("memnic-bench-{}-{side}-{slot}", std::process::id())
    }
}

/// Pairs that may run side by side (`--interleave`): more than any bench has variants.
pub(crate) const MAX_SLOTS: usize = 8;

/// The sides DPDK runs on, each with its own --file-prefix.
const DPDK_SIDES: [&str; 4] = ["server", "client", "backend", "frontend"];

impl Drop for Ctx {
    fn drop(&mut self) {
        self.remove_files();
        let _ = std::fs::remove_dir_all(&self.dir);
        // DPDK leaves its runtime directory (named by our --file-prefix) behind at exit:
        // /var/run/dpdk for root, $XDG_RUNTIME_DIR/dpdk otherwise.
        let mut roots = vec![PathBuf::from("/var/run/dpdk")];
        if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
            roots.push(PathBuf::from(x).join("dpdk"));
        }
        for root in roots {
            for side in DPDK_SIDES {
                for slot in 0..MAX_SLOTS {
                    let _ = std::fs::remove_dir_all(root.join(self.prefix(side, slot)));
                }
            }
        }
    }
}

/// The first `name` among the directories of $PATH.
fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// One process of a pair.
pub(crate) struct Side {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    ready: &'static str,
    /// At its prompt (`--interleave`): forwarding starts and stops when told.
    prompt: bool,
}

impl Side {
    /// Starts the process; one at a prompt is asked `show config fwd`, whose answer is its
    /// ready line.
    pub(crate) fn spawn(&self, ctx: &Ctx) -> Result<Proc, String> {
        let mut p = Proc::spawn(
            &self.name,
            &self.program,
            &self.args,
            ctx.clock,
            self.ready,
            self.prompt,
        )?;
        if self.prompt {
            p.send("show config fwd")?;
        }
        Ok(p)
    }
}

/// Two processes: the first is started (and ready) before the second; `measured` says whose
/// counter is read.
pub(crate) struct Pair {
    pub first: Side,
    pub second: Side,
    pub measured_first: bool,
    pub counter: Counter,
}

/// How a bench starts every side: what it adds to our ports, whether each queue's memory goes
/// on its lcore's node (a scaling run), whether the sides wait at their prompts.
pub(crate) struct Launch<'a> {
    /// `--devargs`: added to every port of ours.
    pub devargs: Option<&'a str>,
    pub per_pair: bool,
    pub interleave: bool,
}

impl Plan {
    fn launch(&self) -> Launch<'_> {
        Launch {
            devargs: self.devargs.as_deref(),
            per_pair: self.per_pair,
            interleave: self.interleave,
        }
    }
}

/// Our testpmd on `cpus` (one forwarding lcore each) with the ports `vdevs`, each with
/// `queues` queue pairs, and the mode's own flags `extra`; a scaling run also places each
/// queue's rings and buffers on its lcore's node (`--ring-bind-lcpu`), as RSS-style scaling
/// wants.
pub(crate) struct Ours<'a> {
    pub cpus: &'a [usize],
    pub vdevs: Vec<String>,
    pub queues: u16,
    pub mode: &'a str,
    pub size: u32,
    pub extra: &'a [&'a str],
}

pub(crate) fn ours(ctx: &Ctx, plan: &Launch, name: &str, o: Ours) -> Side {
    let mut args: Vec<String> = vec![
        "testpmd".into(),
        "-l".into(),
        memnic_numa::format_cpu_list(o.cpus),
    ];
    if o.vdevs.len() > 1 {
        // Each port forwards to itself, so port k's queues are all on lcore k (paired ports
        // would put port 0's rx and port 1's tx on one lcore).
        args.extend(["--port-topology".into(), "loop".into()]);
    }
    for v in o.vdevs {
        args.push("--vdev".into());
        args.push(match plan.devargs {
            Some(extra) => format!("{v},{extra}"),
            None => v,
        });
    }
    if o.queues > 1 {
        args.extend(["--rxq".into(), o.queues.to_string()]);
        args.extend(["--txq".into(), o.queues.to_string()]);
    }
    if plan.per_pair {
        args.push("--ring-bind-lcpu".into());
    }
    args.extend(["--forward-mode", o.mode, "--txpkts", &o.size.to_string()].map(String::from));
    args.extend(o.extra.iter().map(|s| s.to_string()));
    if plan.interleave {
        args.push("-i".into());
    } else {
        args.extend(["--stats-period", "1"].map(String::from));
    }
    Side {
        name: format!("memnic testpmd ({name})"),
        program: ctx.ours.clone(),
        args,
        ready: if plan.interleave {
            PROMPT_READY
        } else {
            OURS_READY
        },
        prompt: plan.interleave,
    }
}

/// DPDK's testpmd on `cpu` (main and forwarding lcore both there), as `peers/dpdk.md` runs it.
pub(crate) struct Dpdk<'a> {
    pub side: &'a str,
    /// The pair's slot (see [`Ctx::sock`]).
    pub slot: usize,
    pub cpu: usize,
    pub mem: &'a str,
    pub eal: &'a [&'a str],
    pub vdev: String,
    pub mode: &'a str,
    pub size: u32,
    pub app: &'a [&'a str],
}

pub(crate) fn dpdk(ctx: &Ctx, plan: &Launch, name: &str, d: Dpdk) -> Side {
    let dpdk = ctx.dpdk.clone().unwrap_or_else(|| DPDK.into());
    // At a prompt: under stdbuf, its stdout line-buffered.
    let (program, mut args) = match (&ctx.stdbuf, plan.interleave) {
        (Some(stdbuf), true) => (
            stdbuf.clone(),
            vec!["-oL".to_string(), dpdk.display().to_string()],
        ),
        _ => (dpdk, Vec::new()),
    };
    args.extend([
        "--no-huge".into(),
        "-m".into(),
        d.mem.into(),
        "--no-pci".into(),
        format!("--lcores=0@{c},1@{c}", c = d.cpu),
        "--file-prefix".into(),
        ctx.prefix(d.side, d.slot),
    ]);
    args.extend(d.eal.iter().map(|s| s.to_string()));
    args.push(format!("--vdev={}", d.vdev));
    args.extend(["--", "--nb-cores=1", "--total-num-mbufs=32768"].map(String::from));
    if plan.interleave {
        args.push("-i".into());
    } else {
        args.extend(["-a", "--stats-period", "1"].map(String::from));
    }
    args.push(format!("--forward-mode={}", d.mode));
    args.push(format!("--txpkts={}", d.size));
    args.extend(d.app.iter().map(|s| s.to_string()));
    Side {
        name: format!("{DPDK} ({name})"),
        program,
        args,
        ready: if plan.interleave {
            PROMPT_READY
        } else {
            DPDK_READY
        },
        prompt: plan.interleave,
    }
}

/// A memif pair: the receiver (the server, or with `server_sends` the client) is measured.
fn memif_pair(
    ctx: &Ctx,
    plan: &Plan,
    (server, client): (Impl, Impl),
    queues: u16,
    (server_sends, zero_copy): (bool, bool),
    size: u32,
    slot: usize,
) -> Pair {
    let sock = ctx.sock(slot).display().to_string();
    let n = usize::from(queues);
    let (a, b) = (&plan.sides.0[..n], &plan.sides.1[..n]);
    // The same key for both implementations; DPDK's zero-copy client needs its memory in one
    // file per segment list to share it.
    let zc = |role: &str| zero_copy && role == "client";
    let opts = |role: &str| if zc(role) { ",zero-copy=yes" } else { "" };
    let side = |imp: Impl, role: &str, cpus: &[usize], mode: &str| match imp {
        Impl::Memnic => ours(
            ctx,
            &plan.launch(),
            &format!("memif {role}"),
            Ours {
                cpus,
                vdevs: vec![format!("memif0,role={role},socket={sock}{}", opts(role))],
                queues,
                mode,
                size,
                extra: &[],
            },
        ),
        Impl::Dpdk => dpdk(
            ctx,
            &plan.launch(),
            &format!("memif {role}"),
            Dpdk {
                side: role,
                slot,
                // The plan runs DPDK with one queue only.
                cpu: cpus[0],
                mem: "512",
                eal: if zc(role) {
                    &["--single-file-segments"]
                } else {
                    &[]
                },
                vdev: format!(
                    "net_memif0,role={role},socket={sock},socket-abstract=no{}",
                    opts(role)
                ),
                mode,
                size,
                app: &[],
            },
        ),
    };
    let (server_mode, client_mode) = if server_sends {
        ("txonly", "rxonly")
    } else {
        ("rxonly", "txonly")
    };
    Pair {
        first: side(server, "server", a, server_mode),
        second: side(client, "client", b, client_mode),
        measured_first: !server_sends,
        counter: Counter::Rx,
    }
}

fn memnic_pair<'a>(
    ctx: &Ctx,
    plan: &'a Plan,
    (host_sends, ports): (bool, u16),
    size: u32,
    slot: usize,
) -> Pair {
    let n = usize::from(ports);
    let (host_mode, guest_mode) = if host_sends {
        ("txonly", "rxonly")
    } else {
        ("rxonly", "txonly")
    };
    // One device (its own region) per queue pair; testpmd gives each port's queue its lcore.
    let side = |role: &str, cpus: &'a [usize], mode: &'a str| Ours {
        cpus: &cpus[..n],
        vdevs: (0..n)
            .map(|k| format!("memnic{k},path={},role={role}", ctx.shm_name(slot, k)))
            .collect(),
        queues: 1,
        mode,
        size,
        extra: &[],
    };
    let host = side("host", &plan.sides.0, host_mode);
    let guest = side("guest", &plan.sides.1, guest_mode);
    Pair {
        first: ours(ctx, &plan.launch(), "MEMNIC host", host),
        second: ours(ctx, &plan.launch(), "MEMNIC guest", guest),
        measured_first: !host_sends,
        counter: Counter::Rx,
    }
}

fn vhost_pair(
    ctx: &Ctx,
    plan: &Plan,
    backend: Impl,
    (ring, dir): (Ring, VhostDir),
    size: u32,
    slot: usize,
) -> Pair {
    let sock = ctx.sock(slot).display().to_string();
    let (a, b) = plan.cpus;
    let (backend_mode, frontend_mode, counter) = match dir {
        // The frontend's TX-packets: its ring holds 256, so what got in is what the backend took.
        VhostDir::Deq => ("rxonly", "txonly", Counter::Tx),
        VhostDir::Enq => ("txonly", "rxonly", Counter::Rx),
    };
    let first = match backend {
        Impl::Memnic => ours(
            ctx,
            &plan.launch(),
            "vhost backend",
            Ours {
                cpus: &[a],
                vdevs: vec![format!("vhost0,iface={sock}")],
                queues: 1,
                mode: backend_mode,
                size,
                extra: &[],
            },
        ),
        Impl::Dpdk => dpdk(
            ctx,
            &plan.launch(),
            "net_vhost backend",
            Dpdk {
                side: "backend",
                slot,
                cpu: a,
                mem: "1024",
                eal: &[],
                vdev: format!("net_vhost0,iface={sock},queues=1"),
                mode: backend_mode,
                size,
                app: &[],
            },
        ),
    };
    let packed = u8::from(ring == Ring::Packed);
    let second = dpdk(
        ctx,
        &plan.launch(),
        "virtio-user frontend",
        Dpdk {
            side: "frontend",
            slot,
            cpu: b,
            mem: "1024",
            eal: &["--single-file-segments"],
            vdev: format!("net_virtio_user0,path={sock},queues=1,packed_vq={packed}"),
            mode: frontend_mode,
            size,
            app: &["--no-flush-rx"],
        },
    );
    Pair {
        first,
        second,
        measured_first: false,
        counter,
    }
}

/// The two processes of `run` at `size` in `case`, with the sockets and regions of `slot`;
/// `None` for the runs in this process (the tester, the limit probe).
pub(crate) fn pair(
    ctx: &Ctx,
    plan: &Plan,
    case: Case,
    run: Run,
    size: u32,
    slot: usize,
) -> Result<Option<Pair>, String> {
    Ok(Some(match (run, case) {
        (
            Run::Memif {
                server,
                client,
                queues,
                server_sends,
                zero_copy,
            },
            _,
        ) => memif_pair(
            ctx,
            plan,
            (server, client),
            queues,
            (server_sends, zero_copy),
            size,
            slot,
        ),
        (Run::Memnic { host_sends, ports }, _) => {
            memnic_pair(ctx, plan, (host_sends, ports), size, slot)
        }
        (Run::Vhost { backend }, Case::Vhost { ring, dir }) => {
            vhost_pair(ctx, plan, backend, (ring, dir), size, slot)
        }
        (Run::Vhost { .. }, Case::Only) => {
            return Err("a vhost run needs a ring and a direction".into())
        }
        (Run::Tester(_) | Run::Limit { .. }, _) => return Ok(None),
    }))
}

/// One run of `run` at `size`: its window rates, Mpps.
pub fn run(ctx: &Ctx, plan: &Plan, case: Case, run: Run, size: u32) -> Result<Vec<f64>, String> {
    match run {
        Run::Tester(v) => return tester(plan, v, size, plan.seconds),
        Run::Limit {
            copies,
            shape,
            rings,
        } => {
            // Ring k on queue pair k's CPUs: its receiver's (side A) and its sender's (B).
            let cpus: Vec<(usize, usize)> = plan
                .sides
                .0
                .iter()
                .copied()
                .zip(plan.sides.1.iter().copied())
                .take(usize::from(rings))
                .collect();
            let rates =
                crate::limit::run(&cpus, copies, shape, size as usize, plan.seconds, ctx.clock)?;
            return Ok(rates.into_iter().map(|r| r / 1e6).collect());
        }
        _ => {}
    }
    let pair = pair(ctx, plan, case, run, size, 0)?
        .ok_or_else(|| format!("{run:?} is not a pair of processes"))?;
    ctx.remove_files();
    let rates = run_pair(ctx, &pair, Duration::from_secs(plan.seconds));
    ctx.remove_files();
    rates
}

fn run_pair(ctx: &Ctx, pair: &Pair, traffic: Duration) -> Result<Vec<f64>, String> {
    let first = pair.first.spawn(ctx)?;
    first.wait_for("start its port", START_LIMIT, |s| s.ready)?;
    let second = match pair.second.spawn(ctx) {
        Ok(p) => p,
        Err(e) => {
            first.stop(STOP_LIMIT);
            return Err(e);
        }
    };
    let measure = || {
        second.wait_for("start its port", START_LIMIT, |s| s.ready)?;
        let measured = if pair.measured_first { &first } else { &second };
        let counter = pair.counter;
        measured.wait_for("count any packets", TRAFFIC_LIMIT, |s| {
            let stamps = if counter == Counter::Rx { &s.rx } else { &s.tx };
            stamps.last().is_some_and(|l| l.count > 0)
        })?;
        // The measurement itself: traffic runs while the readers stamp the counter lines.
        std::thread::sleep(traffic);
        // A run of a few seconds may end before a late stats line closes its first window.
        measured.wait_for("print a whole window of counters", WINDOW_LIMIT, |s| {
            let stamps = if counter == Counter::Rx { &s.rx } else { &s.tx };
            !window_rates(stamps, f64::INFINITY).is_empty()
        })?;
        let until = ctx.clock.elapsed().as_secs_f64();
        Ok(window_rates(&measured.stamps(counter), until))
    };
    let result: Result<Vec<f64>, String> = measure();
    second.stop(STOP_LIMIT);
    first.stop(STOP_LIMIT);
    Ok(result?.into_iter().map(|r| r / 1e6).collect())
}

/// memnic-tester's trials, in this process: one 2-s trial per window.
fn tester(
    plan: &Plan,
    variant: memnic_pmd::Variant,
    size: u32,
    seconds: u64,
) -> Result<Vec<f64>, String> {
    let cfg = memnic_tester::TesterConfig {
        variants: vec![variant],
        sizes: vec![size],
        trials: 1,
        duration: TESTER_WINDOW,
        warmup: Duration::from_millis(100),
        burst: 32,
        host_cpu: Some(plan.cpus.0),
        pmd_cpu: Some(plan.cpus.1),
        direction: memnic_tester::Direction::Both,
    };
    let pool = memnic_tester::pool_for(&[size]).map_err(|e| e.to_string())?;
    let windows = (seconds / TESTER_WINDOW.as_secs()).max(1);
    (0..windows)
        .map(|_| {
            match memnic_tester::run_once(variant, size, &cfg, plan.cpus, &pool) {
                Ok(s) => Ok(s.rx_mpps),
                // The PMD thread got no CPU for the whole window: like a pair's receiver that
                // counted nothing between two lines, a window of nothing.
                Err(memnic_tester::TesterError::Starved(_)) => Ok(0.0),
                Err(e) => Err(e.to_string()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--devargs` goes on every port of ours, both sides, and on nothing else.
    #[test]
    fn devargs_are_added_to_every_port_of_ours() {
        for (line, added) in [
            (
                "memif --peer memnic --sizes 64 --devargs tx-stream=off",
                ",tx-stream=off",
            ),
            ("memif --peer memnic --sizes 64", ""),
        ] {
            let plan = crate::plan::tests::plan_of(line).unwrap();
            let ctx = Ctx::new(&plan, "/bin/true".into()).unwrap();
            let v = &plan.variants[0];
            let p = pair(&ctx, &plan, plan.cases[0], v.run, 64, 0)
                .unwrap()
                .unwrap();
            let sock = ctx.sock(0).display().to_string();
            for (side, role) in [(&p.first, "server"), (&p.second, "client")] {
                let vdevs: Vec<_> = side.args.windows(2).filter(|w| w[0] == "--vdev").collect();
                assert_eq!(
                    vdevs,
                    [[
                        "--vdev".to_string(),
                        format!("memif0,role={role},socket={sock}{added}")
                    ]],
                    "{line}"
                );
            }
            let _ = std::fs::remove_dir_all(&ctx.dir);
        }
    }
}
