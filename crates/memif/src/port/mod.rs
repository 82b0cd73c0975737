//! A memif interface as a memnic port: the control channel (client and server roles, lock-step
//! handshake, disconnect and reconnect) driven from `Port::service`, and the queues of
//! [`crate::queue`].
//!
//! The client allocates everything (`specs/memif.md` §4): region 0 is one memfd holding the C2S
//! rings, the S2C rings, then one buffer of `bsize` bytes per slot. The server maps only what it
//! is given and validates it.
//!
//! * `config`: [`MemifConfig`], devargs and [`MemifError`];
//! * `client`: connecting (never blocking the control thread), HELLO, region 0's layout and the
//!   queued handshake;
//! * `server`: INIT, regions and rings as a client announces them, CONNECT.
//!
//! Both roles share what is the same rule for both: `Session::attach` (how a ring becomes a
//! queue's connection), `Refusal` (a refused step is a DISCONNECT with a reason) and the
//! deadline of every handshake step ([`MemifConfig::handshake_timeout`]).

mod client;
mod config;
mod server;

pub use config::{MemifConfig, MemifError, DEVARGS_KEYS, MAX_QUEUES};

use std::borrow::Cow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memnic_ethdev::gate::Gate;
use memnic_ethdev::{
    Devargs, LinkStatus, Mempool, Port, PortError, PortInfo, QueueMemory, QueueStats, RxQueue,
    StatsCell, TxQueue,
};
use memnic_shm::unix::{dispose_from, EventFd, Sender, SeqpacketConn, SocketAddrSpec};
use memnic_shm::{Region, ShmError};

use crate::msg::{AddRing, Msg, MsgError, RingDirection, Secret};
use crate::queue::{Broken, Conn, MemifRxQueue, MemifTxQueue, QueueCore, QueueSlot, Role};
use crate::ring::{ring_bytes, RING_FLAG_MASK_INT};
use crate::socket::{read_msg, Read, SharedListener};

/// Messages read from the peer in one `service` call at most: the handshake is lock-step (one
/// message in flight), so more is a flood, and the control thread has other ports to serve.
const MAX_MSGS_PER_SERVICE: usize = 64;

/// Where the control channel is.
enum Phase {
    /// Client: not connected; next attempt at `retry_at`. `since`: when this run of failed
    /// attempts began (for `connect_patience`).
    Idle {
        retry_at: Instant,
        since: Instant,
    },
    /// Client: `connect` runs on a helper thread, whose result arrives on `done`: connecting
    /// blocks while the server's backlog is full, and the control thread must not.
    Connecting {
        done: Receiver<Result<SeqpacketConn, ShmError>>,
        deadline: Instant,
        since: Instant,
    },
    /// Client: connected; the server speaks first (HELLO).
    AwaitHello {
        conn: SeqpacketConn,
        deadline: Instant,
        since: Instant,
    },
    /// Server: listening, no client yet.
    Listening,
    /// Handshake in progress on this connection.
    Handshake(Box<Handshake>),
    Connected(Box<Session>),
}

struct Handshake {
    conn: SeqpacketConn,
    /// The peer's next message is due by then; each step moves it on.
    deadline: Instant,
    /// Client: messages still to send, one per reply; empty once CONNECT is sent.
    queue: Vec<(Msg, Option<OwnedFd>)>,
    /// Client: what was prepared for this connection.
    prepared: Option<Session>,
    /// Server: what the client has announced so far.
    regions: Vec<Arc<Region>>,
    rings: Vec<(AddRing, Arc<EventFd>)>,
    inited: bool,
}

impl Handshake {
    fn new(conn: SeqpacketConn, deadline: Instant) -> Handshake {
        Handshake {
            conn,
            deadline,
            queue: Vec::new(),
            prepared: None,
            regions: Vec::new(),
            rings: Vec::new(),
            inited: false,
        }
    }
}

/// Why a handshake step was refused: the reason our DISCONNECT carries (and `last_reason`).
/// Every check's error converts, so each step is a chain of `?`.
#[derive(Debug)]
struct Refusal(Cow<'static, str>);

impl From<MsgError> for Refusal {
    fn from(e: MsgError) -> Refusal {
        Refusal(Cow::Borrowed(e.reason()))
    }
}

impl From<&'static str> for Refusal {
    fn from(reason: &'static str) -> Refusal {
        Refusal(Cow::Borrowed(reason))
    }
}

impl From<String> for Refusal {
    fn from(reason: String) -> Refusal {
        Refusal(Cow::Owned(reason))
    }
}

/// The DISCONNECT reason when a peer shrank the memory it shared with us.
pub const PEER_SHRANK: &str = "Peer shrank its shared memory";
/// The DISCONNECT reason for a peer that filled a ring's interrupt eventfd to the top (which
/// can leave our kick blocked, see `EventFd::unjam`).
pub const PEER_JAMMED: &str = "Peer filled an interrupt line";
/// The DISCONNECT reason for a client that connects while every closer thread of its user is
/// taken (`memnic_shm::unix::closers_busy`): descriptors that user's peers sent are still
/// waiting to close.
pub const CLOSERS_BUSY: &str = "Busy: descriptors this user's peers sent have not closed yet";
/// The DISCONNECT reason for a client that connects while 8 other clients of its user
/// (SO_PEERCRED's uid) were greeted and have not sent their INIT yet.
pub const GREETINGS_BUSY: &str = "Busy: too many connections of this user await their INIT";
/// How often the control path looks for jammed interrupt lines.
const UNJAM_EVERY: Duration = Duration::from_millis(50);
/// How soon `service` must run again while the port is not connected: accepting or connecting,
/// and each handshake step, wait for it.
const SETUP_SERVICE: Duration = Duration::from_millis(5);

/// A live connection: the socket and what the queues use.
struct Session {
    conn: Option<SeqpacketConn>,
    /// Per queue: (rx conn, tx conn).
    rx: Vec<Option<Conn>>,
    tx: Vec<Option<Conn>>,
}

impl Session {
    /// A session for `nq` queue pairs, no ring attached yet.
    fn new(nq: usize) -> Session {
        Session {
            conn: None,
            rx: vec![None; nq],
            tx: vec![None; nq],
        }
    }

    /// Ring `index` of direction `dir`, as the side `conn.role` uses it, the same rule for both
    /// roles (spec §3.6): both counters start at 0; the ring's receiver (the client on S2C, the
    /// server on C2S) polls it, so it sets MASK_INT ("do not kick me") and the ring serves its
    /// rx queue `index`; the other side's ring serves its tx queue `index`. A ring beyond our
    /// queues stays unused.
    fn attach(&mut self, dir: RingDirection, index: usize, conn: Conn) {
        // Relaxed: the peer reads these only after the socket message that follows (CONNECT
        // from the client, CONNECTED from the server), which orders them.
        conn.ring.head().store(0, Relaxed);
        conn.ring.tail().store(0, Relaxed);
        let receives = matches!(
            (conn.role, dir),
            (Role::Client, RingDirection::S2C) | (Role::Server, RingDirection::C2S)
        );
        if receives {
            // Relaxed: as above.
            conn.ring.flags().store(RING_FLAG_MASK_INT, Relaxed);
        }
        let queues = if receives { &mut self.rx } else { &mut self.tx };
        if let Some(q) = queues.get_mut(index) {
            *q = Some(conn);
        }
    }
}

/// A memif port.
pub struct MemifPort {
    name: String,
    cfg: MemifConfig,
    /// `cfg.secret` as checked at start-up (empty: none).
    secret: Secret,
    phase: Phase,
    /// Client: a connect that passed its deadline while still blocked in its thread. No new
    /// attempt starts until it returns, so a server that never accepts costs one thread.
    abandoned_connect: Option<Receiver<Result<SeqpacketConn, ShmError>>>,
    /// Client: whose the server's last connection was (its user, `Sender::of`): while that
    /// user's closes wait (`closers_busy`), we do not connect again.
    server: Sender,
    /// Server: the socket, shared with the other server interfaces on it.
    listener: Option<Arc<SharedListener>>,
    gate: Arc<Gate>,
    broken: Arc<Broken>,
    rx_slots: Vec<Arc<QueueSlot>>,
    tx_slots: Vec<Arc<QueueSlot>>,
    rx_cells: Vec<Arc<StatsCell>>,
    tx_cells: Vec<Arc<StatsCell>>,
    /// Zero copy: the pools the queues use (each becomes a region after region 0), and each
    /// queue's pool.
    pools: Vec<Mempool>,
    rx_pool: Vec<Option<usize>>,
    tx_pool: Vec<Option<usize>>,
    link_up: Arc<AtomicBool>,
    /// When `service` next looks for jammed interrupt lines.
    next_unjam: Instant,
    /// Connections made and lost, and the last disconnect reason (ours or the peer's).
    pub connects: u64,
    pub disconnects: u64,
    pub last_reason: Option<String>,
}

impl MemifPort {
    /// A port as `cfg` says; a configuration that cannot work (a secret that does not fit, a
    /// client whose region 0 would pass 4 GiB) is refused here, before anything connects.
    pub fn new(name: &str, cfg: MemifConfig) -> Result<MemifPort, MemifError> {
        let secret = cfg.checked_secret()?;
        if cfg.role == Role::Client {
            client::Layout::new(1, 1, cfg.log2_ring_size, cfg.bsize)?;
        }
        let addr = SocketAddrSpec::memif(&cfg.socket, cfg.is_abstract);
        let (listener, phase) = match cfg.role {
            Role::Server => (
                Some(SharedListener::register(
                    &addr,
                    cfg.id,
                    cfg.handshake_timeout,
                )?),
                Phase::Listening,
            ),
            Role::Client => (
                None,
                Phase::Idle {
                    retry_at: Instant::now(),
                    since: Instant::now(),
                },
            ),
        };
        Ok(MemifPort {
            name: name.to_string(),
            cfg,
            secret,
            phase,
            abandoned_connect: None,
            server: Sender::UNKNOWN,
            listener,
            gate: Gate::new(),
            broken: Arc::new(Broken::default()),
            rx_slots: Vec::new(),
            tx_slots: Vec::new(),
            rx_cells: Vec::new(),
            tx_cells: Vec::new(),
            pools: Vec::new(),
            rx_pool: Vec::new(),
            tx_pool: Vec::new(),
            link_up: Arc::new(AtomicBool::new(false)),
            next_unjam: Instant::now(),
            connects: 0,
            disconnects: 0,
            last_reason: None,
        })
    }

    /// The index of `pool` among the pools of this port (added if new).
    fn pool_index(&mut self, pool: &Mempool) -> usize {
        let region = pool.region() as *const Region;
        if let Some(i) = self
            .pools
            .iter()
            .position(|p| std::ptr::eq(p.region(), region))
        {
            return i;
        }
        self.pools.push(pool.clone());
        self.pools.len() - 1
    }

    pub fn is_connected(&self) -> bool {
        matches!(self.phase, Phase::Connected(_))
    }

    fn nq(&self) -> u16 {
        self.rx_slots.len().max(self.tx_slots.len()) as u16
    }

    /// Runs the control channel until `deadline` or until connected (for tests and start-up).
    pub fn wait_connected(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            self.service();
            if self.is_connected() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    fn addr(&self) -> SocketAddrSpec {
        SocketAddrSpec::memif(&self.cfg.socket, self.cfg.is_abstract)
    }

    /// Installs (or removes) every queue's connection with the queues out of their bursts.
    fn install(&self, s: Option<&Session>) {
        let set = || {
            for (i, slot) in self.rx_slots.iter().enumerate() {
                let conn = s.and_then(|s| s.rx.get(i).cloned().flatten());
                // A client posts its S2C rings now: a server that sends before our first rx
                // burst would otherwise find no room and drop.
                let prefilled = match (&conn, self.rx_pool.get(i).copied().flatten()) {
                    (Some(c), Some(p)) if c.role == Role::Client => {
                        MemifRxQueue::prefill_client_rx(c, &self.pools[p])
                    }
                    _ => Default::default(),
                };
                *slot.prefilled.lock().unwrap_or_else(|p| p.into_inner()) = prefilled;
                *slot.conn.lock().unwrap_or_else(|p| p.into_inner()) = conn;
            }
            for (i, slot) in self.tx_slots.iter().enumerate() {
                *slot.conn.lock().unwrap_or_else(|p| p.into_inner()) =
                    s.and_then(|s| s.tx.get(i).cloned().flatten());
            }
            Some(())
        };
        // Queues that stay busy longer than this are lcores stuck elsewhere; try again later.
        // One stuck in a kick the peer jammed gets out when we empty the line.
        while self.gate.reset(None, Duration::from_secs(1), set).is_none() {
            self.unjam_kicks();
            std::thread::sleep(Duration::from_millis(1));
        }
        // Release pairs with the Acquire in `link`.
        self.link_up.store(s.is_some(), Release);
    }

    /// Empties every interrupt line of the rings in use that the peer filled to the top (a tx
    /// lcore's kick may be blocked on it: `EventFd::unjam`), and flags the peer for a
    /// disconnect: no honest peer lets 2^64 - 2 kicks pile up.
    fn unjam_kicks(&self) {
        for slot in self.rx_slots.iter().chain(&self.tx_slots) {
            let irq = slot
                .conn
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .and_then(|c| c.irq.clone());
            if irq.is_some_and(|irq| irq.unjam().unwrap_or(false)) {
                self.broken.set(PEER_JAMMED);
            }
        }
    }

    /// When the peer's next handshake message is due, from now.
    fn step_deadline(&self) -> Instant {
        Instant::now() + self.cfg.handshake_timeout
    }

    /// Both roles, once the handshake is done: the queues get their rings and the link is up.
    fn connected(&mut self, conn: SeqpacketConn, mut s: Session) {
        s.conn = Some(conn);
        self.install(Some(&s));
        self.phase = Phase::Connected(Box::new(s));
        self.connects += 1;
    }

    /// Takes the handshake out of the phase (leaving `Listening`), or leaves any other phase.
    fn take_handshake(&mut self) -> Option<Box<Handshake>> {
        match std::mem::replace(&mut self.phase, Phase::Listening) {
            Phase::Handshake(h) => Some(h),
            other => {
                self.phase = other;
                None
            }
        }
    }

    /// A handshake step whose deadline passed ends the connection, with the reason.
    fn expire_handshake(&mut self) {
        let Phase::Handshake(h) = &self.phase else {
            return;
        };
        if Instant::now() < h.deadline {
            return;
        }
        let reason = match self.cfg.role {
            Role::Server => "Timeout waiting for the next handshake message".to_string(),
            Role::Client => format!("Timeout waiting for {}", client::awaited(h)),
        };
        self.disconnect(&reason, true);
    }

    /// Whether the peer shrank a region of the live connection under us (every queue's
    /// connection shares the same regions; ours are sealed, so only a peer's can fault).
    fn peer_memory_faulted(&self) -> bool {
        let Phase::Connected(s) = &self.phase else {
            return false;
        };
        s.rx.iter()
            .chain(&s.tx)
            .flatten()
            .next()
            .is_some_and(|c| c.regions.0.iter().any(|r| r.peer_faulted()))
    }

    fn disconnect(&mut self, reason: &str, tell_peer: bool) {
        let phase = std::mem::replace(&mut self.phase, Phase::Listening);
        let conn = match phase {
            Phase::Connected(mut s) => {
                self.install(None);
                self.disconnects += 1;
                s.conn.take()
            }
            Phase::Handshake(h) => Some(h.conn),
            Phase::AwaitHello { conn, .. } => Some(conn),
            Phase::Connecting { done, .. } => {
                self.abandoned_connect = Some(done);
                None
            }
            Phase::Idle { .. } | Phase::Listening => None,
        };
        if let (Some(c), true) = (&conn, tell_peer) {
            let _ = c.send(&Msg::disconnect(reason).encode(), &[]);
        }
        self.last_reason = Some(reason.to_string());
        if let Some(l) = &self.listener {
            l.release(self.cfg.id);
        }
        self.phase = match self.cfg.role {
            Role::Server => Phase::Listening,
            Role::Client => Phase::Idle {
                retry_at: Instant::now() + Duration::from_millis(100),
                since: Instant::now(),
            },
        };
    }

    /// Reads what the peer sent (a bounded number of messages) and runs the handshake steps.
    fn pump(&mut self) {
        for _ in 0..MAX_MSGS_PER_SERVICE {
            let conn = match &self.phase {
                Phase::Handshake(h) => &h.conn,
                Phase::Connected(s) => match &s.conn {
                    Some(c) => c,
                    None => return,
                },
                _ => return,
            };
            let (m, mut fds) = match read_msg(conn) {
                Read::Nothing => return,
                Read::Closed(why) => {
                    self.disconnect(&why, false);
                    return;
                }
                Read::Bad(reason) => {
                    self.disconnect(reason, true);
                    return;
                }
                Read::Msg(m, fds) => (m, fds),
            };
            if let Msg::Disconnect(d) = &m {
                let reason = format!("peer: {}", d.reason.to_string_lossy());
                self.disconnect(&reason, false);
                return;
            }
            let sender = fds.sender();
            let mut fd = fds.pop();
            let res = match (self.cfg.role, self.is_connected()) {
                (_, true) => Err(Refusal::from("Unexpected message")),
                (Role::Server, false) => self.server_step(m, &mut fd),
                (Role::Client, false) => self.client_step(m),
            };
            // What the step did not keep is closed elsewhere (a FUSE file's close waits on
            // its server, maybe the peer); the rest of `fds` goes the same way when dropped.
            fd.into_iter().for_each(|f| dispose_from(f, sender));
            if let Err(Refusal(reason)) = res {
                self.disconnect(&reason, true);
                return;
            }
            let deadline = self.step_deadline();
            if let Phase::Handshake(h) = &mut self.phase {
                h.deadline = deadline;
            }
        }
    }
}

impl Port for MemifPort {
    fn info(&self) -> PortInfo {
        PortInfo {
            driver: "net_memif",
            name: self.name.clone(),
            mac: self.cfg.mac,
            max_frame_len: crate::MAX_FRAME_LEN as u32,
            max_rx_queues: MAX_QUEUES,
            max_tx_queues: MAX_QUEUES,
        }
    }

    fn link(&self) -> LinkStatus {
        // Acquire pairs with the Release in `install`.
        LinkStatus {
            up: self.link_up.load(Acquire),
            speed_mbps: 10_000,
        }
    }

    fn take_rx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn RxQueue>, PortError> {
        self.check_layout(q).map_err(|e| PortError::Other {
            port: self.name.clone(),
            what: e.to_string(),
        })?;
        take(&mut self.rx_slots, &mut self.rx_cells, q, &self.name, "rx")?;
        let p = self.pool_index(pool);
        set_at(&mut self.rx_pool, q, p);
        let core = QueueCore::new(
            self.gate.join(),
            self.rx_slots[q as usize].clone(),
            self.broken.clone(),
            pool.lcore_cache(),
            self.rx_cells[q as usize].clone(),
        );
        Ok(Box::new(MemifRxQueue::new(
            core,
            self.cfg.rx_flush,
            self.cfg.rx_holdoff,
        )))
    }

    fn take_tx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn TxQueue>, PortError> {
        self.check_layout(q).map_err(|e| PortError::Other {
            port: self.name.clone(),
            what: e.to_string(),
        })?;
        take(&mut self.tx_slots, &mut self.tx_cells, q, &self.name, "tx")?;
        let p = self.pool_index(pool);
        set_at(&mut self.tx_pool, q, p);
        let core = QueueCore::new(
            self.gate.join(),
            self.tx_slots[q as usize].clone(),
            self.broken.clone(),
            pool.lcore_cache(),
            self.tx_cells[q as usize].clone(),
        );
        Ok(Box::new(MemifTxQueue::new(
            core,
            self.cfg.tx_stream,
            self.cfg.tx_demote,
            self.cfg.tx_ahead_shared,
        )))
    }

    fn queue_stats(&self) -> (Vec<QueueStats>, Vec<QueueStats>) {
        (
            self.rx_cells.iter().map(|c| c.snapshot()).collect(),
            self.tx_cells.iter().map(|c| c.snapshot()).collect(),
        )
    }

    /// The receive queues' flushing, the transmit queues' streaming
    /// ([`memnic_ethdev::tuner::xstats`]), their demoting ([`memnic_ethdev::demote::xstats`]),
    /// their write-ahead ([`memnic_ethdev::ahead::xstats`]) and the receive queues' hold-off
    /// ([`memnic_ethdev::holdoff::xstats`]).
    fn xstats(&self) -> Vec<(&'static str, u64)> {
        let mut x = memnic_ethdev::tuner::xstats(
            self.rx_cells.iter().map(|c| c.snapshot()),
            self.tx_cells.iter().map(|c| c.snapshot()),
        );
        x.extend(memnic_ethdev::demote::xstats(
            self.tx_cells.iter().map(|c| c.snapshot()),
        ));
        x.extend(memnic_ethdev::ahead::xstats(
            self.tx_cells.iter().map(|c| c.snapshot()),
        ));
        x.extend(memnic_ethdev::holdoff::xstats(
            self.rx_cells.iter().map(|c| c.snapshot()),
        ));
        x
    }

    /// The control channel: accept or connect, run the handshake, notice the peer leaving.
    fn service(&mut self) {
        if Instant::now() >= self.next_unjam {
            self.next_unjam = Instant::now() + UNJAM_EVERY;
            self.unjam_kicks();
        }
        let broken = self.broken.take();
        if self.peer_memory_faulted() {
            // The peer shrank a region it gave us: shm's SIGBUS guard put zero pages in its
            // place (what a queue read from it since is garbage, and may have flagged `broken`).
            self.disconnect(PEER_SHRANK, true);
        } else if let Some(why) = broken {
            self.disconnect(why, true);
        }
        match &self.phase {
            Phase::Listening => self.server_accept(),
            Phase::Idle { .. } | Phase::Connecting { .. } | Phase::AwaitHello { .. } => {
                self.client_advance()
            }
            Phase::Handshake(_) | Phase::Connected(_) => {
                // Answer clients of the other interfaces on our socket (or refuse ours: busy).
                if let Some(l) = &self.listener {
                    let _ = l.poll(self.cfg.id, false);
                }
            }
        }
        self.pump();
        self.expire_handshake();
    }

    /// While the port connects, every few milliseconds (a client's connect on its helper
    /// thread and the clients greeted on our socket are looked at then); once connected, when
    /// the jammed interrupt lines are next looked for ([`UNJAM_EVERY`]): a queue's `broken`
    /// and a shrunk region wait that long at most. The peer's messages and leaving, and a
    /// client connecting, wake the control thread at once ([`Port::control_fds`]).
    fn service_interval(&self) -> Option<Duration> {
        Some(match self.phase {
            Phase::Connected(_) => self.next_unjam.saturating_duration_since(Instant::now()),
            _ => SETUP_SERVICE,
        })
    }

    /// The listening socket (a server's: a client connecting, on any interface it serves) and
    /// the connection to the peer (its handshake messages, a DISCONNECT, its leaving). A client
    /// still connecting (on a helper thread) and clients greeted but not yet heard from wait
    /// for the next [`Port::service_interval`].
    fn control_fds(&self) -> Vec<BorrowedFd<'_>> {
        let conn = match &self.phase {
            Phase::AwaitHello { conn, .. } => Some(conn),
            Phase::Handshake(h) => Some(&h.conn),
            Phase::Connected(s) => s.conn.as_ref(),
            Phase::Idle { .. } | Phase::Connecting { .. } | Phase::Listening => None,
        };
        let listener = self.listener.as_ref().map(|l| l.as_fd());
        conn.map(|c| c.as_fd())
            .into_iter()
            .chain(listener)
            .collect()
    }

    fn needs_own_shared_pool(&self) -> bool {
        self.cfg.zero_copy
    }

    fn queue_memory(&self, rx: bool, q: u16) -> Vec<QueueMemory> {
        let Phase::Connected(s) = &self.phase else {
            return Vec::new();
        };
        let conn = if rx {
            s.rx.get(q as usize)
        } else {
            s.tx.get(q as usize)
        };
        match conn.cloned().flatten() {
            Some(c) => vec![QueueMemory {
                region: c.ring.region().clone(),
                offset: c.ring.offset(),
                len: ring_bytes(c.ring.log2()),
            }],
            None => Vec::new(),
        }
    }
}

fn set_at(v: &mut Vec<Option<usize>>, q: u16, p: usize) {
    if v.len() <= q as usize {
        v.resize(q as usize + 1, None);
    }
    v[q as usize] = Some(p);
}

fn take(
    slots: &mut Vec<Arc<QueueSlot>>,
    cells: &mut Vec<Arc<StatsCell>>,
    q: u16,
    port: &str,
    dir: &'static str,
) -> Result<(), PortError> {
    if q >= MAX_QUEUES {
        return Err(PortError::NoSuchQueue {
            port: port.to_string(),
            dir,
            queue: q,
            max: MAX_QUEUES,
        });
    }
    while slots.len() <= q as usize {
        slots.push(Arc::new(QueueSlot::default()));
        cells.push(StatsCell::new());
    }
    if Arc::strong_count(&slots[q as usize]) > 1 {
        return Err(PortError::QueueTaken {
            port: port.to_string(),
            dir,
            queue: q,
        });
    }
    Ok(())
}

impl Drop for MemifPort {
    fn drop(&mut self) {
        if matches!(
            self.phase,
            Phase::Connected(_) | Phase::Handshake(_) | Phase::AwaitHello { .. }
        ) {
            self.disconnect("interface closed", true);
        }
        if let Some(l) = &self.listener {
            l.unregister(self.cfg.id);
        }
    }
}

/// Opens a memif port from devargs.
pub fn open(a: &Devargs) -> Result<Box<dyn Port>, MemifError> {
    let cfg = MemifConfig::from_devargs(a)?;
    Ok(Box::new(MemifPort::new(&a.name, cfg)?))
}

/// The memif driver for the devargs registry (`--vdev memif0,role=server,socket=...`).
pub const DRIVER: memnic_ethdev::Driver = memnic_ethdev::Driver {
    name: "memif",
    keys: DEVARGS_KEYS,
    open: |a| open(a).map_err(|e| e.into()),
};
