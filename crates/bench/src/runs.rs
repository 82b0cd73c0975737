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
/// A cold start of DPDK loads every driver library: generous.
const START_LIMIT: Duration = Duration::from_secs(60);
/// From both sides started to the first packets counted.
const TRAFFIC_LIMIT: Duration = Duration::from_secs(30);
const STOP_LIMIT: Duration = Duration::from_secs(10);
/// After `--seconds` of traffic, how long a run waits for its first whole window.
const WINDOW_LIMIT: Duration = Duration::from_secs(10);
/// The tester's trials: one window each.
const TESTER_WINDOW: Duration = Duration::from_secs(2);

/// What every run shares: the programs, a private directory for sockets, the bench's clock.
pub struct Ctx {
    pub ours: PathBuf,
    pub dpdk: Option<PathBuf>,
    dir: PathBuf,
    shm: String,
    pub clock: Instant,
}

impl Ctx {
    pub fn new(plan: &Plan, ours: PathBuf) -> Result<Ctx, String> {
        let dpdk = if plan.uses_dpdk() {
            Some(find_in_path(DPDK).ok_or_else(|| {
                format!(
                    "{DPDK} is not installed (apt-get install {}){}",
                    plan.dpdk_packages(),
                    if plan.bench == "memif" {
                        ", or use --peer memnic to run ours alone"
                    } else {
                        ""
                    }
                )
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
            dir,
            shm: tag,
            clock: Instant::now(),
        })
    }

    fn sock(&self) -> PathBuf {
        self.dir.join("bench.sock")
    }

    /// The name of MEMNIC device `k`'s region (under /dev/shm).
    fn shm_name(&self, k: usize) -> String {
        format!("{}-{k}", self.shm)
    }

    /// The socket and every region a run may have left.
    fn remove_files(&self) {
        let _ = std::fs::remove_file(self.sock());
        for k in 0..usize::from(crate::plan::MAX_QUEUES) {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(self.shm_name(k)));
        }
    }

    fn prefix(&self, side: &str) -> String {
        format!("memnic-bench-{}-{side}", std::process::id())
    }
}

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
                let _ = std::fs::remove_dir_all(root.join(self.prefix(side)));
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
struct Side {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    ready: &'static str,
}

/// Two processes: the first is started (and ready) before the second; `measured` says whose
/// counter is read.
struct Pair {
    first: Side,
    second: Side,
    measured_first: bool,
    counter: Counter,
}

/// Our testpmd on `cpus` (one forwarding lcore each) with the ports `vdevs`, each with
/// `queues` queue pairs; a scaling run also places each queue's rings and buffers on its lcore's
/// node (`--ring-bind-lcpu`), as RSS-style scaling wants.
struct Ours<'a> {
    cpus: &'a [usize],
    vdevs: Vec<String>,
    queues: u16,
    mode: &'a str,
    size: u32,
}

fn ours(ctx: &Ctx, plan: &Plan, name: &str, o: Ours) -> Side {
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
        args.push(v);
    }
    if o.queues > 1 {
        args.extend(["--rxq".into(), o.queues.to_string()]);
        args.extend(["--txq".into(), o.queues.to_string()]);
    }
    if plan.per_pair {
        args.push("--ring-bind-lcpu".into());
    }
    args.extend(
        [
            "--forward-mode",
            o.mode,
            "--txpkts",
            &o.size.to_string(),
            "--stats-period",
            "1",
        ]
        .map(String::from),
    );
    Side {
        name: format!("memnic testpmd ({name})"),
        program: ctx.ours.clone(),
        args,
        ready: OURS_READY,
    }
}

/// DPDK's testpmd on `cpu` (main and forwarding lcore both there), as `peers/dpdk.md` runs it.
struct Dpdk<'a> {
    side: &'a str,
    cpu: usize,
    mem: &'a str,
    eal: &'a [&'a str],
    vdev: String,
    mode: &'a str,
    size: u32,
    app: &'a [&'a str],
}

fn dpdk(ctx: &Ctx, name: &str, d: Dpdk) -> Side {
    let mut args: Vec<String> = vec![
        "--no-huge".into(),
        "-m".into(),
        d.mem.into(),
        "--no-pci".into(),
        format!("--lcores=0@{c},1@{c}", c = d.cpu),
        "--file-prefix".into(),
        ctx.prefix(d.side),
    ];
    args.extend(d.eal.iter().map(|s| s.to_string()));
    args.push(format!("--vdev={}", d.vdev));
    args.extend(
        [
            "--",
            "--nb-cores=1",
            "--total-num-mbufs=32768",
            "-a",
            "--stats-period",
            "1",
        ]
        .map(String::from),
    );
    args.push(format!("--forward-mode={}", d.mode));
    args.push(format!("--txpkts={}", d.size));
    args.extend(d.app.iter().map(|s| s.to_string()));
    Side {
        name: format!("{DPDK} ({name})"),
        program: ctx.dpdk.clone().unwrap_or_else(|| DPDK.into()),
        args,
        ready: DPDK_READY,
    }
}

/// A memif pair: the receiver (the server, or with `server_sends` the client) is measured.
fn memif_pair(
    ctx: &Ctx,
    plan: &Plan,
    (server, client): (Impl, Impl),
    queues: u16,
    server_sends: bool,
    size: u32,
) -> Pair {
    let sock = ctx.sock().display().to_string();
    let n = usize::from(queues);
    let (a, b) = (&plan.sides.0[..n], &plan.sides.1[..n]);
    let side = |imp: Impl, role: &str, cpus: &[usize], mode: &str| match imp {
        Impl::Memnic => ours(
            ctx,
            plan,
            &format!("memif {role}"),
            Ours {
                cpus,
                vdevs: vec![format!("memif0,role={role},socket={sock}")],
                queues,
                mode,
                size,
            },
        ),
        Impl::Dpdk => dpdk(
            ctx,
            &format!("memif {role}"),
            Dpdk {
                side: role,
                // The plan runs DPDK with one queue only.
                cpu: cpus[0],
                mem: "512",
                eal: &[],
                vdev: format!("net_memif0,role={role},socket={sock},socket-abstract=no"),
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

fn memnic_pair<'a>(ctx: &Ctx, plan: &'a Plan, host_sends: bool, ports: u16, size: u32) -> Pair {
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
            .map(|k| format!("memnic{k},path={},role={role}", ctx.shm_name(k)))
            .collect(),
        queues: 1,
        mode,
        size,
    };
    let host = side("host", &plan.sides.0, host_mode);
    let guest = side("guest", &plan.sides.1, guest_mode);
    Pair {
        first: ours(ctx, plan, "MEMNIC host", host),
        second: ours(ctx, plan, "MEMNIC guest", guest),
        measured_first: !host_sends,
        counter: Counter::Rx,
    }
}

fn vhost_pair(ctx: &Ctx, plan: &Plan, backend: Impl, ring: Ring, dir: VhostDir, size: u32) -> Pair {
    let sock = ctx.sock().display().to_string();
    let (a, b) = plan.cpus;
    let (backend_mode, frontend_mode, counter) = match dir {
        // The frontend's TX-packets: its ring holds 256, so what got in is what the backend took.
        VhostDir::Deq => ("rxonly", "txonly", Counter::Tx),
        VhostDir::Enq => ("txonly", "rxonly", Counter::Rx),
    };
    let first = match backend {
        Impl::Memnic => ours(
            ctx,
            plan,
            "vhost backend",
            Ours {
                cpus: &[a],
                vdevs: vec![format!("vhost0,iface={sock}")],
                queues: 1,
                mode: backend_mode,
                size,
            },
        ),
        Impl::Dpdk => dpdk(
            ctx,
            "net_vhost backend",
            Dpdk {
                side: "backend",
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
        "virtio-user frontend",
        Dpdk {
            side: "frontend",
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

/// One run of `run` at `size`: its window rates, Mpps.
pub fn run(ctx: &Ctx, plan: &Plan, case: Case, run: Run, size: u32) -> Result<Vec<f64>, String> {
    let pair = match (run, case) {
        (
            Run::Memif {
                server,
                client,
                queues,
                server_sends,
            },
            _,
        ) => memif_pair(ctx, plan, (server, client), queues, server_sends, size),
        (Run::Memnic { host_sends, ports }, _) => memnic_pair(ctx, plan, host_sends, ports, size),
        (Run::Vhost { backend }, Case::Vhost { ring, dir }) => {
            vhost_pair(ctx, plan, backend, ring, dir, size)
        }
        (Run::Vhost { .. }, Case::Only) => {
            return Err("a vhost run needs a ring and a direction".into())
        }
        (Run::Tester(v), _) => return tester(plan, v, size, plan.seconds),
        (Run::Limit { copies }, _) => {
            let rates =
                crate::limit::run(plan.cpus, copies, size as usize, plan.seconds, ctx.clock)?;
            return Ok(rates.into_iter().map(|r| r / 1e6).collect());
        }
    };
    ctx.remove_files();
    let rates = run_pair(ctx, &pair, Duration::from_secs(plan.seconds));
    ctx.remove_files();
    rates
}

fn run_pair(ctx: &Ctx, pair: &Pair, traffic: Duration) -> Result<Vec<f64>, String> {
    let spawn = |s: &Side| Proc::spawn(&s.name, &s.program, &s.args, ctx.clock, s.ready);
    let first = spawn(&pair.first)?;
    first.wait_for("start its port", START_LIMIT, |s| s.ready)?;
    let second = match spawn(&pair.second) {
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
