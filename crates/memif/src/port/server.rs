//! The server role: take a client the shared socket greeted, check its INIT, collect its regions
//! and rings, and map them at CONNECT.
//!
//! What a client can make us hold is bounded: at most 256 regions (decoding refuses an index
//! above [`MAX_REGION_INDEX`](crate::msg::MAX_REGION_INDEX), what our HELLO advertises, and they
//! come in order), and one ring per direction and queue (an index below our queue count, no
//! repeat), each with one eventfd.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use memnic_shm::unix::EventFd;
use memnic_shm::Region;

use super::{Handshake, MemifPort, Phase, Refusal, Session, MAX_QUEUES};
use crate::msg::{self, Msg, Name, RingDirection};
use crate::queue::{Conn, Role};
use crate::ring::{Regions, Ring};

impl MemifPort {
    /// Server: take a client whose INIT named our id (the shared socket greeted it) and check
    /// that INIT.
    pub(super) fn server_accept(&mut self) {
        let Some(l) = &self.listener else { return };
        let Some(p) = l.poll(self.cfg.id, true) else {
            return;
        };
        self.phase = Phase::Handshake(Box::new(Handshake::new(p.conn, self.step_deadline())));
        if let Err(Refusal(reason)) = self.server_step(Msg::Init(p.init), &mut None) {
            self.disconnect(&reason, true);
        }
    }

    /// Server: one message of the handshake, ACKed; a refusal disconnects with its reason.
    /// `fd`: the message's descriptor, taken when it is kept (the caller disposes of what is
    /// left as the peer's, `memnic_shm::unix::dispose_from`).
    pub(super) fn server_step(&mut self, m: Msg, fd: &mut Option<OwnedFd>) -> Result<(), Refusal> {
        // Rings a client may add in each direction: one per queue we have (at least one).
        let ring_count = self.nq().clamp(1, MAX_QUEUES);
        let Phase::Handshake(h) = &mut self.phase else {
            return Ok(());
        };
        match m {
            Msg::Init(init) if !h.inited => {
                init.check_version()?;
                if init.id != self.cfg.id {
                    return Err("ID not found".into());
                }
                init.check_mode()?;
                init.check_secret(&self.secret)?;
                h.inited = true;
            }
            Msg::AddRegion(r) if h.inited => {
                r.check_next(h.regions.len())?;
                // memfd or hugetlbfs, as DPDK and VPP send: anything else is asked about
                // nothing more (a file on a filesystem the peer serves could hang us).
                // Left in `fd` when refused: the caller disposes of it as the peer's.
                let fd = fd
                    .take_if(|f| Region::is_shared_memory_fd(f.as_fd()))
                    .ok_or(match fd {
                        None => "Missing region fd",
                        Some(_) => "Region fd is not shared memory",
                    })?;
                let file = std::fs::File::from(fd);
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                r.check_file_size(len)?;
                let mapped: u64 = h.regions.iter().map(|r| r.len() as u64).sum();
                // More than one peer may make us map (`MAX_PEER_BYTES`), all regions together.
                if mapped.saturating_add(r.size) > memnic_shm::MAX_PEER_BYTES {
                    return Err("Regions too large".into());
                }
                let region = Region::from_fd(file.into(), r.size as usize)
                    .map_err(|e| format!("Failed to map region: {e}"))?;
                h.regions.push(Arc::new(region));
            }
            Msg::AddRing(ring) if h.inited => {
                ring.check_index(ring_count)?;
                ring.check_not_added(h.rings.iter().map(|(r, _)| r))?;
                ring.check_size(msg::MAX_LOG2_RING_SIZE)?;
                ring.check_region(h.regions.len())?;
                ring.check_in_region(h.regions[ring.region as usize].len() as u64)?;
                let fd = fd
                    .take_if(|f| EventFd::is_eventfd(f.as_fd()))
                    .ok_or(match fd {
                        None => "Missing interrupt fd",
                        Some(_) => "Invalid interrupt fd",
                    })?;
                let irq = EventFd::from_fd(fd).map_err(|_| "Invalid interrupt fd")?;
                h.rings.push((ring, Arc::new(irq)));
            }
            Msg::Connect { .. } if h.inited => return self.server_connect(),
            _ => return Err("Unexpected message".into()),
        }
        let _ = h.conn.send(&Msg::Ack.encode(), &[]);
        Ok(())
    }

    /// Server, on CONNECT: check every ring's cookie, attach the rings to our queues, answer
    /// CONNECTED.
    fn server_connect(&mut self) -> Result<(), Refusal> {
        let mut session = Session::new(self.nq() as usize);
        let Phase::Handshake(h) = &self.phase else {
            return Ok(());
        };
        // A connection without a ring each way could never move a frame, yet would say the
        // link is up.
        for (dir, what) in [(RingDirection::C2S, "C2S"), (RingDirection::S2C, "S2C")] {
            if !h.rings.iter().any(|(r, _)| r.direction == dir) {
                return Err(format!("No {what} ring").into());
            }
        }
        let regions = Regions(h.regions.clone());
        for (r, irq) in &h.rings {
            let ring = Ring::checked(
                h.regions[r.region as usize].clone(),
                r.offset as usize,
                r.log2_ring_size,
            )
            .map_err(|_| "Wrong ring")?;
            let conn = Conn {
                role: Role::Server,
                ring,
                regions: regions.clone(),
                buffers: None,
                irq: Some(irq.clone()),
                zero_copy_region: None,
            };
            session.attach(r.direction, r.index as usize, conn);
        }
        let Some(h) = self.take_handshake() else {
            return Ok(());
        };
        let reply = Msg::Connected {
            if_name: Name::truncated(&self.name),
        };
        let _ = h.conn.send(&reply.encode(), &[]);
        self.connected(h.conn, session);
        Ok(())
    }
}
