//! The command line and what it asks for: which pairs run, at which sizes, how often, where.

use std::path::PathBuf;

use memnic_pmd::Variant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub bench: Bench,
}

#[derive(clap::Subcommand, Debug)]
pub enum Bench {
    /// memif copy mode, txonly -> rxonly: memnic<->memnic beside DPDK<->DPDK (server receives)
    Memif {
        /// dpdk: memnic<->memnic and DPDK<->DPDK; memnic: memnic<->memnic alone (no DPDK
        /// needed); both: also the mixed pairs (memnic server <- DPDK client and the reverse)
        #[arg(long, value_enum, default_value_t = Peer::Dpdk)]
        peer: Peer,
        #[command(flatten)]
        common: Common,
    },
    /// MEMNIC, two memnic testpmd processes over one region: host->guest and guest->host
    Memnic {
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
    /// emulator; B: the other); default: the first two CPUs this process may use
    #[arg(long)]
    pub cpus: Option<String>,
    /// No progress bar
    #[arg(long)]
    pub quiet: bool,
    /// Leave out the bare-ring limit probe (by default it runs in the rotation and every row
    /// gets its fraction of it)
    #[arg(long)]
    pub no_limit: bool,
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
    },
    Memnic {
        host_sends: bool,
    },
    Tester(Variant),
    Vhost {
        backend: Impl,
    },
    /// The bare-ring limit probe with this many copies per frame (see `limit`).
    Limit {
        copies: u8,
    },
}

impl Run {
    fn uses_dpdk(self) -> bool {
        match self {
            Run::Memif { server, client } => server == Impl::Dpdk || client == Impl::Dpdk,
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
    /// The variant the others are divided by (DPDK's), if any.
    pub baseline: Option<usize>,
    /// The limit probe's variant (the last), unless `--no-limit`.
    pub limit: Option<usize>,
    pub rounds: usize,
    pub seconds: u64,
    /// (A, B): see [`Common::cpus`].
    pub cpus: (usize, usize),
    pub json: bool,
    pub svg: Option<PathBuf>,
    pub quiet: bool,
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

    /// Runs in all.
    pub fn runs(&self) -> usize {
        self.rounds * self.cases.len() * self.sizes.len() * self.variants.len()
    }
}

/// Checks the flags; every failure is one sentence naming the flag.
pub fn plan(args: Args, allowed_cpus: &[usize]) -> Result<Plan, String> {
    let (bench, common) = match &args.bench {
        Bench::Memif { common, .. } => ("memif", common),
        Bench::Memnic { common } => ("memnic", common),
        Bench::Tester { common, .. } => ("tester", common),
        Bench::Vhost { common, .. } => ("vhost", common),
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
    let cpus = cpus(common.cpus.as_deref(), allowed_cpus)?;
    let (a, b) = cpus;
    let mut cases = vec![Case::Only];
    let mut windows = "~2-s windows of the receiver's counters, stamped by the bench's clock";
    // The copies a frame costs in the pairs of this bench, for the limit probe: memif copy
    // mode and MEMNIC copy into the shared ring and out of it (so does the tester's host
    // emulator with its PMD); virtio-user writes only a frame's headers and our vhost backend
    // or DPDK's copies the frame once.
    let copies = if bench == "vhost" { 1 } else { 2 };
    let (title, method, heading, mut variants, baseline) = match &args.bench {
        Bench::Memif { peer, .. } => {
            let mut pairs = vec![];
            if *peer != Peer::Memnic {
                pairs.push((Impl::Dpdk, Impl::Dpdk));
            }
            pairs.push((Impl::Memnic, Impl::Memnic));
            if *peer == Peer::Both {
                pairs.push((Impl::Memnic, Impl::Dpdk));
                pairs.push((Impl::Dpdk, Impl::Memnic));
            }
            let variants = pairs
                .into_iter()
                .map(|(server, client)| VariantSpec {
                    label: format!("{}<-{}", server.name(), client.name()),
                    run: Run::Memif { server, client },
                })
                .collect();
            (
                "memif copy mode, txonly -> rxonly".to_string(),
                format!("server (receiver) on CPU {a}, client (sender) on CPU {b}; pair: server<-client"),
                "server<-client",
                variants,
                (*peer != Peer::Memnic).then_some(0),
            )
        }
        Bench::Memnic { .. } => (
            "MEMNIC, two memnic testpmd processes, txonly -> rxonly".to_string(),
            format!("host on CPU {a}, guest on CPU {b}"),
            "direction",
            vec![
                VariantSpec {
                    label: "host->guest".into(),
                    run: Run::Memnic { host_sends: true },
                },
                VariantSpec {
                    label: "guest->host".into(),
                    run: Run::Memnic { host_sends: false },
                },
            ],
            None,
        ),
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
                    .map(|v| VariantSpec {
                        label: v.name().into(),
                        run: Run::Tester(v),
                    })
                    .collect(),
                baseline,
            )
        }
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
                    .map(|backend| VariantSpec {
                        label: backend.name().into(),
                        run: Run::Vhost { backend },
                    })
                    .collect(),
                Some(0),
            )
        }
    };
    let limit = (!common.no_limit).then(|| {
        variants.push(VariantSpec {
            label: format!(
                "limit ({copies} cop{})",
                if copies == 1 { "y" } else { "ies" }
            ),
            run: Run::Limit { copies },
        });
        variants.len() - 1
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
        baseline,
        limit,
        rounds: common.rounds,
        seconds: common.seconds,
        cpus,
        json: common.json,
        svg: common.svg.clone(),
        quiet: common.quiet,
    })
}

/// `--cpus A,B`, or the first two CPUs this process may use.
fn cpus(flag: Option<&str>, allowed: &[usize]) -> Result<(usize, usize), String> {
    let Some(s) = flag else {
        return match allowed {
            [a, b, ..] => Ok((*a, *b)),
            _ => Err(format!(
                "the bench needs two CPUs, one per side; this process may use {allowed:?}"
            )),
        };
    };
    let parsed: Vec<Option<usize>> = s.split(',').map(|c| c.trim().parse().ok()).collect();
    let (a, b) = match parsed[..] {
        [Some(a), Some(b)] => (a, b),
        _ => {
            return Err(format!(
                "--cpus '{s}' is not two CPU numbers A,B (for example 0,1)"
            ))
        }
    };
    if a == b {
        return Err(format!("--cpus {s}: the two sides need two different CPUs"));
    }
    if let Some(c) = [a, b].into_iter().find(|c| !allowed.contains(c)) {
        return Err(format!(
            "--cpus {s}: CPU {c} is not available to this process (allowed: {allowed:?})"
        ));
    }
    Ok((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn plan_of(line: &str) -> Result<Plan, String> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(line.split_whitespace()))
            .map_err(|e| e.to_string())?;
        plan(cli.args, &[0, 1, 2])
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
        assert_eq!((p.baseline, p.limit), (Some(0), Some(2)));
        assert!(p.uses_dpdk());
        let p = plan_of("memif --peer memnic --no-limit").unwrap();
        assert_eq!(labels(&p), ["memnic<-memnic"]);
        assert_eq!(p.limit, None);
        assert_eq!(p.baseline, None);
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

    #[test]
    fn common_flags() {
        let p = plan_of("memnic --sizes 1518,64,64 --rounds 2 --seconds 4 --cpus 2,0").unwrap();
        assert_eq!(p.sizes, [64, 1518]);
        assert_eq!((p.rounds, p.seconds, p.cpus), (2, 4, (2, 0)));
        assert_eq!(p.runs(), 2 * 2 * 3);
        assert_eq!(plan_of("memnic").unwrap().cpus, (0, 1));
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
        assert_eq!(p.baseline, Some(1));
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
            ("memnic --cpus 1,1", "two different CPUs"),
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
