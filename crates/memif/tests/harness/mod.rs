//! The memif data-path harness, shared by `tests/ring_harness.rs` (proptest) and the cargo-fuzz
//! target `fuzz/fuzz_targets/memif_ring.rs`.
//!
//! Real queues (`MemifRxQueue`, `MemifTxQueue`: server, client copy, client zero copy) are built
//! straight over a private region, with no socket: the same `Conn`/`QueueCore`/`QueueSlot` the
//! control path builds, installed through the same gate. The test plays the peer: between bursts
//! it writes any bytes anywhere in the rings and buffers (counters included, ours too), or plays
//! an honest peer for a step, so that valid traffic flows and the corruptions land on live rings.
//!
//! A reference model, written from `specs/memif.md` §5–§8 and independent of the driver's code,
//! predicts each burst from a snapshot of the memory: the frames handed up (their bytes), how
//! many frames are sent, every byte the burst writes into the region, the counters, and which
//! violation (by its DISCONNECT reason) the burst must report. The harness asserts that the
//! queue does exactly that: so a frame is handed up only from inside its buffers, every bad value
//! is counted and flags the port broken (`Broken::take` gives the reason), and no burst panics or
//! touches memory the model does not. Bursts are single calls: one that looped forever would hang
//! the test (the fuzzer's `-timeout` reports it).
//!
//! The input is a byte string read as a little program (see [`run`]): any bytes are a valid
//! program, so proptest and libFuzzer drive it the same way.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use memnic_ethdev::ahead::AheadMode;
use memnic_ethdev::demote::DemoteMode;
use memnic_ethdev::flush::FlushMode;
use memnic_ethdev::gate::Gate;
use memnic_ethdev::stream::StreamMode;
use memnic_ethdev::{Mbuf, Mempool, PoolCache, QueueStats, RxQueue, StatsCell, TxQueue};
use memnic_memif::queue::{
    Broken, Conn, MemifRxQueue, MemifTxQueue, Prefilled, QueueCore, QueueSlot, Role, REFILL_SHARE,
};
use memnic_memif::ring::{ring_bytes, Regions, Ring};
use memnic_pktbuf::PoolConfig;
use memnic_shm::Region;

/// MAX_BURST of the burst API.
const MAX_BURST: usize = memnic_ethdev::MAX_BURST;
const HDR: usize = 128;
const HEAD: usize = 6;
const TAIL: usize = 64;
const NEXT: u16 = 1;
/// Buffers in the harness pool: enough that a burst never runs it dry (the model has no pool).
const POOL_BUFS: u32 = 1024;
/// Size of region 1 (a server has two regions from its client).
const REGION1: usize = 4096;

/// Which end the queues under test are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Server,
    ClientCopy,
    ClientZeroCopy,
}

/// One descriptor as the model reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct D {
    flags: u16,
    region: u16,
    length: u32,
    offset: u32,
}

/// A snapshot of the memory the peer shares with us: region 0 (rings and the client's buffers)
/// and region 1.
#[derive(Clone, PartialEq, Eq)]
struct Mem {
    r0: Vec<u8>,
    r1: Vec<u8>,
}

impl Mem {
    fn u16(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.r0[off], self.r0[off + 1]])
    }
    fn set_u16(&mut self, off: usize, v: u16) {
        self.r0[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn desc(&self, ring: usize, mask: u16, slot: u16) -> D {
        let o = ring + HDR + (slot & mask) as usize * 16;
        let b = &self.r0[o..o + 16];
        D {
            flags: u16::from_le_bytes([b[0], b[1]]),
            region: u16::from_le_bytes([b[2], b[3]]),
            length: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            offset: u32::from_le_bytes(b[8..12].try_into().unwrap()),
        }
    }
    fn set_desc(&mut self, ring: usize, mask: u16, slot: u16, d: D) {
        let o = ring + HDR + (slot & mask) as usize * 16;
        self.r0[o..o + 2].copy_from_slice(&d.flags.to_le_bytes());
        self.r0[o + 2..o + 4].copy_from_slice(&d.region.to_le_bytes());
        self.r0[o + 4..o + 8].copy_from_slice(&d.length.to_le_bytes());
        self.r0[o + 8..o + 16].copy_from_slice(&(d.offset as u64).to_le_bytes());
    }
    /// The bytes a descriptor points at, if inside region 0 or 1 (the server's view).
    fn range(&mut self, d: D) -> Option<&mut [u8]> {
        let r = match d.region {
            0 => &mut self.r0,
            1 => &mut self.r1,
            _ => return None,
        };
        let end = (d.offset as usize).checked_add(d.length as usize)?;
        r.get_mut(d.offset as usize..end)
    }
}

/// What the model says a burst does.
type Expect<T> = Result<T, &'static str>;

/// Our side's private state as the model keeps it (never read back from shared memory).
#[derive(Default)]
struct Model {
    rx_dead: bool,
    tx_dead: bool,
    /// Server rx: last head (= the tail we publish). Client rx: last tail.
    rx_seen: u16,
    /// Client rx: our head.
    rx_own: u16,
    /// Server tx: our tail. Client tx: our head.
    tx_own: u16,
    /// Client tx: last tail.
    tx_seen: u16,
    /// Client zero copy rx: the pool offset of the buffer parked in each slot.
    rx_parked: Vec<Option<u32>>,
    rx_stats: QueueStats,
    tx_stats: QueueStats,
}

/// A frame to send, as the model sees it.
struct TxFrame {
    bytes: Vec<u8>,
    /// Zero copy: the pool offset, when the frame is one segment of our pool.
    zc_offset: Option<u32>,
    /// One segment: a frame up to [`STREAM_MAX`] bytes is written with streaming stores when
    /// its first buffer holds it whole (counted in the queue's `tuned`).
    one_seg: bool,
}

/// The longest frame the tx queue (`StreamMode::On`) writes with streaming stores.
const STREAM_MAX: usize = 128;

/// How many of a burst's frames the model's tx wrote with streaming stores (counted in the
/// queue's `tuned`), and how many of those it wrote with plain stores it demoted
/// (`DemoteMode::On`: every one, its first `DEMOTE_BYTES`, counted in `demoted`).
#[derive(Default)]
struct Written {
    streamed: u64,
    demoted: u64,
}

impl Written {
    /// Counts a frame the model wrote (copied, not parked).
    fn count(&mut self, streamed: bool) {
        if streamed {
            self.streamed += 1;
        } else {
            self.demoted += 1;
        }
    }
}

pub struct Harness {
    pub kind: Kind,
    log2: u8,
    size: u16,
    mask: u16,
    bsize: u32,
    rb: usize,
    region0: Arc<Region>,
    region1: Arc<Region>,
    pool: Mempool,
    cache: PoolCache,
    gate: Arc<Gate>,
    broken: Arc<Broken>,
    rx_slot: Arc<QueueSlot>,
    tx_slot: Arc<QueueSlot>,
    rx: MemifRxQueue,
    tx: MemifTxQueue,
    m: Model,
    seq: u64,
    /// Bursts run and frames moved (for the tests' own sanity checks).
    pub bursts: u64,
    pub frames_rx: u64,
    pub frames_tx: u64,
    pub violations: u64,
    /// The reasons of the violations seen, in order.
    pub reasons: Vec<&'static str>,
}

impl Harness {
    pub fn new(kind: Kind, log2: u8, bsize: u32) -> Harness {
        let size = 1u16 << log2;
        let rb = ring_bytes(log2);
        let len0 = 2 * rb + 2 * size as usize * bsize as usize;
        let region0 = Arc::new(Region::private(len0, false).unwrap());
        let region1 = Arc::new(Region::private(REGION1, false).unwrap());
        let mut c = PoolConfig::new("harness", POOL_BUFS);
        c.huge = false;
        c.shared = kind == Kind::ClientZeroCopy;
        c.cache_size = 32;
        let pool = Mempool::new(&c).unwrap();
        let gate = Gate::new();
        let broken = Arc::new(Broken::default());
        let rx_slot = Arc::new(QueueSlot::default());
        let tx_slot = Arc::new(QueueSlot::default());
        let core = |slot: &Arc<QueueSlot>| {
            QueueCore::new(
                gate.join(),
                slot.clone(),
                broken.clone(),
                pool.cache(),
                StatsCell::new(),
            )
        };
        // Polled as the tests drive it: no hold-off.
        let rx = MemifRxQueue::new(core(&rx_slot), FlushMode::On, Duration::ZERO);
        // Short frames streamed, as before the choice was tuned (long ones test plain stores),
        // and up to 256 B demoted once written; lines asked for ahead in exclusive state, as
        // before that choice was.
        let tx = MemifTxQueue::new(
            core(&tx_slot),
            StreamMode::On,
            DemoteMode::On,
            AheadMode::Off,
        );
        let mut h = Harness {
            kind,
            log2,
            size,
            mask: size - 1,
            bsize,
            rb,
            region0,
            region1,
            cache: pool.cache(),
            pool,
            gate,
            broken,
            rx_slot,
            tx_slot,
            rx,
            tx,
            m: Model::default(),
            seq: 0,
            bursts: 0,
            frames_rx: 0,
            frames_tx: 0,
            violations: 0,
            reasons: Vec::new(),
        };
        h.connect();
        h
    }

    /// Back to a fresh connection over zeroed memory, counts cleared.
    pub fn reset(&mut self) {
        self.region0.fill(0, self.region0.len(), 0).unwrap();
        self.region1.fill(0, self.region1.len(), 0).unwrap();
        self.bursts = 0;
        self.frames_rx = 0;
        self.frames_tx = 0;
        self.violations = 0;
        self.reasons.clear();
        self.connect();
    }

    fn is_client(&self) -> bool {
        self.kind != Kind::Server
    }

    /// The ring we receive on: C2S (at 0) for a server, S2C (after it) for a client.
    fn rx_ring_off(&self) -> usize {
        if self.is_client() {
            self.rb
        } else {
            0
        }
    }

    fn tx_ring_off(&self) -> usize {
        if self.is_client() {
            0
        } else {
            self.rb
        }
    }

    /// Where slot 0's buffer of the ring at `ring_off` starts in the client's layout.
    fn base(&self, ring_off: usize) -> usize {
        let g = ring_off / self.rb;
        2 * self.rb + g * self.size as usize * self.bsize as usize
    }

    fn ring(&self, off: usize) -> Ring {
        Ring::new(self.region0.clone(), off, self.log2).unwrap()
    }

    fn snapshot(&self) -> Mem {
        let mut m = Mem {
            r0: vec![0; self.region0.len()],
            r1: vec![0; self.region1.len()],
        };
        self.region0.read_bytes(0, &mut m.r0).unwrap();
        self.region1.read_bytes(0, &mut m.r1).unwrap();
        m
    }

    fn conn(&self, ring_off: usize) -> Conn {
        let client = self.is_client();
        Conn {
            role: if client { Role::Client } else { Role::Server },
            ring: self.ring(ring_off),
            regions: if client {
                Regions(vec![self.region0.clone()])
            } else {
                Regions(vec![self.region0.clone(), self.region1.clone()])
            },
            buffers: client.then(|| (self.base(ring_off), self.bsize)),
            irq: None,
            zero_copy_region: (self.kind == Kind::ClientZeroCopy).then_some(1),
        }
    }

    /// What the control path does at connect: fresh rings (head = tail = 0), a client posts its
    /// S2C ring, the queues are handed their connections through the gate.
    pub fn connect(&mut self) {
        self.install(false)
    }

    /// Zero copy: a connection whose S2C head says every slot is posted while no buffer is
    /// parked in any (no peer can do this; it stands for a control path that lost the buffers).
    /// A slot the server then fills must be refused, never dereferenced.
    pub fn connect_unposted(&mut self) {
        assert_eq!(self.kind, Kind::ClientZeroCopy);
        self.install(true)
    }

    fn install(&mut self, unposted: bool) {
        let rx_conn = self.conn(self.rx_ring_off());
        let tx_conn = self.conn(self.tx_ring_off());
        rx_conn.ring.init();
        tx_conn.ring.init();
        let prefilled = if unposted {
            rx_conn
                .ring
                .head()
                .store(self.size, std::sync::atomic::Ordering::Release);
            Prefilled {
                parked: Vec::new(),
                head: self.size,
            }
        } else if self.is_client() {
            MemifRxQueue::prefill_client_rx(&rx_conn, &self.pool)
        } else {
            Prefilled::default()
        };
        let head = prefilled.head;
        let (rx_slot, tx_slot) = (self.rx_slot.clone(), self.tx_slot.clone());
        self.gate
            .reset(None, Duration::from_secs(5), move || {
                *rx_slot.conn.lock().unwrap() = Some(rx_conn);
                *rx_slot.prefilled.lock().unwrap() = prefilled;
                *tx_slot.conn.lock().unwrap() = Some(tx_conn);
                Some(())
            })
            .expect("the queues are idle");
        let stats = (self.m.rx_stats, self.m.tx_stats);
        self.m = Model {
            rx_stats: stats.0,
            tx_stats: stats.1,
            rx_parked: vec![None; self.size as usize],
            ..Model::default()
        };
        let _ = self.broken.take();
        // The model's view of the prefill: copy mode posts its own layout, zero copy a pool
        // buffer per slot (which one is the driver's choice: learn it, check its shape).
        let mem = self.snapshot();
        let ring = self.rx_ring_off();
        if self.is_client() {
            assert_eq!(head, self.size, "the whole S2C ring is posted at connect");
            assert_eq!(mem.u16(ring + HEAD), head, "and head published");
            for s in 0..head {
                if !unposted {
                    self.check_posted(&mem, s);
                }
            }
        } else {
            assert_eq!(head, 0);
        }
        self.m.rx_own = head;
    }

    /// A client's posted S2C slot `s`: its descriptor as refill must write it.
    fn check_posted(&mut self, mem: &Mem, s: u16) {
        let ring = self.rx_ring_off();
        let d = mem.desc(ring, self.mask, s);
        match self.kind {
            Kind::ClientCopy => {
                let off = self.base(ring) + (s & self.mask) as usize * self.bsize as usize;
                assert_eq!(
                    d,
                    D {
                        flags: 0,
                        region: 0,
                        length: self.bsize,
                        offset: off as u32
                    },
                    "slot {s} posted with our layout"
                );
            }
            Kind::ClientZeroCopy => {
                let cap = self.pool.data_room();
                assert_eq!((d.flags, d.region, d.length), (0, 1, cap), "slot {s}");
                let buf = self.pool.buf_size();
                assert_eq!(
                    d.offset % buf,
                    self.pool.headroom(),
                    "a buffer's data start"
                );
                assert!(d.offset < self.pool.region().len() as u32);
                assert!(
                    !self.m.rx_parked.contains(&Some(d.offset)),
                    "one buffer parked twice"
                );
                self.m.rx_parked[(s & self.mask) as usize] = Some(d.offset);
            }
            Kind::Server => unreachable!(),
        }
    }

    // ---- the model -------------------------------------------------------------------------

    /// rx, as the spec says it goes.
    fn model_rx(&mut self, mem: &mut Mem, max: usize) -> (Expect<Vec<Vec<u8>>>, u64) {
        let mut bytes = 0u64;
        if self.m.rx_dead {
            return (Ok(Vec::new()), 0);
        }
        let ring = self.rx_ring_off();
        let size = self.size;
        let max = max.min(MAX_BURST);
        let seen = self.m.rx_seen;
        let avail = if self.is_client() {
            let tail = mem.u16(ring + TAIL);
            let a = tail.wrapping_sub(seen);
            if a > self.m.rx_own.wrapping_sub(seen) {
                return (Err("Ring tail passed head"), 0);
            }
            a
        } else {
            let head = mem.u16(ring + HEAD);
            let a = head.wrapping_sub(seen);
            if a > size {
                return (Err("Ring head out of range"), 0);
            }
            if a == 0 {
                return (Ok(Vec::new()), 0);
            }
            a
        };
        let past_end = if self.is_client() {
            "Chained buffer runs past tail"
        } else {
            "Chained buffer runs past head"
        };
        let mut parked = self.m.rx_parked.clone();
        let mut used: u16 = 0;
        let mut frames = Vec::new();
        while used < avail && frames.len() < max {
            let mut f = Vec::new();
            loop {
                if used == avail {
                    return (Err(past_end), bytes);
                }
                let slot = seen.wrapping_add(used);
                let d = mem.desc(ring, self.mask, slot);
                used += 1;
                match self.kind {
                    Kind::Server => match mem.range(d) {
                        Some(b) => f.extend_from_slice(b),
                        None => return (Err("Descriptor outside its region"), bytes),
                    },
                    Kind::ClientCopy => {
                        if d.length > self.bsize {
                            return (Err("Descriptor longer than its buffer"), bytes);
                        }
                        let off =
                            self.base(ring) + (slot & self.mask) as usize * self.bsize as usize;
                        f.extend_from_slice(&mem.r0[off..off + d.length as usize]);
                    }
                    Kind::ClientZeroCopy => {
                        let Some(off) = parked[(slot & self.mask) as usize].take() else {
                            return (Err("Tail moved over an empty slot"), bytes);
                        };
                        if d.length > self.pool.data_room() {
                            return (Err("Descriptor longer than its buffer"), bytes);
                        }
                        let mut b = vec![0; d.length as usize];
                        self.pool.region().read_bytes(off as usize, &mut b).unwrap();
                        f.extend_from_slice(&b);
                    }
                }
                if d.flags & NEXT == 0 {
                    break;
                }
            }
            bytes += f.len() as u64;
            frames.push(f);
        }
        let seen = seen.wrapping_add(used);
        self.m.rx_seen = seen;
        self.m.rx_parked = parked;
        if self.is_client() {
            // Refill, once an eighth of the ring (REFILL_SHARE) is free: every free slot posted
            // again, head published if it moved. The zero-copy descriptors are learnt after the
            // burst (the driver picks the buffers).
            let mut own = self.m.rx_own;
            let refills = size - own.wrapping_sub(seen) >= size / REFILL_SHARE;
            while refills && own.wrapping_sub(seen) < size {
                if self.kind == Kind::ClientCopy {
                    let off = self.base(ring) + (own & self.mask) as usize * self.bsize as usize;
                    mem.set_desc(
                        ring,
                        self.mask,
                        own,
                        D {
                            flags: 0,
                            region: 0,
                            length: self.bsize,
                            offset: off as u32,
                        },
                    );
                }
                own = own.wrapping_add(1);
            }
            if own != self.m.rx_own {
                mem.set_u16(ring + HEAD, own);
            }
        } else if used > 0 {
            mem.set_u16(ring + TAIL, seen);
        }
        (Ok(frames), bytes)
    }

    /// tx, as the spec says it goes. Returns the frames sent, the bytes counted, and how many
    /// of the frames sent were streamed and demoted (none when the burst broke the protocol).
    fn model_tx(&mut self, mem: &mut Mem, frames: &[TxFrame]) -> (Expect<usize>, u64, Written) {
        if self.m.tx_dead {
            return (Ok(0), 0, Written::default());
        }
        let ring = self.tx_ring_off();
        let size = self.size;
        let mut bytes = 0u64;
        let mut sent = 0;
        let mut written = Written::default();
        let streams = |f: &TxFrame, room: u32| {
            f.one_seg && f.bytes.len() <= STREAM_MAX && f.bytes.len() <= room as usize
        };
        if self.is_client() {
            let (own, seen) = (self.m.tx_own, self.m.tx_seen);
            // The server's tail, checked against our last one and our published head: read
            // every burst in zero copy, in copy mode only once the room known from the last
            // read runs out.
            let read_tail = |m: &mut Model, mem: &Mem| {
                let tail = mem.u16(ring + TAIL);
                if tail.wrapping_sub(seen) > own.wrapping_sub(seen) {
                    return Err("Ring tail out of range");
                }
                m.tx_seen = tail;
                Ok(tail)
            };
            let mut free = size - own.wrapping_sub(seen);
            let mut tail_read = false;
            if self.kind == Kind::ClientZeroCopy {
                match read_tail(&mut self.m, mem) {
                    Ok(tail) => free = size - own.wrapping_sub(tail),
                    Err(e) => return (Err(e), 0, Written::default()),
                }
                tail_read = true;
            }
            let mut head = own;
            for f in frames.iter().take(MAX_BURST) {
                if let Some(offset) = f.zc_offset {
                    if free == 0 {
                        break;
                    }
                    let d = D {
                        flags: 0,
                        region: 1,
                        length: f.bytes.len() as u32,
                        offset,
                    };
                    mem.set_desc(ring, self.mask, head, d);
                    head = head.wrapping_add(1);
                    free -= 1;
                } else {
                    let b = self.bsize as usize;
                    let slots = f.bytes.len().div_ceil(b).max(1);
                    if slots > free as usize && !tail_read {
                        match read_tail(&mut self.m, mem) {
                            Ok(tail) => free = size - head.wrapping_sub(tail),
                            Err(e) => return (Err(e), 0, Written::default()),
                        }
                        tail_read = true;
                    }
                    if slots > free as usize {
                        break;
                    }
                    written.count(streams(f, self.bsize));
                    for k in 0..slots {
                        let off = self.base(ring) + (head & self.mask) as usize * b;
                        let chunk =
                            &f.bytes[(k * b).min(f.bytes.len())..((k + 1) * b).min(f.bytes.len())];
                        mem.r0[off..off + chunk.len()].copy_from_slice(chunk);
                        let flags = if k + 1 < slots { NEXT } else { 0 };
                        let d = D {
                            flags,
                            region: 0,
                            length: chunk.len() as u32,
                            offset: off as u32,
                        };
                        mem.set_desc(ring, self.mask, head, d);
                        head = head.wrapping_add(1);
                    }
                    free -= slots as u16;
                }
                bytes += f.bytes.len() as u64;
                sent += 1;
            }
            if head != own {
                self.m.tx_own = head;
                mem.set_u16(ring + HEAD, head);
            }
        } else {
            let own = self.m.tx_own;
            let head = mem.u16(ring + HEAD);
            let avail = head.wrapping_sub(own);
            if avail > size {
                return (Err("Ring head out of range"), 0, Written::default());
            }
            let mut used: u16 = 0;
            'frames: for f in frames.iter().take(MAX_BURST) {
                let len = f.bytes.len();
                let mut streamed = false;
                let (mut done, mut slots) = (0usize, 0u16);
                loop {
                    if used + slots == avail {
                        break 'frames;
                    }
                    let slot = own.wrapping_add(used + slots);
                    let d = mem.desc(ring, self.mask, slot);
                    let k = (len - done).min(d.length as usize);
                    let Some(dst) = mem.range(d) else {
                        return (
                            Err("Descriptor outside its region"),
                            bytes,
                            Written::default(),
                        );
                    };
                    if k == 0 && len > done {
                        return (Err("Descriptor with no room"), bytes, Written::default());
                    }
                    if slots == 0 {
                        streamed = streams(f, d.length);
                    }
                    dst[..k].copy_from_slice(&f.bytes[done..done + k]);
                    done += k;
                    slots += 1;
                    let mut dd = mem.desc(ring, self.mask, slot);
                    dd.length = k as u32;
                    dd.flags = if done < len { NEXT } else { 0 };
                    // Only length and flags are written back: keep the rest as it is now.
                    let o = ring + HDR + (slot & self.mask) as usize * 16;
                    mem.r0[o + 4..o + 8].copy_from_slice(&dd.length.to_le_bytes());
                    mem.r0[o..o + 2].copy_from_slice(&dd.flags.to_le_bytes());
                    if done == len {
                        written.count(streamed);
                        break;
                    }
                }
                used += slots;
                bytes += len as u64;
                sent += 1;
            }
            if used > 0 {
                self.m.tx_own = own.wrapping_add(used);
                mem.set_u16(ring + TAIL, self.m.tx_own);
            }
        }
        (Ok(sent), bytes, written)
    }

    // ---- bursts, checked against the model ---------------------------------------------------

    fn check_memory(&self, want: &Mem, what: &str) {
        let got = self.snapshot();
        for (name, a, b) in [
            ("region 0", &got.r0, &want.r0),
            ("region 1", &got.r1, &want.r1),
        ] {
            // One memcmp first: a byte loop here would be most of the fuzzer's time.
            if a == b {
                continue;
            }
            if let Some(i) = a.iter().zip(b.iter()).position(|(x, y)| x != y) {
                panic!(
                    "{what}: {name} byte {i:#x} is {:#04x}, the model says {:#04x} (ring bytes {:#x})",
                    a[i], b[i], self.rb
                );
            }
        }
    }

    fn check_broken(&mut self, expect: Option<&'static str>, what: &str) {
        let got = self.broken.take();
        assert_eq!(got, expect, "{what}: the reason the port is flagged with");
        if let Some(r) = expect {
            self.violations += 1;
            self.reasons.push(r);
            assert_eq!(
                self.broken.last_error().map(|e| e.reason()),
                Some(r),
                "{what}: the typed error"
            );
        }
    }

    /// One rx burst of at most `max` frames, checked.
    pub fn rx(&mut self, max: usize) {
        self.bursts += 1;
        let live = !self.m.rx_dead;
        let mut mem = self.snapshot();
        let (expect, bytes) = self.model_rx(&mut mem, max);
        let mut pkts = Vec::new();
        let n = self.rx.rx_burst(&mut pkts, max);
        assert_eq!(n, pkts.len(), "rx returns what it appended");
        assert!(n <= max.min(MAX_BURST));
        match expect {
            Ok(frames) => {
                // Bytes count only for frames handed up: a burst that ends in a violation hands
                // up nothing, so its frames' bytes are not counted either.
                self.m.rx_stats.bytes += bytes;
                self.m.rx_stats.packets += frames.len() as u64;
                // The queue flushes every frame it copies (FlushMode::On); zero copy copies none.
                if self.kind != Kind::ClientZeroCopy {
                    self.m.rx_stats.tuned += frames.len() as u64;
                }
                self.frames_rx += frames.len() as u64;
                assert_eq!(n, frames.len(), "rx: frames handed up");
                for (i, (m, want)) in pkts.iter().zip(&frames).enumerate() {
                    check_segments(m);
                    assert!(
                        m.to_vec() == *want,
                        "rx frame {i}: bytes differ from its buffers"
                    );
                }
                self.check_broken(None, "rx");
                if live && self.is_client() {
                    // Refill posted every free slot, once an eighth of the ring was free.
                    // Zero copy: which buffers is the driver's choice; learn them from the
                    // ring, checking each descriptor's shape.
                    let free = self.size - self.m.rx_own.wrapping_sub(self.m.rx_seen);
                    let own = if free >= self.size / REFILL_SHARE {
                        self.m.rx_seen.wrapping_add(self.size)
                    } else {
                        self.m.rx_own
                    };
                    if self.kind == Kind::ClientZeroCopy {
                        let got = self.snapshot();
                        let ring = self.rx_ring_off();
                        let mut s = self.m.rx_own;
                        while s != own {
                            mem.set_desc(ring, self.mask, s, got.desc(ring, self.mask, s));
                            self.check_posted(&got, s);
                            s = s.wrapping_add(1);
                        }
                    }
                    self.m.rx_own = own;
                }
            }
            Err(reason) => {
                assert_eq!(
                    n, 0,
                    "rx: nothing handed up from a ring that broke the protocol"
                );
                self.m.rx_stats.errors += 1;
                self.m.rx_dead = true;
                self.m.rx_parked.iter_mut().for_each(|p| *p = None);
                self.check_broken(Some(reason), "rx");
            }
        }
        self.check_memory(&mem, "rx");
        assert_eq!(self.rx.stats(), self.m.rx_stats, "rx counters");
        self.cache.free_all(&mut pkts);
    }

    /// A frame of `len` bytes (two segments when `chained`), numbered.
    fn frame(&mut self, len: usize, chained: bool) -> Mbuf {
        self.seq += 1;
        let bytes: Vec<u8> = (0..len)
            .map(|i| (self.seq as u8).wrapping_mul(31).wrapping_add(i as u8))
            .collect();
        // Segments: two halves when `chained`, and none longer than a buffer.
        let cap = self.pool.data_room() as usize;
        let split = if chained { len / 2 } else { len };
        let mut cuts = Vec::new();
        for (from, to) in [(0, split), (split, len)] {
            let mut at = from;
            while at < to || (at == 0 && to == 0 && cuts.is_empty()) {
                let end = (at + cap).min(to);
                cuts.push((at, end));
                if end == at {
                    break;
                }
                at = end;
            }
        }
        let mut segs = cuts.into_iter().map(|(a, b)| {
            let mut t = self.cache.alloc().expect("pool");
            assert!(t.set_len(b - a));
            assert!(t.copy_in(0, &bytes[a..b]));
            t
        });
        let mut m = segs.next().expect("a segment");
        for t in segs {
            m.chain(t).unwrap();
        }
        assert_eq!(m.to_vec(), bytes);
        m
    }

    /// One tx burst of frames of these lengths (odd-indexed ones chained when asked), checked.
    pub fn tx(&mut self, lens: &[(usize, bool)]) {
        self.bursts += 1;
        let mut pkts: Vec<Mbuf> = lens.iter().map(|&(l, c)| self.frame(l, c)).collect();
        let frames: Vec<TxFrame> = pkts
            .iter()
            .map(|m| TxFrame {
                bytes: m.to_vec(),
                zc_offset: (self.kind == Kind::ClientZeroCopy && m.nb_segs() == 1)
                    .then(|| m.region_offset() as u32),
                one_seg: m.nb_segs() == 1,
            })
            .collect();
        let mut mem = self.snapshot();
        let (expect, bytes, written) = self.model_tx(&mut mem, &frames);
        let before = pkts.len();
        let n = self.tx.tx_burst(&mut pkts);
        assert_eq!(before - pkts.len(), n, "tx removes what it sent");
        self.m.tx_stats.bytes += bytes;
        match expect {
            Ok(sent) => {
                assert_eq!(n, sent, "tx: frames sent");
                self.m.tx_stats.packets += sent as u64;
                self.m.tx_stats.tuned += written.streamed;
                self.m.tx_stats.demoted += written.demoted;
                self.frames_tx += sent as u64;
                self.check_broken(None, "tx");
            }
            Err(reason) => {
                assert_eq!(n, 0, "tx: nothing sent on a ring that broke the protocol");
                self.m.tx_stats.errors += 1;
                self.m.tx_dead = true;
                self.check_broken(Some(reason), "tx");
            }
        }
        // What was not sent is handed back whole, in order.
        for (m, f) in pkts.iter().zip(&frames[n..]) {
            assert!(m.to_vec() == f.bytes, "an unsent frame came back changed");
        }
        self.check_memory(&mem, "tx");
        assert_eq!(self.tx.stats(), self.m.tx_stats, "tx counters");
        self.cache.free_all(&mut pkts);
    }

    // ---- the peer ----------------------------------------------------------------------------

    /// The peer writes `bytes` at `off` (any offset: wrapped into the region).
    pub fn poke(&self, region1: bool, off: usize, bytes: &[u8]) {
        let r = if region1 && !self.is_client() {
            &self.region1
        } else if region1 && self.kind == Kind::ClientZeroCopy {
            self.pool.region()
        } else {
            &self.region0
        };
        let off = off % r.len();
        let n = bytes.len().min(r.len() - off);
        r.write_bytes(off, &bytes[..n]).unwrap();
    }

    /// The peer writes a descriptor of one of the rings.
    pub fn poke_desc(
        &self,
        rx_ring: bool,
        slot: u16,
        flags: u16,
        region: u16,
        length: u32,
        offset: u32,
    ) {
        let ring = if rx_ring {
            self.rx_ring_off()
        } else {
            self.tx_ring_off()
        };
        let o = ring + HDR + (slot & self.mask) as usize * 16;
        let mut b = [0u8; 16];
        b[0..2].copy_from_slice(&flags.to_le_bytes());
        b[2..4].copy_from_slice(&region.to_le_bytes());
        b[4..8].copy_from_slice(&length.to_le_bytes());
        b[8..12].copy_from_slice(&offset.to_le_bytes());
        self.region0.write_bytes(o, &b).unwrap();
    }

    /// The peer sets a counter of one of the rings (`head` or tail) to `value`, or moves it by
    /// `value` as a signed delta from where it is.
    pub fn poke_counter(&self, rx_ring: bool, head: bool, value: u16, relative: bool) {
        let ring = if rx_ring {
            self.rx_ring_off()
        } else {
            self.tx_ring_off()
        };
        let r = self.ring(ring);
        let c = if head { r.head() } else { r.tail() };
        let v = if relative {
            c.load(std::sync::atomic::Ordering::Relaxed)
                .wrapping_add(value as i8 as i16 as u16)
        } else {
            value
        };
        c.store(v, std::sync::atomic::Ordering::Release);
    }

    /// The limits a test can use to aim its pokes.
    pub fn region_len(&self) -> usize {
        self.region0.len()
    }
    pub fn bsize(&self) -> u32 {
        self.bsize
    }
    pub fn size(&self) -> u16 {
        self.size
    }

    /// An honest peer sends up to `lens.len()` frames to us on our rx ring.
    pub fn peer_send(&self, lens: &[usize]) {
        self.peer_send_bent(lens, 0, 0)
    }

    /// As [`Harness::peer_send`], then one descriptor of what was sent is bent before the
    /// counter moves: `how` 1: slot `which` (mod the slots sent) one byte or more over its
    /// buffer; 2: NEXT on the last slot; 3: NEXT cleared on slot `which`; 4: slot `which`
    /// pointed outside every region. Chains are where these hide.
    pub fn peer_send_bent(&self, lens: &[usize], how: u8, which: u16) {
        let ring = self.rx_ring_off();
        let r = self.ring(ring);
        let mut mem = self.snapshot();
        let (head, tail) = (mem.u16(ring + HEAD), mem.u16(ring + TAIL));
        let fill = |slot: u16, data: &[u8], flags: u16, mem: &mut Mem| -> bool {
            if self.is_client() {
                // We are the client: the peer (a server) fills the slots we posted.
                let mut d = mem.desc(ring, self.mask, slot);
                if (d.length as usize) < data.len() {
                    return false;
                }
                let target = if self.kind == Kind::ClientZeroCopy {
                    self.pool.region()
                } else {
                    &self.region0
                };
                if d.region != (self.kind == Kind::ClientZeroCopy) as u16
                    || target.write_bytes(d.offset as usize, data).is_err()
                {
                    return false;
                }
                d.length = data.len() as u32;
                d.flags = flags;
                mem.set_desc(ring, self.mask, slot, d);
            } else {
                // We are the server: the peer (a client) uses its own layout.
                let off = self.base(ring) + (slot & self.mask) as usize * self.bsize as usize;
                self.region0.write_bytes(off, data).unwrap();
                let d = D {
                    flags,
                    region: 0,
                    length: data.len() as u32,
                    offset: off as u32,
                };
                mem.set_desc(ring, self.mask, slot, d);
            }
            true
        };
        let (mut at, limit) = if self.is_client() {
            (tail, head.wrapping_sub(tail).min(self.size))
        } else {
            (head, self.size.saturating_sub(head.wrapping_sub(tail)))
        };
        let mut used = 0u16;
        let chunk = if self.is_client() {
            usize::MAX
        } else {
            self.bsize as usize
        };
        'frames: for (k, &len) in lens.iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|i| (k * 7 + i) as u8).collect();
            let chunk = chunk.min(self.peer_chunk(&mem, ring, at.wrapping_add(used)));
            let slots = len.div_ceil(chunk.max(1)).max(1);
            if used as usize + slots > limit as usize {
                break;
            }
            for s in 0..slots {
                let part = &data[(s * chunk).min(len)..((s + 1) * chunk).min(len)];
                let flags = if s + 1 < slots { NEXT } else { 0 };
                if !fill(at.wrapping_add(used), part, flags, &mut mem) {
                    break 'frames;
                }
                used += 1;
            }
        }
        if used > 0 {
            let last = at.wrapping_add(used - 1);
            let slot = at.wrapping_add(which % used);
            let mut d = mem.desc(ring, self.mask, slot);
            match how % 5 {
                1 => {
                    let cap = match self.kind {
                        Kind::ClientZeroCopy => self.pool.data_room(),
                        _ => self.bsize,
                    };
                    d.length = cap + 1 + (which as u32 >> 8);
                    mem.set_desc(ring, self.mask, slot, d);
                }
                2 => {
                    let mut l = mem.desc(ring, self.mask, last);
                    l.flags |= NEXT;
                    mem.set_desc(ring, self.mask, last, l);
                }
                3 => {
                    d.flags &= !NEXT;
                    mem.set_desc(ring, self.mask, slot, d);
                }
                4 => {
                    d.offset = u32::MAX - (which as u32);
                    mem.set_desc(ring, self.mask, slot, d);
                }
                _ => {}
            }
        }
        // Descriptors first, then the counter (Release, as a peer must).
        self.region0
            .write_bytes(
                ring + HDR,
                &mem.r0[ring + HDR..ring + HDR + self.size as usize * 16],
            )
            .unwrap();
        at = at.wrapping_add(used);
        let c = if self.is_client() { r.tail() } else { r.head() };
        c.store(at, std::sync::atomic::Ordering::Release);
    }

    /// The capacity a server peer can count on per slot (the client's posted length).
    fn peer_chunk(&self, mem: &Mem, ring: usize, slot: u16) -> usize {
        if self.is_client() {
            (mem.desc(ring, self.mask, slot).length as usize).clamp(1, 1 << 16)
        } else {
            self.bsize as usize
        }
    }

    /// An honest peer takes what we sent on our tx ring (a server: tail = head) or posts its
    /// free slots (a client: each gets a capacity of `cap` in its layout, head moves).
    pub fn peer_take(&self, cap: u32) {
        let ring = self.tx_ring_off();
        let r = self.ring(ring);
        let mem = self.snapshot();
        let (head, tail) = (mem.u16(ring + HEAD), mem.u16(ring + TAIL));
        if self.is_client() {
            r.tail().store(head, std::sync::atomic::Ordering::Release);
        } else {
            let mut h = head;
            // A capacity of 0 now and then: a slot with no room for anything.
            let cap = cap % (self.bsize + 1);
            while h.wrapping_sub(tail) < self.size {
                let off = self.base(ring) + (h & self.mask) as usize * self.bsize as usize;
                self.poke_desc(false, h, 0, 0, cap, off as u32);
                h = h.wrapping_add(1);
            }
            r.head().store(h, std::sync::atomic::Ordering::Release);
        }
    }
}

/// Every segment of a frame handed up lies within its buffer, and the lengths add up.
fn check_segments(m: &Mbuf) {
    let mut total = 0;
    for s in m.segments() {
        assert!(s.data_len() <= s.capacity(), "a segment past its buffer");
        total += s.data_len();
    }
    assert_eq!(total, m.len(), "segment lengths add up to the frame");
}

/// Reads the program: bytes, zero once exhausted.
struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
}

/// Runs one program against a fresh harness; panics (with the model's word) on any difference.
///
/// Byte 0: kind (mod 3) and log2 ring size (1..=4); byte 1: buffer size (64, 128, 256, 1024).
/// Then operations, one byte of opcode (mod 12) and its operands:
///
/// 0 raw bytes anywhere · 1 a descriptor (aimed near the buffers, or wild) · 2 a peer counter
/// (absolute or a signed delta) · 3 one of our own counters in shared memory · 4 rx burst ·
/// 5 tx burst · 6 an honest peer sends · 7 it sends with one descriptor bent · 8, 9 an honest
/// peer takes / posts · 10 reconnect ·
/// 11 rx and tx bursts.
pub fn run(data: &[u8]) -> Harness {
    let mut inp = Input { data, at: 0 };
    let (kind, log2, bsize) = header(&mut inp);
    let mut h = Harness::new(kind, log2, bsize);
    program(&mut h, &mut inp);
    h
}

/// As [`run`], on a harness kept from an earlier input of the same shape and [reset]: the
/// fuzzer's way (building queues, pools and regions for every input would dominate its time).
///
/// [reset]: Harness::reset
pub fn run_reusing(data: &[u8]) {
    use std::cell::RefCell;
    use std::collections::HashMap;
    thread_local! {
        static KEPT: RefCell<HashMap<(u8, u8, u32), Harness>> = RefCell::new(HashMap::new());
    }
    let mut inp = Input { data, at: 0 };
    let (kind, log2, bsize) = header(&mut inp);
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        let h = kept
            .entry((kind as u8, log2, bsize))
            .or_insert_with(|| Harness::new(kind, log2, bsize));
        h.reset();
        program(h, &mut inp);
    });
}

/// Byte 0: kind and log2 ring size; byte 1: buffer size.
fn header(inp: &mut Input) -> (Kind, u8, u32) {
    let b0 = inp.u8();
    let kind = [Kind::Server, Kind::ClientCopy, Kind::ClientZeroCopy][(b0 % 3) as usize];
    let log2 = 1 + (b0 / 3) % 4;
    let bsize = [64, 128, 256, 1024][(inp.u8() % 4) as usize];
    (kind, log2, bsize)
}

/// Runs the operations of a program.
fn program(h: &mut Harness, inp: &mut Input) {
    let mut steps = 0;
    while !inp.done() && steps < 256 {
        steps += 1;
        match inp.u8() % 12 {
            0 => {
                let r1 = inp.u8() & 1 == 1;
                let off = inp.u16() as usize;
                let n = (inp.u8() % 24) as usize;
                let bytes: Vec<u8> = (0..n).map(|_| inp.u8()).collect();
                h.poke(r1, off, &bytes);
            }
            1 => {
                let rx_ring = inp.u8() & 1 == 1;
                let slot = inp.u8() as u16;
                let f = inp.u8();
                let flags = if f & 0x80 != 0 {
                    f as u16
                } else {
                    (f & 1) as u16
                };
                let wild = inp.u8();
                let (region, length, offset) = if wild & 0x80 != 0 {
                    (inp.u16(), inp.u32(), inp.u32())
                } else {
                    let region = (wild % 3) as u16;
                    let len = inp.u16() as u32 % (2 * h.bsize() + 2);
                    let off = inp.u16() as u32 % (h.region_len() as u32 + 64);
                    (region, len, off)
                };
                h.poke_desc(rx_ring, slot, flags, region, length, offset);
            }
            op @ (2 | 3) => {
                let rx_ring = inp.u8() & 1 == 1;
                let rel = inp.u8() & 1 == 1;
                let v = inp.u16();
                // 2: the peer's own counter (a client's head, a server's tail); 3: ours, which
                // the peer can write too (we must never read it back).
                let peer_head = !h.is_client();
                let head = if op == 3 { !peer_head } else { peer_head };
                h.poke_counter(rx_ring, head, v, rel);
            }
            4 => {
                let max = 1 + inp.u8() as usize % 40;
                h.rx(max);
            }
            5 => {
                let n = 1 + inp.u8() as usize % 8;
                let lens: Vec<(usize, bool)> = (0..n)
                    .map(|_| {
                        let l = inp.u16() as usize % 3000;
                        (l, l % 3 == 1 && l > 1)
                    })
                    .collect();
                h.tx(&lens);
            }
            op @ (6 | 7) => {
                let n = 1 + inp.u8() as usize % 8;
                let lens: Vec<usize> = (0..n).map(|_| inp.u16() as usize % 3000).collect();
                if op == 6 {
                    h.peer_send(&lens);
                } else {
                    let (how, which) = (inp.u8(), inp.u16());
                    h.peer_send_bent(&lens, how, which);
                }
            }
            8 | 9 => {
                let cap = inp.u16() as u32;
                h.peer_take(cap);
            }
            10 => h.connect(),
            _ => {
                h.rx(MAX_BURST);
                h.tx(&[(60, false), (1500, true)]);
            }
        }
    }
    // Whatever state the program left: a last pair of bursts is checked too.
    h.rx(MAX_BURST);
    h.tx(&[(64, false)]);
}
