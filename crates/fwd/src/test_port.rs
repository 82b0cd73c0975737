//! A port for the engine's own tests: its rx queue never has a frame and its tx queue never
//! takes one (txonly's frames are all dropped by the engine). While `stuck` is set, every tx
//! burst waits for the port's `service()` to clear it (or for [`STUCK_FOR`]): an lcore stuck
//! in a burst until the control path does its work, as memif's lcore is in a kick on an
//! interrupt line its peer jammed, until `service` empties the line.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memnic_ethdev::{
    LinkStatus, MacAddr, Mbuf, Mempool, Port, PortError, PortInfo, QueueStats, RxQueue, TxQueue,
};

/// How long a stuck tx burst waits for `service()` at most: long past any test's limit on
/// the wait, so a test sees the difference, short enough that a failing one does not hang.
pub const STUCK_FOR: Duration = Duration::from_secs(20);

#[derive(Default)]
pub struct TestPort {
    /// Set: tx bursts wait until `service()` clears it. SeqCst on both sides: a flag between
    /// the control thread and an lcore, off the data path.
    pub stuck: Arc<AtomicBool>,
    /// How many times `service()` ran.
    pub serviced: Arc<AtomicU64>,
    /// How many tx bursts began.
    pub tx_bursts: Arc<AtomicU64>,
}

struct Nothing {
    stuck: Arc<AtomicBool>,
    tx_bursts: Arc<AtomicU64>,
}

impl RxQueue for Nothing {
    fn rx_burst(&mut self, _: &mut Vec<Mbuf>, _: usize) -> usize {
        0
    }
    fn stats(&self) -> QueueStats {
        QueueStats::default()
    }
}

impl TxQueue for Nothing {
    fn tx_burst(&mut self, _: &mut Vec<Mbuf>) -> usize {
        self.tx_bursts.fetch_add(1, SeqCst);
        let until = Instant::now() + STUCK_FOR;
        while self.stuck.load(SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        0
    }
    fn stats(&self) -> QueueStats {
        QueueStats::default()
    }
}

impl Port for TestPort {
    fn info(&self) -> PortInfo {
        PortInfo {
            driver: "test",
            name: "test0".into(),
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            max_frame_len: 1518,
            max_rx_queues: 1,
            max_tx_queues: 1,
        }
    }
    fn link(&self) -> LinkStatus {
        LinkStatus {
            up: true,
            speed_mbps: 10000,
        }
    }
    fn take_rx_queue(&mut self, _: u16, _: &Mempool) -> Result<Box<dyn RxQueue>, PortError> {
        Ok(Box::new(Nothing {
            stuck: self.stuck.clone(),
            tx_bursts: self.tx_bursts.clone(),
        }))
    }
    fn take_tx_queue(&mut self, _: u16, _: &Mempool) -> Result<Box<dyn TxQueue>, PortError> {
        Ok(Box::new(Nothing {
            stuck: self.stuck.clone(),
            tx_bursts: self.tx_bursts.clone(),
        }))
    }
    fn queue_stats(&self) -> (Vec<QueueStats>, Vec<QueueStats>) {
        (vec![QueueStats::default()], vec![QueueStats::default()])
    }
    fn service(&mut self) {
        self.serviced.fetch_add(1, SeqCst);
        self.stuck.store(false, SeqCst);
    }
    fn service_interval(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_millis(5))
    }
}

/// An engine running `mode` on one stream of `port` (rx and tx queue 0) on lcore CPU 0.
pub fn engine(port: TestPort, mode: crate::FwdMode, tag: &str) -> crate::Engine {
    let cfg = crate::FwdConfig {
        mode,
        ..Default::default()
    };
    let spec = crate::StreamSpec {
        rx_port: 0,
        rx_queue: 0,
        tx_port: 0,
        tx_queue: 0,
    };
    let pool = memnic_pktbuf::Mempool::new(&memnic_pktbuf::PoolConfig {
        huge: false,
        ..memnic_pktbuf::PoolConfig::new(tag, 512)
    })
    .unwrap();
    crate::Engine::new(vec![Box::new(port)], cfg, vec![spec], &[0], |_, _| {
        crate::QueuePools {
            rx: pool.clone(),
            tx: pool.clone(),
            private: pool.clone(),
        }
    })
    .unwrap()
}
