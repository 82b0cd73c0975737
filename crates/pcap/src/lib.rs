//! The pcap port (DPDK `net_pcap`'s devargs): `pcap0,rx_pcap=IN.pcap,tx_pcap=OUT.pcap`.
//!
//! * rx replays the records of a pcap file as received frames, at full speed or at the pace the
//!   file recorded (`rx_pace=recorded`), once or forever (`infinite_rx=1`); a frame longer than
//!   one buffer becomes a chain ([`rx`]).
//! * tx writes every frame it is given as a record stamped with the wall clock, buffered, flushed
//!   when the queue is dropped ([`tx`]).
//!
//! The file is input we do not trust: every record is checked before it becomes a frame, and
//! what is wrong with it is counted (see [`rx`] for the rules). One rx and one tx queue; a port
//! without `tx_pcap` drops what it is given (counted), one without `rx_pcap` receives nothing.
#![forbid(unsafe_code)]

pub mod rx;
pub mod tx;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use memnic_ethdev::{
    Devargs, DevargsError, LinkStatus, MacAddr, Mempool, Port, PortError, PortInfo, QueueStats,
    RxQueue, StatsCell, TxQueue,
};

pub use rx::{Pace, PcapRxQueue, RecordReader};
pub use tx::PcapTxQueue;

/// Devargs keys: DPDK's `rx_pcap`, `tx_pcap` and `infinite_rx`, and `rx_pace` (ours: DPDK
/// always replays at full speed).
pub const DEVARGS_KEYS: &[&str] = &["rx_pcap", "tx_pcap", "infinite_rx", "rx_pace"];

/// Largest frame the port passes (DPDK's `RTE_ETH_PCAP_SNAPLEN`, a jumbo frame): longer records
/// are skipped and counted.
pub const MAX_FRAME: u32 = 16128;

/// The snap length written in the header of a tx file; a longer frame is recorded truncated to
/// it, with its whole length as the original length.
pub const TX_SNAPLEN: u32 = 65535;

/// Errors opening a pcap port, each one sentence.
#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    #[error(transparent)]
    Devargs(#[from] DevargsError),
    #[error("give rx_pcap=FILE (frames to replay), tx_pcap=FILE (where sent frames go) or both")]
    NoFile,
    #[error("{key} needs rx_pcap=FILE (it says how to replay one)")]
    NeedsRx { key: &'static str },
    #[error("cannot open rx_pcap file {path}: {why}")]
    Open { path: PathBuf, why: std::io::Error },
    #[error("cannot read rx_pcap file {path}: {why}")]
    Read { path: PathBuf, why: std::io::Error },
    #[error("rx_pcap file {path} is not a pcap file: {why}")]
    NotPcap { path: PathBuf, why: String },
    #[error("rx_pcap file {path} is pcapng; the pcap port replays pcap files (convert it with `tcpdump -r {} -w OUT.pcap`)", path.display())]
    Pcapng { path: PathBuf },
    #[error("rx_pcap file {path} holds link type {linktype}; the pcap port replays Ethernet captures (link type 1)")]
    NotEthernet { path: PathBuf, linktype: u32 },
    #[error("tx_pcap {path} is the rx_pcap file: writing it would destroy what is replayed")]
    SameFile { path: PathBuf },
    #[error("cannot create tx_pcap file {path}: {why}")]
    Create { path: PathBuf, why: std::io::Error },
}

/// Counters of the rx queue beyond [`QueueStats`], published after each burst (single writer).
#[derive(Debug, Default)]
pub struct RxExtra {
    /// Records cut by the capture's snap length: delivered as captured, shorter than they were.
    pub truncated: AtomicU64,
    /// Records longer than [`MAX_FRAME`]: skipped (also in the queue's drops).
    pub oversize: AtomicU64,
    /// Malformed records (empty, captured length past the original, a cut-off tail, a length
    /// no capture writes) and read errors: skipped (also in the queue's errors).
    pub malformed: AtomicU64,
    /// Times the end of the file was reached (with `infinite_rx=1`, one per pass).
    pub passes: AtomicU64,
}

/// Counters of the tx queue beyond [`QueueStats`].
#[derive(Debug, Default)]
pub struct TxExtra {
    /// Frames longer than [`TX_SNAPLEN`]: recorded truncated.
    pub truncated: AtomicU64,
}

/// A pcap port: the rx file (if any) is open and its header checked, the tx file (if any) is
/// created with its header, until the queues take them.
pub struct PcapPort {
    name: String,
    mac: MacAddr,
    rx: Option<RecordReader>,
    pace: Pace,
    infinite: bool,
    tx: Option<tx::Writer>,
    rx_taken: bool,
    tx_taken: bool,
    rx_cell: Arc<StatsCell>,
    tx_cell: Arc<StatsCell>,
    rx_extra: Arc<RxExtra>,
    tx_extra: Arc<TxExtra>,
}

/// Opens a pcap port from devargs (`pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap`).
pub fn open(args: &Devargs) -> Result<PcapPort, PcapError> {
    let rx_path = args.get("rx_pcap").map(PathBuf::from);
    let tx_path = args.get("tx_pcap").map(PathBuf::from);
    for key in ["rx_pcap", "tx_pcap"] {
        if args.get(key) == Some("") {
            return Err(args.bad(key, "", "expected a file name").into());
        }
    }
    if rx_path.is_none() && tx_path.is_none() {
        return Err(PcapError::NoFile);
    }
    let infinite = args.bool_or("infinite_rx", false)?;
    let pace = match args.choice_or("rx_pace", &["full", "recorded"], "full")? {
        "recorded" => Pace::Recorded,
        _ => Pace::Full,
    };
    if rx_path.is_none() {
        for key in ["infinite_rx", "rx_pace"] {
            if args.get(key).is_some() {
                return Err(PcapError::NeedsRx { key });
            }
        }
    }
    let rx = rx_path.as_deref().map(RecordReader::open).transpose()?;
    let tx = match &tx_path {
        None => None,
        Some(p) => {
            if let Some(r) = &rx_path {
                if same_file(r, p) {
                    return Err(PcapError::SameFile { path: p.clone() });
                }
            }
            Some(tx::Writer::create(p)?)
        }
    };
    Ok(PcapPort {
        name: args.name.clone(),
        mac: mac_of(&args.name),
        rx,
        pace,
        infinite,
        tx,
        rx_taken: false,
        tx_taken: false,
        rx_cell: StatsCell::new(),
        tx_cell: StatsCell::new(),
        rx_extra: Arc::default(),
        tx_extra: Arc::default(),
    })
}

/// Whether two paths name one existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// DPDK's pcap MAC: 02:70:63:61:70:NN ("pcap"), NN from the port name's number.
fn mac_of(name: &str) -> MacAddr {
    let digits = name.trim_start_matches(|c: char| !c.is_ascii_digit());
    let n: u64 = digits.parse().unwrap_or(0);
    MacAddr([0x02, 0x70, 0x63, 0x61, 0x70, n as u8])
}

impl Port for PcapPort {
    fn info(&self) -> PortInfo {
        PortInfo {
            driver: "net_pcap",
            name: self.name.clone(),
            mac: self.mac,
            max_frame_len: MAX_FRAME,
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

    fn take_rx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn RxQueue>, PortError> {
        PortError::take_only_queue(&self.name, "rx", q, &mut self.rx_taken)?;
        Ok(Box::new(PcapRxQueue::new(
            self.rx.take(),
            self.pace,
            self.infinite,
            pool.lcore_cache(),
            self.rx_cell.clone(),
            self.rx_extra.clone(),
        )))
    }

    fn take_tx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn TxQueue>, PortError> {
        PortError::take_only_queue(&self.name, "tx", q, &mut self.tx_taken)?;
        Ok(Box::new(PcapTxQueue::new(
            &self.name,
            self.tx.take(),
            pool.lcore_cache(),
            self.tx_cell.clone(),
            self.tx_extra.clone(),
        )))
    }

    fn queue_stats(&self) -> (Vec<QueueStats>, Vec<QueueStats>) {
        let rx = if self.rx_taken {
            vec![self.rx_cell.snapshot()]
        } else {
            Vec::new()
        };
        let tx = if self.tx_taken {
            vec![self.tx_cell.snapshot()]
        } else {
            Vec::new()
        };
        (rx, tx)
    }

    fn xstats(&self) -> Vec<(&'static str, u64)> {
        // Relaxed: pairs with the queues' Relaxed publishing stores; counters stand alone.
        let (r, t) = (&self.rx_extra, &self.tx_extra);
        vec![
            ("rx_truncated_records", r.truncated.load(Relaxed)),
            ("rx_oversize_records", r.oversize.load(Relaxed)),
            ("rx_malformed_records", r.malformed.load(Relaxed)),
            ("rx_file_passes", r.passes.load(Relaxed)),
            ("tx_truncated_records", t.truncated.load(Relaxed)),
        ]
    }
}

/// The pcap driver for the devargs registry (`--vdev pcap0,rx_pcap=...,tx_pcap=...`).
pub const DRIVER: memnic_ethdev::Driver = memnic_ethdev::Driver {
    name: "pcap",
    keys: DEVARGS_KEYS,
    open: |a| Ok(Box::new(open(a)?)),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_follows_dpdk_and_the_port_number() {
        assert_eq!(mac_of("pcap3").to_string(), "02:70:63:61:70:03");
        assert_eq!(mac_of("net_pcap12").to_string(), "02:70:63:61:70:0C");
    }
}
