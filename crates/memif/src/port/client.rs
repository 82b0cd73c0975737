//! The client role: connect, read HELLO, lay out region 0 and its rings (`specs/memif.md` §4),
//! and send the handshake one message per reply.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use memnic_shm::unix::{poll, EventFd, PollFd, SeqpacketConn};
use memnic_shm::Region;

use super::{Handshake, MemifPort, Phase, Session};
use crate::msg::{self, AddRegion, AddRing, Init, InterfaceMode, Msg, Name, RingDirection, Secret};
use crate::queue::{Conn, Role};
use crate::ring::{ring_bytes, Regions, Ring, RING_FLAG_MASK_INT};

impl MemifPort {
    /// Client: connect, read HELLO, build the regions and rings, queue the handshake.
    pub(super) fn client_start(&mut self) -> Result<(), String> {
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

    /// Client: one reply of the handshake.
    pub(super) fn client_step(&mut self, m: Msg) -> Result<(), String> {
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
}
