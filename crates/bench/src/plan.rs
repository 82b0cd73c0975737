//! The command line and what it asks for: which pairs run, at which sizes, how often, where.

use std::path::PathBuf;

use crate::limit::Shape;
use memnic_pmd::Variant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub bench: Bench,
}

#[derive(clap::Subcommand, Debug)]
pub enum Bench {
    /// memif copy mode, txonly -> rxonly: memnic<->memnic beside DPDK<->DPDK (by default the
    /// server receives; --dir s2c: the client)
    Memif {
        /// dpdk: memnic<->memnic and DPDK<->DPDK; memnic: memnic<->memnic alone (no DPDK
        /// needed); both: also the mixed pairs (memnic server <- DPDK client and the reverse)
        #[arg(long, value_enum, default_value_t = Peer::Dpdk)]
        peer: Peer,
        /// Queue pairs, comma-separated: `1,2,4,8` measures scaling, each queue on its own
        /// lcore on each side (above 1 runs memnic<->memnic alone: add --peer memnic)
        #[arg(long, value_delimiter = ',', default_value = "1")]
        queues: Vec<u16>,
        /// Which way the frames go: c2s (client txonly -> server rxonly, the client's C2S ring)
        /// or s2c (server txonly -> client rxonly, the S2C ring)
        #[arg(long, value_enum, default_value_t = MemifDir::C2s)]
        dir: MemifDir,
        /// Every pair's client in zero-copy mode (`zero-copy=yes`, ours and DPDK's alike): it
        /// hands the server its own buffers, so a frame is copied once (by the server) instead
        /// of twice; the pairs compare with DPDK's zero-copy client
        #[arg(long)]
        zero_copy: bool,
        #[command(flatten)]
        common: Common,
    },
    /// MEMNIC, two memnic testpmd processes over one region: host->guest and guest->host
    Memnic {
        /// Queue pairs, comma-separated: `1,2,4,8` measures scaling. A MEMNIC device has one
        /// queue pair, so N pairs are N devices, each on its own lcore on each side
        #[arg(long, value_delimiter = ',', default_value = "1")]
        queues: Vec<u16>,
        #[command(flatten)]
        common: Common,
    },
    /// memnic-tester's PMD variants (2014-before, 2014-after, memnic), run in this process
    Tester {
        /// Variants to run, comma-separated (default: all three)
        #[arg(long, value_delimiter = ',', value_parser = parse_variant)]
        variants: Vec<Variant>,
        #[command(flatten)]
        common: Common,
    },
    /// Round trips (latency) through a reflector: our testpmd pings, ours or DPDK's reflects,
    /// over memif, MEMNIC and vhost-user
    Ping(crate::ping::PingArgs),
    /// vhost-user backends, DPDK's net_vhost beside ours, against DPDK's virtio-user
    Vhost {
        /// Rings: split, packed (comma-separated)
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "split,packed"
        )]
        rings: Vec<Ring>,
        /// Directions: deq (virtio-user txonly -> backend rxonly), enq (backend txonly ->
        /// virtio-user rxonly)
        #[arg(long, value_enum, value_delimiter = ',', default_value = "deq,enq")]
        dirs: Vec<VhostDir>,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Frame sizes, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "64,512,1518")]
    pub sizes: Vec<u32>,
    /// Rounds: each runs every pair at every size once, alternating the pairs
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds of traffic per run (windows of about 2 s are taken of it)
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Print the results as JSON rows instead of a table
    #[arg(long)]
    pub json: bool,
    /// Write a chart (Mpps against frame size) to this SVG file
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// A,B: the CPUs of the two sides (A: memif server, MEMNIC host, vhost backend, tester host
    /// emulator; B: the other); with --queues above 1, two CPU lists A/B (`0-7/8-15`), a CPU
    /// per queue on each side; default: the first CPUs this process may use
    #[arg(long)]
    pub cpus: Option<String>,
    /// No progress bar
    #[arg(long)]
    pub quiet: bool,
    /// Leave out the bare-ring limit probe (by default it runs in the rotation and every row
    /// gets its fraction of it)
    #[arg(long)]
    pub no_limit: bool,
    /// Keep every pair of a size running at its testpmd prompts and let each forward in turn
    /// for 1-s windows (`start`, `show port stats all`, `stop`), seconds apart; ratios compare
    /// the windows of one turn, which share the machine's state. `--seconds` is then windows
    /// per pair per round
    #[arg(long)]
    pub interleave: bool,
    /// Devargs added to every port of ours, `KEY=VALUE,...` (for example `tx-stream=off`, to
    /// compare a setting with its default run by run)
    #[arg(long)]
    pub devargs: Option<String>,
}

fn parse_variant(s: &str) -> Result<Variant, String> {
    s.parse()
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Dpdk,
    Memnic,
    Both,
}

/// The direction of a memif pair's frames.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemifDir {
    /// Client txonly -> server rxonly.
    C2s,
    /// Server txonly -> client rxonly.
    S2c,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    Split,
    Packed,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum VhostDir {
    Deq,
    Enq,
}

/// Whose implementation runs a side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Impl {
    Dpdk,
    Memnic,
}

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Dpdk => "dpdk",
            Impl::Memnic => "memnic",
        }
    }
}

/// What one run of a variant is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    Memif {
        server: Impl,
        client: Impl,
        /// Queue pairs of the port, each polled by its own lcore on each side.
        queues: u16,
        /// The server sends (S2C) rather than receives (C2S).
        server_sends: bool,
        /// The client runs in zero-copy mode.
        zero_copy: bool,
    },
    Memnic {
        host_sends: bool,
        /// MEMNIC devices (one queue pair each), each polled by its own lcore on each side.
        ports: u16,
    },
    Tester(Variant),
    Vhost {
        backend: Impl,
    },
    /// The bare-ring limit probe with this many copies per frame through a ring of this
    /// shape (see `limit`), `rings` of them side by side on the CPUs of as many queue pairs.
    Limit {
        copies: u8,
        shape: Shape,
        rings: u16,
    },
}

impl Run {
    fn uses_dpdk(self) -> bool {
        match self {
            Run::Memif { server, client, .. } => server == Impl::Dpdk || client == Impl::Dpdk,
            Run::Memnic { .. } | Run::Tester(_) | Run::Limit { .. } => false,
            // The frontend is always DPDK's virtio-user.
            Run::Vhost { .. } => true,
        }
    }
}

/// The settings besides the variant and the size that a cell holds fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    Only,
    Vhost { ring: Ring, dir: VhostDir },
}

impl Case {
    /// Empty for a bench with one case.
    pub fn label(self) -> String {
        match self {
            Case::Only => String::new(),
            Case::Vhost { ring, dir } => format!(
                "{} {}",
                if ring == Ring::Split {
                    "split"
                } else {
                    "packed"
                },
                if dir == VhostDir::Deq { "deq" } else { "enq" }
            ),
        }
    }
}

#[derive(Debug, Clone)]
pub struct VariantSpec {
    pub label: String,
    pub run: Run,
    /// The variant this one is divided by (DPDK's pair, or the same pair with one queue).
    pub baseline: Option<usize>,
    /// Queue pairs, each with its lcore per side (1 but in a scaling run).
    pub pairs: u16,
}

impl VariantSpec {
    fn one_pair(label: String, run: Run, baseline: Option<usize>) -> VariantSpec {
        VariantSpec {
            label,
            run,
            baseline,
            pairs: 1,
        }
    }
}

/// Everything the bench will do.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `memif`, `memnic`, `tester` or `vhost`.
    pub bench: &'static str,
    /// What is measured, in a line (the table's first and the chart's title).
    pub title: String,
    /// Where the two sides run and what goes which way, in a line.
    pub method: String,
    /// What a window is.
    pub windows: &'static str,
    /// The heading of the variant column.
    pub variant_heading: &'static str,
    pub cases: Vec<Case>,
    pub sizes: Vec<u32>,
    pub variants: Vec<VariantSpec>,
    /// A scaling run (`--queues` other than 1): each variant's ratio is over N times its
    /// one-queue baseline, and its fraction of the limit over N times the one-pair limit.
    pub per_pair: bool,
    /// `--interleave`: every variant of a cell started once, each forwarding in turn for
    /// 1-s windows; the k-th window of every variant is of one turn.
    pub interleave: bool,
    /// The limit probe's first variant (after the pairs; in a scaling run one per queue
    /// count follows it), unless `--no-limit`.
    pub limit: Option<usize>,
    pub rounds: usize,
    pub seconds: u64,
    /// (A, B): see [`Common::cpus`]; the first CPU of each side.
    pub cpus: (usize, usize),
    /// Every CPU of each side, one per queue pair (as many as the most pairs asked for).
    pub sides: (Vec<usize>, Vec<usize>),
    pub json: bool,
    pub svg: Option<PathBuf>,
    pub quiet: bool,
    /// `--devargs`: added to every port of ours.
    pub devargs: Option<String>,
}

impl Plan {
    pub fn uses_dpdk(&self) -> bool {
        self.variants.iter().any(|v| v.run.uses_dpdk())
    }

    /// The Debian packages that bring dpdk-testpmd with the drivers this bench needs.
    pub fn dpdk_packages(&self) -> &'static str {
        if self.bench == "vhost" {
            "dpdk-dev librte-net-vhost23 librte-net-virtio23"
        } else {
            "dpdk-dev librte-net-memif23"
        }
    }

    /// Whether variant `vi` is a limit probe.
    pub fn is_limit(&self, vi: usize) -> bool {
        matches!(self.variants[vi].run, Run::Limit { .. })
    }

    /// The limit probe a pair's rate is a fraction of: the one with as many rings as the
    /// pair has queue pairs (in a scaling run), else the only one; `None` for a limit's own.
    pub fn limit_for(&self, vi: usize) -> Option<usize> {
        if self.is_limit(vi) {
            return None;
        }
        let pairs = self.variants[vi].pairs;
        let first = self.limit?;
        (first..self.variants.len())
            .find(|&l| matches!(self.variants[l].run, Run::Limit { rings, .. } if rings == pairs))
    }

    /// Runs in all (with `--interleave`: windows, `--seconds` a round).
    pub fn runs(&self) -> usize {
        let per_round = if self.interleave {
            self.seconds as usize
        } else {
            1
        };
        self.rounds * per_round * self.cases.len() * self.sizes.len() * self.variants.len()
    }
}

/// `bench ping` measures round trips, not rates: `crate::ping` plans and runs it.
const PING_PLANS_ITSELF: &str = "bench ping has its own plan (memnic_bench::ping)";

/// Checks the flags of a rate bench; every failure is one sentence naming the flag.
pub fn plan(args: Args, allowed_cpus: &[usize]) -> Result<Plan, String> {
    let (bench, common) = match &args.bench {
        Bench::Memif { common, .. } => ("memif", common),
        Bench::Memnic { common, .. } => ("memnic", common),
        Bench::Tester { common, .. } => ("tester", common),
        Bench::Vhost { common, .. } => ("vhost", common),
        Bench::Ping(_) => return Err(PING_PLANS_ITSELF.into()),
    };
    let max_size = if bench == "tester" {
        memnic_tester::JUMBO
    } else {
        1518
    };
    let mut sizes = common.sizes.clone();
    if let Some(bad) = sizes.iter().find(|s| !(60..=max_size).contains(*s)) {
        return Err(format!("--sizes: {bad} is outside 60..={max_size} bytes"));
    }
    sizes.sort_unstable();
    sizes.dedup();
    if common.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    if common.seconds < 3 {
        return Err(format!(
            "--seconds {} is too short: each run needs at least 3 s for one ~2-s window of the receiver's counters",
            common.seconds
        ));
    }
    if let Some(svg) = &common.svg {
        let dir = match svg.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        if !dir.is_dir() {
            return Err(format!(
                "--svg {}: the directory {} does not exist",
                svg.display(),
                dir.display()
            ));
        }
    }
    let queues = match &args.bench {
        Bench::Memif { queues, .. } | Bench::Memnic { queues, .. } => {
            let mut q = queues.clone();
            if let Some(bad) = q.iter().find(|n| !(1..=MAX_QUEUES).contains(*n)) {
                return Err(format!("--queues: {bad} is outside 1..={MAX_QUEUES}"));
            }
            q.sort_unstable();
            q.dedup();
            q
        }
        _ => vec![1],
    };
    let per_pair = queues != [1];
    if per_pair && matches!(args.bench, Bench::Memif { peer, .. } if peer != Peer::Memnic) {
        return Err("--queues other than 1 runs memnic<->memnic alone: add --peer memnic".into());
    }
    if common.interleave && bench == "tester" {
        return Err("--interleave keeps pairs of processes at their prompts; the tester runs in this process and its variants already alternate 2-s trials".into());
    }
    if common.devargs.is_some() && bench == "tester" {
        return Err("--devargs goes on the ports of our testpmd; the tester runs its variants in this process, with no devargs".into());
    }
    if common.interleave && per_pair {
        return Err("--interleave measures one queue pair: leave out --queues".into());
    }
    let most = usize::from(queues.iter().copied().max().unwrap_or(1));
    let sides = sides(common.cpus.as_deref(), allowed_cpus, most)?;
    let cpus = (sides.0[0], sides.1[0]);
    let (a, b) = (
        memnic_numa::format_cpu_list(&sides.0),
        memnic_numa::format_cpu_list(&sides.1),
    );
    let mut cases = vec![Case::Only];
    let mut windows = "~2-s windows of the receiver's counters, stamped by the bench's clock";
    // The copies a frame costs in the pairs of this bench, for the limit probe: memif copy
    // mode and MEMNIC copy into the shared ring and out of it (so does the tester's host
    // emulator with its PMD); virtio-user writes only a frame's headers and our vhost backend
    // or DPDK's copies the frame once.
    // A zero-copy memif client hands the server its own buffers: one copy, the server's.
    let memif_zero_copy = matches!(
        args.bench,
        Bench::Memif {
            zero_copy: true,
            ..
        }
    );
    let copies = if bench == "vhost" || memif_zero_copy {
        1
    } else {
        2
    };
    // A scaling run's label: the pair and its queue count.
    let scaled = |label: &str, n: u16| {
        if per_pair {
            format!("{label} x{n}")
        } else {
            label.to_string()
        }
    };
    // One variant per queue count of one pair, each divided by the pair's one-queue variant.
    let per_queues = |variants: &mut Vec<VariantSpec>, label: &str, run: &dyn Fn(u16) -> Run| {
        let first = variants.len();
        let one = queues.iter().position(|&n| n == 1).map(|i| first + i);
        for &n in &queues {
            variants.push(VariantSpec {
                label: scaled(label, n),
                run: run(n),
                baseline: one.filter(|&o| o != variants.len()),
                pairs: n,
            });
        }
    };
    let sides_say = if per_pair { "CPUs" } else { "CPU" };
    let (title, method, heading, mut variants) = match &args.bench {
        Bench::Memif {
            peer,
            dir,
            zero_copy,
            ..
        } => {
            let server_sends = *dir == MemifDir::S2c;
            let arrow = if server_sends { "->" } else { "<-" };
            let mut variants = vec![];
            if per_pair {
                per_queues(&mut variants, &format!("memnic{arrow}memnic"), &|queues| {
                    Run::Memif {
                        server: Impl::Memnic,
                        client: Impl::Memnic,
                        queues,
                        server_sends,
                        zero_copy: *zero_copy,
                    }
                });
            } else {
                let mut pairs = vec![];
                if *peer != Peer::Memnic {
                    pairs.push((Impl::Dpdk, Impl::Dpdk));
                }
                pairs.push((Impl::Memnic, Impl::Memnic));
                if *peer == Peer::Both {
                    pairs.push((Impl::Memnic, Impl::Dpdk));
                    pairs.push((Impl::Dpdk, Impl::Memnic));
                }
                let baseline = (*peer != Peer::Memnic).then_some(0);
                variants = pairs
                    .into_iter()
                    .enumerate()
                    .map(|(i, (server, client))| {
                        VariantSpec::one_pair(
                            format!("{}{arrow}{}", server.name(), client.name()),
                            Run::Memif {
                                server,
                                client,
                                queues: 1,
                                server_sends,
                                zero_copy: *zero_copy,
                            },
                            baseline.filter(|&b| b != i),
                        )
                    })
                    .collect();
            }
            let (ring, server_is, client_is) = if server_sends {
                ("S2C", "sender", "receiver")
            } else {
                ("C2S", "receiver", "sender")
            };
            let mode = if *zero_copy {
                "zero-copy client"
            } else {
                "copy mode"
            };
            (
                format!("memif {mode}, txonly -> rxonly over the {ring} ring"),
                format!("server ({server_is}) on {sides_say} {a}, client ({client_is}) on {sides_say} {b}; pair: server{arrow}client"),
                if server_sends { "server->client" } else { "server<-client" },
                variants,
            )
        }
        Bench::Memnic { .. } => {
            let mut variants = vec![];
            for (label, host_sends) in [("host->guest", true), ("guest->host", false)] {
                per_queues(&mut variants, label, &|ports| Run::Memnic {
                    host_sends,
                    ports,
                });
            }
            (
                "MEMNIC, two memnic testpmd processes, txonly -> rxonly".to_string(),
                format!("host on {sides_say} {a}, guest on {sides_say} {b}"),
                "direction",
                variants,
            )
        }
        Bench::Tester { variants, .. } => {
            let variants = if variants.is_empty() {
                Variant::ALL.to_vec()
            } else {
                variants.clone()
            };
            let baseline = variants.iter().position(|v| *v == Variant::Before2014);
            windows = "the tester's 2-s trials (one window each), timed by the PMD thread";
            (
                "memnic-tester, PMD rx_burst + tx_burst against a host emulator".to_string(),
                format!("host emulator on CPU {a}, PMD on CPU {b}"),
                "variant",
                variants
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| {
                        VariantSpec::one_pair(
                            v.name().into(),
                            Run::Tester(v),
                            baseline.filter(|&b| b != i),
                        )
                    })
                    .collect(),
            )
        }
        Bench::Ping(_) => return Err(PING_PLANS_ITSELF.into()),
        Bench::Vhost { rings, dirs, .. } => {
            if rings.is_empty() || dirs.is_empty() {
                return Err("--rings and --dirs each need at least one value".into());
            }
            cases = Vec::new();
            windows = "~2-s windows of virtio-user's counters (deq: its TX-packets, enq: its RX-packets), stamped by the bench's clock";
            for &ring in rings {
                for &dir in dirs {
                    let c = Case::Vhost { ring, dir };
                    if !cases.contains(&c) {
                        cases.push(c);
                    }
                }
            }
            (
                "vhost-user backend <-> DPDK virtio-user".to_string(),
                format!("backend on CPU {a}, virtio-user on CPU {b}; deq: virtio-user txonly -> backend rxonly, enq: backend txonly -> virtio-user rxonly"),
                "backend",
                [Impl::Dpdk, Impl::Memnic]
                    .into_iter()
                    .enumerate()
                    .map(|(i, backend)| {
                        VariantSpec::one_pair(
                            backend.name().into(),
                            Run::Vhost { backend },
                            (i != 0).then_some(0),
                        )
                    })
                    .collect(),
            )
        }
    };
    if common.interleave {
        windows = if bench == "vhost" {
            "1-s windows of virtio-user's counters (deq: TX-packets, enq: RX-packets) by `show port stats all`, stamped by the bench's clock; the pairs forward in turn"
        } else {
            "1-s windows of the receiver's counters by `show port stats all`, stamped by the bench's clock; the pairs forward in turn"
        };
    }
    // MEMNIC's pairs (and the tester's) move frames through MEMNIC's own ring, a status word
    // per 4-KiB slot: their limit is that ring bare, the first limit below (the one the pairs
    // are a fraction of). The ring of two indices that memif's pairs are over runs beside it,
    // so the table shows what MEMNIC's wire format itself costs against it.
    let shapes: &[Shape] = if bench == "memnic" || bench == "tester" {
        &[Shape::MemnicSlots, Shape::Indices]
    } else {
        &[Shape::Indices]
    };
    let limit = (!common.no_limit).then(|| {
        let first = variants.len();
        for &shape in shapes {
            let label = match shape {
                Shape::MemnicSlots => "limit (MEMNIC slots)".to_string(),
                Shape::Indices => format!(
                    "limit ({copies} cop{})",
                    if copies == 1 { "y" } else { "ies" }
                ),
            };
            if per_pair {
                // A limit per queue count (N rings side by side), over its own x1: the bare
                // rings' scaling, the ceiling of the pairs' with as many queues.
                per_queues(&mut variants, &label, &|rings| Run::Limit {
                    copies,
                    shape,
                    rings,
                });
            } else {
                variants.push(VariantSpec::one_pair(
                    label,
                    Run::Limit {
                        copies,
                        shape,
                        rings: 1,
                    },
                    None,
                ));
            }
        }
        first
    });
    Ok(Plan {
        bench,
        title,
        method,
        windows,
        variant_heading: heading,
        cases,
        sizes,
        variants,
        per_pair,
        interleave: common.interleave,
        limit,
        rounds: common.rounds,
        seconds: common.seconds,
        cpus,
        sides,
        json: common.json,
        svg: common.svg.clone(),
        quiet: common.quiet,
        devargs: common.devargs.clone(),
    })
}

/// The most queue pairs a scaling run asks for (eight per side fill a 16-CPU machine).
pub const MAX_QUEUES: u16 = 64;

/// The CPUs of each side, `n` each: `--cpus A,B` (one queue), `--cpus LIST/LIST`, or the first
/// `2n` CPUs this process may use (side A the first `n`).
pub(crate) fn sides(
    flag: Option<&str>,
    allowed: &[usize],
    n: usize,
) -> Result<(Vec<usize>, Vec<usize>), String> {
    let Some(s) = flag else {
        if allowed.len() < 2 * n {
            return Err(if n == 1 {
                format!("the bench needs two CPUs, one per side; this process may use {allowed:?}")
            } else {
                format!(
                    "--queues {n} needs {} CPUs, {n} per side; this process may use {allowed:?}",
                    2 * n
                )
            });
        }
        return Ok((allowed[..n].to_vec(), allowed[n..2 * n].to_vec()));
    };
    let (a, b) = if let Some((a, b)) = s.split_once('/') {
        let list = |l: &str| {
            memnic_numa::parse_cpu_list(l)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("--cpus {s}: '{l}' is not a CPU list like 0-3 or 0,2,4"))
        };
        (list(a)?, list(b)?)
    } else {
        let parsed: Vec<Option<usize>> = s.split(',').map(|c| c.trim().parse().ok()).collect();
        match parsed[..] {
            [Some(a), Some(b)] => (vec![a], vec![b]),
            _ => {
                return Err(format!(
                    "--cpus '{s}' is not two CPU numbers A,B (for example 0,1) nor two CPU lists A/B (0-3/4-7)"
                ))
            }
        }
    };
    if let Some(c) = a.iter().find(|c| b.contains(c)) {
        return Err(format!(
            "--cpus {s}: CPU {c} is on both sides; the two sides need different CPUs"
        ));
    }
    if let Some(c) = a.iter().chain(&b).find(|c| !allowed.contains(c)) {
        return Err(format!(
            "--cpus {s}: CPU {c} is not available to this process (allowed: {allowed:?})"
        ));
    }
    if a.len() < n || b.len() < n {
        return Err(format!(
            "--cpus {s}: --queues {n} needs {n} CPUs on each side, a queue's lcore per CPU"
        ));
    }
    Ok((a[..n].to_vec(), b[..n].to_vec()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    pub(crate) fn plan_of(line: &str) -> Result<Plan, String> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(line.split_whitespace()))
            .map_err(|e| e.to_string())?;
        plan(cli.args, &[0, 1, 2])
    }

    fn baselines(p: &Plan) -> Vec<Option<usize>> {
        p.variants.iter().map(|v| v.baseline).collect()
    }

    fn labels(p: &Plan) -> Vec<&str> {
        p.variants.iter().map(|v| v.label.as_str()).collect()
    }

    #[test]
    fn memif_peers() {
        let p = plan_of("memif").unwrap();
        assert_eq!(
            labels(&p),
            ["dpdk<-dpdk", "memnic<-memnic", "limit (2 copies)"]
        );
        assert_eq!(baselines(&p), [None, Some(0), None]);
        assert_eq!(p.limit, Some(2));
        assert!(p.uses_dpdk());
        let p = plan_of("memif --peer memnic --no-limit").unwrap();
        assert_eq!(labels(&p), ["memnic<-memnic"]);
        assert_eq!(p.limit, None);
        assert_eq!(baselines(&p), [None]);
        assert!(!p.uses_dpdk());
        let p = plan_of("memif --peer both").unwrap();
        assert_eq!(
            labels(&p),
            [
                "dpdk<-dpdk",
                "memnic<-memnic",
                "memnic<-dpdk",
                "dpdk<-memnic",
                "limit (2 copies)"
            ]
        );
    }

    /// --interleave runs pairs of processes, one queue pair each, and counts its windows as
    /// runs; the tester and scaling runs refuse it in a sentence.
    #[test]
    fn interleave() {
        let p =
            plan_of("memif --peer both --interleave --sizes 64 --rounds 2 --seconds 5").unwrap();
        assert!(p.interleave);
        assert_eq!(p.runs(), 2 * 5 * 5);
        assert!(p.windows.contains("in turn"), "{}", p.windows);
        assert!(!plan_of("memif").unwrap().interleave);
        let e = plan_of("tester --interleave").unwrap_err();
        assert!(e.starts_with("--interleave") && e.contains("tester"), "{e}");
        let e = plan_of("tester --devargs tx_stream=off").unwrap_err();
        assert!(e.starts_with("--devargs") && e.contains("tester"), "{e}");
        let p = plan_of("memnic --devargs tx_stream=off").unwrap();
        assert_eq!(p.devargs.as_deref(), Some("tx_stream=off"));
        let e = plan_of("memnic --queues 1,2 --interleave").unwrap_err();
        assert!(e.contains("--queues"), "{e}");
        assert!(plan_of("vhost --interleave --rings packed").is_ok());
    }

    /// A flag of each memif pair of the plan, picked from (server_sends, zero_copy).
    fn memif_flags(p: &Plan, pick: impl Fn(bool, bool) -> bool) -> Vec<bool> {
        p.variants
            .iter()
            .filter_map(|v| match v.run {
                Run::Memif {
                    server_sends,
                    zero_copy,
                    ..
                } => Some(pick(server_sends, zero_copy)),
                _ => None,
            })
            .collect()
    }

    /// --zero-copy puts every pair's client in zero-copy mode, and the limit probe copies a
    /// frame once, as the pairs then do.
    #[test]
    fn memif_zero_copy_clients() {
        let zc = |p: &Plan| memif_flags(p, |_, zero_copy| zero_copy);
        let p = plan_of("memif --peer both --zero-copy").unwrap();
        assert_eq!(zc(&p), [true; 4]);
        assert!(p.title.contains("zero-copy client"), "{}", p.title);
        assert_eq!(labels(&p).last(), Some(&"limit (1 copy)"));
        let p = plan_of("memif --peer both").unwrap();
        assert_eq!(zc(&p), [false; 4]);
        assert!(p.title.contains("copy mode"), "{}", p.title);
        assert_eq!(labels(&p).last(), Some(&"limit (2 copies)"));
    }

    /// --dir s2c turns every memif pair around (the server sends, the client is measured);
    /// c2s, the default, is the server receiving.
    #[test]
    fn memif_directions() {
        let sends = |p: &Plan| memif_flags(p, |server_sends, _| server_sends);
        let p = plan_of("memif --peer both").unwrap();
        assert_eq!(sends(&p), [false; 4]);
        assert_eq!(p.variant_heading, "server<-client");
        assert_eq!(plan_of("memif --dir c2s").unwrap().title, p.title);
        let p = plan_of("memif --peer both --dir s2c").unwrap();
        assert_eq!(
            labels(&p),
            [
                "dpdk->dpdk",
                "memnic->memnic",
                "memnic->dpdk",
                "dpdk->memnic",
                "limit (2 copies)"
            ]
        );
        assert_eq!(sends(&p), [true; 4]);
        assert_eq!(p.variant_heading, "server->client");
        assert!(p.title.contains("S2C"), "{}", p.title);
        assert!(p.method.contains("server (sender)"), "{}", p.method);
        let cli = Cli::try_parse_from(
            "bench memif --peer memnic --dir s2c --queues 1,2".split_whitespace(),
        )
        .unwrap();
        let p = plan(cli.args, &[0, 1, 2, 3]).unwrap();
        assert_eq!(labels(&p)[..2], ["memnic->memnic x1", "memnic->memnic x2"]);
        assert_eq!(sends(&p), [true; 2]);
        assert!(plan_of("memif --dir up").is_err());
    }

    #[test]
    fn common_flags() {
        let p = plan_of("memnic --sizes 1518,64,64 --rounds 2 --seconds 4 --cpus 2,0").unwrap();
        assert_eq!(p.sizes, [64, 1518]);
        assert_eq!((p.rounds, p.seconds, p.cpus), (2, 4, (2, 0)));
        // Two sizes x two rounds x (two directions and two limits).
        assert_eq!(p.runs(), 2 * 2 * 4);
        assert_eq!(plan_of("memnic").unwrap().cpus, (0, 1));
    }

    #[test]
    fn scaling_runs() {
        let cli = Cli::try_parse_from(
            "bench memif --peer memnic --queues 4,1,2 --cpus 0-3/8,10-12".split_whitespace(),
        )
        .unwrap();
        let p = plan(cli.args, &(0..16).collect::<Vec<_>>()).unwrap();
        assert_eq!(
            labels(&p),
            [
                "memnic<-memnic x1",
                "memnic<-memnic x2",
                "memnic<-memnic x4",
                "limit (2 copies) x1",
                "limit (2 copies) x2",
                "limit (2 copies) x4"
            ]
        );
        // Each divided by the one-queue run of its pair; the limits by their x1.
        assert_eq!(
            baselines(&p),
            [None, Some(0), Some(0), None, Some(3), Some(3)]
        );
        let pairs: Vec<u16> = p.variants.iter().map(|v| v.pairs).collect();
        assert_eq!(pairs, [1, 2, 4, 1, 2, 4]);
        // Each pair over the limit with as many rings.
        let limits: Vec<Option<usize>> = (0..6).map(|vi| p.limit_for(vi)).collect();
        assert_eq!(limits, [Some(3), Some(4), Some(5), None, None, None]);
        assert!(p.per_pair);
        assert_eq!(p.sides, (vec![0, 1, 2, 3], vec![8, 10, 11, 12]));
        assert_eq!(p.cpus, (0, 8));
        assert!(p.method.contains("CPUs 0-3"), "{}", p.method);
        // MEMNIC: one device per pair, both directions, each over its own x1; by default the
        // first CPUs this process may use, side A first.
        let cli = Cli::try_parse_from("bench memnic --queues 1,2".split_whitespace()).unwrap();
        let p = plan(cli.args, &[0, 1, 2, 3, 4]).unwrap();
        assert_eq!(
            labels(&p),
            [
                "host->guest x1",
                "host->guest x2",
                "guest->host x1",
                "guest->host x2",
                "limit (MEMNIC slots) x1",
                "limit (MEMNIC slots) x2",
                "limit (2 copies) x1",
                "limit (2 copies) x2"
            ]
        );
        assert_eq!(
            baselines(&p),
            [None, Some(0), None, Some(2), None, Some(4), None, Some(6)]
        );
        assert_eq!(p.sides, (vec![0, 1], vec![2, 3]));
        // Each direction over MEMNIC's own bare ring with as many rings, not the indices'.
        let limits: Vec<Option<usize>> = (0..4).map(|vi| p.limit_for(vi)).collect();
        assert_eq!(limits, [Some(4), Some(5), Some(4), Some(5)]);
        // Without --queues nothing changes: one pair, no scaling.
        let p = plan_of("memnic").unwrap();
        assert_eq!(
            labels(&p),
            [
                "host->guest",
                "guest->host",
                "limit (MEMNIC slots)",
                "limit (2 copies)"
            ]
        );
        assert_eq!((p.limit_for(0), p.limit_for(1)), (Some(2), Some(2)));
        assert!(!p.per_pair);
    }

    #[test]
    fn vhost_cases_and_tester_variants() {
        let p = plan_of("vhost --rings packed --dirs enq,deq").unwrap();
        let cases: Vec<String> = p.cases.iter().map(|c| c.label()).collect();
        assert_eq!(cases, ["packed enq", "packed deq"]);
        assert!(p.uses_dpdk());
        // virtio-user writes a frame's headers, the backend copies it once.
        assert_eq!(labels(&p), ["dpdk", "memnic", "limit (1 copy)"]);
        let p = plan_of("tester --variants memnic,2014-before --sizes 4088 --no-limit").unwrap();
        assert_eq!(labels(&p), ["memnic", "2014-before"]);
        assert_eq!(baselines(&p), [Some(1), None]);
        assert!(!p.uses_dpdk());
    }

    #[test]
    fn bad_flags_are_one_sentence() {
        for (line, says) in [
            ("memnic --sizes 59", "--sizes: 59 is outside 60..=1518"),
            ("memif --sizes 4088", "--sizes: 4088 is outside 60..=1518"),
            ("tester --sizes 5000", "--sizes: 5000 is outside 60..=4088"),
            ("memnic --rounds 0", "--rounds must be at least 1"),
            ("memnic --seconds 2", "--seconds 2 is too short"),
            ("memnic --cpus 1", "--cpus '1' is not two CPU numbers"),
            ("memnic --cpus a,b", "--cpus 'a,b' is not two CPU numbers"),
            ("memnic --cpus 1,1", "CPU 1 is on both sides"),
            ("memnic --cpus 0/x", "'x' is not a CPU list"),
            (
                "memnic --queues 2 --cpus 0,1",
                "--queues 2 needs 2 CPUs on each side",
            ),
            ("memnic --queues 2", "--queues 2 needs 4 CPUs, 2 per side"),
            ("memnic --queues 0", "--queues: 0 is outside 1..=64"),
            ("memif --queues 1,2 --cpus 0/1", "add --peer memnic"),
            ("memnic --cpus 0,7", "CPU 7 is not available"),
            (
                "memnic --svg /nonexistent-dir/x.svg",
                "the directory /nonexistent-dir does not exist",
            ),
        ] {
            let e = plan_of(line).unwrap_err();
            assert!(e.contains(says), "{line}: {e}");
            assert!(!e.contains('\n'), "{line}: {e}");
        }
        assert!(
            plan(Cli::try_parse_from(["bench", "memnic"]).unwrap().args, &[3])
                .unwrap_err()
                .contains("needs two CPUs")
        );
    }
}
