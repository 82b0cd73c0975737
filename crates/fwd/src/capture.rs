//! Live capture of a port's frames into a pcapng file while it forwards (what `dpdk-dumpcap`
//! does): `--capture PORT[:rx|tx|both]=FILE[,snaplen=N][,ring=N]`.
//!
//! The lcore copies up to `snaplen` bytes of each captured frame into a slot taken from a queue
//! of free slots (all allocated up front) and hands the slot to the file's writer thread through
//! a queue of full ones; both are bounded lock-free queues (crossbeam's `ArrayQueue`). When no
//! slot is free the frame is not captured and `missed` counts it: forwarding never waits for
//! the disk. Received frames are captured as received; sent frames are copied before the burst
//! is offered and handed over only when the tx queue took them, so `captured + missed` is the
//! port's count of frames in that direction.
//!
//! The writer writes one interface block per captured direction (`memif0-rx`, `memif0-tx`,
//! nanosecond timestamps) and an enhanced packet block per frame, with the frame's length on
//! the wire and its direction in the block's flags. [`Capture::flush`] (at every stop) returns
//! once every frame handed over so far is in the file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Release;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_queue::ArrayQueue;
use memnic_ethdev::{Mbuf, MAX_BURST};
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::section_header::{SectionHeaderBlock, SectionHeaderOption};
use pcap_file::pcapng::{Block, PcapNgWriter};
use pcap_file::DataLink;

/// The largest snap length accepted (libpcap's `MAXIMUM_SNAPLEN`).
pub const MAX_SNAPLEN: u32 = 262_144;
/// Slots of a capture unless `ring=` says otherwise ...
pub const DEFAULT_RING: usize = 4096;
/// ... and fewer when that many slots of `snaplen` bytes would pass this many bytes.
pub const DEFAULT_RING_BYTES: usize = 32 << 20;
/// The fewest slots a default ring gets, however long the snap length.
const MIN_DEFAULT_RING: usize = 64;
/// The most slots `ring=` may ask for.
pub const MAX_RING: usize = 1 << 20;

/// A direction of a port's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    Rx,
    Tx,
}

impl Dir {
    pub fn name(self) -> &'static str {
        match self {
            Dir::Rx => "rx",
            Dir::Tx => "tx",
        }
    }

    /// The pcapng `epb_flags` direction bits: 01 inbound, 10 outbound.
    fn epb_flags(self) -> u32 {
        match self {
            Dir::Rx => 0b01,
            Dir::Tx => 0b10,
        }
    }
}

/// One `--capture` flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureSpec {
    pub port: u16,
    /// The directions captured, rx before tx.
    pub dirs: Vec<Dir>,
    pub path: PathBuf,
    /// None: the port's largest frame.
    pub snaplen: Option<u32>,
    /// None: [`DEFAULT_RING`] slots within [`DEFAULT_RING_BYTES`].
    pub ring: Option<usize>,
}

const FORM: &str = "PORT[:rx|tx|both]=FILE[,snaplen=N][,ring=N]";

impl std::str::FromStr for CaptureSpec {
    type Err = String;

    /// `0=cap.pcapng`, `1:rx=/tmp/rx.pcapng,snaplen=128,ring=1024`.
    fn from_str(s: &str) -> Result<CaptureSpec, String> {
        let bad = |why: String| format!("--capture '{s}': {why}");
        let (target, rest) = s
            .split_once('=')
            .ok_or_else(|| bad(format!("expected {FORM}")))?;
        let (port, dir) = target.split_once(':').unwrap_or((target, "both"));
        let port: u16 = port
            .trim()
            .parse()
            .map_err(|_| bad(format!("'{port}' is not a port number")))?;
        let dirs = match dir.trim() {
            "rx" => vec![Dir::Rx],
            "tx" => vec![Dir::Tx],
            "both" => vec![Dir::Rx, Dir::Tx],
            d => return Err(bad(format!("direction '{d}' is not rx, tx or both"))),
        };
        let mut items = rest.split(',');
        let path = items.next().unwrap_or("").trim();
        if path.is_empty() {
            return Err(bad(format!("no file name (expected {FORM})")));
        }
        let mut spec = CaptureSpec {
            port,
            dirs,
            path: PathBuf::from(path),
            snaplen: None,
            ring: None,
        };
        for item in items {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("'{item}' is not key=value (expected {FORM})")))?;
            let number = |max: u64| -> Result<u64, String> {
                match v.trim().parse::<u64>() {
                    Ok(n) if (1..=max).contains(&n) => Ok(n),
                    _ => Err(bad(format!("{k}={v} is not a number within 1..={max}"))),
                }
            };
            match k.trim() {
                "snaplen" if spec.snaplen.is_none() => {
                    spec.snaplen = Some(number(MAX_SNAPLEN.into())? as u32)
                }
                "ring" if spec.ring.is_none() => {
                    spec.ring = Some(number(MAX_RING as u64)? as usize)
                }
                "snaplen" | "ring" => return Err(bad(format!("{k} is given twice"))),
                _ => return Err(bad(format!("unknown option '{k}' (known: snaplen, ring)"))),
            }
        }
        Ok(spec)
    }
}

/// A captured frame on its way to the file.
struct Slot {
    /// The interface block it belongs to (its direction).
    iface: u32,
    ts_ns: u64,
    orig_len: u32,
    caplen: u32,
    data: Box<[u8]>,
}

/// What the lcores, the writer and the control thread share.
struct Shared {
    free: ArrayQueue<Slot>,
    full: ArrayQueue<Slot>,
    /// Flush requests made and served: the control thread bumps `request`, the writer stores
    /// it into `served` once everything pushed before it is in the file.
    request: AtomicU64,
    served: AtomicU64,
    /// Set after the last request: the writer leaves once it has served it.
    closing: AtomicBool,
    /// Why writing failed, once it has (later frames are discarded).
    error: Mutex<Option<String>>,
    written: AtomicU64,
}

/// Counters of one tap, published by its lcore after each burst.
#[derive(Debug, Default)]
#[repr(align(64))]
struct TapCell {
    captured: AtomicU64,
    missed: AtomicU64,
}

/// Frames of one port and direction that were captured, and that had no free slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CaptureCounts {
    pub captured: u64,
    pub missed: u64,
}

/// The lcore's end of a capture: one per stream and direction.
pub(crate) struct Tap {
    shared: Arc<Shared>,
    iface: u32,
    snaplen: usize,
    /// Slots filled for the burst on its way (None: no slot was free), until [`Tap::commit`].
    held: Vec<Option<Slot>>,
    /// Frames of the burst on its way that were not looked at: no slot was free when it came.
    passed: usize,
    captured: u64,
    missed: u64,
    cell: Arc<TapCell>,
}

impl Tap {
    /// Copies each frame of `pkts` into a free slot, held until [`Tap::commit`].
    #[inline]
    pub(crate) fn hold(&mut self, pkts: &[Mbuf]) {
        // A capture that cannot keep up costs a look at the free queue a burst, no more (no
        // clock read, nothing per frame). A/B in the commit that added this.
        if self.shared.free.is_empty() {
            self.passed = pkts.len();
            return;
        }
        let ts_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // Once no slot is free, the rest of the burst is missed without looking again: a pop
        // that finds the queue empty costs a SeqCst fence (crossbeam's), one a frame while a
        // capture cannot keep up. A/B in the commit that added this.
        let mut free_left = true;
        for m in pkts {
            // ArrayQueue's pop and push carry the slot's bytes between threads (crossbeam's
            // Acquire/Release on the queue's stamps).
            let popped = if free_left {
                self.shared.free.pop()
            } else {
                None
            };
            free_left = popped.is_some();
            let slot = popped.map(|mut s| {
                let len = m.len();
                let cap = len.min(self.snaplen);
                m.copy_out(0, &mut s.data[..cap]);
                (s.iface, s.ts_ns, s.orig_len, s.caplen) =
                    (self.iface, ts_ns, len as u32, cap as u32);
                s
            });
            self.held.push(slot);
        }
    }

    /// Hands the first `sent` held frames to the writer (those without a slot are missed) and
    /// returns the slots of the rest, which the port did not take.
    #[inline]
    pub(crate) fn commit(&mut self, sent: usize) {
        self.missed += sent.min(std::mem::take(&mut self.passed)) as u64;
        for (i, slot) in self.held.drain(..).enumerate() {
            match slot {
                Some(s) if i < sent => match self.shared.full.push(s) {
                    Ok(()) => self.captured += 1,
                    // Cannot happen: `full` has room for every slot there is.
                    Err(s) => {
                        let _ = self.shared.free.push(s);
                        self.missed += 1;
                    }
                },
                Some(s) => {
                    let _ = self.shared.free.push(s);
                }
                None if i < sent => self.missed += 1,
                None => {}
            }
        }
        // Relaxed: statistics, read on their own by Capture::counts.
        self.cell.captured.store(self.captured, Relaxed);
        self.cell.missed.store(self.missed, Relaxed);
    }

    /// Captures a received burst.
    #[inline]
    pub(crate) fn capture(&mut self, pkts: &[Mbuf]) {
        self.hold(pkts);
        self.commit(pkts.len());
    }
}

/// One capture file and its writer thread.
pub struct Capture {
    pub spec: CaptureSpec,
    pub snaplen: u32,
    pub ring: usize,
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    /// The interface id of each direction captured, in `spec.dirs` order.
    ifaces: Vec<(Dir, u32)>,
    cells: Vec<(Dir, Arc<TapCell>)>,
}

impl Capture {
    /// Creates the file, writes its section and interface blocks, allocates the slots and
    /// starts the writer. `port_name` names the interfaces; `max_frame` is the default snap
    /// length. An error is one sentence.
    pub fn start(spec: CaptureSpec, port_name: &str, max_frame: u32) -> Result<Capture, String> {
        let snaplen = spec.snaplen.unwrap_or(max_frame.clamp(1, MAX_SNAPLEN));
        let ring = spec.ring.unwrap_or_else(|| {
            (DEFAULT_RING_BYTES / snaplen as usize).clamp(MIN_DEFAULT_RING, DEFAULT_RING)
        });
        let what = format!("--capture {}={}", spec.port, spec.path.display());
        let file =
            File::create(&spec.path).map_err(|e| format!("{what}: cannot create the file: {e}"))?;
        let section = SectionHeaderBlock {
            options: vec![SectionHeaderOption::UserApplication(
                "memnic testpmd".into(),
            )],
            ..Default::default()
        };
        let write_err = |e: pcap_file::PcapError| format!("{what}: cannot write the file: {e}");
        let mut out =
            PcapNgWriter::with_section_header(BufWriter::with_capacity(1 << 20, file), section)
                .map_err(write_err)?;
        let mut ifaces = Vec::new();
        for (id, dir) in spec.dirs.iter().enumerate() {
            let idb = InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen,
                options: vec![
                    InterfaceDescriptionOption::IfName(
                        format!("{port_name}-{}", dir.name()).into(),
                    ),
                    InterfaceDescriptionOption::IfDescription(
                        format!("port {} ({port_name}) {}", spec.port, dir.name()).into(),
                    ),
                    // Nanoseconds: the unit EnhancedPacketBlock's timestamps are written in.
                    InterfaceDescriptionOption::IfTsResol(9),
                ],
            };
            out.write_pcapng_block(idb).map_err(write_err)?;
            ifaces.push((*dir, id as u32));
        }
        let shared = Arc::new(Shared {
            free: ArrayQueue::new(ring),
            full: ArrayQueue::new(ring),
            request: AtomicU64::new(0),
            served: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            error: Mutex::new(None),
            written: AtomicU64::new(0),
        });
        for _ in 0..ring {
            let slot = Slot {
                iface: 0,
                ts_ns: 0,
                orig_len: 0,
                caplen: 0,
                data: vec![0; snaplen as usize].into_boxed_slice(),
            };
            assert!(
                shared.free.push(slot).is_ok(),
                "free has room for every slot"
            );
        }
        let dirs: Vec<Dir> = spec.dirs.clone();
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("capture-{}", spec.port))
                .spawn(move || write_loop(&shared, out, &dirs))
                .map_err(|e| format!("{what}: cannot start the writer thread: {e}"))?
        };
        Ok(Capture {
            spec,
            snaplen,
            ring,
            shared,
            writer: Some(writer),
            ifaces,
            cells: Vec::new(),
        })
    }

    /// A tap for one stream's `dir` frames of the captured port, or None when this capture
    /// does not take that direction.
    pub(crate) fn tap(&mut self, dir: Dir) -> Option<Tap> {
        let iface = self.ifaces.iter().find(|(d, _)| *d == dir)?.1;
        let cell = Arc::new(TapCell::default());
        self.cells.push((dir, cell.clone()));
        Some(Tap {
            shared: self.shared.clone(),
            iface,
            snaplen: self.snaplen as usize,
            held: Vec::with_capacity(MAX_BURST),
            passed: 0,
            captured: 0,
            missed: 0,
            cell,
        })
    }

    /// Whether this capture takes `dir`.
    pub fn takes(&self, dir: Dir) -> bool {
        self.spec.dirs.contains(&dir)
    }

    /// Frames of `dir` captured and missed so far, over every stream.
    pub fn counts(&self, dir: Dir) -> CaptureCounts {
        let mut c = CaptureCounts::default();
        for (d, cell) in &self.cells {
            if *d == dir {
                // Relaxed: pairs with the Relaxed stores in Tap::commit.
                c.captured += cell.captured.load(Relaxed);
                c.missed += cell.missed.load(Relaxed);
            }
        }
        c
    }

    /// Frames the writer has put in the file.
    pub fn written(&self) -> u64 {
        // Relaxed: a statistic.
        self.shared.written.load(Relaxed)
    }

    /// Waits until every frame handed over before this call is in the file (call it with the
    /// lcores stopped, so none is on its way). Says so on stderr when that takes a while (a
    /// slow destination). An error is one sentence: why the file is incomplete.
    pub fn flush(&self) -> Result<(), String> {
        self.request(false)
    }

    /// Flushes, stops the writer and closes the file.
    pub fn close(&mut self) -> Result<(), String> {
        if self.writer.is_none() {
            return Ok(());
        }
        let res = self.request(true);
        if let Some(h) = self.writer.take() {
            let _ = h.join();
        }
        res
    }

    /// Asks the writer to write and flush everything pushed so far (and then to leave, with
    /// `closing`), and waits until it has.
    fn request(&self, closing: bool) -> Result<(), String> {
        let Some(writer) = self.writer.as_ref() else {
            return Ok(());
        };
        // Release: pairs with the writer's Acquire load of `request`: the slots pushed before
        // (by lcores joined since) are visible to it.
        let want = self.shared.request.fetch_add(1, Release) + 1;
        if closing {
            // Release, after the request: a writer that sees `closing` (Acquire) then loads a
            // `request` that includes this one.
            self.shared.closing.store(true, Release);
        }
        let start = Instant::now();
        let mut told = false;
        // Acquire: pairs with the writer's Release store of `served`: the file is written and
        // `error` set before it.
        while self.shared.served.load(Acquire) < want {
            if writer.is_finished() {
                return Err(self.failure("the writer thread stopped"));
            }
            if !told && start.elapsed() > Duration::from_secs(1) {
                eprintln!(
                    "waiting for the capture writer of {} (a slow destination)...",
                    self.spec.path.display()
                );
                told = true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        match self
            .shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(why) => Err(self.failure(why)),
            None => Ok(()),
        }
    }

    fn failure(&self, why: &str) -> String {
        format!(
            "--capture {}={}: the file is incomplete after {} frames: {why}",
            self.spec.port,
            self.spec.path.display(),
            self.written()
        )
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            eprintln!("warning: {e}");
        }
    }
}

/// The writer thread: writes full slots, returns them, serves flush requests; sleeps a little
/// longer each time it finds nothing (up to 1 ms).
fn write_loop(shared: &Shared, mut out: PcapNgWriter<BufWriter<File>>, dirs: &[Dir]) {
    let flags: Vec<u32> = dirs.iter().map(|d| d.epb_flags()).collect();
    let mut failed = false;
    let mut served = 0;
    let mut idle = Duration::from_micros(50);
    loop {
        // Acquire: pairs with the Release store in Capture::request; read before `request`, so
        // a writer that sees it also sees the last request.
        let closing = shared.closing.load(Acquire);
        // Acquire: pairs with the Release increment in Capture::request: every slot pushed
        // before the request is found by the pops below.
        let request = shared.request.load(Acquire);
        let mut wrote = 0u64;
        while let Some(slot) = shared.full.pop() {
            if !failed {
                let block = Block::EnhancedPacket(EnhancedPacketBlock {
                    interface_id: slot.iface,
                    timestamp: Duration::from_nanos(slot.ts_ns),
                    original_len: slot.orig_len,
                    data: std::borrow::Cow::Borrowed(&slot.data[..slot.caplen as usize]),
                    options: vec![EnhancedPacketOption::Flags(flags[slot.iface as usize])],
                });
                match out.write_block(&block) {
                    Ok(_) => wrote += 1,
                    Err(e) => {
                        fail(shared, e.to_string());
                        failed = true;
                    }
                }
            }
            let _ = shared.free.push(slot);
        }
        // Relaxed: a statistic.
        shared.written.fetch_add(wrote, Relaxed);
        if request != served {
            if let Err(e) = out.get_mut().flush() {
                if !failed {
                    fail(shared, e.to_string());
                    failed = true;
                }
            }
            served = request;
            // Release: pairs with the Acquire load in Capture::request: what was written and
            // any error are visible once `served` reaches its request.
            shared.served.store(served, Release);
        }
        if closing {
            return;
        }
        if wrote == 0 {
            std::thread::sleep(idle);
            idle = (idle * 2).min(Duration::from_millis(1));
        } else {
            idle = Duration::from_micros(50);
        }
    }
}

fn fail(shared: &Shared, why: String) {
    *shared.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
}

#[cfg(test)]
mod tests {
    use super::*;
    use memnic_pktbuf::{Mempool, PoolConfig};
    use pcap_file::pcapng::PcapNgReader;

    fn spec(s: &str) -> Result<CaptureSpec, String> {
        s.parse()
    }

    #[test]
    fn capture_flags_parse_and_bad_ones_are_one_sentence() {
        let s = spec("1:rx=/tmp/a.pcapng,snaplen=128,ring=16").unwrap();
        assert_eq!(
            s,
            CaptureSpec {
                port: 1,
                dirs: vec![Dir::Rx],
                path: "/tmp/a.pcapng".into(),
                snaplen: Some(128),
                ring: Some(16),
            }
        );
        assert_eq!(spec("0=x").unwrap().dirs, [Dir::Rx, Dir::Tx]);
        assert_eq!(spec("0:tx=x").unwrap().dirs, [Dir::Tx]);
        for (bad, says) in [
            ("0", "expected PORT[:rx|tx|both]=FILE"),
            ("p=x", "'p' is not a port number"),
            ("0:up=x", "direction 'up' is not rx, tx or both"),
            ("0=", "no file name"),
            (
                "0=x,snaplen=0",
                "snaplen=0 is not a number within 1..=262144",
            ),
            ("0=x,snaplen=262145", "is not a number within 1..=262144"),
            ("0=x,ring=many", "ring=many is not a number"),
            ("0=x,snaplen=9,snaplen=9", "snaplen is given twice"),
            (
                "0=x,speed=1",
                "unknown option 'speed' (known: snaplen, ring)",
            ),
            ("0=x,snaplen", "'snaplen' is not key=value"),
        ] {
            let e = spec(bad).unwrap_err();
            assert!(e.starts_with(&format!("--capture '{bad}': ")), "{e}");
            assert!(e.contains(says), "{bad}: '{e}' does not say '{says}'");
        }
    }

    fn frames(pool: &Mempool, n: usize, len: usize) -> Vec<Mbuf> {
        (0..n)
            .map(|i| {
                let mut m = pool.alloc().unwrap();
                let f: Vec<u8> = (0..len).map(|b| (b + i) as u8).collect();
                assert!(m.set_len(len) && m.copy_in(0, &f));
                m
            })
            .collect()
    }

    /// An enhanced packet block: (interface, original length, data, flags).
    type Packet = (u32, u32, Vec<u8>, u32);

    /// The interfaces (name, snap length) and packets of a pcapng file.
    fn read_back(path: &std::path::Path) -> (Vec<(String, u32)>, Vec<Packet>) {
        let mut r = PcapNgReader::new(File::open(path).unwrap()).unwrap();
        let mut packets = Vec::new();
        while let Some(b) = r.next_block() {
            if let Block::EnhancedPacket(p) = b.unwrap() {
                let flags = p
                    .options
                    .iter()
                    .find_map(|o| match o {
                        EnhancedPacketOption::Flags(f) => Some(*f),
                        _ => None,
                    })
                    .unwrap_or(0);
                packets.push((p.interface_id, p.original_len, p.data.to_vec(), flags));
            }
        }
        let ifaces = r
            .interfaces()
            .iter()
            .map(|i| {
                let name = i
                    .options
                    .iter()
                    .find_map(|o| match o {
                        InterfaceDescriptionOption::IfName(n) => Some(n.to_string()),
                        _ => None,
                    })
                    .unwrap_or_default();
                (name, i.snaplen)
            })
            .collect();
        (ifaces, packets)
    }

    /// A burst larger than the free slots: the frames past them are missed (counted), the rest
    /// captured in order; a burst that finds no slot free is missed whole; frames a tx queue
    /// does not take are neither; after flush the file
    /// holds every captured frame, cut at the snap length, with its length on the wire.
    #[test]
    fn a_full_ring_misses_and_counts_and_flush_completes_the_file() {
        let path =
            std::env::temp_dir().join(format!("memnic-capture-{}.pcapng", std::process::id()));
        let mut cfg = PoolConfig::new("capture-test", 64);
        cfg.huge = false;
        let pool = Mempool::new(&cfg).unwrap();
        let s = spec(&format!("3={},snaplen=100,ring=4", path.display())).unwrap();
        let mut cap = Capture::start(s, "memif0", 1518).unwrap();
        assert_eq!((cap.snaplen, cap.ring), (100, 4));
        let mut rx = cap.tap(Dir::Rx).unwrap();
        let mut tx = cap.tap(Dir::Tx).unwrap();

        let burst = frames(&pool, 10, 150);
        rx.capture(&burst);
        assert_eq!(
            cap.counts(Dir::Rx),
            CaptureCounts {
                captured: 4,
                missed: 6
            }
        );
        cap.flush().unwrap();
        // The writer gave the slots back: a tx burst of 5 of which the queue took 3.
        let sent = frames(&pool, 5, 80);
        tx.hold(&sent);
        // The tx burst holds every slot: a burst received meanwhile is missed whole, counted
        // without a look at its frames.
        rx.capture(&frames(&pool, 3, 150));
        assert_eq!(
            cap.counts(Dir::Rx),
            CaptureCounts {
                captured: 4,
                missed: 9
            }
        );
        tx.commit(3);
        assert_eq!(
            cap.counts(Dir::Tx),
            CaptureCounts {
                captured: 3,
                missed: 0
            }
        );
        cap.close().unwrap();
        assert_eq!(cap.written(), 7);

        let (ifaces, packets) = read_back(&path);
        assert_eq!(
            ifaces,
            [
                ("memif0-rx".to_string(), 100),
                ("memif0-tx".to_string(), 100)
            ]
        );
        assert_eq!(packets.len(), 7);
        for (i, (iface, orig, data, flags)) in packets.iter().enumerate() {
            let (m, want_iface, want_flags, len) = if i < 4 {
                (&burst[i], 0, 0b01, 100)
            } else {
                (&sent[i - 4], 1, 0b10, 80)
            };
            assert_eq!((*iface, *flags), (want_iface, want_flags), "packet {i}");
            assert_eq!(*orig as usize, m.len(), "packet {i}: length on the wire");
            assert_eq!(data[..], m.to_vec()[..len], "packet {i}");
        }
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_file_that_cannot_be_created_is_one_sentence() {
        let s = spec("0=/nonexistent-dir/x.pcapng").unwrap();
        let e = Capture::start(s, "memif0", 1518).err().unwrap();
        assert!(
            e.starts_with("--capture 0=/nonexistent-dir/x.pcapng: cannot create the file: "),
            "{e}"
        );
    }
}
