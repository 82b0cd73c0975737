//! The server role: take a client the shared socket greeted, check its INIT, collect its regions
//! and rings, and map them at CONNECT.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use memnic_shm::unix::EventFd;
use memnic_shm::Region;

use super::{Handshake, MemifPort, Phase, Session, MAX_QUEUES};
use crate::msg::{self, Msg, MsgError, Name, RingDirection, Secret};
use crate::queue::{Conn, Role};
use crate::ring::{Regions, Ring, RING_FLAG_MASK_INT};

impl MemifPort {
    /// Server: take a client whose INIT named our id (the shared socket greeted it) and check
    /// that INIT.
    pub(super) fn server_accept(&mut self) {
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
    pub(super) fn server_step(&mut self, m: Msg, fd: Option<OwnedFd>) -> Result<(), String> {
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
}
