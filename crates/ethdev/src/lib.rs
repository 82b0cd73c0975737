//! The burst API every memnic driver implements, shaped like DPDK's ethdev.
//!
//! * A [`Port`] has rx and tx queues; each queue is polled by exactly one lcore, so the burst
//!   methods take `&mut self` and need no lock.
//! * [`RxQueue::rx_burst`] appends up to `max` packets; [`TxQueue::tx_burst`] sends what fits from
//!   the front of a burst and leaves the rest with the caller (retry or drop: the caller decides).
//! * Counters are plain integers owned by the queue ([`QueueStats`]); the queue publishes a
//!   snapshot into a [`StatsCell`] after each burst, and other threads read only the snapshot.
//! * [`tuner::Tuner`]: a queue's choice between two ways of doing its work, tried both ways
//!   while traffic runs; [`flush::FlushTuner`] is a receive queue's choice whether to flush the
//!   lines it read from its peer's buffers; [`stream::StreamTuner`] a transmit queue's choice
//!   whether to write short frames into its peer's buffers with streaming stores;
//!   [`ahead::AheadTuner`] a transmit queue's choice whether to ask for its peer's buffer lines
//!   ahead of its copy in shared state instead of exclusive; [`demote::DemoteTuner`] a transmit
//!   queue's choice whether to push the first lines of the frames it wrote out to the shared
//!   cache.
//! * [`holdoff::Holdoff`]: a receive queue leaves its ring alone a few microseconds after it
//!   caught up with a streaming sender.
#![forbid(unsafe_code)]

pub mod abflip;
pub mod ahead;
pub mod demote;
mod devargs;
pub mod flush;
pub mod gate;
pub mod holdoff;
mod stats;
pub mod stream;
pub mod tuner;

pub use devargs::{Devargs, DevargsError};
pub use memnic_pktbuf::{ExtPool, Mbuf, Mempool, PoolCache, SegKind};
pub use stats::{QueueStats, StatsCell};

use std::fmt;

/// Largest burst any driver accepts in one call.
pub const MAX_BURST: usize = 512;

/// An Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }
    pub fn is_locally_administered(&self) -> bool {
        self.0[0] & 2 != 0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02X}:{:02X}:{:02X}:{:02X}:{:02X}:{:02X}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        let err = || {
            format!("'{s}' is not a MAC address (expected six hex bytes like 02:00:00:00:00:01)")
        };
        if parts.len() != 6 {
            return Err(err());
        }
        let mut m = [0u8; 6];
        for (b, p) in m.iter_mut().zip(parts) {
            if p.is_empty() || p.len() > 2 {
                return Err(err());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        Ok(MacAddr(m))
    }
}

/// What a port is and can do.
#[derive(Debug, Clone)]
pub struct PortInfo {
    /// Driver name (`net_memnic`, `net_memif`).
    pub driver: &'static str,
    /// Port name from the devargs (`memnic0`).
    pub name: String,
    pub mac: MacAddr,
    /// Largest frame (L2, without FCS) the port passes.
    pub max_frame_len: u32,
    pub max_rx_queues: u16,
    pub max_tx_queues: u16,
}

/// Link state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkStatus {
    pub up: bool,
    /// Nominal speed in Mbit/s (shared-memory links report 10000, as DPDK's virtual PMDs do).
    pub speed_mbps: u32,
}

/// Errors raised by ports when queues are set up or taken.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error("port {port}: queue {queue} does not exist (the port has {max} {dir} queue(s))")]
    NoSuchQueue {
        port: String,
        dir: &'static str,
        queue: u16,
        max: u16,
    },
    #[error("port {port}: {dir} queue {queue} is already in use")]
    QueueTaken {
        port: String,
        dir: &'static str,
        queue: u16,
    },
    #[error("port {port}: {what}")]
    Other { port: String, what: String },
}

impl PortError {
    /// For a port with a single queue in direction `dir`: `q` must be 0 and not taken yet;
    /// marks it taken.
    pub fn take_only_queue(
        port: &str,
        dir: &'static str,
        q: u16,
        taken: &mut bool,
    ) -> Result<(), PortError> {
        if q != 0 {
            return Err(PortError::NoSuchQueue {
                port: port.to_string(),
                dir,
                queue: q,
                max: 1,
            });
        }
        if *taken {
            return Err(PortError::QueueTaken {
                port: port.to_string(),
                dir,
                queue: q,
            });
        }
        *taken = true;
        Ok(())
    }
}

/// The receive half of one queue.
pub trait RxQueue: Send {
    /// Appends up to `max` received packets to `pkts` (never more than [`MAX_BURST`]) and returns
    /// how many were appended.
    fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize;
    /// The queue's counters as of the last burst.
    fn stats(&self) -> QueueStats;
    /// Interrupt mode: sleeps until the peer signals new packets or `timeout` passes, instead of
    /// spinning on an idle queue. Returns false at once when the driver has no interrupts.
    fn wait(&mut self, _timeout: std::time::Duration) -> bool {
        false
    }
}

/// The transmit half of one queue.
pub trait TxQueue: Send {
    /// Sends packets from the front of `pkts`, removes those it took (their buffers are freed or
    /// owned by the driver) and returns how many. Packets left in `pkts` were not sent.
    fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize;
    fn stats(&self) -> QueueStats;
}

/// A network port.
pub trait Port: Send {
    fn info(&self) -> PortInfo;
    fn link(&self) -> LinkStatus;
    /// Takes rx queue `q`; received packets are allocated from `pool`.
    fn take_rx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn RxQueue>, PortError>;
    /// Takes tx queue `q`; sent buffers are returned through a cache of `pool` (buffers of other
    /// pools go back to their own).
    fn take_tx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn TxQueue>, PortError>;
    /// Snapshots of the counters of every queue taken so far: (rx, tx).
    fn queue_stats(&self) -> (Vec<QueueStats>, Vec<QueueStats>);
    /// Control-path work the control thread does between stats ticks (for example serving a
    /// peer's reset request when no lcore polls the queue that would). Never on the data path.
    fn service(&mut self) {}
    /// How soon the control thread must call [`Port::service`] again, at the latest (it may
    /// call sooner, when another port asks to be served); `None` (the default, as `service`
    /// does nothing by default): never for this port's sake. A port that is up should ask
    /// seldom: the control thread shares the CPUs with polling lcores, and each time it wakes
    /// it takes one of them from its lcore for a while, which shows in the tail of the round
    /// trips those lcores forward.
    fn service_interval(&self) -> Option<std::time::Duration> {
        None
    }
    /// The descriptors whose having something to read (or hanging up) means [`Port::service`]
    /// has work now: a control connection, a listening socket. The control thread sleeps on
    /// them until [`Port::service_interval`] passes, and serves the ports as soon as one has
    /// something. None by default.
    fn control_fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        Vec::new()
    }
    /// The shared memory behind queue `q` (`rx` or tx): (region, offset, length) ranges, so the
    /// caller can place them on a NUMA node. Empty when the driver has none of its own.
    fn queue_memory(&self, _rx: bool, _q: u16) -> Vec<QueueMemory> {
        Vec::new()
    }
    /// Whether the port hands its queues' pool buffers to its peer (zero copy). Such a port
    /// needs pools of its own in shared memory ([`PoolConfig::shared`](memnic_pktbuf::PoolConfig)),
    /// never a pool another port (or that port's peer) can also see.
    fn needs_own_shared_pool(&self) -> bool {
        false
    }
    /// The driver's own counters beyond the queues' (DPDK's extended statistics), cumulative
    /// since the port was opened: (name, value).
    fn xstats(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// What a driver's open function returns: a port, or an error to print as one sentence.
pub type OpenResult = Result<Box<dyn Port>, Box<dyn std::error::Error + Send + Sync>>;

/// A driver: its name in devargs (`memnic` for `memnic0,...` and `net_memnic0,...`), the keys it
/// accepts, and how it opens a port.
pub struct Driver {
    pub name: &'static str,
    pub keys: &'static [&'static str],
    pub open: fn(&Devargs) -> OpenResult,
}

/// Opens the port described by `vdev` with the driver its name selects; an error is one
/// sentence that names the port.
pub fn open_vdev(drivers: &[Driver], vdev: &str) -> Result<Box<dyn Port>, String> {
    let name = vdev.split(',').next().unwrap_or("").trim();
    let probe = Devargs {
        name: name.to_string(),
        pairs: Vec::new(),
    };
    let wanted = probe.driver();
    let Some(drv) = drivers.iter().find(|d| d.name == wanted) else {
        if name.is_empty() || name.contains('=') {
            return Err(DevargsError::Empty.to_string());
        }
        let known: Vec<&str> = drivers.iter().map(|d| d.name).collect();
        return Err(format!(
            "port '{name}': no driver '{wanted}' (available: {})",
            known.join(", ")
        ));
    };
    let args = Devargs::parse(vdev, drv.keys).map_err(|e| e.to_string())?;
    (drv.open)(&args).map_err(|e| {
        let msg = e.to_string();
        if msg.starts_with("port '") {
            msg
        } else {
            format!("port '{name}': {msg}")
        }
    })
}

/// A range of a region that backs a queue's ring.
#[derive(Debug, Clone)]
pub struct QueueMemory {
    pub region: std::sync::Arc<memnic_shm::Region>,
    pub offset: usize,
    pub len: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parse_and_print() {
        let m: MacAddr = "02:1a:FF:00:00:09".parse().unwrap();
        assert_eq!(m.to_string(), "02:1A:FF:00:00:09");
        assert!(m.is_locally_administered() && !m.is_multicast());
        for bad in [
            "",
            "02:1a:ff:00:00",
            "02:1a:ff:00:00:0g",
            "02:1a:ff:00:00:001",
            "02::ff:00:00:09",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
    }
}
