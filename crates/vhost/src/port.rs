//! A vhost-user net port: devargs with DPDK `net_vhost`'s names, the socket in either role
//! (server: we listen on `iface`; client: we connect to it, and again whenever the frontend
//! goes away), and a control thread per port that serves one frontend at a time through rust-vmm's
//! `vhost` request handler. A frontend that leaves (or breaks the protocol) is link down: its
//! rings are taken from the queues and its memory unmapped, and the next one is served.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Acquire, Relaxed},
};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vhost::vhost_user::BackendReqHandler;

use memnic_ethdev::flush::FlushMode;
use memnic_ethdev::gate::Gate;
use memnic_ethdev::tuner::Mode;
use memnic_ethdev::{
    Devargs, DevargsError, Driver, LinkStatus, MacAddr, Mempool, OpenResult, Port, PortError,
    PortInfo, QueueStats, RxQueue, StatsCell, TxQueue,
};
use memnic_shm::unix::{poll, EventFd, PollFd, Sender};

use crate::device::Device;
use crate::mem::Frontend;
use crate::queue::{VhostRxQueue, VhostTxQueue, VringSlot};
use crate::zerocopy::{ZeroCopyConfig, DEFAULT_MIN_LEN};

/// Devargs keys: DPDK `net_vhost`'s names, and `mac`.
pub const DEVARGS_KEYS: &[&str] = &[
    "iface",
    "queues",
    "client",
    "mac",
    "dequeue-zero-copy",
    "dequeue-zero-copy-min-len",
    "rx-flush",
    "tx-stream",
    "rx-hold",
];

/// Most queue pairs a port offers.
pub const MAX_QUEUES: u16 = 8;

/// The driver: `vhost0,iface=/tmp/vhost.sock[,queues=N][,client=1]`.
pub const DRIVER: Driver = Driver {
    name: "vhost",
    keys: DEVARGS_KEYS,
    open,
};

fn open(a: &Devargs) -> OpenResult {
    let cfg = VhostConfig::from_devargs(a)?;
    Ok(Box::new(VhostPort::new(&a.name, cfg)?))
}

/// How a vhost port is set up.
#[derive(Debug, Clone)]
pub struct VhostConfig {
    pub iface: PathBuf,
    pub queues: u16,
    /// We connect to the frontend (QEMU `server=on`, virtio-user `server=1`) instead of
    /// listening.
    pub client: bool,
    pub mac: MacAddr,
    pub mtu: u16,
    /// How long a frontend may take to send its first message after connecting, and any
    /// message (and to read our reply) once it has started; past it the connection is closed
    /// so that the next frontend can be served. 5 s (tests shorten it).
    pub message_timeout: Duration,
    /// Dequeue zero copy (`dequeue-zero-copy=1`, off by default as in DPDK).
    pub zero_copy: Option<ZeroCopyConfig>,
    /// Whether dequeue flushes each frame's first line from our caches once copied
    /// (`rx-flush=auto|on|off`, ours: `queue::flush_first_line`).
    pub rx_flush: FlushMode,
    /// Whether enqueue writes short frames into a packed ring's buffers with streaming stores
    /// (`tx-stream=auto|on|off`, ours: `Vring::STREAM_TUNED`).
    pub tx_stream: Mode,
    /// Whether an IN_ORDER dequeue holds its run of the guest's tx chains over full bursts
    /// (`rx-hold=0|1`, off by default as in DPDK since 20.11, ours: `queue::HeldRun`): faster
    /// at 512-1518 B, but the driver has up to half its tx ring less for frames not taken yet.
    pub rx_hold: bool,
}

/// Buffers each vhost queue's cache keeps (the pool's own size is 256). A frame's buffer is
/// allocated from one queue's cache and freed into another's (rx queue to the stream's or the
/// other port's tx queue), and between the two it waits in the shared list: the larger the
/// caches, the more buffers cycle and the colder their lines are when they are used again. At
/// 1518 B those copies missed L2. A/B in one sitting (DPDK virtio-user on CPU 0, memnic testpmd
/// on CPU 1, 3 rounds alternating, Mpps p20/p50/p80, 256 / 64): io loop (two vhost ports
/// forwarding to each other) packed 1518 B 2.70/2.75/2.86 / 3.77/3.96/3.99, split 1518 B
/// 2.57/2.64/2.69 / 3.51/3.78/3.83 (2 rounds); txonly -> virtio-user rxonly split 1518 B
/// 7.71/8.07/9.10 / 8.01/9.91/10.12, packed 8.39/8.60/9.55 / 9.43/10.16/10.46; rxonly packed
/// 1518 B 6.74/7.20/7.58 / 6.74/6.98/7.32 (level); 64 B level (enq split 20.45 / 19.31, packed
/// 18.55 / 19.15, deq packed 20.47 / 20.79, io packed 11.33 / 11.82 at p50). Not the pool's
/// default: 64 for every queue lost on MEMNIC guest tx 1518 B (p50 6.69 -> 5.38) and memif
/// 64 B (31.46 -> 28.28).
const QUEUE_CACHE: usize = 64;

impl VhostConfig {
    pub fn new(iface: impl Into<PathBuf>) -> VhostConfig {
        VhostConfig {
            iface: iface.into(),
            queues: 1,
            client: false,
            mac: MacAddr([2, 0x56, 0x48, 0, 0, 0]),
            mtu: 9000,
            message_timeout: MESSAGE_TIMEOUT,
            zero_copy: None,
            rx_flush: FlushMode::Auto,
            tx_stream: Mode::Auto,
            rx_hold: false,
        }
    }

    pub fn from_devargs(a: &Devargs) -> Result<VhostConfig, DevargsError> {
        let mut c = VhostConfig::new(a.require("iface")?);
        c.queues = a.parse_or("queues", 1u16)?;
        if !(1..=MAX_QUEUES).contains(&c.queues) {
            return Err(a.bad(
                "queues",
                &c.queues.to_string(),
                format!("queue pairs, 1..={MAX_QUEUES}"),
            ));
        }
        c.client = a.bool_or("client", false)?;
        if a.bool_or("dequeue-zero-copy", false)? {
            let min_len = a.parse_or("dequeue-zero-copy-min-len", DEFAULT_MIN_LEN)?;
            c.zero_copy = Some(ZeroCopyConfig {
                min_len,
                ..ZeroCopyConfig::default()
            });
        }
        if let Some(m) = a.get("mac") {
            c.mac = m.parse().map_err(|e: String| a.bad("mac", m, e))?;
        }
        c.rx_flush = a.parse_or("rx-flush", FlushMode::Auto)?;
        c.tx_stream = a.parse_or("tx-stream", Mode::Auto)?;
        c.rx_hold = a.bool_or("rx-hold", false)?;
        Ok(c)
    }
}

/// Errors of the vhost driver.
#[derive(Debug, thiserror::Error)]
pub enum VhostError {
    #[error(transparent)]
    Devargs(#[from] DevargsError),
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the control thread: {0}")]
    Thread(std::io::Error),
}

/// What the control thread and the queues share.
pub struct Shared {
    pub gate: Arc<Gate>,
    /// Per virtqueue (rx of pair q = 2q, tx = 2q + 1, as virtio numbers them).
    slots: Vec<Arc<VringSlot>>,
    pub link_up: AtomicBool,
    stop: AtomicBool,
    /// Frontends served and lost, and why the last one went.
    pub connects: AtomicU64,
    pub disconnects: AtomicU64,
    pub last_reason: Mutex<Option<String>>,
    /// Bounds each request of the connection being served.
    dog: Watchdog,
    pub zero_copy: Option<ZeroCopyConfig>,
    /// The next ring's id (see `VringConn::ring_id`); from 1.
    pub next_ring_id: AtomicU64,
    /// Call eventfds the control thread is notifying now (rings that left their queues): the
    /// watchdog unjams them as it does the running rings' (see [`unjam_calls`]).
    pub calling: Mutex<Vec<Arc<EventFd>>>,
}

impl Shared {
    pub fn queues(&self) -> u16 {
        (self.slots.len() / 2) as u16
    }
    pub fn slot(&self, vq: usize) -> &Arc<VringSlot> {
        &self.slots[vq]
    }
    /// The guest's tx virtqueue of pair `q`: our rx queue `q`.
    pub fn rx_slot(&self, q: u16) -> &Arc<VringSlot> {
        &self.slots[2 * q as usize + 1]
    }
    fn set_reason(&self, why: String) {
        *self.last_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }
}

/// A vhost-user port.
pub struct VhostPort {
    name: String,
    cfg: VhostConfig,
    shared: Arc<Shared>,
    control: Option<JoinHandle<()>>,
    watchdog: Option<JoinHandle<()>>,
    rx_cells: Vec<Option<Arc<StatsCell>>>,
    tx_cells: Vec<Option<Arc<StatsCell>>>,
}

impl VhostPort {
    pub fn new(name: &str, cfg: VhostConfig) -> Result<VhostPort, VhostError> {
        let shared = Arc::new(Shared {
            gate: Gate::new(),
            slots: (0..2 * cfg.queues)
                .map(|_| Arc::new(VringSlot::default()))
                .collect(),
            link_up: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            connects: AtomicU64::new(0),
            disconnects: AtomicU64::new(0),
            last_reason: Mutex::new(None),
            dog: Watchdog::default(),
            zero_copy: cfg.zero_copy,
            next_ring_id: AtomicU64::new(1),
            calling: Mutex::new(Vec::new()),
        });
        let listener = if cfg.client {
            None
        } else {
            let path = cfg.iface.display().to_string();
            // A socket file left by a backend that died is replaced (as DPDK's vhost does).
            let _ = std::fs::remove_file(&cfg.iface);
            let l = UnixListener::bind(&cfg.iface)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|source| VhostError::Listen { path, source })?;
            Some(l)
        };
        let control = {
            let shared = shared.clone();
            let cfg = cfg.clone();
            std::thread::Builder::new()
                .name(format!("vhost-{name}"))
                .spawn(move || control_thread(&shared, &cfg, listener))
                .map_err(VhostError::Thread)?
        };
        let watchdog = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("vhost-{name}-dog"))
                .spawn(move || shared.dog.run(&shared))
        };
        let watchdog = match watchdog {
            Ok(w) => w,
            Err(e) => {
                // Relaxed: the join orders it.
                shared.stop.store(true, Relaxed);
                let _ = control.join();
                return Err(VhostError::Thread(e));
            }
        };
        let q = cfg.queues as usize;
        Ok(VhostPort {
            name: name.to_string(),
            cfg,
            shared,
            control: Some(control),
            watchdog: Some(watchdog),
            rx_cells: vec![None; q],
            tx_cells: vec![None; q],
        })
    }

    pub fn connects(&self) -> u64 {
        self.shared.connects.load(Relaxed)
    }
    pub fn disconnects(&self) -> u64 {
        self.shared.disconnects.load(Relaxed)
    }
    pub fn last_reason(&self) -> Option<String> {
        self.shared
            .last_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// Chains the guest got wrong (each refused and returned unused), over every queue.
    pub fn bad_chains(&self) -> u64 {
        self.shared
            .slots
            .iter()
            .map(|s| s.bad_chains.load(Relaxed))
            .sum()
    }

    /// Times a queue found its ring broken (avail.idx moved by more than the queue size) and
    /// stopped using it until the control thread installs a ring again, over every queue.
    pub fn broken_rings(&self) -> u64 {
        self.shared
            .slots
            .iter()
            .map(|s| s.broken.load(Relaxed))
            .sum()
    }

    /// Serves one frontend on `stream` exactly as the control thread serves a connection
    /// (a fresh [`Device`], every request through rust-vmm's handler, the port's rings taken
    /// away and the link down when it ends) and returns why it ended, also left in
    /// [`VhostPort::last_reason`]. For fuzzing and tests that hold both ends of a socket pair:
    /// do not use it while the port's own socket has a frontend.
    pub fn serve_stream(&self, stream: UnixStream) -> String {
        serve(&self.shared, &self.cfg, stream);
        self.last_reason().unwrap_or_default()
    }

    /// Dequeue zero copy over every queue: chains sent up uncopied, chains abandoned by a
    /// ring that stopped while they were held, and segments of those that came back later
    /// (discarded).
    pub fn zero_copy_counts(&self) -> (u64, u64, u64) {
        let sum = |f: fn(&VringSlot) -> &AtomicU64| {
            self.shared
                .slots
                .iter()
                .map(|s| f(s).load(Relaxed))
                .sum::<u64>()
        };
        (
            sum(|s| &s.zc_chains),
            sum(|s| &s.zc_abandoned),
            sum(|s| &s.zc_late),
        )
    }

    /// Why the last refused chain (of any queue) was refused.
    pub fn last_bad_chain(&self) -> Option<crate::chain::ChainError> {
        self.shared
            .slots
            .iter()
            .find_map(|s| *s.last_bad.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn take_queue(
        &mut self,
        rx: bool,
        q: u16,
    ) -> Result<(Arc<VringSlot>, Arc<StatsCell>), PortError> {
        let dir = if rx { "rx" } else { "tx" };
        if q >= self.cfg.queues {
            return Err(PortError::NoSuchQueue {
                port: self.name.clone(),
                dir,
                queue: q,
                max: self.cfg.queues,
            });
        }
        let cells = if rx {
            &mut self.rx_cells
        } else {
            &mut self.tx_cells
        };
        if cells[q as usize].is_some() {
            return Err(PortError::QueueTaken {
                port: self.name.clone(),
                dir,
                queue: q,
            });
        }
        let cell = StatsCell::new();
        cells[q as usize] = Some(cell.clone());
        // Our rx queue q is the guest's tx virtqueue (2q + 1); our tx queue its rx (2q).
        let vq = 2 * q as usize + usize::from(rx);
        Ok((self.shared.slots[vq].clone(), cell))
    }
}

impl Drop for VhostPort {
    fn drop(&mut self) {
        // Relaxed: the join below orders everything after it; the thread only needs to see
        // the flag eventually (it looks every TICK).
        self.shared.stop.store(true, Relaxed);
        self.shared.dog.cv.notify_all();
        if let Some(t) = self.control.take() {
            let _ = t.join();
        }
        if let Some(t) = self.watchdog.take() {
            let _ = t.join();
        }
        if !self.cfg.client {
            let _ = std::fs::remove_file(&self.cfg.iface);
        }
    }
}

impl Port for VhostPort {
    fn info(&self) -> PortInfo {
        PortInfo {
            driver: "net_vhost",
            name: self.name.clone(),
            mac: self.cfg.mac,
            max_frame_len: 9018,
            max_rx_queues: self.cfg.queues,
            max_tx_queues: self.cfg.queues,
        }
    }

    fn link(&self) -> LinkStatus {
        LinkStatus {
            // Acquire pairs with the Release in `Device::install`.
            up: self.shared.link_up.load(Acquire),
            speed_mbps: 10_000,
        }
    }

    fn take_rx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn RxQueue>, PortError> {
        let (slot, cell) = self.take_queue(true, q)?;
        let name = format!("{}-rx{q}", self.name);
        Ok(Box::new(VhostRxQueue::new(
            self.shared.gate.join(),
            slot,
            pool.lcore_cache_sized(QUEUE_CACHE),
            cell,
            self.cfg.zero_copy.map(|z| (name.as_str(), z)),
            self.cfg.rx_flush,
            self.cfg.rx_hold,
        )))
    }

    fn take_tx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn TxQueue>, PortError> {
        let (slot, cell) = self.take_queue(false, q)?;
        Ok(Box::new(VhostTxQueue::new(
            self.shared.gate.join(),
            slot,
            pool.lcore_cache_sized(QUEUE_CACHE),
            cell,
            self.cfg.tx_stream,
        )))
    }

    fn xstats(&self) -> Vec<(&'static str, u64)> {
        let (zc, abandoned, late) = self.zero_copy_counts();
        let mut x = vec![
            ("connects", self.connects()),
            ("disconnects", self.disconnects()),
            ("bad_chains", self.bad_chains()),
            ("broken_rings", self.broken_rings()),
            ("zero_copy_chains", zc),
            ("zero_copy_abandoned", abandoned),
            ("zero_copy_late", late),
        ];
        let (rx, tx) = self.queue_stats();
        x.extend(memnic_ethdev::tuner::xstats(rx, tx));
        x
    }

    fn queue_stats(&self) -> (Vec<QueueStats>, Vec<QueueStats>) {
        let snap = |v: &Vec<Option<Arc<StatsCell>>>| {
            v.iter().flatten().map(|c| c.snapshot()).collect::<Vec<_>>()
        };
        (snap(&self.rx_cells), snap(&self.tx_cells))
    }
}

/// How often the control thread looks at its stop flag while it waits.
const TICK: Duration = Duration::from_millis(50);
/// The default [`VhostConfig::message_timeout`].
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

fn control_thread(shared: &Arc<Shared>, cfg: &VhostConfig, listener: Option<UnixListener>) {
    while !shared.stop.load(Relaxed) {
        let stream = match &listener {
            Some(l) => match l.accept() {
                Ok((s, _)) => s,
                Err(_) => {
                    wait_readable(l.as_fd());
                    continue;
                }
            },
            None => match UnixStream::connect(&cfg.iface) {
                Ok(s) => s,
                Err(_) => {
                    // The frontend is not there (yet, or again): try again shortly.
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            },
        };
        if memnic_shm::unix::closers_busy(Sender::of(stream.as_fd())) {
            // Descriptors this frontend's user sent still wait to close (a process serving
            // their files does not answer): no frontend of that user is served until they do,
            // or one that keeps sending them and reconnecting would grow our descriptor table
            // (see `dispose_from`); other users' frontends are. Refused
            // at once, not left in the backlog: QEMU waits for our replies with its main lock
            // held, and a closed connection is an error it reports (or retries, with
            // reconnect=).
            let why = "busy: descriptors this frontend's user sent have not closed yet";
            crate::device::trace(format_args!("frontend refused: {why}"));
            shared.set_reason(why.to_string());
            memnic_shm::unix::close_connection(stream.into());
            std::thread::sleep(TICK);
            continue;
        }
        serve(shared, cfg, stream);
    }
    if let Some(l) = listener {
        memnic_shm::unix::close_listener(l.into());
    }
}

/// Requests the control thread answers itself, ahead of rust-vmm's handler:
///
/// * QEMU 7.2's vhost-net sends SET_VRING_ENABLE(1) *before* SET_FEATURES when it starts a
///   device (it restores the enable state first, judging PROTOCOL_FEATURES by what we
///   offered), and never again after it. rust-vmm's handler refuses that message
///   (PROTOCOL_FEATURES not acked yet), which would leave the rings disabled or end the
///   connection.
/// * SET_STATUS and GET_STATUS (the STATUS protocol feature): vhost 0.18's handler has no
///   case for them.
///
/// So the control thread looks at the next message first (these carry no fds): one of these
/// is read and applied here, with the reply it takes (REPLY_ACK's, or GET_STATUS's value);
/// anything else, a message of the wrong size included, is left to rust-vmm. `Ok(true)`: the
/// message was taken.
fn take_own_request(stream: &UnixStream, device: &Mutex<Device>) -> Result<bool, String> {
    const SET_VRING_ENABLE: u32 = 18;
    const SET_STATUS: u32 = 39;
    const GET_STATUS: u32 = 40;
    const FLAG_VERSION: u32 = 0x1;
    const FLAG_REPLY: u32 = 0x4;
    const FLAG_NEED_REPLY: u32 = 0x8;
    // Header (request, flags, size) and at most 8 bytes of payload, all little-endian.
    let mut msg = [0u8; 20];
    let word = |m: &[u8; 20], i: usize| {
        u32::from_le_bytes([m[4 * i], m[4 * i + 1], m[4 * i + 2], m[4 * i + 3]])
    };
    let mut n = memnic_shm::unix::peek(stream.as_fd(), &mut msg).unwrap_or(0);
    if n < 12 {
        return Ok(false);
    }
    let (code, size) = (word(&msg, 0), word(&msg, 2) as usize);
    let expected = match code {
        SET_VRING_ENABLE | SET_STATUS => 8,
        GET_STATUS => 0,
        _ => return Ok(false),
    };
    if size != expected {
        return Ok(false);
    }
    let whole = 12 + size;
    // A message is sent whole; give its tail a moment if only the header is queued yet.
    for _ in 0..100 {
        if n >= whole {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
        n = memnic_shm::unix::peek(stream.as_fd(), &mut msg).unwrap_or(0);
    }
    if n < whole {
        return Ok(false);
    }
    let mut dev = device.lock().unwrap_or_else(|p| p.into_inner());
    let res = match code {
        SET_VRING_ENABLE => match dev.early_vring_enable(word(&msg, 3), word(&msg, 4)) {
            Some(res) => res,
            None => return Ok(false),
        },
        _ if !dev.status_negotiated() => return Ok(false),
        SET_STATUS => dev.set_status(u64::from(word(&msg, 3)) | u64::from(word(&msg, 4)) << 32),
        _ => Ok(()),
    };
    let name = match code {
        SET_VRING_ENABLE => "SET_VRING_ENABLE",
        SET_STATUS => "SET_STATUS",
        _ => "GET_STATUS",
    };
    let mut s = stream;
    s.read_exact(&mut msg[..whole])
        .map_err(|e| format!("read {name}: {e}"))?;
    let answer = match code {
        GET_STATUS => Some(u64::from(dev.status())),
        _ if word(&msg, 1) & FLAG_NEED_REPLY != 0 && dev.reply_ack() => {
            Some(u64::from(res.is_err()))
        }
        _ => None,
    };
    if let Some(v) = answer {
        let mut reply = [0u8; 20];
        reply[0..4].copy_from_slice(&code.to_le_bytes());
        reply[4..8].copy_from_slice(&(FLAG_VERSION | FLAG_REPLY).to_le_bytes());
        reply[8..12].copy_from_slice(&8u32.to_le_bytes());
        reply[12..20].copy_from_slice(&v.to_le_bytes());
        s.write_all(&reply)
            .map_err(|e| format!("reply to {name}: {e}"))?;
    }
    res.map(|()| true).map_err(|e| match dev.last_error.take() {
        Some(why) => format!("{name}: {e}: {why}"),
        None => format!("{name}: {e}"),
    })
}

/// The most descriptors one vhost-user message carries (rust-vmm takes no more).
const MAX_MSG_FDS: usize = 32;

/// Looks at the descriptors the frontend attached to its next message before rust-vmm takes
/// them: rust-vmm closes those it does not pass on (fds on a request that takes none, a message
/// it refuses, fds that come with any bytes of the message past its first read) on this
/// thread, and closing a file whose filesystem a process serves (FUSE) waits for that process,
/// maybe the frontend itself. So the whole message (its header, then up to rust-vmm's largest
/// body) is waited for with looks that install nothing, then looked at once with its
/// descriptors: a message whose descriptors come anywhere but with its first bytes (a stream
/// read stops after them, so a peek of the whole message comes back short while its bytes are
/// all queued), descriptors the look could not take (more than a message can carry, or our
/// table full), more than a request carries, or one whose close could wait on a process (a
/// file on FUSE or on a mount no table names, a socket) is refused: the copies the look
/// installed are closed elsewhere (`dispose_from`), and the frontend is dropped with why, its
/// socket still holding the message (`serve` hands it whole to `close_connection`). So is a
/// frontend whose user's closes are busy (the look would add to them), and a message that
/// does not arrive whole within `timeout`.
fn screen_fds(sock: &UnixStream, peer: Frontend, timeout: Duration) -> Result<(), String> {
    use memnic_shm::unix::{
        closers_busy, closes_without_a_server, dispose_from, peek, peek_with_fds, queued_bytes,
        SCM_MAX_FD,
    };
    let err = |e: memnic_shm::ShmError| e.to_string();
    let deadline = Instant::now() + timeout;
    let mut want = 12;
    let mut body_deadline = deadline;
    loop {
        let queued = queued_bytes(sock.as_fd()).map_err(err)?;
        // The frontend shut its side: what is queued is all that comes.
        let mut look = [PollFd::readable(sock.as_fd())];
        let ended =
            poll(&mut look, Some(Duration::ZERO)).map_err(err)? > 0 && look[0].ready().hangup;
        if queued == 0 && ended {
            return Ok(()); // the end of the stream: rust-vmm reads it
        }
        if want == 12 && queued >= 12 {
            let mut h = [0u8; 12];
            if peek(sock.as_fd(), &mut h).map_err(err)? == 12 {
                body_deadline = Instant::now() + BODY_WAIT;
                let size = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
                // Past rust-vmm's largest body it reads the header alone and refuses it.
                if size <= MAX_MSG_BODY {
                    want = 12 + size;
                }
            }
        }
        if queued >= want || ended {
            break;
        }
        // rust-vmm waits for a header (under the watchdog), but reads a body with one
        // `recvmsg`, whatever came by then, descriptors included: a frontend sends a message
        // whole, so a body that does not follow its header at once is refused here.
        if want > 12 && Instant::now() >= body_deadline {
            return Err(format!(
                "invalid message: its header announces {} bytes of body, {} came with it",
                want - 12,
                queued.saturating_sub(12)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "a message took longer than {timeout:?} to arrive whole ({queued} bytes came)"
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if closers_busy(peer.sender) {
        return Err("busy: descriptors this frontend's user sent have not closed yet".into());
    }
    let seen = peek_with_fds(sock.as_fd(), want, SCM_MAX_FD).map_err(err)?;
    let n = seen.len;
    let why = if seen.cut {
        Some(
            "a message carries descriptors we could not look at (more than a message can \
             carry, or our descriptor table is full)"
                .to_string(),
        )
    } else if n < want && !seen.fds.is_empty() {
        Some(format!(
            "descriptors came with bytes {n}.. of a {want}-byte message, not with its first \
             (a frontend sends a message and its descriptors in one piece)"
        ))
    } else if seen.fds.len() > MAX_MSG_FDS {
        Some(format!(
            "a message carries {} descriptors, more than the {MAX_MSG_FDS} a request may",
            seen.fds.len()
        ))
    } else {
        seen.fds
            .iter()
            .position(|f| !closes_without_a_server(f.as_fd(), peer.pid))
            .map(|i| {
                format!(
                    "descriptor {i} of a message could stall its close: a file on FUSE or on a \
                     mount no table names, or a socket"
                )
            })
    };
    seen.fds
        .into_iter()
        .for_each(|f| dispose_from(f, peer.sender));
    match why {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// How long a message's body may trail its header (a frontend sends them in one piece).
const BODY_WAIT: Duration = Duration::from_millis(100);

/// rust-vmm's largest message body (vhost 0.18's `MAX_MSG_SIZE`).
const MAX_MSG_BODY: usize = 0x1000;

fn wait_readable(fd: std::os::fd::BorrowedFd<'_>) {
    let mut fds = [PollFd::readable(fd)];
    let _ = poll(&mut fds, Some(TICK));
}

/// Bounds how long one request may hold the control thread. rust-vmm's handler reads a
/// header until it has all 12 bytes and writes a reply until it is all sent, retrying on a
/// socket timeout, so half a header, or a frontend that stops reading our replies, would block
/// it for ever (and with it the port's stop and the next frontend). Past the deadline, or once
/// the port stops, the watchdog shuts the socket down: the blocked call returns, with an error.
/// One per port, on its own thread; it watches the connection being served.
#[derive(Default)]
struct Watchdog {
    state: Mutex<Watch>,
    cv: Condvar,
}

#[derive(Default)]
struct Watch {
    /// The connection being served (a clone of its socket), and the deadline of the request
    /// in progress.
    sock: Option<UnixStream>,
    deadline: Option<Instant>,
    fired: bool,
    /// The watchdog found a call eventfd of this frontend's filled to the top.
    jammed: bool,
}

impl Watchdog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Watch> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches `sock` from now on (until `detach`).
    fn attach(&self, sock: UnixStream) {
        *self.lock() = Watch {
            sock: Some(sock),
            ..Watch::default()
        };
    }

    fn detach(&self) {
        *self.lock() = Watch::default();
    }

    /// Sets the deadline of the request about to be handled. (No wake-up: the watchdog looks
    /// every TICK, so it fires at most a TICK late, and a request costs no context switch.)
    fn arm(&self, timeout: Duration) {
        self.lock().deadline = Some(Instant::now() + timeout);
    }

    /// Whether it fired since it was armed.
    fn disarm(&self) -> bool {
        let mut w = self.lock();
        w.deadline = None;
        std::mem::take(&mut w.fired)
    }

    /// Whether the watchdog found a call eventfd jammed (and shut the connection down) since
    /// the connection was attached.
    fn jammed(&self) -> bool {
        self.lock().jammed
    }

    /// Until the port stops: shuts the watched socket down once its request's deadline has
    /// passed (or the port stops while a request is in progress), and every TICK empties the
    /// call eventfds a frontend jammed ([`unjam_calls`]) and shuts that frontend out.
    fn run(&self, shared: &Shared) {
        loop {
            let jammed = unjam_calls(shared);
            let mut w = self.lock();
            if jammed && !w.jammed {
                w.jammed = true;
                if let Some(s) = &w.sock {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
            }
            // Relaxed: a flag looked at every TICK; the port's drop joins this thread.
            let stopping = shared.stop.load(Relaxed);
            let now = Instant::now();
            if let Some(d) = w.deadline {
                if now >= d || stopping {
                    w.fired = true;
                    w.deadline = None;
                    if let Some(s) = &w.sock {
                        let _ = s.shutdown(std::net::Shutdown::Both);
                    }
                }
            }
            if stopping {
                return;
            }
            let wait = w
                .deadline
                .map_or(TICK, |d| d.saturating_duration_since(now).min(TICK));
            drop(
                self.cv
                    .wait_timeout(w, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0,
            );
        }
    }
}

/// Empties every call eventfd a frontend filled to the top (`EventFd::unjam`): those of the
/// rings in the queues, those a queue is notifying outside its burst (`VringSlot::calling`),
/// and those the control thread is notifying. A frontend shares the
/// eventfd's O_NONBLOCK with us and can clear it; filling the counter just after our look
/// leaves our write blocked (a queue's lcore, and every install after it, or the control
/// thread) until the counter is read. Returns whether it found one (no honest frontend lets
/// 2^64 - 2 calls pile up).
fn unjam_calls(shared: &Shared) -> bool {
    let mut calls: Vec<Arc<EventFd>> = Vec::new();
    for s in &shared.slots {
        calls.extend(
            s.conn
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .and_then(|c| c.call.clone()),
        );
        calls.extend(s.calling.lock().unwrap_or_else(|p| p.into_inner()).clone());
    }
    calls.extend(
        shared
            .calling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned(),
    );
    let mut jammed = false;
    for call in calls {
        jammed |= call.unjam().unwrap_or(false);
    }
    jammed
}

/// Serves one frontend until it leaves, breaks the protocol, says nothing for the message
/// timeout after connecting, stalls inside a message, or the port stops.
fn serve(shared: &Arc<Shared>, cfg: &VhostConfig, stream: UnixStream) {
    let set_up = || -> Result<(UnixStream, UnixStream), String> {
        let e = |e: std::io::Error| e.to_string();
        stream.set_nonblocking(false).map_err(e)?;
        stream.set_read_timeout(None).map_err(e)?;
        // A peer's MSG_OOB byte (and what it carries) where the screen's peeks see it.
        memnic_shm::unix::set_oob_inline(stream.as_fd()).map_err(|e| e.to_string())?;
        Ok((
            stream.try_clone().map_err(e)?,
            stream.try_clone().map_err(e)?,
        ))
    };
    let (watch, cut) = match set_up() {
        Ok(copies) => copies,
        Err(why) => {
            // Any copy made is gone already: ours is the last.
            shared.set_reason(format!("frontend refused: {why}"));
            memnic_shm::unix::close_connection(stream.into());
            return;
        }
    };
    shared.connects.fetch_add(1, Relaxed);
    let mut device = Device::new(shared.clone(), cfg.mac, cfg.mtu);
    device.frontend = Frontend::of(stream.as_fd());
    let peer = device.frontend;
    let device = Arc::new(Mutex::new(device));
    let mut handler = BackendReqHandler::from_stream(stream, device.clone());
    let timeout = cfg.message_timeout;
    let dog = &shared.dog;
    dog.attach(cut);
    let connected = Instant::now();
    let mut heard = false;
    let why = loop {
        if shared.stop.load(Relaxed) {
            break "the port stopped".to_string();
        }
        let mut fds = [PollFd::readable(watch.as_fd())];
        match poll(&mut fds, Some(TICK)) {
            Ok(0) if !heard && connected.elapsed() >= timeout => {
                break format!("the frontend sent nothing within {timeout:?} of connecting");
            }
            Ok(0) => continue,
            Ok(_) => {}
            Err(e) => break format!("poll: {e}"),
        }
        heard = true;
        dog.arm(timeout);
        // Screened first: the requests answered here are read with plain reads, which
        // leave any descriptors attached to the kernel to release, on this thread.
        if let Err(why) = screen_fds(&watch, peer, timeout) {
            dog.disarm();
            break why;
        }
        match take_own_request(&watch, &device) {
            Ok(true) => {
                dog.disarm();
                continue;
            }
            Ok(false) => {}
            Err(why) => {
                dog.disarm();
                break why;
            }
        }
        let r = handler.handle_request();
        let fired = dog.disarm();
        let detail = device
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_error
            .take();
        let Err(e) = r else { continue };
        let e = match detail {
            Some(d) => format!("{e}: {d}"),
            None => e.to_string(),
        };
        break if shared.stop.load(Relaxed) {
            "the port stopped".to_string()
        } else if fired {
            format!("a message (or our reply) took longer than {timeout:?}: {e}")
        } else {
            e
        };
    };
    let why = if dog.jammed() {
        format!("the frontend filled a call eventfd to the top ({why})")
    } else {
        why
    };
    dog.detach();
    crate::device::trace(format_args!("frontend dropped: {why}"));
    // Our other copies of the socket first: the last one closed is where the kernel releases
    // what its queue still holds (`close_connection` gives that to a closer thread).
    drop(handler);
    memnic_shm::unix::close_connection(watch.into());
    device.lock().unwrap_or_else(|p| p.into_inner()).reset();
    shared.disconnects.fetch_add(1, Relaxed);
    shared.set_reason(why);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devargs_turn_dequeue_zero_copy_on_with_dpdks_name() {
        let parse = |s: &str| VhostConfig::from_devargs(&Devargs::parse(s, DEVARGS_KEYS).unwrap());
        assert_eq!(parse("vhost0,iface=/s").unwrap().zero_copy, None);
        assert_eq!(
            parse("vhost0,iface=/s,dequeue-zero-copy=1")
                .unwrap()
                .zero_copy,
            Some(ZeroCopyConfig::default())
        );
        assert_eq!(
            parse("vhost0,iface=/s,dequeue-zero-copy=0")
                .unwrap()
                .zero_copy,
            None
        );
        let z = parse("vhost0,iface=/s,dequeue-zero-copy=1,dequeue-zero-copy-min-len=0");
        assert_eq!(z.unwrap().zero_copy.unwrap().min_len, 0);
        let e = parse("vhost0,iface=/s,dequeue-zero-copy=maybe").unwrap_err();
        assert!(e.to_string().contains("dequeue-zero-copy"), "{e}");
    }
    #[test]
    fn devargs_choose_the_tuned_ways() {
        let parse = |s: &str| VhostConfig::from_devargs(&Devargs::parse(s, DEVARGS_KEYS).unwrap());
        let c = parse("vhost0,iface=/s").unwrap();
        assert_eq!((c.rx_flush, c.tx_stream), (FlushMode::Auto, Mode::Auto));
        let c = parse("vhost0,iface=/s,rx-flush=off,tx-stream=on").unwrap();
        assert_eq!((c.rx_flush, c.tx_stream), (FlushMode::Off, Mode::On));
        let e = parse("vhost0,iface=/s,tx-stream=sometimes").unwrap_err();
        assert!(e.to_string().contains("tx-stream"), "{e}");
        assert!(
            !c.rx_hold,
            "an in-order dequeue hands each burst back by default"
        );
        assert!(parse("vhost0,iface=/s,rx-hold=1").unwrap().rx_hold);
        let e = parse("vhost0,iface=/s,rx-hold=later").unwrap_err();
        assert!(e.to_string().contains("rx-hold"), "{e}");
    }
}
