//! testpmd-style forwarding: streams (rx port/queue → tx port/queue) owned by lcores pinned to
//! CPUs, forwarding modes, generation and verification, and counters the control thread reads.
//!
//! The control thread owns the ports and never touches a queue: each queue is moved into the one
//! stream that uses it, each stream into the one lcore that runs it. Counters flow back through
//! per-stream snapshot cells.
#![forbid(unsafe_code)]

pub mod capture;
mod ping;
pub mod pkt;
pub mod report;
pub mod rtt;
mod stream;
#[cfg(test)]
mod test_port;
pub mod verify;

pub use capture::{Capture, CaptureCounts, CaptureSpec};
pub use rtt::{RoundTrips, RttSummary};
pub use stream::{Stream, StreamCounters, StreamSpec};
pub use verify::{Verifier, VerifyCounts};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

use memnic_ethdev::{MacAddr, Mempool, Port, PortError, QueueStats};

/// Forwarding modes (testpmd's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FwdMode {
    /// Forward as received.
    Io,
    /// Rewrite destination MAC to the peer's (`--eth-peer`) and source MAC to the tx port's.
    Mac,
    /// Swap source and destination MACs.
    MacSwap,
    /// Receive and free (count, and verify with `--verify`).
    RxOnly,
    /// Generate UDP frames of `--txpkts` bytes (sequence-numbered with `--verify`).
    TxOnly,
    /// Generate frames over many IP flows; receive and free.
    FlowGen,
    /// Send a burst of `--burst` sequence-numbered frames, wait until it is back (through a
    /// reflector: a peer in `macswap` or `io` mode), record each frame's round trip, repeat.
    Ping,
}

impl FwdMode {
    pub const ALL: [FwdMode; 7] = [
        FwdMode::Io,
        FwdMode::Mac,
        FwdMode::MacSwap,
        FwdMode::RxOnly,
        FwdMode::TxOnly,
        FwdMode::FlowGen,
        FwdMode::Ping,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FwdMode::Io => "io",
            FwdMode::Mac => "mac",
            FwdMode::MacSwap => "macswap",
            FwdMode::RxOnly => "rxonly",
            FwdMode::TxOnly => "txonly",
            FwdMode::FlowGen => "flowgen",
            FwdMode::Ping => "ping",
        }
    }
}

impl std::str::FromStr for FwdMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        FwdMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown forwarding mode '{s}' (available: {})",
                    FwdMode::ALL.map(|m| m.name()).join(", ")
                )
            })
    }
}

impl std::fmt::Display for FwdMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How ports pair up (testpmd's `--port-topology`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// 0↔1, 2↔3, …; an odd last port forwards to itself.
    Paired,
    /// 0→1→2→…→0.
    Chained,
    /// Each port to itself.
    Loop,
}

impl std::str::FromStr for Topology {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "paired" => Ok(Topology::Paired),
            "chained" => Ok(Topology::Chained),
            "loop" => Ok(Topology::Loop),
            _ => Err(format!(
                "unknown port topology '{s}' (available: paired, chained, loop)"
            )),
        }
    }
}

/// The port a port's received frames go out of.
pub fn peer_port(p: u16, nb_ports: u16, topo: Topology) -> u16 {
    match topo {
        Topology::Loop => p,
        Topology::Chained => (p + 1) % nb_ports,
        Topology::Paired => {
            let peer = p ^ 1;
            if peer < nb_ports {
                peer
            } else {
                p
            }
        }
    }
}

/// Waits until one of `fds` has something to read (or hung up) or `timeout` passes: the
/// control thread's sleep between the ports' control work. A poll that fails sleeps the whole
/// `timeout` instead (never a busy loop).
pub fn wait_readable(fds: &[std::os::fd::BorrowedFd<'_>], timeout: std::time::Duration) {
    use memnic_shm::unix::{poll, PollFd};
    if fds.is_empty() {
        return std::thread::sleep(timeout);
    }
    let mut set: Vec<PollFd<'_>> = fds.iter().map(|&fd| PollFd::readable(fd)).collect();
    if poll(&mut set, Some(timeout)).is_err() {
        std::thread::sleep(timeout);
    }
}

/// Streams as testpmd builds them: for each port, for each rx queue, rx (port, q) → tx (peer, q).
pub fn plan_streams(nb_ports: u16, nb_queues: u16, topo: Topology) -> Vec<StreamSpec> {
    let mut v = Vec::new();
    for p in 0..nb_ports {
        for q in 0..nb_queues {
            v.push(StreamSpec {
                rx_port: p,
                rx_queue: q,
                tx_port: peer_port(p, nb_ports, topo),
                tx_queue: q,
            });
        }
    }
    v
}

/// Splits `n` streams over `lcores` lcores in contiguous runs, as testpmd does: each gets
/// `n / lcores`, the first `n % lcores` one more. With more lcores than streams, the extra lcores
/// get none.
pub fn distribute(n: usize, lcores: usize) -> Vec<std::ops::Range<usize>> {
    let lcores = lcores.max(1);
    let (per, extra) = (n / lcores, n % lcores);
    let mut start = 0;
    (0..lcores)
        .map(|i| {
            let len = per + usize::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

/// What the lcores run.
#[derive(Debug, Clone)]
pub struct FwdConfig {
    pub mode: FwdMode,
    pub burst: usize,
    /// Frame length for the generators.
    pub txpkts: usize,
    /// Generators write sequence numbers and checksums; receivers check them; generators retry
    /// what the tx queue hands back instead of dropping it.
    pub verify: bool,
    /// Destination MAC per tx port for `mac` mode and the generators (`--eth-peer`).
    pub eth_peer: BTreeMap<u16, MacAddr>,
    /// Number of IP flows for `flowgen`.
    pub flows: u32,
    /// txonly: at most this many frames sent and not yet received back (0: no limit). With a
    /// reflector in the loop and a window below its ring sizes, nothing is ever dropped, so a
    /// round trip can be verified for zero loss.
    pub window: u64,
    /// Generators (txonly, flowgen): send this many frames on each stream, then only receive
    /// (None: no limit). With --verify nothing is dropped, so the peer gets exactly this many.
    pub tx_count: Option<u64>,
    /// After a run of empty polls an rx stream sleeps on its queue's interrupt (memif eventfd)
    /// instead of spinning; the whole lcore sleeps, so use one stream per lcore.
    pub rx_interrupt: bool,
}

impl Default for FwdConfig {
    fn default() -> Self {
        FwdConfig {
            mode: FwdMode::Io,
            burst: 32,
            txpkts: 64,
            verify: false,
            eth_peer: BTreeMap::new(),
            flows: 1024,
            window: 0,
            tx_count: None,
            rx_interrupt: false,
        }
    }
}

impl FwdConfig {
    /// The peer MAC for tx port `p`: `--eth-peer` or testpmd's default 02:00:00:00:00:PP.
    pub fn peer_mac(&self, p: u16) -> MacAddr {
        self.eth_peer
            .get(&p)
            .copied()
            .unwrap_or(MacAddr([2, 0, 0, 0, 0, p as u8]))
    }
}

/// One forwarding lcore: a thread pinned to `cpu`.
pub struct Lcore {
    pub id: usize,
    pub cpu: usize,
    streams: Vec<Stream>,
}

/// Errors setting up or running the engine.
#[derive(Debug, thiserror::Error)]
pub enum FwdError {
    #[error(transparent)]
    Port(#[from] PortError),
    #[error("cannot start lcore {lcore} on CPU {cpu}: {why}")]
    Lcore {
        lcore: usize,
        cpu: usize,
        why: String,
    },
    #[error("forwarding is already running")]
    Running,
    #[error("forwarding is not running")]
    Stopped,
    #[error("{0}")]
    Config(String),
}

/// A port and its name, owned by the control thread.
pub struct PortEntry {
    pub port: Box<dyn Port>,
}

/// Ports, streams and lcores.
pub struct Engine {
    pub ports: Vec<PortEntry>,
    pub cfg: FwdConfig,
    lcores: Vec<Lcore>,
    running: Arc<AtomicBool>,
    threads: Vec<(usize, usize, JoinHandle<Vec<Stream>>)>,
    /// Per-stream counter cells in stream order, readable while running.
    cells: Vec<(StreamSpec, Arc<stream::StreamCell>)>,
    /// Counters of streams as of the last clear.
    base: Vec<StreamCounters>,
    /// Live captures (`--capture`), one per file.
    captures: Vec<Capture>,
    /// Why capture files were left incomplete at the last stop.
    capture_errors: Vec<String>,
}

/// Where the rx and tx queues of one stream get their buffers.
pub struct QueuePools {
    pub rx: Mempool,
    pub tx: Mempool,
    /// A private pool (no peer sees it) for copies that must not land in peer-visible memory:
    /// the copy-on-write of a shared or external first segment before a header rewrite. May be
    /// `rx` or `tx` when those are private.
    pub private: Mempool,
}

impl Engine {
    /// Takes every queue of `streams` from `ports`, builds the streams and spreads them over
    /// `lcore_cpus` (lcore i runs on CPU `lcore_cpus[i]`). `pools(spec, lcore)` says where each
    /// stream's buffers come from.
    pub fn new(
        mut ports: Vec<Box<dyn Port>>,
        cfg: FwdConfig,
        specs: Vec<StreamSpec>,
        lcore_cpus: &[usize],
        mut pools: impl FnMut(&StreamSpec, usize) -> QueuePools,
    ) -> Result<Engine, FwdError> {
        if lcore_cpus.is_empty() {
            return Err(FwdError::Config("no forwarding lcore".into()));
        }
        let ranges = distribute(specs.len(), lcore_cpus.len());
        let mut lcores: Vec<Lcore> = lcore_cpus
            .iter()
            .enumerate()
            .map(|(id, &cpu)| Lcore {
                id,
                cpu,
                streams: Vec::new(),
            })
            .collect();
        let mut cells = Vec::new();
        for (li, r) in ranges.iter().enumerate() {
            for si in r.clone() {
                let spec = specs[si];
                let qp = pools(&spec, li);
                let rxq = ports[spec.rx_port as usize].take_rx_queue(spec.rx_queue, &qp.rx)?;
                let txq = ports[spec.tx_port as usize].take_tx_queue(spec.tx_queue, &qp.tx)?;
                let tx_mac = ports[spec.tx_port as usize].info().mac;
                if qp.private.is_shared() {
                    return Err(FwdError::Config(format!(
                        "pool {} is in shared memory; header rewrites need a private one",
                        qp.private.name()
                    )));
                }
                let caches = (qp.tx.lcore_cache(), qp.private.cache());
                let s = Stream::new(spec, si as u16, rxq, txq, caches, tx_mac);
                cells.push((spec, s.cell()));
                lcores[li].streams.push(s);
            }
        }
        let base = vec![StreamCounters::default(); cells.len()];
        let ports = ports.drain(..).map(|port| PortEntry { port }).collect();
        Ok(Engine {
            ports,
            cfg,
            lcores,
            running: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            cells,
            base,
            captures: Vec::new(),
            capture_errors: Vec::new(),
        })
    }

    /// Starts capturing what `spec` names (while stopped): creates its file and writer and taps
    /// every stream that receives on (rx) or sends to (tx) the port. An error is one sentence.
    pub fn add_capture(&mut self, spec: CaptureSpec) -> Result<&Capture, FwdError> {
        if self.is_running() {
            return Err(FwdError::Running);
        }
        let Some(port) = self.ports.get(spec.port as usize) else {
            return Err(FwdError::Config(format!(
                "--capture names port {}, but there are {} port(s)",
                spec.port,
                self.ports.len()
            )));
        };
        let info = port.info();
        let mut cap =
            Capture::start(spec, &info.name, info.max_frame_len).map_err(FwdError::Config)?;
        let port = cap.spec.port;
        for s in self.lcores.iter_mut().flat_map(|l| l.streams.iter_mut()) {
            if s.spec.rx_port == port {
                if let Some(tap) = cap.tap(capture::Dir::Rx) {
                    s.rx_tap = Some(tap);
                }
            }
            if s.spec.tx_port == port {
                if let Some(tap) = cap.tap(capture::Dir::Tx) {
                    s.tx_tap = Some(tap);
                }
            }
        }
        self.captures.push(cap);
        Ok(self.captures.last().expect("just pushed"))
    }

    pub fn captures(&self) -> &[Capture] {
        &self.captures
    }

    /// Why capture files were left incomplete at the last stop (one sentence each).
    pub fn capture_errors(&self) -> &[String] {
        &self.capture_errors
    }

    pub fn is_running(&self) -> bool {
        !self.threads.is_empty()
    }

    pub fn lcores(&self) -> impl Iterator<Item = (&Lcore, Vec<StreamSpec>)> {
        self.lcores
            .iter()
            .map(|l| (l, l.streams.iter().map(|s| s.spec).collect()))
    }

    /// Starts forwarding; with `tx_first`, every stream first sends one burst of generated frames.
    pub fn start(&mut self, tx_first: bool) -> Result<(), FwdError> {
        if self.is_running() {
            return Err(FwdError::Running);
        }
        // Relaxed: the flag only tells lcores when to stop; the thread spawn orders the rest.
        self.running.store(true, Relaxed);
        for l in &mut self.lcores {
            let mut streams = std::mem::take(&mut l.streams);
            streams.iter_mut().for_each(Stream::reset_pinger);
            let (running, cfg, cpu, id) = (self.running.clone(), self.cfg.clone(), l.cpu, l.id);
            let h = std::thread::Builder::new()
                .name(format!("lcore-{id}"))
                .spawn(move || lcore_main(cpu, streams, cfg, tx_first, &running))
                .map_err(|e| FwdError::Lcore {
                    lcore: id,
                    cpu,
                    why: e.to_string(),
                })?;
            self.threads.push((id, cpu, h));
        }
        Ok(())
    }

    /// Stops forwarding and takes the streams back (their queues stay taken).
    pub fn stop(&mut self) -> Result<(), FwdError> {
        if !self.is_running() {
            return Err(FwdError::Stopped);
        }
        self.running.store(false, Relaxed);
        // The ports' control work goes on until every lcore is out: an lcore stuck in a
        // burst can need it to get out (memif empties an interrupt line a peer jammed, which
        // a kick may be blocked on, only in `service`).
        while !self.threads.iter().all(|(_, _, h)| h.is_finished()) {
            self.service();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        for (id, cpu, h) in self.threads.drain(..) {
            let streams = h.join().map_err(|_| FwdError::Lcore {
                lcore: id,
                cpu,
                why: "it panicked".into(),
            })?;
            self.lcores[id].streams = streams;
        }
        // No lcore runs: everything captured is on its way to the files; wait until it is in.
        self.capture_errors = self
            .captures
            .iter()
            .filter_map(|c| c.flush().err())
            .collect();
        Ok(())
    }

    /// `ping`'s round trips of every stream, merged, over the last run (since its start);
    /// None in other modes, and while forwarding runs (the lcores hold them).
    pub fn round_trips(&self) -> Option<RoundTrips> {
        if self.cfg.mode != FwdMode::Ping || self.is_running() {
            return None;
        }
        let mut all = RoundTrips::default();
        for s in self.lcores.iter().flat_map(|l| &l.streams) {
            all.merge(s.round_trips());
        }
        Some(all)
    }

    /// Control-path work of every port (between stats ticks).
    pub fn service(&mut self) {
        for p in &mut self.ports {
            p.port.service();
        }
    }

    /// How soon [`Engine::service`] must run again: the shortest of the ports'
    /// [`Port::service_interval`]s, `None` when no port asks.
    pub fn service_interval(&self) -> Option<std::time::Duration> {
        self.ports
            .iter()
            .filter_map(|p| p.port.service_interval())
            .min()
    }

    /// Every port's control descriptors ([`Port::control_fds`]).
    pub fn control_fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        self.ports
            .iter()
            .flat_map(|p| p.port.control_fds())
            .collect()
    }

    /// Waits until a port's control descriptor has something or `timeout` passes (then
    /// [`Engine::service`] has work, or it is due).
    pub fn wait_control(&self, timeout: std::time::Duration) {
        wait_readable(&self.control_fds(), timeout);
    }

    /// Per-stream counters since the last clear, in stream order.
    pub fn stream_counters(&self) -> Vec<(StreamSpec, StreamCounters)> {
        self.cells
            .iter()
            .zip(&self.base)
            .map(|((spec, c), b)| (*spec, c.snapshot().since(b)))
            .collect()
    }

    /// Driver counters of each port: (rx, tx) summed over queues, since the last clear.
    pub fn port_counters(&self) -> Vec<(QueueStats, QueueStats)> {
        self.ports
            .iter()
            .map(|p| {
                let (rx, tx) = p.port.queue_stats();
                let mut r = QueueStats::default();
                let mut t = QueueStats::default();
                rx.iter().for_each(|s| r.add(s));
                tx.iter().for_each(|s| t.add(s));
                (r, t)
            })
            .collect()
    }

    /// Zeroes the forwarding counters (driver counters are cumulative; callers keep their base).
    pub fn clear_stream_counters(&mut self) {
        self.base = self.cells.iter().map(|(_, c)| c.snapshot()).collect();
    }

    /// Changes the forwarding mode (only while stopped).
    pub fn set_mode(&mut self, mode: FwdMode) -> Result<(), FwdError> {
        if self.is_running() {
            return Err(FwdError::Running);
        }
        self.cfg.mode = mode;
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = self.stop();
        }
    }
}

impl std::ops::Deref for PortEntry {
    type Target = dyn Port;
    fn deref(&self) -> &Self::Target {
        &*self.port
    }
}

fn lcore_main(
    cpu: usize,
    mut streams: Vec<Stream>,
    cfg: FwdConfig,
    tx_first: bool,
    running: &AtomicBool,
) -> Vec<Stream> {
    if let Err(e) = memnic_shm::cpu::pin_current_thread(cpu) {
        eprintln!("warning: {e}; this lcore runs unpinned");
    }
    // (`ping` sends its first burst at once anyway, and times every burst it sends.)
    if tx_first && cfg.mode != FwdMode::Ping {
        for s in &mut streams {
            s.generate(&cfg, false);
        }
    }
    // Relaxed: see Engine::start.
    while running.load(Relaxed) {
        for s in &mut streams {
            s.forward(&cfg);
        }
    }
    for s in &mut streams {
        s.drain();
    }
    streams
}

#[cfg(test)]
mod wait_tests {
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    /// The control thread's sleep ends when a descriptor has something, and lasts the whole
    /// timeout when none has.
    #[test]
    fn wait_readable_ends_early_only_when_a_descriptor_is_readable() {
        let e = std::sync::Arc::new(memnic_shm::unix::EventFd::new().unwrap());
        let t = Instant::now();
        super::wait_readable(&[e.as_fd()], Duration::from_millis(60));
        assert!(
            t.elapsed() >= Duration::from_millis(60),
            "{:?}",
            t.elapsed()
        );
        let notifier = {
            let e = e.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                e.notify().unwrap();
            })
        };
        let t = Instant::now();
        super::wait_readable(&[e.as_fd()], Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        notifier.join().unwrap();
        let t = Instant::now();
        super::wait_readable(&[], Duration::from_millis(30));
        assert!(t.elapsed() >= Duration::from_millis(30));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_pair_ports_like_testpmd() {
        let s = plan_streams(2, 2, Topology::Paired);
        let v: Vec<_> = s
            .iter()
            .map(|s| (s.rx_port, s.rx_queue, s.tx_port, s.tx_queue))
            .collect();
        assert_eq!(v, [(0, 0, 1, 0), (0, 1, 1, 1), (1, 0, 0, 0), (1, 1, 0, 1)]);
        assert_eq!(peer_port(2, 3, Topology::Paired), 2, "odd last port loops");
        assert_eq!(peer_port(2, 3, Topology::Chained), 0);
        assert_eq!(peer_port(1, 3, Topology::Loop), 1);
    }

    #[test]
    fn distribution_is_contiguous_with_the_remainder_first() {
        assert_eq!(distribute(5, 2), [0..3, 3..5]);
        assert_eq!(distribute(4, 4), [0..1, 1..2, 2..3, 3..4]);
        assert_eq!(distribute(1, 3), [0..1, 1..1, 1..1]);
    }

    /// An lcore stuck in a burst until its port's control work runs (memif's kick on a line
    /// the peer jammed): `stop` services the ports until the lcore is out, instead of waiting
    /// on it for ever.
    #[test]
    fn stop_services_the_ports_until_a_stuck_lcore_is_out() {
        use std::sync::atomic::Ordering::SeqCst;
        let port = test_port::TestPort::default();
        let (stuck, serviced) = (port.stuck.clone(), port.serviced.clone());
        let bursts = port.tx_bursts.clone();
        stuck.store(true, SeqCst);
        let mut engine = test_port::engine(port, FwdMode::TxOnly, "stop-test");
        engine.start(false).unwrap();
        // Stuck in its first tx burst before the stop (else it might see the stop first).
        while bursts.load(SeqCst) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let t = std::time::Instant::now();
        engine.stop().unwrap();
        assert!(
            t.elapsed() < test_port::STUCK_FOR / 2,
            "stop waited {:?} on the stuck lcore",
            t.elapsed()
        );
        assert!(serviced.load(SeqCst) > 0);
        assert!(!stuck.load(SeqCst));
    }

    #[test]
    fn mode_names() {
        for m in FwdMode::ALL {
            assert_eq!(m.name().parse::<FwdMode>().unwrap(), m);
        }
        let e = "fast".parse::<FwdMode>().unwrap_err();
        assert_eq!(
            e,
            "unknown forwarding mode 'fast' (available: io, mac, macswap, rxonly, txonly, flowgen, ping)"
        );
    }
}
