//! `memnic testpmd`: a testpmd-style forwarder and traffic generator.
//!
//! Flags, words and output follow DPDK's `dpdk-testpmd` where it makes sense, so habits and
//! scripts carry over. EAL-only flags that mean nothing here (`--no-huge`, `-m`, …) are accepted
//! and ignored; a lone `--` between EAL and application flags is accepted too.

mod interactive;
pub mod lcores;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memnic_ethdev::{MacAddr, Mempool, Port};
use memnic_fwd::{
    report, CaptureSpec, Engine, FwdConfig, FwdMode, QueuePools, StreamSpec, Topology,
};
use memnic_numa::{Dir, NumaConfig, Placement, QueueRef};
use memnic_pktbuf::PoolConfig;

/// Every driver this build knows.
pub const DRIVERS: &[memnic_ethdev::Driver] = &[
    memnic_pmd::DRIVER,
    memnic_memif::DRIVER,
    memnic_vhost::DRIVER,
    memnic_tap::DRIVER,
    memnic_pcap::DRIVER,
];

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Forwarding lcores: a CPU list (`1`, `0-3`) or DPDK's map (`0@1,1@1`, lowest = main lcore)
    #[arg(short = 'l', long = "lcores")]
    lcores: Option<String>,
    /// A port from devargs, e.g. memnic0,path=/dev/shm/vm1,role=guest (repeatable)
    #[arg(long = "vdev")]
    vdev: Vec<String>,
    /// Number of forwarding lcores to use (default: all of -l)
    #[arg(long = "nb-cores")]
    nb_cores: Option<usize>,
    /// Rx queues per port
    #[arg(long, default_value_t = 1)]
    rxq: u16,
    /// Tx queues per port
    #[arg(long, default_value_t = 1)]
    txq: u16,
    /// Packets per burst
    #[arg(long, default_value_t = 32)]
    burst: usize,
    /// Length of generated frames (segment lengths are added: 64 or 32,32)
    #[arg(long, default_value = "64", value_delimiter = ',')]
    txpkts: Vec<usize>,
    /// Buffers in each mbuf pool
    #[arg(long = "total-num-mbufs", default_value_t = 16384)]
    total_num_mbufs: u32,
    /// Bytes per mbuf, headroom included
    #[arg(long = "mbuf-size", default_value_t = memnic_pktbuf::DEFAULT_BUF_SIZE)]
    mbuf_size: u32,
    /// Buffers each queue's cache of a pool keeps (DPDK testpmd's `--mbcache`)
    #[arg(long = "mbcache", default_value_t = memnic_pktbuf::DEFAULT_CACHE_SIZE)]
    mbcache: u32,
    /// io, mac, macswap, rxonly, txonly, flowgen or ping (round trips through a reflector)
    #[arg(long = "forward-mode", default_value = "io")]
    forward_mode: String,
    /// Destination MAC for a port: N,XX:XX:XX:XX:XX:XX (repeatable)
    #[arg(long = "eth-peer")]
    eth_peer: Vec<String>,
    /// paired, chained or loop
    #[arg(long = "port-topology", default_value = "paired")]
    port_topology: String,
    /// Send one burst on every stream before forwarding starts
    #[arg(long = "tx-first")]
    tx_first: bool,
    /// Generators write sequence numbers and checksums; receivers count lost, corrupted,
    /// duplicated and reordered frames
    #[arg(long)]
    verify: bool,
    /// txonly: keep at most N frames sent and not yet received back (a reflector in the loop
    /// then never drops, and --verify can demand zero loss)
    #[arg(long, default_value_t = 0)]
    window: u64,
    /// txonly, flowgen: send N frames on each stream, then only receive; the run ends once
    /// every stream has sent them (and received what --rx-count asks for)
    #[arg(long = "tx-count")]
    tx_count: Option<u64>,
    /// End the run once every stream has received N frames (and sent what --tx-count asks for)
    #[arg(long = "rx-count")]
    rx_count: Option<u64>,
    /// An idle rx stream sleeps on its queue's interrupt (memif eventfd) instead of spinning;
    /// the whole lcore sleeps, so give each rx queue its own lcore
    #[arg(long = "rx-interrupt")]
    rx_interrupt: bool,
    /// Print port statistics every N seconds (0: never)
    #[arg(long = "stats-period", default_value_t = 0)]
    stats_period: u64,
    /// Stop by itself after N seconds (default: run until SIGINT/SIGTERM)
    #[arg(long)]
    duration: Option<f64>,
    /// Capture a port's frames into a pcapng file while forwarding:
    /// PORT[:rx|tx|both]=FILE[,snaplen=N][,ring=N] (repeatable)
    #[arg(long = "capture")]
    capture: Vec<String>,
    /// Print the final statistics as one JSON object on stdout (the rest goes to stderr)
    #[arg(long)]
    json: bool,
    /// Interactive prompt
    #[arg(short = 'i', long = "interactive")]
    interactive: bool,
    /// Start forwarding at once (with -i)
    #[arg(short = 'a', long = "auto-start")]
    auto_start: bool,
    /// (port,socket)[,(port,socket)]: NUMA node of a port's rings and buffers
    #[arg(long = "port-numa-config")]
    port_numa_config: Option<String>,
    /// (port,flag,socket)[,...]: node of a port's rx (flag 1), tx (2) or both (3) rings
    #[arg(long = "ring-numa-config")]
    ring_numa_config: Option<String>,
    /// Node for memory when no other rule names one
    #[arg(long = "socket-num")]
    socket_num: Option<String>,
    /// Place each queue's rings and buffers on the node of the lcore that polls it
    #[arg(long = "ring-bind-lcpu")]
    ring_bind_lcpu: bool,
    /// Read the CPU/node topology from this sysfs root instead of /sys (for tests)
    #[arg(long = "sysfs-root", hide = true)]
    sysfs_root: Option<std::path::PathBuf>,
    /// Accepted for DPDK habits; no meaning here
    #[arg(long = "no-huge", hide = true)]
    _no_huge: bool,
    #[arg(long = "no-pci", hide = true)]
    _no_pci: bool,
    #[arg(long = "in-memory", hide = true)]
    _in_memory: bool,
    #[arg(long = "single-file-segments", hide = true)]
    _single_file_segments: bool,
    #[arg(short = 'm', hide = true)]
    _mem: Option<String>,
    #[arg(long = "file-prefix", hide = true)]
    _file_prefix: Option<String>,
    #[arg(long = "log-level", hide = true)]
    _log_level: Option<String>,
}

/// Drops lone `--` separators (DPDK puts one between EAL and application flags).
pub fn strip_separator(args: impl Iterator<Item = String>) -> Vec<String> {
    args.filter(|a| a != "--").collect()
}

/// Output that goes to stdout normally and to stderr under `--json`.
pub struct Out {
    json: bool,
}

impl Out {
    pub fn line(&self, s: &str) {
        if self.json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    }
}

/// Everything set up: the engine and what the control thread needs to run it.
pub struct Session {
    pub engine: Engine,
    pub meter: report::Meter,
    pub out: Out,
}

fn parse_eth_peer(s: &str) -> Result<(u16, MacAddr), String> {
    let (p, m) = s.split_once(',').ok_or_else(|| {
        format!("--eth-peer '{s}' is not PORT,MAC (for example 0,02:00:00:00:00:01)")
    })?;
    let p: u16 = p
        .trim()
        .parse()
        .map_err(|_| format!("--eth-peer '{s}': '{p}' is not a port number"))?;
    let m: MacAddr = m.trim().parse().map_err(|e| format!("--eth-peer: {e}"))?;
    Ok((p, m))
}

/// Validates the flags, opens the ports, places and creates queues; every failure is one sentence.
pub fn setup(a: &Args) -> Result<Session, String> {
    let out = Out { json: a.json };
    let mode: FwdMode = a.forward_mode.parse()?;
    let topo: Topology = a.port_topology.parse()?;
    if a.burst == 0 || a.burst > memnic_ethdev::MAX_BURST {
        return Err(format!(
            "--burst={} is outside 1..={}",
            a.burst,
            memnic_ethdev::MAX_BURST
        ));
    }
    let txpkts: usize = a.txpkts.iter().sum();
    if !(memnic_fwd::pkt::MIN_FRAME..=9000).contains(&txpkts) {
        return Err(format!("--txpkts={txpkts} is outside 60..=9000"));
    }
    if a.verify && !matches!(mode, FwdMode::TxOnly | FwdMode::RxOnly | FwdMode::Ping) {
        return Err(format!(
            "--verify works with --forward-mode=txonly, rxonly or ping, not {mode}"
        ));
    }
    if a.tx_count.is_some() && !matches!(mode, FwdMode::TxOnly | FwdMode::FlowGen | FwdMode::Ping) {
        return Err(format!(
            "--tx-count works with --forward-mode=txonly, flowgen or ping, not {mode}"
        ));
    }
    if a.interactive && (a.tx_count.is_some() || a.rx_count.is_some()) {
        return Err("--tx-count and --rx-count end a run by themselves: not with -i".into());
    }
    if a.mbuf_size < txpkts as u32 + memnic_pktbuf::DEFAULT_HEADROOM {
        return Err(format!(
            "--mbuf-size={} cannot hold --txpkts={txpkts} frames plus {} bytes of headroom",
            a.mbuf_size,
            memnic_pktbuf::DEFAULT_HEADROOM
        ));
    }
    if a.total_num_mbufs < 2 * a.burst as u32 {
        return Err(format!(
            "--total-num-mbufs={} is too few for bursts of {}",
            a.total_num_mbufs, a.burst
        ));
    }
    if !(1..=512).contains(&a.mbcache) {
        return Err(format!(
            "--mbcache={} is out of range: a queue's cache holds 1 to 512 buffers",
            a.mbcache
        ));
    }
    if a.rxq == 0 || a.txq == 0 {
        return Err("--rxq and --txq must be at least 1".into());
    }
    if a.rxq != a.txq {
        return Err(format!(
            "--rxq={} and --txq={} differ: each stream pairs rx queue N with tx queue N",
            a.rxq, a.txq
        ));
    }
    let mut eth_peer = BTreeMap::new();
    for e in &a.eth_peer {
        let (p, m) = parse_eth_peer(e)?;
        eth_peer.insert(p, m);
    }

    // Lcores and topology.
    let numa_topo = match &a.sysfs_root {
        Some(root) => memnic_numa::Topology::from_sysfs(root),
        None => memnic_numa::Topology::system(),
    }
    .map_err(|e| e.to_string())?;
    let allowed = memnic_shm::cpu::allowed_cpus();
    let mut cpus = match &a.lcores {
        Some(s) => lcores::forwarding_cpus(s)?,
        None => vec![*allowed.first().ok_or("this process may run on no CPU")?],
    };
    // With a fake sysfs the CPUs are checked against it; otherwise against the affinity mask.
    let usable: Vec<usize> = if a.sysfs_root.is_some() {
        numa_topo.cpus()
    } else {
        allowed.clone()
    };
    for (i, c) in cpus.iter().enumerate() {
        if !usable.contains(c) {
            return Err(format!(
                "lcore {i}: CPU {c} is not available to this process (CPUs {} are)",
                memnic_numa::format_cpu_list(&usable)
            ));
        }
    }
    if let Some(n) = a.nb_cores {
        if n == 0 || n > cpus.len() {
            return Err(format!(
                "--nb-cores={n} must be between 1 and the {} forwarding lcore(s) of -l",
                cpus.len()
            ));
        }
        cpus.truncate(n);
    }
    let numa_topo = numa_topo.with_allowed_cpus(&cpus);
    let numa_cfg = NumaConfig::from_args(
        &numa_topo,
        a.port_numa_config.as_deref(),
        a.ring_numa_config.as_deref(),
        a.socket_num.as_deref(),
        a.ring_bind_lcpu,
    )
    .map_err(|e| e.to_string())?;

    // Ports.
    if a.vdev.is_empty() {
        return Err(
            "no ports: give at least one --vdev (for example --vdev memnic0,path=vm1,role=guest)"
                .into(),
        );
    }
    let mut ports: Vec<Box<dyn Port>> = Vec::new();
    for v in &a.vdev {
        let p = memnic_ethdev::open_vdev(DRIVERS, v)?;
        let info = p.info();
        if a.rxq > info.max_rx_queues || a.txq > info.max_tx_queues {
            return Err(format!(
                "port '{}': --rxq={} --txq={} asks for more queues than the driver offers ({} rx, {} tx)",
                info.name, a.rxq, a.txq, info.max_rx_queues, info.max_tx_queues
            ));
        }
        if txpkts as u32 > info.max_frame_len
            && matches!(mode, FwdMode::TxOnly | FwdMode::FlowGen | FwdMode::Ping)
        {
            return Err(format!(
                "port '{}': --txpkts={txpkts} is longer than the port's largest frame ({} bytes)",
                info.name, info.max_frame_len
            ));
        }
        out.line(&format!(
            "Configuring Port {} ({}): {} MAC {}",
            ports.len(),
            info.driver,
            info.name,
            info.mac
        ));
        ports.push(p);
    }
    if let Some(peer) = eth_peer.keys().find(|p| **p as usize >= ports.len()) {
        return Err(format!(
            "--eth-peer names port {peer}, but there are {} port(s)",
            ports.len()
        ));
    }
    numa_cfg
        .check_ports(ports.len() as u16)
        .map_err(|e| e.to_string())?;

    // Streams, placement, pools.
    let specs = memnic_fwd::plan_streams(ports.len() as u16, a.rxq, topo);
    let ranges = memnic_fwd::distribute(specs.len(), cpus.len());
    let mut lcore_of = vec![0usize; specs.len()];
    for (li, r) in ranges.iter().enumerate() {
        for si in r.clone() {
            lcore_of[si] = li;
        }
    }
    // Pools: one private pool per NUMA node, shared by the ports that copy; a port that hands
    // its buffers to its peer (zero copy) gets a pool of its own in a memfd, so that peer can
    // see no other port's buffers.
    let mut pools: Vec<(PoolKey, Mempool)> = Vec::new();
    let mut pool_for = |key: PoolKey| -> Result<Mempool, String> {
        if let Some((_, p)) = pools.iter().find(|(k, _)| *k == key) {
            return Ok(p.clone());
        }
        let (name, shared, node) = match key {
            PoolKey::Node(node) => (format!("mb_pool_{node}"), false, node),
            PoolKey::ZeroCopyPort { port, node } => (format!("zc_pool_p{port}_{node}"), true, node),
        };
        let mut cfg = PoolConfig::new(name, a.total_num_mbufs);
        cfg.buf_size = a.mbuf_size;
        cfg.cache_size = a.mbcache;
        cfg.shared = shared;
        let p = Mempool::new(&cfg).map_err(|e| e.to_string())?;
        bind_or_warn(p.region(), 0, p.region().len(), node, &out);
        pools.push((key, p.clone()));
        Ok(p)
    };
    let own_pool: Vec<bool> = ports.iter().map(|p| p.needs_own_shared_pool()).collect();
    let key = |port: u16, node: usize| {
        if own_pool[port as usize] {
            PoolKey::ZeroCopyPort { port, node }
        } else {
            PoolKey::Node(node)
        }
    };
    let mut placed: Vec<(StreamSpec, Placement, Placement)> = Vec::new();
    let mut stream_pools = Vec::new();
    for (si, spec) in specs.iter().enumerate() {
        let cpu = cpus[lcore_of[si]];
        let rxp = memnic_numa::place(
            &numa_topo,
            &numa_cfg,
            QueueRef {
                port: spec.rx_port,
                queue: spec.rx_queue,
                dir: Dir::Rx,
                lcore_cpu: cpu,
            },
        );
        let txp = memnic_numa::place(
            &numa_topo,
            &numa_cfg,
            QueueRef {
                port: spec.tx_port,
                queue: spec.tx_queue,
                dir: Dir::Tx,
                lcore_cpu: cpu,
            },
        );
        for (port, q, rx, p) in [
            (spec.rx_port, spec.rx_queue, true, &rxp),
            (spec.tx_port, spec.tx_queue, false, &txp),
        ] {
            for m in ports[port as usize].queue_memory(rx, q) {
                bind_or_warn(&m.region, m.offset, m.len, p.node, &out);
            }
        }
        stream_pools.push(QueuePools {
            rx: pool_for(key(spec.rx_port, rxp.node))?,
            tx: pool_for(key(spec.tx_port, txp.node))?,
            private: pool_for(PoolKey::Node(txp.node))?,
        });
        placed.push((*spec, rxp, txp));
    }
    for (si, (spec, rxp, txp)) in placed.iter().enumerate() {
        let li = lcore_of[si];
        let qp = &stream_pools[si];
        out.line(&format!(
            "  port {} rxq {}: lcore {} (CPU {}), node {} ({}), pool {}",
            spec.rx_port,
            spec.rx_queue,
            li,
            cpus[li],
            rxp.node,
            rxp.reason,
            qp.rx.name()
        ));
        out.line(&format!(
            "  port {} txq {}: lcore {} (CPU {}), node {} ({}), pool {}",
            spec.tx_port,
            spec.tx_queue,
            li,
            cpus[li],
            txp.node,
            txp.reason,
            qp.tx.name()
        ));
    }
    let cfg = FwdConfig {
        mode,
        burst: a.burst,
        txpkts,
        verify: a.verify,
        eth_peer,
        flows: 1024,
        window: a.window,
        tx_count: a.tx_count,
        rx_interrupt: a.rx_interrupt,
    };
    let mut it = stream_pools.into_iter();
    let mut engine = Engine::new(ports, cfg, specs, &cpus, |_, _| {
        it.next().expect("one pool pair per stream")
    })
    .map_err(|e| e.to_string())?;
    add_captures(&mut engine, &a.capture, &out)?;
    let meter = report::Meter::new(&mut engine);
    Ok(Session { engine, meter, out })
}

/// Starts the `--capture` flags' captures; a bad value or a file that cannot be created is one
/// sentence.
fn add_captures(engine: &mut Engine, flags: &[String], out: &Out) -> Result<(), String> {
    let specs: Vec<CaptureSpec> = flags
        .iter()
        .map(|f| f.parse())
        .collect::<Result<_, String>>()?;
    for (i, a) in specs.iter().enumerate() {
        for b in &specs[..i] {
            if a.path == b.path {
                return Err(format!(
                    "--capture: {} is named twice (one file per --capture)",
                    a.path.display()
                ));
            }
            if let Some(d) = a
                .dirs
                .iter()
                .find(|d| a.port == b.port && b.dirs.contains(d))
            {
                return Err(format!(
                    "--capture: port {} {} is captured twice",
                    a.port,
                    d.name()
                ));
            }
        }
    }
    for spec in specs {
        let c = engine.add_capture(spec).map_err(|e| e.to_string())?;
        let dirs: Vec<&str> = c.spec.dirs.iter().map(|d| d.name()).collect();
        out.line(&format!(
            "Capturing port {} {} into {} (pcapng, snaplen {}, {} slots)",
            c.spec.port,
            dirs.join("+"),
            c.spec.path.display(),
            c.snaplen,
            c.ring
        ));
    }
    Ok(())
}

/// Says why capture files were left incomplete at the last stop, if they were.
pub fn warn_capture_errors(s: &Session) {
    for e in s.engine.capture_errors() {
        s.out.line(&format!("warning: {e}"));
    }
}

/// Which pool a queue's buffers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PoolKey {
    /// The private pool of a NUMA node.
    Node(usize),
    /// The pool of one zero-copy port on a node, in shared memory.
    ZeroCopyPort { port: u16, node: usize },
}

fn bind_or_warn(region: &memnic_shm::Region, off: usize, len: usize, node: usize, out: &Out) {
    if let Err(e) = memnic_shm::numa::bind_range(region, off, len, node) {
        out.line(&format!(
            "warning: memory stays where the kernel puts it: {e}"
        ));
    }
}

/// `show config fwd`.
pub fn config_fwd(engine: &Engine) -> String {
    let mut s = format!(
        "{} packet forwarding - ports={} - cores={} - streams={}\n",
        engine.cfg.mode,
        engine.ports.len(),
        engine.lcores().count(),
        engine.stream_counters().len()
    );
    for (l, specs) in engine.lcores() {
        s += &format!(
            "Logical Core {} (CPU {}) forwards packets on {} streams:\n",
            l.id,
            l.cpu,
            specs.len()
        );
        for sp in specs {
            s += &format!(
                "  RX P={}/Q={} (socket) -> TX P={}/Q={} (socket) peer={}\n",
                sp.rx_port,
                sp.rx_queue,
                sp.tx_port,
                sp.tx_queue,
                engine.cfg.peer_mac(sp.tx_port)
            );
        }
    }
    s
}

/// Runs `memnic testpmd`.
pub fn main(a: Args) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| format!("cannot handle signals: {e}"))?;
    }
    let mut s = setup(&a)?;
    // A developer's A/B measurement, when built in and asked for (`memnic_ethdev::abflip`).
    memnic_ethdev::abflip::start();
    if a.interactive {
        return interactive::run(s, a.auto_start, a.tx_first, stop);
    }
    s.out.line(&config_fwd(&s.engine));
    s.meter = report::Meter::new(&mut s.engine);
    s.engine.start(a.tx_first).map_err(|e| e.to_string())?;
    s.out
        .line("Press Ctrl-C to stop forwarding (or wait for --duration).");
    let started = Instant::now();
    let mut next_stats = started + Duration::from_secs(a.stats_period.max(1));
    let end = a.duration.map(|d| started + Duration::from_secs_f64(d));
    let mut pace = Pace::default();
    // Relaxed: set by the signal handler; nothing else is published with it.
    while !stop.load(Relaxed) {
        let now = Instant::now();
        let mut wake = now + control_sleep(&s.engine);
        if a.tx_count.is_some() || a.rx_count.is_some() {
            wake = wake.min(now + COUNT_CHECK);
        }
        if a.stats_period > 0 {
            wake = wake.min(next_stats);
        }
        if let Some(end) = end {
            wake = wake.min(end);
        }
        s.engine.wait_control(wake.saturating_duration_since(now));
        pace.settle();
        s.engine.service();
        let now = Instant::now();
        if a.duration
            .is_some_and(|d| now - started >= Duration::from_secs_f64(d))
        {
            break;
        }
        if counts_reached(&s.engine, a.tx_count, a.rx_count) {
            break;
        }
        if a.stats_period > 0 && now >= next_stats {
            next_stats += Duration::from_secs(a.stats_period);
            for p in s.meter.ports(&s.engine) {
                s.out.line(&report::nic_stats(&p));
            }
        }
    }
    finish(&mut s, started.elapsed())
}

/// The longest the control thread sleeps between the ports' control work: how long Ctrl-C
/// (and the prompt's `quit`) may wait for it.
const LONGEST_SLEEP: Duration = Duration::from_millis(100);
/// How often the control loop looks whether `--tx-count` / `--rx-count` are reached.
const COUNT_CHECK: Duration = Duration::from_millis(5);

/// The shortest time between two services of the ports: a peer that keeps its control socket
/// readable (a flood of messages or of connections) wakes the control thread at once, and
/// each service takes a bounded amount of it, so this bounds the CPU such a peer can take from
/// the lcores sharing it (the 5 ms the control thread used to sleep between services).
const MIN_SERVICE_GAP: Duration = Duration::from_millis(5);

/// Keeps the services of the ports [`MIN_SERVICE_GAP`] apart.
#[derive(Default)]
pub(crate) struct Pace {
    last: Option<Instant>,
}

impl Pace {
    /// Waits until [`MIN_SERVICE_GAP`] has passed since the last call, if it has not.
    pub(crate) fn settle(&mut self) {
        if let Some(last) = self.last {
            let gap = last.elapsed();
            if gap < MIN_SERVICE_GAP {
                std::thread::sleep(MIN_SERVICE_GAP - gap);
            }
        }
        self.last = Some(Instant::now());
    }
}

/// How long the control thread may sleep before the ports' next control work: as long as the
/// port in most need allows ([`memnic_fwd::Engine::service_interval`]: a few milliseconds
/// while one connects, tens once all are up), at most [`LONGEST_SLEEP`]. It sleeps on the
/// ports' control descriptors ([`memnic_fwd::Engine::wait_control`]), so a message from a
/// peer is served when it comes.
///
/// The control thread shares the CPUs with the polling lcores, and every time it wakes it
/// takes one from its lcore. Woken every 5 ms (before) against this, our testpmd pinging
/// through our reflectors, single 1518-B frames, four 3-s runs each alternating the builds,
/// p99.9 us: memif 23.2/27.3/35.6/43.3 against 9.7/9.5/14.3/15.2, MEMNIC 29.1/24.4/32.4/33.5
/// against 4.9/7.1/14.1/8.5 (64 B and every p50 level).
pub(crate) fn control_sleep(engine: &Engine) -> Duration {
    engine
        .service_interval()
        .map_or(LONGEST_SLEEP, |d| d.min(LONGEST_SLEEP))
}

/// Whether every stream has sent `tx` and received `rx` frames (false when neither is given).
fn counts_reached(engine: &Engine, tx: Option<u64>, rx: Option<u64>) -> bool {
    (tx.is_some() || rx.is_some())
        && engine
            .stream_counters()
            .iter()
            .all(|(_, c)| tx.is_none_or(|n| c.tx >= n) && rx.is_none_or(|n| c.rx >= n))
}

/// Stops forwarding and prints the totals (and the JSON object under --json).
pub fn finish(s: &mut Session, elapsed: Duration) -> Result<(), String> {
    s.out.line("Telling cores to stop...");
    if s.engine.is_running() {
        s.engine.stop().map_err(|e| e.to_string())?;
    }
    let ports = final_ports(s);
    s.out.line(&report::fwd_stats(&ports));
    if let Some(r) = s.engine.round_trips() {
        s.out.line(&report::round_trips(&r.summary()));
    }
    warn_capture_errors(s);
    s.out.line("Done.");
    print_json(s, elapsed, ports)
}

/// Counters since the last clear, with the whole run's average rates.
fn final_ports(s: &mut Session) -> Vec<report::PortReport> {
    let since = s.meter.started.elapsed().as_secs_f64().max(1e-9);
    let mut ports = s.meter.ports(&s.engine);
    for p in &mut ports {
        p.rx_pps = (p.rx_packets as f64 / since) as u64;
        p.tx_pps = (p.tx_packets as f64 / since) as u64;
        p.rx_bps = (p.rx_bytes as f64 * 8.0 / since) as u64;
        p.tx_bps = (p.tx_bytes as f64 * 8.0 / since) as u64;
    }
    ports
}

/// With `--json`: the final report as one JSON object on stdout.
fn print_json(
    s: &mut Session,
    elapsed: Duration,
    ports: Vec<report::PortReport>,
) -> Result<(), String> {
    if s.out.json {
        let r = report::Report {
            mode: s.engine.cfg.mode.to_string(),
            seconds: elapsed.as_secs_f64(),
            ports,
            lcores: report::lcores(&s.engine),
            round_trips: s.engine.round_trips().map(|r| r.summary()),
        };
        println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    }
    Ok(())
}

/// The end of a prompt session: a run still going is finished as at the end of a run; one
/// already stopped has had its statistics printed, and `--json` still gets its report.
pub fn finish_prompt(s: &mut Session, elapsed: Duration) -> Result<(), String> {
    if s.engine.is_running() {
        return finish(s, elapsed);
    }
    let ports = final_ports(s);
    print_json(s, elapsed, ports)
}
