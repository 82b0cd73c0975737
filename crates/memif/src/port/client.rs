//! The client role: connect without blocking the control thread, read HELLO, lay out region 0
//! and its rings (`specs/memif.md` §4), and send the handshake one message per reply.
//!
//! Each step has [`MemifConfig::handshake_timeout`](super::MemifConfig::handshake_timeout):
//! connecting (on a helper thread: a blocking `connect` waits while the server's backlog is
//! full), HELLO, every ACK, CONNECTED. `Port::service` only ever looks whether the step is done.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memnic_shm::unix::{EventFd, SeqpacketConn};
use memnic_shm::Region;

use super::{Handshake, MemifPort, Phase, Refusal, Session};
use crate::msg::{
    self, AddRegion, AddRing, Hello, Init, InterfaceMode, Msg, MsgType, Name, RingDirection,
};
use crate::queue::{Conn, Role};
use crate::ring::{ring_bytes, Regions, Ring};
use crate::socket::{read_msg, Read};

/// What the client waits for in its handshake: an ACK for each message until CONNECT is sent,
/// then CONNECTED.
pub(super) fn awaited(h: &Handshake) -> MsgType {
    if h.queue.is_empty() {
        MsgType::Connected
    } else {
        MsgType::Ack
    }
}

fn refuse(conn: &SeqpacketConn, reason: &str) {
    let _ = conn.send(&Msg::disconnect(reason).encode(), &[]);
}

impl MemifPort {
    /// Client: takes the attempt to connect as far as it goes without waiting: starts a connect
    /// when one is due, takes its result, reads HELLO and sends INIT.
    pub(super) fn client_advance(&mut self) {
        if let Phase::Idle { retry_at, since } = &self.phase {
            let (retry_at, since) = (*retry_at, *since);
            if Instant::now() < retry_at {
                return;
            }
            if let Err(e) = self.start_connect(since) {
                self.attempt_failed(e, since);
                return;
            }
        }
        if let Phase::Connecting { .. } = &self.phase {
            self.poll_connect();
        }
        if let Phase::AwaitHello { .. } = &self.phase {
            self.poll_hello();
        }
    }

    /// An attempt failed before the handshake: remember why and retry later.
    fn attempt_failed(&mut self, reason: String, since: Instant) {
        self.last_reason = Some(reason);
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

    /// Starts `connect` on a helper thread (one at a time: not while an abandoned one still
    /// blocks).
    fn start_connect(&mut self, since: Instant) -> Result<(), String> {
        if let Some(done) = &self.abandoned_connect {
            match done.try_recv() {
                Err(TryRecvError::Empty) => {
                    return Err(format!(
                        "connect to {} is still blocked: the server accepts no connections",
                        self.addr()
                    ))
                }
                // Its connection, if it made one, closes here.
                Ok(_) | Err(TryRecvError::Disconnected) => self.abandoned_connect = None,
            }
        }
        let (tx, done) = mpsc::sync_channel(1);
        let addr = self.addr();
        std::thread::Builder::new()
            .name("memif-connect".into())
            .spawn(move || {
                let _ = tx.send(SeqpacketConn::connect(&addr));
            })
            .map_err(|e| format!("cannot start a thread to connect to {}: {e}", self.addr()))?;
        self.phase = Phase::Connecting {
            done,
            deadline: self.step_deadline(),
            since,
        };
        Ok(())
    }

    /// Has the connect finished (or run out of time)?
    fn poll_connect(&mut self) {
        let phase = std::mem::replace(&mut self.phase, Phase::Listening);
        let Phase::Connecting {
            done,
            deadline,
            since,
        } = phase
        else {
            self.phase = phase;
            return;
        };
        match done.try_recv() {
            Ok(Ok(conn)) => match conn.set_nonblocking(true) {
                Ok(()) => {
                    self.phase = Phase::AwaitHello {
                        conn,
                        deadline: self.step_deadline(),
                        since,
                    }
                }
                Err(e) => self.attempt_failed(e.to_string(), since),
            },
            Ok(Err(e)) => self.attempt_failed(e.to_string(), since),
            Err(TryRecvError::Empty) if Instant::now() < deadline => {
                self.phase = Phase::Connecting {
                    done,
                    deadline,
                    since,
                }
            }
            Err(TryRecvError::Empty) => {
                self.abandoned_connect = Some(done);
                let why = format!(
                    "connect to {} timed out after {:?}",
                    self.addr(),
                    self.cfg.handshake_timeout
                );
                self.attempt_failed(why, since);
            }
            Err(TryRecvError::Disconnected) => {
                self.attempt_failed("the connect thread ended without a result".into(), since)
            }
        }
    }

    /// Has the server greeted us? Then lay out the regions and send INIT.
    fn poll_hello(&mut self) {
        let phase = std::mem::replace(&mut self.phase, Phase::Listening);
        let Phase::AwaitHello {
            conn,
            deadline,
            since,
        } = phase
        else {
            self.phase = phase;
            return;
        };
        match read_msg(&conn) {
            Read::Nothing if Instant::now() < deadline => {
                self.phase = Phase::AwaitHello {
                    conn,
                    deadline,
                    since,
                }
            }
            Read::Nothing => {
                let why = "Timeout waiting for HELLO";
                refuse(&conn, why);
                self.attempt_failed(why.into(), since);
            }
            Read::Closed(why) => self.attempt_failed(why, since),
            Read::Bad(why) => {
                refuse(&conn, why);
                self.attempt_failed(why.into(), since);
            }
            Read::Msg(Msg::Hello(hello), _) => match self.begin_handshake(conn, &hello) {
                Ok(h) => self.phase = Phase::Handshake(h),
                Err(why) => self.attempt_failed(why, since),
            },
            Read::Msg(Msg::Disconnect(d), _) => {
                let why = format!("peer: {}", d.reason.to_string_lossy());
                self.attempt_failed(why, since);
            }
            Read::Msg(m, _) => {
                let why = format!("Unexpected {}", m.msg_type());
                refuse(&conn, &why);
                self.attempt_failed(why, since);
            }
        }
    }

    /// Client: after HELLO, build the regions and rings, queue the handshake and send INIT.
    fn begin_handshake(
        &mut self,
        conn: SeqpacketConn,
        hello: &Hello,
    ) -> Result<Box<Handshake>, String> {
        if let Err(e) = hello.check_version() {
            refuse(&conn, e.reason());
            return Err(e.to_string());
        }
        let nq = self.nq().max(1);
        let n = hello.negotiate(nq, nq, self.cfg.log2_ring_size);
        let (session, region_fd, size, rings) =
            self.client_layout(n.c2s_rings, n.s2c_rings, n.log2_ring_size)?;
        let mut queue: Vec<(Msg, Option<OwnedFd>)> = Vec::new();
        queue.push((
            Msg::Init(Init {
                version: msg::VERSION,
                id: self.cfg.id,
                mode: InterfaceMode::Ethernet,
                secret: self.secret.clone(),
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
            ..Handshake::new(conn, self.step_deadline())
        };
        Self::send_next(&mut h)?;
        Ok(Box::new(h))
    }

    fn send_next(h: &mut Handshake) -> Result<(), String> {
        if let Some((m, fd)) = h.queue.pop() {
            let fds: Vec<_> = fd.iter().map(|f| f.as_fd()).collect();
            h.conn.send(&m.encode(), &fds).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Client: region 0 with `c2s` + `s2c` rings of 2^log2 slots and their buffers (§4), its
    /// rings initialised, one eventfd per ring.
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
        let mut session = Session::new(self.nq() as usize);
        let mut adds = Vec::new();
        for g in 0..nrings {
            let (dir, index) = if g < c2s as usize {
                (RingDirection::C2S, g)
            } else {
                (RingDirection::S2C, g - c2s as usize)
            };
            let ring = Ring::new(region.clone(), g * rb, log2).map_err(|e| e.to_string())?;
            ring.init();
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
            session.attach(dir, index, conn);
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
        Ok((session, fd, size, adds))
    }

    /// Client: one reply of the handshake: an ACK sends the next message, CONNECTED (only once
    /// CONNECT is sent) brings the link up; anything else is refused.
    pub(super) fn client_step(&mut self, m: Msg) -> Result<(), Refusal> {
        let Phase::Handshake(h) = &mut self.phase else {
            return Ok(());
        };
        let got = m.msg_type();
        if got != awaited(h) {
            return Err(format!("Unexpected {got}").into());
        }
        if got == MsgType::Ack {
            return Ok(Self::send_next(h)?);
        }
        let Some(mut h) = self.take_handshake() else {
            return Ok(());
        };
        let Some(s) = h.prepared.take() else {
            return Err("Unexpected CONNECTED".into());
        };
        self.connected(h.conn, s);
        Ok(())
    }
}
