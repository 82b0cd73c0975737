//! Replaying a pcap file: records read through a buffer of our own (so a record can be looked at
//! before it is taken, and a file that fits is replayed forever without reading it again), each
//! checked, then copied into mbufs.
//!
//! What happens to a record (the file may be anything):
//!
//! | record | what the port does | counted in |
//! |---|---|---|
//! | captured length < original length (cut by the capture's snap length) | delivered as captured | `rx_truncated_records` |
//! | captured length > [`MAX_FRAME`] | skipped | queue drops (RX-missed), `rx_oversize_records` |
//! | empty, or captured length > original length | skipped | queue errors, `rx_malformed_records` |
//! | captured length > [`MAX_RECORD`] (no capture writes one: the file is garbage from here), a record cut off by the end of the file, a read error | the file ends there | queue errors, `rx_malformed_records` |
//!
//! Timestamps are only used by `rx_pace=recorded`: a record is due when as much time has passed
//! since the first one was sent as the file says passed between them (a timestamp earlier than
//! the last one is due at once). With `infinite_rx=1` the next pass follows the last record.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use memnic_ethdev::{Mbuf, PoolCache, QueueStats, RxQueue, StatsCell, MAX_BURST};
use pcap_file::pcap::{PcapHeader, PcapParser};
use pcap_file::{DataLink, TsResolution};

use crate::{PcapError, RxExtra, MAX_FRAME};

/// The longest record a file may hold before it is taken for garbage: libpcap's
/// `MAXIMUM_SNAPLEN`.
pub const MAX_RECORD: usize = 262_144;

/// Bytes of the file held at once: several records, and always room for the longest one.
const BUF_SIZE: usize = 1 << 20;

const RECORD_HEADER: usize = 16;
const FILE_HEADER: usize = 24;
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// How fast records are replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// As fast as the port is polled (DPDK's only way).
    Full,
    /// At the intervals between the records' timestamps.
    Recorded,
}

/// One record, as the file has it.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Nanoseconds since the epoch.
    pub ts_ns: u64,
    pub orig_len: u32,
    pub data: &'a [u8],
}

/// What [`RecordReader::peek`] found.
#[derive(Debug)]
pub enum Peek<'a> {
    Record(Record<'a>),
    /// The end of the file.
    End,
    /// The file cannot be read past here (see the module's table); nothing more comes of it.
    Broken,
}

/// The records of a pcap file, one at a time.
pub struct RecordReader {
    path: PathBuf,
    file: File,
    parser: PcapParser,
    buf: Vec<u8>,
    /// The unread bytes are `buf[pos..len]`; `buf[0]` is at `base` in the file.
    pos: usize,
    len: usize,
    base: u64,
    eof: bool,
    broken: bool,
    /// Bytes of the record [`peek`](Self::peek) returned, for [`consume`](Self::consume).
    peeked: usize,
}

impl RecordReader {
    /// Opens `path` and checks its header: a pcap file (either byte order, micro- or
    /// nanosecond timestamps) of Ethernet frames.
    pub fn open(path: &Path) -> Result<RecordReader, PcapError> {
        let file = File::open(path).map_err(|why| PcapError::Open {
            path: path.into(),
            why,
        })?;
        let mut r = RecordReader {
            path: path.into(),
            file,
            parser: PcapParser::new(&default_header())
                .expect("a valid header")
                .1,
            buf: vec![0; BUF_SIZE],
            pos: 0,
            len: 0,
            base: 0,
            eof: false,
            broken: false,
            peeked: 0,
        };
        while r.len < FILE_HEADER && !r.eof {
            r.fill().map_err(|why| PcapError::Read {
                path: path.into(),
                why,
            })?;
        }
        let not_pcap = |why: String| PcapError::NotPcap {
            path: path.into(),
            why,
        };
        if r.buf[..4.min(r.len)] == PCAPNG_MAGIC {
            return Err(PcapError::Pcapng { path: path.into() });
        }
        if r.len < FILE_HEADER {
            return Err(not_pcap(format!(
                "it has {} bytes, fewer than a pcap header's 24",
                r.len
            )));
        }
        let (_, parser) = PcapParser::new(&r.buf[..r.len]).map_err(|_| {
            let m = &r.buf[..4];
            not_pcap(format!(
                "its magic number is {:02x}{:02x}{:02x}{:02x}, not a1b2c3d4 or a1b23c4d in either byte order",
                m[0], m[1], m[2], m[3]
            ))
        })?;
        let header = parser.header();
        if header.datalink != DataLink::ETHERNET {
            return Err(PcapError::NotEthernet {
                path: path.into(),
                linktype: header.datalink.into(),
            });
        }
        r.parser = parser;
        r.pos = FILE_HEADER;
        Ok(r)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next record, without taking it; reads more of the file when needed.
    pub fn peek(&mut self) -> Peek<'_> {
        self.peeked = 0;
        if self.broken {
            return Peek::Broken;
        }
        loop {
            let avail = &self.buf[self.pos..self.len];
            match self.parser.next_raw_packet(avail) {
                Ok((rest, raw)) => {
                    if raw.incl_len as usize > MAX_RECORD {
                        self.broken = true;
                        return Peek::Broken;
                    }
                    self.peeked = avail.len() - rest.len();
                    let frac = u64::from(raw.ts_frac);
                    let frac_ns = match self.parser.header().ts_resolution {
                        TsResolution::MicroSecond => frac * 1000,
                        TsResolution::NanoSecond => frac,
                    };
                    // Cannot overflow: u32 seconds · 10^9 + u32 · 1000 < 2^64.
                    let ts_ns = u64::from(raw.ts_sec) * 1_000_000_000 + frac_ns;
                    let start = self.pos + RECORD_HEADER;
                    return Peek::Record(Record {
                        ts_ns,
                        orig_len: raw.orig_len,
                        data: &self.buf[start..start + raw.incl_len as usize],
                    });
                }
                Err(pcap_file::PcapError::IncompleteBuffer) => {
                    let have = avail.len();
                    if self.eof {
                        // A record (or its header) cut off by the end of the file.
                        if have > 0 {
                            self.broken = true;
                            return Peek::Broken;
                        }
                        return Peek::End;
                    }
                    if have >= RECORD_HEADER + MAX_RECORD {
                        // It says it is longer than any capture writes.
                        self.broken = true;
                        return Peek::Broken;
                    }
                    if self.fill().is_err() {
                        self.broken = true;
                        return Peek::Broken;
                    }
                }
                Err(_) => {
                    self.broken = true;
                    return Peek::Broken;
                }
            }
        }
    }

    /// Takes the record the last [`peek`](Self::peek) returned.
    pub fn consume(&mut self) {
        self.pos += std::mem::take(&mut self.peeked);
    }

    /// Starts over at the first record: without reading when the whole file is in the buffer.
    /// False when the file cannot be read again (a pipe).
    pub fn rewind(&mut self) -> bool {
        self.peeked = 0;
        if self.broken {
            return false;
        }
        if self.base == 0 && self.eof {
            self.pos = FILE_HEADER;
            return true;
        }
        if self.file.seek(SeekFrom::Start(FILE_HEADER as u64)).is_err() {
            self.broken = true;
            return false;
        }
        (self.pos, self.len, self.base, self.eof) = (0, 0, FILE_HEADER as u64, false);
        true
    }

    /// Reads more after the unread bytes; when the buffer is full, first moves them to the
    /// front (so a file that fits stays whole in the buffer).
    fn fill(&mut self) -> std::io::Result<()> {
        if self.len == self.buf.len() && self.pos > 0 {
            self.buf.copy_within(self.pos..self.len, 0);
            self.base += self.pos as u64;
            self.len -= self.pos;
            self.pos = 0;
        }
        loop {
            match self.file.read(&mut self.buf[self.len..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(());
                }
                Ok(n) => {
                    self.len += n;
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// The bytes of a little-endian microsecond Ethernet pcap header (a placeholder parser until
/// the file's own header is read).
fn default_header() -> Vec<u8> {
    let mut v = Vec::new();
    PcapHeader {
        endianness: pcap_file::Endianness::Little,
        ..Default::default()
    }
    .write_to(&mut v)
    .expect("a Vec takes any write");
    v
}

/// Recorded pace: when each record is due.
#[derive(Debug, Default)]
struct Pacer {
    /// When the first record went.
    start: Option<Instant>,
    /// The timestamp of the first record of this pass.
    first: Option<u64>,
    /// Recorded time the passes before this one took.
    offset: u64,
    /// The timestamp of the last record taken.
    last: u64,
}

impl Pacer {
    /// Whether a record stamped `ts` may go at `now` (read once per burst).
    fn due(&mut self, ts: u64, now: &mut Option<Instant>) -> bool {
        let now = *now.get_or_insert_with(Instant::now);
        let start = *self.start.get_or_insert(now);
        let first = *self.first.get_or_insert(ts);
        let at = self.offset.saturating_add(ts.saturating_sub(first));
        now.duration_since(start).as_nanos() >= u128::from(at)
    }

    /// The next pass starts where this one ended, in recorded time.
    fn next_pass(&mut self) {
        if let Some(first) = self.first.take() {
            self.offset = self.offset.saturating_add(self.last.saturating_sub(first));
        }
    }
}

/// The rx queue of a pcap port.
pub struct PcapRxQueue {
    reader: Option<RecordReader>,
    pace: Pace,
    infinite: bool,
    cache: PoolCache,
    stats: QueueStats,
    cell: Arc<StatsCell>,
    truncated: u64,
    oversize: u64,
    malformed: u64,
    passes: u64,
    extra: Arc<RxExtra>,
    /// Records taken in this pass over the file (an empty file is not replayed forever).
    in_pass: u64,
    pacer: Pacer,
}

impl PcapRxQueue {
    pub fn new(
        reader: Option<RecordReader>,
        pace: Pace,
        infinite: bool,
        cache: PoolCache,
        cell: Arc<StatsCell>,
        extra: Arc<RxExtra>,
    ) -> PcapRxQueue {
        PcapRxQueue {
            reader,
            pace,
            infinite,
            cache,
            stats: QueueStats::default(),
            cell,
            truncated: 0,
            oversize: 0,
            malformed: 0,
            passes: 0,
            extra,
            in_pass: 0,
            pacer: Pacer::default(),
        }
    }

    fn publish(&self) {
        self.cell.publish(&self.stats);
        // Relaxed: read by PcapPort::xstats, which needs no order between counters.
        self.extra.truncated.store(self.truncated, Relaxed);
        self.extra.oversize.store(self.oversize, Relaxed);
        self.extra.malformed.store(self.malformed, Relaxed);
        self.extra.passes.store(self.passes, Relaxed);
    }

    /// The end of the file: true to go on with another pass (infinite_rx, a file with records
    /// that can be read again); otherwise the port has nothing more.
    #[cold]
    fn end_of_file(&mut self) -> bool {
        self.passes += 1;
        let again = self.infinite && self.in_pass > 0;
        self.in_pass = 0;
        self.pacer.next_pass();
        if again && self.reader.as_mut().is_some_and(RecordReader::rewind) {
            return true;
        }
        self.reader = None;
        false
    }
}
/// Copies `data` into one mbuf, or a chain of them when it is longer than one buffer. None
/// (nothing held) when the pool runs dry.
fn build(cache: &mut PoolCache, data: &[u8]) -> Option<Mbuf> {
    let mut head: Option<Mbuf> = None;
    let mut done = 0;
    while done < data.len() {
        let Some(mut seg) = cache.alloc() else {
            if let Some(h) = head {
                cache.free(h);
            }
            return None;
        };
        let n = (data.len() - done).min(seg.capacity());
        let ok = seg.set_len(n) && seg.copy_in(0, &data[done..done + n]);
        debug_assert!(ok, "a fresh buffer takes its capacity");
        done += n;
        match head.as_mut() {
            None => head = Some(seg),
            Some(h) => {
                if let Err(seg) = h.chain(seg) {
                    // Past 65535 segments: cannot happen for records of MAX_FRAME bytes.
                    cache.free(seg);
                    cache.free(head.take().expect("head is set"));
                    return None;
                }
            }
        }
    }
    head
}

impl RxQueue for PcapRxQueue {
    fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        let max = max.min(MAX_BURST);
        let mut got = 0;
        // Records looked at in this burst, skipped ones too, and passes begun: a burst's work
        // stays bounded whatever the file holds.
        let mut budget = 4 * max;
        let mut rewound = false;
        let mut now = None;
        while got < max && budget > 0 {
            let Some(reader) = self.reader.as_mut() else {
                break;
            };
            budget -= 1;
            let rec = match reader.peek() {
                Peek::Record(r) => r,
                Peek::End => {
                    if rewound || !self.end_of_file() {
                        break;
                    }
                    rewound = true;
                    continue;
                }
                Peek::Broken => {
                    self.stats.errors += 1;
                    self.malformed += 1;
                    self.reader = None;
                    self.passes += 1;
                    break;
                }
            };
            let (ts, len, orig) = (rec.ts_ns, rec.data.len(), rec.orig_len as usize);
            if len == 0 || len > orig {
                self.stats.errors += 1;
                self.malformed += 1;
            } else if len > MAX_FRAME as usize {
                self.stats.drops += 1;
                self.oversize += 1;
            } else {
                if self.pace == Pace::Recorded && !self.pacer.due(ts, &mut now) {
                    break;
                }
                let Some(m) = build(&mut self.cache, rec.data) else {
                    // The record stays for the next burst.
                    self.stats.nombuf += 1;
                    break;
                };
                pkts.push(m);
                got += 1;
                self.stats.packets += 1;
                self.stats.bytes += len as u64;
                if len < orig {
                    self.truncated += 1;
                }
            }
            self.pacer.last = ts;
            self.in_pass += 1;
            self.reader.as_mut().expect("peeked above").consume();
        }
        self.publish();
        got
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }
}
