//! Recording what a port sends: one pcap record per frame (nanosecond timestamps from the wall
//! clock, read once per burst), written through a buffer, flushed when the queue is dropped.
//! A port without a tx file drops what it is given and counts it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use memnic_ethdev::{Mbuf, PoolCache, QueueStats, StatsCell, TxQueue};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};

use crate::{PcapError, TxExtra, TX_SNAPLEN};

/// Bytes buffered before a write to the file.
const WRITE_BUFFER: usize = 1 << 20;

/// A created tx file with its header (in the buffer until the first flush).
pub struct Writer {
    path: PathBuf,
    out: PcapWriter<BufWriter<File>>,
}

impl Writer {
    /// Creates (or truncates) `path` and writes a nanosecond Ethernet pcap header.
    pub fn create(path: &Path) -> Result<Writer, PcapError> {
        let create = |why| PcapError::Create {
            path: path.into(),
            why,
        };
        let file = File::create(path).map_err(create)?;
        let header = PcapHeader {
            snaplen: TX_SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::native(),
            ..Default::default()
        };
        let out = PcapWriter::with_header(BufWriter::with_capacity(WRITE_BUFFER, file), header)
            .map_err(|e| create(std::io::Error::other(e.to_string())))?;
        Ok(Writer {
            path: path.into(),
            out,
        })
    }
}

/// The tx queue of a pcap port.
pub struct PcapTxQueue {
    port: String,
    writer: Option<Writer>,
    /// Why writing failed, once it has: later frames are counted as errors, not written.
    failed: Option<String>,
    cache: PoolCache,
    /// A frame that is not one private slice is copied here to be written.
    scratch: Vec<u8>,
    stats: QueueStats,
    cell: Arc<StatsCell>,
    truncated: u64,
    extra: Arc<TxExtra>,
}

impl PcapTxQueue {
    pub fn new(
        port: &str,
        writer: Option<Writer>,
        cache: PoolCache,
        cell: Arc<StatsCell>,
        extra: Arc<TxExtra>,
    ) -> PcapTxQueue {
        PcapTxQueue {
            port: port.into(),
            writer,
            failed: None,
            cache,
            scratch: vec![0; TX_SNAPLEN as usize],
            stats: QueueStats::default(),
            cell,
            truncated: 0,
            extra,
        }
    }

    /// Writes one frame; false when the file cannot be written.
    fn write(&mut self, m: &Mbuf, ts: std::time::Duration) -> bool {
        let Some(w) = self.writer.as_mut() else {
            return false;
        };
        let len = m.len();
        let cap = len.min(TX_SNAPLEN as usize);
        let data = match m.frame_slice() {
            Some(s) => &s[..cap],
            None => {
                m.copy_out(0, &mut self.scratch[..cap]);
                &self.scratch[..cap]
            }
        };
        if cap < len {
            self.truncated += 1;
        }
        match w.out.write_packet(&PcapPacket::new(ts, len as u32, data)) {
            Ok(_) => true,
            Err(e) => {
                self.failed = Some(e.to_string());
                false
            }
        }
    }
}

impl TxQueue for PcapTxQueue {
    fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let n = pkts.len();
        if n == 0 {
            return 0;
        }
        if self.writer.is_none() {
            // No tx file: an rx-only port drops what it is given.
            self.stats.drops += n as u64;
        } else {
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            for m in pkts.iter() {
                if self.failed.is_none() && self.write(m, ts) {
                    self.stats.packets += 1;
                    self.stats.bytes += m.len() as u64;
                } else {
                    self.stats.errors += 1;
                }
            }
        }
        self.cache.free_all(pkts);
        self.cell.publish(&self.stats);
        // Relaxed: read by PcapPort::xstats, which needs no order between counters.
        self.extra.truncated.store(self.truncated, Relaxed);
        n
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }
}

impl Drop for PcapTxQueue {
    /// Flushes the file; a failure is said on stderr (nothing else can be told from here).
    fn drop(&mut self) {
        let Some(w) = self.writer.take() else {
            return;
        };
        let flushed = w.out.into_writer().flush();
        let why = self
            .failed
            .take()
            .or_else(|| flushed.err().map(|e| e.to_string()));
        if let Some(why) = why {
            eprintln!(
                "warning: port '{}': tx_pcap file {} is incomplete: {why}",
                self.port,
                w.path.display()
            );
        }
    }
}
