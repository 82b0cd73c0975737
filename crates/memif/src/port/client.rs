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

use memnic_shm::unix::{closers_busy, EventFd, SeqpacketConn};
use memnic_shm::Region;

use super::{Handshake, MemifError, MemifPort, Phase, Refusal, Session};
use crate::msg::{
    self, AddRegion, AddRing, Hello, Init, InterfaceMode, Msg, MsgType, Name, RingDirection,
    APP_NAME, DESC_SIZE, MAX_LOG2_RING_SIZE, RING_HEADER_SIZE,
};
use crate::queue::{Conn, Role};
use crate::ring::{Regions, Ring};
use crate::socket::{read_msg, Read};

/// Region 0 of a client (spec §4): the C2S rings, the S2C rings, then one buffer of `bsize`
/// bytes per slot, ring by ring. Descriptor and ADD_RING offsets are u32 on the wire, so the
/// region may not pass 4 GiB; [`Layout::new`] refuses one that would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    pub size: u64,
    pub log2: u8,
    pub bsize: u32,
    pub rings: Vec<RingPlace>,
}

/// Where one ring and its buffers lie in region 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RingPlace {
    pub direction: RingDirection,
    pub index: u16,
    /// The ring header.
    pub offset: u32,
    /// The buffer of its slot 0; slot j's is `bsize · j` further.
    pub buffers: u32,
}

/// The most bytes region 0 may have: every offset in it then fits a u32.
const REGION_LIMIT: u64 = 1 << 32;

impl Layout {
    pub fn new(c2s: u16, s2c: u16, log2: u8, bsize: u32) -> Result<Layout, MemifError> {
        if log2 > MAX_LOG2_RING_SIZE {
            return Err(MemifError::RingSize { log2 });
        }
        let rings = u64::from(c2s) + u64::from(s2c);
        let slots = 1u64 << log2;
        let ring_bytes = RING_HEADER_SIZE + DESC_SIZE * slots;
        let per_ring = slots * u64::from(bsize);
        // No overflow in u64: rings < 2^17, slots <= 2^14, bsize < 2^32.
        let buffer_offset = rings * ring_bytes;
        let size = buffer_offset + rings * per_ring;
        let too_large = || MemifError::RegionTooLarge {
            size,
            rings: u32::from(c2s) + u32::from(s2c),
            log2,
            bsize,
        };
        if size > REGION_LIMIT {
            return Err(too_large());
        }
        let offset = |x: u64| u32::try_from(x).map_err(|_| too_large());
        let mut places = Vec::with_capacity(rings as usize);
        for g in 0..rings {
            let (direction, index) = match g.checked_sub(u64::from(c2s)) {
                None => (RingDirection::C2S, g),
                Some(i) => (RingDirection::S2C, i),
            };
            places.push(RingPlace {
                direction,
                index: index as u16, // below c2s or s2c, both u16
                offset: offset(g * ring_bytes)?,
                buffers: offset(buffer_offset + g * per_ring)?,
            });
        }
        Ok(Layout {
            size,
            log2,
            bsize,
            rings: places,
        })
    }
}

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
        if closers_busy(self.server) {
            return Err(self.busy_reason());
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

    /// Whether descriptors the user of the server at the other end of `conn` sent still wait
    /// to close (`closers_busy`): a server that sends us more each time we connect would grow
    /// our descriptor table (see `dispose_from`). Remembers that user: we do not connect again
    /// while it is busy.
    fn busy_server(&mut self, conn: &SeqpacketConn) -> bool {
        self.server = conn.sender();
        closers_busy(self.server)
    }

    fn busy_reason(&self) -> String {
        format!(
            "not connecting to {}: descriptors its user's peers sent have not closed yet",
            self.addr()
        )
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
            Ok(Ok(conn)) if self.busy_server(&conn) => {
                // Closed before its greeting is read; what it queued goes whole to a closer
                // (`close_connection`), and we do not connect again while that user is busy.
                let why = self.busy_reason();
                drop(conn);
                self.attempt_failed(why, since);
            }
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
        let layout = Layout::new(n.c2s_rings, n.s2c_rings, n.log2_ring_size, self.cfg.bsize)
            .map_err(|e| e.to_string())?;
        let (session, region_fd, rings) = self.client_layout(&layout)?;
        let mut queue: Vec<(Msg, Option<OwnedFd>)> = Vec::new();
        queue.push((
            Msg::Init(Init {
                version: msg::VERSION,
                id: self.cfg.id,
                mode: InterfaceMode::Ethernet,
                secret: self.secret.clone(),
                name: Name::truncated(APP_NAME),
            }),
            None,
        ));
        queue.push((
            Msg::AddRegion(AddRegion {
                index: 0,
                size: layout.size,
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

    /// Client: region 0 as `layout` places it, its rings initialised, one eventfd per ring.
    #[allow(clippy::type_complexity)]
    fn client_layout(
        &self,
        layout: &Layout,
    ) -> Result<(Session, OwnedFd, Vec<(AddRing, OwnedFd)>), String> {
        // Zero copy: pools that live in a memfd become regions 1, 2, ...
        let zc_region = |pool: Option<usize>| -> Option<u16> {
            let p = pool?;
            (self.cfg.zero_copy && self.pools[p].region().fd().is_some()).then_some(1 + p as u16)
        };
        let size = usize::try_from(layout.size).map_err(|e| e.to_string())?;
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
        for place in &layout.rings {
            let ring = Ring::new(region.clone(), place.offset as usize, layout.log2)
                .map_err(|e| e.to_string())?;
            ring.init();
            let irq = Arc::new(EventFd::new().map_err(|e| e.to_string())?);
            let irq_fd = irq
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| e.to_string())?;
            let index = usize::from(place.index);
            let conn = Conn {
                role: Role::Client,
                ring,
                regions: regions.clone(),
                buffers: Some((place.buffers as usize, layout.bsize)),
                irq: Some(irq),
                zero_copy_region: match place.direction {
                    RingDirection::C2S => zc_region(self.tx_pool.get(index).copied().flatten()),
                    RingDirection::S2C => zc_region(self.rx_pool.get(index).copied().flatten()),
                },
            };
            session.attach(place.direction, index, conn);
            adds.push((
                AddRing {
                    direction: place.direction,
                    index: place.index,
                    region: 0,
                    offset: place.offset,
                    log2_ring_size: layout.log2,
                },
                irq_fd,
            ));
        }
        Ok((session, fd, adds))
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

    /// Client with queue `q` taken: would region 0 still fit (the most rings and slots the
    /// handshake can settle on)? Server: nothing to lay out.
    pub(super) fn check_layout(&self, q: u16) -> Result<(), MemifError> {
        if self.cfg.role != Role::Client {
            return Ok(());
        }
        let nq = self.nq().max(q.saturating_add(1));
        Layout::new(nq, nq, self.cfg.log2_ring_size, self.cfg.bsize).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_spec_example_and_refuses_past_4_gib() {
        // spec §4: one queue pair, bsize 2048, k = 10: rings of 16,512 B, buffers from 33,024,
        // 4,227,328 B in all.
        let l = Layout::new(1, 1, 10, 2048).unwrap();
        assert_eq!(l.size, 4_227_328);
        assert_eq!(
            l.rings,
            vec![
                RingPlace {
                    direction: RingDirection::C2S,
                    index: 0,
                    offset: 0,
                    buffers: 33_024
                },
                RingPlace {
                    direction: RingDirection::S2C,
                    index: 0,
                    offset: 16_512,
                    buffers: 33_024 + 1024 * 2048
                },
            ]
        );
        // One pair of 2^14 slots of 64 KiB: 2 GiB of buffers and the rings, fits.
        let l = Layout::new(1, 1, 14, 65_536).unwrap();
        assert!(l.size < REGION_LIMIT);
        // Two pairs: the buffers alone are 4 GiB, so the region passes it.
        let e = Layout::new(2, 2, 14, 65_536).unwrap_err();
        assert!(matches!(e, MemifError::RegionTooLarge { .. }), "{e}");
        assert!(e.to_string().contains("4 GiB"), "{e}");
        assert!(matches!(
            Layout::new(1, 1, 15, 2048),
            Err(MemifError::RingSize { log2: 15 })
        ));
    }
}
