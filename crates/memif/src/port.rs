//! A memif interface as a memnic port: the control channel (client and server roles, lock-step
//! handshake, disconnect and reconnect) driven from `Port::service`, and the queues of
//! [`crate::queue`].
//!
//! The client allocates everything (`specs/memif.md` §4): region 0 is one memfd holding the C2S
//! rings, the S2C rings, then one buffer of `bsize` bytes per slot. The server maps only what it
//! is given and validates it.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memnic_ethdev::gate::Gate;
use memnic_ethdev::{
    Devargs, DevargsError, LinkStatus, MacAddr, Mempool, Port, PortError, PortInfo, QueueMemory,
    QueueStats, RxQueue, StatsCell, TxQueue,
};
use memnic_shm::unix::{poll, EventFd, PollFd, SeqpacketConn, SocketAddrSpec};
use memnic_shm::Region;

use crate::msg::{
    self, AddRegion, AddRing, Init, InterfaceMode, Msg, MsgError, Name, RingDirection, Secret,
};
use crate::queue::{Broken, Conn, MemifRxQueue, MemifTxQueue, QueueCore, QueueSlot, Role};
use crate::ring::{ring_bytes, Regions, Ring, RING_FLAG_MASK_INT};
use crate::socket::{read_msg, Read, RegisterError, SharedListener};

/// Devargs keys, DPDK's names.
pub const DEVARGS_KEYS: &[&str] = &[
    "role",
    "socket",
    "socket-abstract",
    "id",
    "secret",
    "rsize",
    "bsize",
    "zero-copy",
    "mac",
];

/// Most queue pairs a port offers.
pub const MAX_QUEUES: u16 = 16;

/// Errors of the memif driver.
#[derive(Debug, thiserror::Error)]
pub enum MemifError {
    #[error(transparent)]
    Devargs(#[from] DevargsError),
    #[error(transparent)]
    Shm(#[from] memnic_shm::ShmError),
    #[error(transparent)]
    Socket(#[from] RegisterError),
}

/// How a memif port is set up.
#[derive(Debug, Clone)]
pub struct MemifConfig {
    pub role: Role,
    pub socket: String,
    pub is_abstract: bool,
    pub id: u32,
    pub secret: Option<String>,
    pub log2_ring_size: u8,
    pub bsize: u32,
    pub mac: MacAddr,
    /// How long a client keeps retrying before giving up (reported as link down).
    pub connect_patience: Duration,
    /// Client: descriptors point straight at pool buffers (pools must live in a memfd, which
    /// is sent as a region); a server ignores it, as DPDK's does.
    pub zero_copy: bool,
}

impl MemifConfig {
    pub fn new(role: Role, socket: impl Into<String>) -> MemifConfig {
        MemifConfig {
            role,
            socket: socket.into(),
            is_abstract: false,
            id: 0,
            secret: None,
            log2_ring_size: 10,
            bsize: 2048,
            mac: MacAddr([2, 0xfe, 0, 0, 0, 0]),
            connect_patience: Duration::from_secs(30),
            zero_copy: false,
        }
    }

    /// Reads DPDK-style devargs: `memif0,role=server,socket=/run/memif.sock,id=0,...`.
    pub fn from_devargs(a: &Devargs) -> Result<MemifConfig, MemifError> {
        let role = match a.choice_or("role", &["server", "client", "master", "slave"], "client")? {
            "server" | "master" => Role::Server,
            _ => Role::Client,
        };
        let mut c = MemifConfig::new(role, a.get("socket").unwrap_or("/run/memif.sock"));
        c.is_abstract = a.bool_or("socket-abstract", false)?;
        c.id = a.parse_or("id", 0u32)?;
        c.secret = a.get("secret").map(str::to_string);
        if let Some(s) = &c.secret {
            if s.len() > msg::SECRET_SIZE - 1 {
                return Err(a.bad("secret", s, "at most 23 bytes").into());
            }
        }
        c.log2_ring_size = a.parse_or("rsize", 10u8)?;
        if !(1..=14).contains(&c.log2_ring_size) {
            return Err(a
                .bad(
                    "rsize",
                    &c.log2_ring_size.to_string(),
                    "log2 of the ring size, 1..=14",
                )
                .into());
        }
        c.bsize = a.parse_or("bsize", 2048u32)?;
        if !(64..=65536).contains(&c.bsize) {
            return Err(a
                .bad(
                    "bsize",
                    &c.bsize.to_string(),
                    "buffer size in bytes, 64..=65536",
                )
                .into());
        }
        c.zero_copy = a.bool_or("zero-copy", false)? && role == Role::Client;
        if let Some(m) = a.get("mac") {
            c.mac = m.parse().map_err(|e: String| a.bad("mac", m, e))?;
        }
        Ok(c)
    }
}

/// Where the handshake is.
enum Phase {
    /// Client: not connected; next attempt at this time.
    Idle {
        retry_at: Instant,
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
    /// Client: messages still to send, one per reply.
    queue: Vec<(Msg, Option<OwnedFd>)>,
    /// Client: what was prepared for this connection.
    prepared: Option<Session>,
    /// Server: what the client has announced so far.
    regions: Vec<Arc<Region>>,
    rings: Vec<(AddRing, Arc<EventFd>)>,
    inited: bool,
}

impl Handshake {
    fn new(conn: SeqpacketConn) -> Handshake {
        Handshake {
            conn,
            queue: Vec::new(),
            prepared: None,
            regions: Vec::new(),
            rings: Vec::new(),
            inited: false,
        }
    }
}

/// A live connection: the socket and what the queues use.
struct Session {
    conn: Option<SeqpacketConn>,
    /// Per queue: (rx conn, tx conn).
    rx: Vec<Option<Conn>>,
    tx: Vec<Option<Conn>>,
}

/// A memif port.
pub struct MemifPort {
    name: String,
    cfg: MemifConfig,
    phase: Phase,
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
    /// Connections made and lost, and the last disconnect reason (ours or the peer's).
    pub connects: u64,
    pub disconnects: u64,
    pub last_reason: Option<String>,
}

impl MemifPort {
    pub fn new(name: &str, cfg: MemifConfig) -> Result<MemifPort, MemifError> {
        let addr = SocketAddrSpec::memif(&cfg.socket, cfg.is_abstract);
        let (listener, phase) = match cfg.role {
            Role::Server => (
                Some(SharedListener::register(&addr, cfg.id)?),
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
            phase,
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
        while self.gate.reset(None, Duration::from_secs(1), set).is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Release pairs with the Acquire in `link`.
        self.link_up.store(s.is_some(), Release);
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
            _ => None,
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

    /// Client: connect, read HELLO, build the regions and rings, queue the handshake.
    fn client_start(&mut self) -> Result<(), String> {
        let conn = SeqpacketConn::connect(&self.addr()).map_err(|e| e.to_string())?;
        let mut buf = [0u8; 256];
        // The server greets at once; one that does not is not waited for forever.
        let mut pfd = [PollFd::readable(conn.as_fd())];
        if poll(&mut pfd, Some(Duration::from_secs(2))).map_err(|e| e.to_string())? == 0 {
            return Err("the server sent no HELLO within 2 s".into());
        }
        let got = conn.recv(&mut buf).map_err(|e| e.to_string())?;
        if got.is_eof() {
            return Err("the server closed the connection".into());
        }
        let hello = match Msg::decode(&buf[..got.len]) {
            Ok(Msg::Hello(h)) => h,
            Ok(m) => return Err(format!("expected HELLO, got {}", m.msg_type())),
            Err(e) => return Err(e.to_string()),
        };
        if let Err(e) = hello.check_version() {
            let _ = conn.send(&e.to_disconnect().encode(), &[]);
            return Err(e.to_string());
        }
        let nq = self.nq().max(1);
        let n = hello.negotiate(nq, nq, self.cfg.log2_ring_size);
        let (session, region_fd, size, rings) =
            self.client_layout(n.c2s_rings, n.s2c_rings, n.log2_ring_size)?;
        let mut queue: Vec<(Msg, Option<OwnedFd>)> = Vec::new();
        let secret = match &self.cfg.secret {
            Some(s) => Secret::try_from(s.as_str()).map_err(|e| e.to_string())?,
            None => Secret::empty(),
        };
        queue.push((
            Msg::Init(Init {
                version: msg::VERSION,
                id: self.cfg.id,
                mode: InterfaceMode::Ethernet,
                secret,
                name: Name::truncated("memnic"),
            }),
            None,
        ));
        queue.push((
            Msg::AddRegion(AddRegion {
                index: 0,
                size: size as u64,
            }),
            Some(region_fd),
        ));
        if self.cfg.zero_copy {
            for (i, pool) in self.pools.iter().enumerate() {
                let r = pool.region();
                let Some(fd) = r.fd() else { continue };
                let fd = fd.try_clone_to_owned().map_err(|e| e.to_string())?;
                queue.push((
                    Msg::AddRegion(AddRegion {
                        index: 1 + i as u16,
                        size: r.len() as u64,
                    }),
                    Some(fd),
                ));
            }
        }
        for (add, fd) in rings {
            queue.push((Msg::AddRing(add), Some(fd)));
        }
        queue.push((
            Msg::Connect {
                if_name: Name::truncated(&self.name),
            },
            None,
        ));
        queue.reverse(); // popped from the back
        let mut h = Handshake {
            queue,
            prepared: Some(session),
            ..Handshake::new(conn)
        };
        h.conn.set_nonblocking(true).map_err(|e| e.to_string())?;
        Self::send_next(&mut h)?;
        self.phase = Phase::Handshake(Box::new(h));
        Ok(())
    }

    fn send_next(h: &mut Handshake) -> Result<(), String> {
        if let Some((m, fd)) = h.queue.pop() {
            let fds: Vec<_> = fd.iter().map(|f| f.as_fd()).collect();
            h.conn.send(&m.encode(), &fds).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Client: region 0 with `c2s` + `s2c` rings of 2^log2 slots and their buffers (§4).
    #[allow(clippy::type_complexity)]
    fn client_layout(
        &self,
        c2s: u16,
        s2c: u16,
        log2: u8,
    ) -> Result<(Session, OwnedFd, usize, Vec<(AddRing, OwnedFd)>), String> {
        // Zero copy: pools that live in a memfd become regions 1, 2, ...
        let zc_region = |pool: Option<usize>| -> Option<u16> {
            let p = pool?;
            (self.cfg.zero_copy && self.pools[p].region().fd().is_some()).then_some(1 + p as u16)
        };
        let rb = ring_bytes(log2);
        let nrings = c2s as usize + s2c as usize;
        let slots = 1usize << log2;
        let buffer_offset = nrings * rb;
        let size = buffer_offset + nrings * slots * self.cfg.bsize as usize;
        let region =
            Arc::new(Region::memfd("memif_region_0", size, false).map_err(|e| e.to_string())?);
        let fd = region
            .fd()
            .expect("memfd")
            .try_clone_to_owned()
            .map_err(|e| e.to_string())?;
        let regions = Regions(vec![region.clone()]);
        let nq = self.nq() as usize;
        let mut rx = vec![None; nq];
        let mut tx = vec![None; nq];
        let mut adds = Vec::new();
        for g in 0..nrings {
            let (dir, index) = if g < c2s as usize {
                (RingDirection::C2S, g)
            } else {
                (RingDirection::S2C, g - c2s as usize)
            };
            let ring = Ring::new(region.clone(), g * rb, log2).map_err(|e| e.to_string())?;
            ring.init();
            if dir == RingDirection::S2C {
                // We receive on S2C rings and poll them: do not kick us.
                ring.flags().store(RING_FLAG_MASK_INT, Relaxed);
            }
            let irq = Arc::new(EventFd::new().map_err(|e| e.to_string())?);
            let irq_fd = irq
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| e.to_string())?;
            let conn = Conn {
                role: Role::Client,
                ring,
                regions: regions.clone(),
                buffers: Some((
                    buffer_offset + g * slots * self.cfg.bsize as usize,
                    self.cfg.bsize,
                )),
                irq: Some(irq),
                zero_copy_region: match dir {
                    RingDirection::C2S => zc_region(self.tx_pool.get(index).copied().flatten()),
                    RingDirection::S2C => zc_region(self.rx_pool.get(index).copied().flatten()),
                },
            };
            match dir {
                RingDirection::C2S if index < nq => tx[index] = Some(conn),
                RingDirection::S2C if index < nq => rx[index] = Some(conn),
                _ => {}
            }
            adds.push((
                AddRing {
                    direction: dir,
                    index: index as u16,
                    region: 0,
                    offset: (g * rb) as u32,
                    log2_ring_size: log2,
                },
                irq_fd,
            ));
        }
        Ok((Session { conn: None, rx, tx }, fd, size, adds))
    }

    /// Server: take a client whose INIT named our id (the shared socket greeted it) and check
    /// that INIT.
    fn server_accept(&mut self) {
        let Some(l) = &self.listener else { return };
        let Some(p) = l.poll(self.cfg.id, true) else {
            return;
        };
        self.phase = Phase::Handshake(Box::new(Handshake::new(p.conn)));
        if let Err(reason) = self.server_step(Msg::Init(p.init), None) {
            self.disconnect(&reason, true);
        }
    }

    /// Server: one message of the handshake. Err(reason) disconnects.
    fn server_step(&mut self, m: Msg, fd: Option<OwnedFd>) -> Result<(), String> {
        let r = |e: MsgError| e.reason().to_string();
        let nq = self.nq() as usize;
        let Phase::Handshake(h) = &mut self.phase else {
            return Ok(());
        };
        match m {
            Msg::Init(init) if !h.inited => {
                init.check_version().map_err(r)?;
                if init.id != self.cfg.id {
                    return Err("ID not found".into());
                }
                init.check_mode().map_err(r)?;
                let expected = match &self.cfg.secret {
                    Some(s) => Secret::try_from(s.as_str()).unwrap_or_default(),
                    None => Secret::empty(),
                };
                init.check_secret(&expected).map_err(r)?;
                h.inited = true;
            }
            Msg::AddRegion(reg) if h.inited => {
                let r = reg;
                let r_ = |e: MsgError| e.reason().to_string();
                r.check_next(h.regions.len()).map_err(r_)?;
                let fd = fd.ok_or("Missing region fd")?;
                let file = std::fs::File::from(fd);
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                r.check_file_size(len).map_err(r_)?;
                let region = Region::from_fd(file.into(), r.size as usize)
                    .map_err(|e| format!("Failed to map region: {e}"))?;
                h.regions.push(Arc::new(region));
            }
            Msg::AddRing(ring) if h.inited => {
                let e = |e: MsgError| e.reason().to_string();
                ring.check_index((nq.max(1) as u16).min(MAX_QUEUES))
                    .map_err(e)?;
                ring.check_size(msg::MAX_LOG2_RING_SIZE).map_err(e)?;
                ring.check_region(h.regions.len()).map_err(e)?;
                ring.check_in_region(h.regions[ring.region as usize].len() as u64)
                    .map_err(e)?;
                let r = ring;
                let fd = fd.ok_or("Missing interrupt fd")?;
                let irq = EventFd::from_fd(fd).map_err(|_| "Invalid interrupt fd".to_string())?;
                h.rings.push((r, Arc::new(irq)));
            }
            Msg::Connect { .. } if h.inited => {
                let regions = Regions(h.regions.clone());
                let mut rx = vec![None; nq];
                let mut tx = vec![None; nq];
                for (r, irq) in &h.rings {
                    let ring = Ring::checked(
                        h.regions[r.region as usize].clone(),
                        r.offset as usize,
                        r.log2_ring_size,
                    )
                    .map_err(|_| "Wrong ring".to_string())?;
                    // Both counters start at 0 on connect.
                    ring.head().store(0, Relaxed);
                    ring.tail().store(0, Relaxed);
                    if r.direction == RingDirection::C2S {
                        // We receive on C2S rings and poll them.
                        ring.flags().store(RING_FLAG_MASK_INT, Relaxed);
                    }
                    let conn = Conn {
                        role: Role::Server,
                        ring,
                        regions: regions.clone(),
                        buffers: None,
                        irq: Some(irq.clone()),
                        zero_copy_region: None,
                    };
                    let i = r.index as usize;
                    match r.direction {
                        RingDirection::C2S if i < nq => rx[i] = Some(conn),
                        RingDirection::S2C if i < nq => tx[i] = Some(conn),
                        _ => {}
                    }
                }
                let reply = Msg::Connected {
                    if_name: Name::truncated(&self.name),
                };
                let Phase::Handshake(h) = std::mem::replace(&mut self.phase, Phase::Listening)
                else {
                    unreachable!()
                };
                let _ = h.conn.send(&reply.encode(), &[]);
                let s = Session {
                    conn: Some(h.conn),
                    rx,
                    tx,
                };
                self.install(Some(&s));
                self.phase = Phase::Connected(Box::new(s));
                self.connects += 1;
                return Ok(());
            }
            _ => return Err("Unexpected message".into()),
        }
        let _ = h.conn.send(&Msg::Ack.encode(), &[]);
        Ok(())
    }

    /// Client: one reply of the handshake.
    fn client_step(&mut self, m: Msg) -> Result<(), String> {
        let Phase::Handshake(h) = &mut self.phase else {
            return Ok(());
        };
        match m {
            Msg::Ack => Self::send_next(h),
            Msg::Connected { .. } => {
                let Phase::Handshake(mut h) = std::mem::replace(&mut self.phase, Phase::Listening)
                else {
                    unreachable!()
                };
                let mut s = h.prepared.take().expect("client prepared a session");
                s.conn = Some(h.conn);
                self.install(Some(&s));
                self.phase = Phase::Connected(Box::new(s));
                self.connects += 1;
                Ok(())
            }
            other => Err(format!(
                "unexpected {} during the handshake",
                other.msg_type()
            )),
        }
    }

    /// Reads what the peer sent; returns false when the connection is gone.
    fn pump(&mut self) {
        loop {
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
            let res = match (self.cfg.role, self.is_connected()) {
                (_, true) => Err("Unexpected message".to_string()),
                (Role::Server, false) => self.server_step(m, fds.pop()),
                (Role::Client, false) => self.client_step(m),
            };
            if let Err(reason) = res {
                self.disconnect(&reason, true);
                return;
            }
        }
    }
}

impl Port for MemifPort {
    fn needs_own_shared_pool(&self) -> bool {
        self.cfg.zero_copy
    }

    fn info(&self) -> PortInfo {
        PortInfo {
            driver: "net_memif",
            name: self.name.clone(),
            mac: self.cfg.mac,
            max_frame_len: 9018,
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
        take(&mut self.rx_slots, &mut self.rx_cells, q, &self.name, "rx")?;
        let p = self.pool_index(pool);
        set_at(&mut self.rx_pool, q, p);
        let core = QueueCore::new(
            self.gate.join(),
            self.rx_slots[q as usize].clone(),
            self.broken.clone(),
            pool.cache(),
            self.rx_cells[q as usize].clone(),
        );
        Ok(Box::new(MemifRxQueue::new(core)))
    }

    fn take_tx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn TxQueue>, PortError> {
        take(&mut self.tx_slots, &mut self.tx_cells, q, &self.name, "tx")?;
        let p = self.pool_index(pool);
        set_at(&mut self.tx_pool, q, p);
        let core = QueueCore::new(
            self.gate.join(),
            self.tx_slots[q as usize].clone(),
            self.broken.clone(),
            pool.cache(),
            self.tx_cells[q as usize].clone(),
        );
        Ok(Box::new(MemifTxQueue::new(core)))
    }

    fn queue_stats(&self) -> (Vec<QueueStats>, Vec<QueueStats>) {
        (
            self.rx_cells.iter().map(|c| c.snapshot()).collect(),
            self.tx_cells.iter().map(|c| c.snapshot()).collect(),
        )
    }

    /// The control channel: accept or connect, run the handshake, notice the peer leaving.
    fn service(&mut self) {
        if let Some(why) = self.broken.take() {
            self.disconnect(why, true);
        }
        match &self.phase {
            Phase::Listening => self.server_accept(),
            Phase::Idle { retry_at, since } => {
                let (retry_at, since) = (*retry_at, *since);
                if Instant::now() >= retry_at {
                    if let Err(e) = self.client_start() {
                        self.last_reason = Some(e);
                        let gave_up = since.elapsed() > self.cfg.connect_patience;
                        let wait = if gave_up {
                            Duration::from_secs(1)
                        } else {
                            Duration::from_millis(50)
                        };
                        self.phase = Phase::Idle {
                            retry_at: Instant::now() + wait,
                            since,
                        };
                    }
                }
            }
            _ => {
                // Answer clients of the other interfaces on our socket (or refuse ours: busy).
                if let Some(l) = &self.listener {
                    let _ = l.poll(self.cfg.id, false);
                }
            }
        }
        self.pump();
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
        if self.is_connected() {
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
