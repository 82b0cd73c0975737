//! The port: the interface, one descriptor per queue pair, and the queues' counters.

use std::sync::Arc;

use memnic_ethdev::{
    LinkStatus, MacAddr, Mempool, Port, PortError, PortInfo, QueueStats, RxQueue, StatsCell,
    TxQueue,
};
use memnic_shm::tap::{self, Tap};
use memnic_shm::ShmError;

use crate::config::TapConfig;
use crate::queue::{TapRxQueue, TapTxQueue, MAX_FRAME, MAX_RX_SEGS};

/// Errors of the TAP driver (the interface could not be made ready).
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error(transparent)]
    Devargs(#[from] memnic_ethdev::DevargsError),
    #[error(transparent)]
    Interface(#[from] ShmError),
}

/// One queue pair: its descriptor, whether the kernel sends it frames, and its counters.
struct Pair {
    tap: Arc<Tap>,
    attached: bool,
    rx: Option<Arc<StatsCell>>,
    tx: Option<Arc<StatsCell>>,
}

/// A TAP port.
pub struct TapPort {
    name: String,
    iface: String,
    mac: MacAddr,
    pairs: Vec<Pair>,
}

impl TapPort {
    /// Creates (or joins) the interface with one descriptor per queue pair, sets its address
    /// if asked, brings it up, and makes it persistent if asked.
    pub fn open(name: &str, cfg: &TapConfig) -> Result<TapPort, TapError> {
        let first = Tap::open(&cfg.iface)?;
        let iface = first.name().to_string();
        let mut pairs = vec![Pair {
            tap: Arc::new(first),
            attached: true,
            rx: None,
            tx: None,
        }];
        for _ in 1..cfg.queues {
            // Joined now, while the name is surely this interface's (it may move to another
            // namespace later); sent nothing until taken.
            let t = Tap::open(&iface)?;
            t.detach()?;
            pairs.push(Pair {
                tap: Arc::new(t),
                attached: false,
                rx: None,
                tx: None,
            });
        }
        let mac = match cfg.mac {
            Some(m) => {
                tap::set_mac(&iface, m.0)?;
                m
            }
            None => MacAddr(tap::mac(&iface)?),
        };
        tap::set_up(&iface)?;
        if cfg.persist {
            pairs[0].tap.set_persist(true)?;
        }
        Ok(TapPort {
            name: name.to_string(),
            iface,
            mac,
            pairs,
        })
    }

    /// The interface's name (the kernel's `dtapN` when none was given).
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Checks that queue `q` exists and its `rx` (or tx) half is free, joins it to the
    /// interface if neither half was taken yet, and gives it counters.
    fn take(&mut self, rx: bool, q: u16) -> Result<(Arc<Tap>, Arc<StatsCell>), PortError> {
        let dir = if rx { "rx" } else { "tx" };
        let max = self.pairs.len() as u16;
        let Some(p) = self.pairs.get_mut(q as usize) else {
            return Err(PortError::NoSuchQueue {
                port: self.name.clone(),
                dir,
                queue: q,
                max,
            });
        };
        let cell = if rx { &mut p.rx } else { &mut p.tx };
        if cell.is_some() {
            return Err(PortError::QueueTaken {
                port: self.name.clone(),
                dir,
                queue: q,
            });
        }
        if !p.attached {
            p.tap.attach().map_err(|e| PortError::Other {
                port: self.name.clone(),
                what: e.to_string(),
            })?;
            p.attached = true;
        }
        let c = StatsCell::new();
        *cell = Some(c.clone());
        Ok((p.tap.clone(), c))
    }
}

impl Port for TapPort {
    fn info(&self) -> PortInfo {
        PortInfo {
            driver: "net_tap",
            name: self.name.clone(),
            mac: self.mac,
            max_frame_len: MAX_FRAME as u32,
            max_rx_queues: self.pairs.len() as u16,
            max_tx_queues: self.pairs.len() as u16,
        }
    }

    /// Up while the interface exists, is up and has its carrier. An interface moved to another
    /// network namespace cannot be looked at from here: it counts as up while it exists.
    fn link(&self) -> LinkStatus {
        let up = self.pairs[0].tap.is_alive()
            && match tap::flags(&self.iface) {
                Ok(f) => f.up && f.running,
                Err(ShmError::NoSuchInterface { .. }) => true,
                Err(_) => false,
            };
        LinkStatus {
            up,
            speed_mbps: 10_000,
        }
    }

    fn take_rx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn RxQueue>, PortError> {
        let other = |what: String| PortError::Other {
            port: self.name.clone(),
            what,
        };
        if pool.is_shared() {
            return Err(other(format!(
                "rx queue {q}: a TAP port receives into a private pool, not shared memory ({})",
                pool.name()
            )));
        }
        let room = pool.data_room() as usize;
        let segs = (MAX_FRAME + 1).div_ceil(room.max(1));
        if segs > MAX_RX_SEGS {
            return Err(other(format!(
                "rx queue {q}: buffers of {room} bytes are too small (a {MAX_FRAME}-byte frame would take {segs} segments; at most {MAX_RX_SEGS})"
            )));
        }
        let (tap, cell) = self.take(true, q)?;
        Ok(Box::new(TapRxQueue::new(
            tap,
            pool.lcore_cache(),
            room,
            segs,
            cell,
        )))
    }

    fn take_tx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn TxQueue>, PortError> {
        let (tap, cell) = self.take(false, q)?;
        Ok(Box::new(TapTxQueue::new(tap, pool.lcore_cache(), cell)))
    }

    fn queue_stats(&self) -> (Vec<QueueStats>, Vec<QueueStats>) {
        let rx = self.pairs.iter().filter_map(|p| p.rx.as_ref());
        let tx = self.pairs.iter().filter_map(|p| p.tx.as_ref());
        (
            rx.map(|c| c.snapshot()).collect(),
            tx.map(|c| c.snapshot()).collect(),
        )
    }
}
