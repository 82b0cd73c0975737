//! The guest side: the PMD of the 2014 `memnic` driver, in three variants.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memnic_ethdev::{
    LinkStatus, MacAddr, Mbuf, Mempool, PoolCache, Port, PortError, PortInfo, QueueMemory,
    QueueStats, RxQueue, StatsCell, TxQueue, MAX_BURST,
};
use memnic_shm::Region;

use crate::layout::*;
use crate::ring::{self, Oversize};
use crate::{host, slot, MemnicError};
use memnic_ethdev::flush::{FlushMode, FlushTuner};
use memnic_ethdev::gate::{Enter, Gate, GateMember};
use memnic_ethdev::holdoff::Holdoff;
use memnic_ethdev::stream::{StreamMode, StreamTuner};

/// Which burst implementation the guest queues run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Variant {
    /// The PMD before the 2014 series: `rte_mb()` before every status store, no prefetch, no
    /// branch hints, each mbuf freed inside the copy loop, CAS claim on transmit.
    Before2014,
    /// The PMD after the 2014 series: compiler barrier (Release/Acquire), prefetch of the next
    /// slot on receive, cold rare branches, mbufs freed after the copy loop; CAS claim kept.
    After2014,
    /// memnic's own: batched receive (scan, bulk alloc, copy, bulk hand-back) with deeper
    /// prefetch, and transmit without CAS (the guest is the only producer of `down`).
    #[default]
    Memnic,
}

impl Variant {
    pub const ALL: [Variant; 3] = [Variant::Before2014, Variant::After2014, Variant::Memnic];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Before2014 => "2014-before",
            Variant::After2014 => "2014-after",
            Variant::Memnic => "memnic",
        }
    }
}

impl std::str::FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                format!("unknown variant '{s}' (expected 2014-before, 2014-after or memnic)")
            })
    }
}

/// How the guest attaches.
#[derive(Debug, Clone)]
pub struct GuestConfig {
    /// shm name, file path, or an ivshmem BAR (`/sys/bus/pci/devices/<BDF>/resource2`).
    pub path: String,
    /// Frame size to request with the frame-size feature (1518..=4088); None keeps 1518.
    pub framesz: Option<u32>,
    pub variant: Variant,
    /// How long to wait for the host to answer a reset.
    pub reset_timeout: Duration,
    /// How long the `memnic` variant's rx leaves the ring alone after an empty poll that
    /// followed a run ([`crate::DEFAULT_RX_HOLDOFF`]; zero polls without pause).
    pub rx_holdoff: Duration,
    /// Whether the `memnic` variant's rx flushes the frames it copied from our caches
    /// (`ring::flush_copied`).
    pub rx_flush: FlushMode,
    /// Whether the `memnic` variant's tx writes short frames with streaming stores
    /// (`ring::STREAM_MAX`).
    pub tx_stream: StreamMode,
}

impl GuestConfig {
    pub fn new(path: impl Into<String>) -> Self {
        GuestConfig {
            path: path.into(),
            framesz: None,
            variant: Variant::Memnic,
            reset_timeout: Duration::from_secs(5),
            rx_holdoff: ring::DEFAULT_RX_HOLDOFF,
            rx_flush: FlushMode::Auto,
            tx_stream: StreamMode::Auto,
        }
    }
}

struct GuestShared {
    region: Arc<Region>,
    gate: Arc<Gate>,
    /// The frame size agreed at the last reset (private copy).
    framesz: AtomicU32,
}

/// The guest end of one MEMNIC region.
pub struct GuestPort {
    name: String,
    mac: MacAddr,
    features: u32,
    cfg: GuestConfig,
    shared: Arc<GuestShared>,
    rx_taken: bool,
    tx_taken: bool,
    rx_cells: Vec<Arc<StatsCell>>,
    tx_cells: Vec<Arc<StatsCell>>,
}

impl GuestPort {
    /// Opens the region named in `cfg`, checks it, and resets the device.
    pub fn attach(name: &str, cfg: &GuestConfig) -> Result<GuestPort, MemnicError> {
        let region = Region::open_shared(&cfg.path, AREA_SIZE).map_err(|e| match e {
            memnic_shm::ShmError::TooSmall { actual, .. } => MemnicError::TooSmall {
                len: actual as usize,
            },
            e => MemnicError::Shm(e),
        })?;
        Self::on_region(name, Arc::new(region), cfg)
    }

    /// Guest side over an already mapped region.
    pub fn on_region(
        name: &str,
        region: Arc<Region>,
        cfg: &GuestConfig,
    ) -> Result<GuestPort, MemnicError> {
        if region.len() < AREA_SIZE {
            return Err(MemnicError::TooSmall { len: region.len() });
        }
        if let Some(f) = cfg.framesz {
            if !(MAX_FRAME_LEN..=MAX_JUMBO_FRAME_LEN).contains(&f) {
                return Err(MemnicError::FrameSize(f));
            }
        }
        // Acquire pairs with the host's Release store of the magic in init_region.
        let magic = region.u32(HDR_MAGIC).load(Acquire);
        if magic != MAGIC {
            return Err(MemnicError::NotMemnic { magic });
        }
        let version = region.u32(HDR_VERSION).load(Relaxed);
        if version != VERSION_1 {
            return Err(MemnicError::Version(version));
        }
        let shared = Arc::new(GuestShared {
            region,
            gate: Gate::new(),
            framesz: AtomicU32::new(MAX_FRAME_LEN),
        });
        let mut port = GuestPort {
            name: name.to_string(),
            mac: MacAddr::default(),
            features: 0,
            cfg: cfg.clone(),
            shared,
            rx_taken: false,
            tx_taken: false,
            rx_cells: Vec::new(),
            tx_cells: Vec::new(),
        };
        port.reset()?;
        Ok(port)
    }

    /// Asks the host for a reset and waits for it (`specs/memnic.md` §4): both rings empty, both
    /// sides back at slot 0, frame size renegotiated. Queues taken from this port park during the
    /// reset; they must be polled for it to proceed. Returns the agreed frame size.
    pub fn reset(&mut self) -> Result<u32, MemnicError> {
        let sh = self.shared.clone();
        let region = &*sh.region;
        let timeout = self.cfg.reset_timeout;
        // Relaxed: the features word was published with the header; read before asking.
        self.features = region.u32(HDR_FEATURES).load(Relaxed);
        self.mac = host::read_mac(region);
        let want = self
            .cfg
            .framesz
            .filter(|_| self.features & FEAT_FRAME_SIZE != 0);
        let answered = sh.gate.reset(None, timeout, || {
            // The host gets the whole timeout, however long the queues took to step out.
            let deadline = Instant::now() + timeout;
            region.u32(HDR_VALID).store(0, Relaxed);
            region
                .u32(HDR_REQUEST)
                .store(if want.is_some() { FEAT_FRAME_SIZE } else { 0 }, Relaxed);
            if let Some(f) = want {
                region.u32(HDR_FRAMESZ).store(f, Relaxed);
            }
            // Release pairs with the host's Acquire in reset_requested: request/framesz are visible.
            region.u32(HDR_RESET).store(1, Release);
            loop {
                // Acquire pairs with serve_reset's Release stores of reset = 0 and valid = 1.
                if region.u32(HDR_RESET).load(Acquire) == 0
                    && region.u32(HDR_VALID).load(Acquire) == 1
                {
                    break;
                }
                if Instant::now() > deadline {
                    return Some(false);
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            let agreed = region.u32(HDR_FRAMESZ).load(Relaxed);
            // An honest host answers what we asked for or 1518 (spec §4); anything else, even
            // a size within the limits, is not what we set our buffers up for: 1518.
            let framesz = match want {
                Some(w) if agreed == w && (MAX_FRAME_LEN..=MAX_JUMBO_FRAME_LEN).contains(&w) => w,
                _ => MAX_FRAME_LEN,
            };
            // Relaxed: published to the queues by the gate's Release when the reset ends.
            sh.framesz.store(framesz, Relaxed);
            Some(true)
        });
        match answered {
            None => Err(MemnicError::QueuesNotPolled),
            Some(false) => Err(MemnicError::NoHost {
                secs: timeout.as_secs_f64(),
            }),
            Some(true) => Ok(sh.framesz.load(Relaxed)),
        }
    }

    /// Features the host offers.
    pub fn features(&self) -> u32 {
        self.features
    }

    /// The frame size agreed at the last reset.
    pub fn framesz(&self) -> u32 {
        self.shared.framesz.load(Relaxed)
    }

    pub fn region(&self) -> &Arc<Region> {
        &self.shared.region
    }
}

impl Port for GuestPort {
    fn info(&self) -> PortInfo {
        PortInfo {
            driver: "net_memnic",
            name: self.name.clone(),
            mac: self.mac,
            max_frame_len: self.framesz(),
            max_rx_queues: 1,
            max_tx_queues: 1,
        }
    }

    fn link(&self) -> LinkStatus {
        // Relaxed: a status snapshot.
        LinkStatus {
            up: self.shared.region.u32(HDR_VALID).load(Relaxed) == 1,
            speed_mbps: 10_000,
        }
    }

    fn take_rx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn RxQueue>, PortError> {
        if pool.data_room() < self.framesz() {
            return Err(PortError::Other {
                port: self.name.clone(),
                what: format!(
                    "pool buffers hold {} bytes but frames can be {} bytes; use a larger --mbuf-size",
                    pool.data_room(),
                    self.framesz()
                ),
            });
        }
        PortError::take_only_queue(&self.name, "rx", q, &mut self.rx_taken)?;
        let cell = StatsCell::new();
        self.rx_cells.push(cell.clone());
        Ok(Box::new(self.rx_queue(pool, cell)))
    }

    fn take_tx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn TxQueue>, PortError> {
        PortError::take_only_queue(&self.name, "tx", q, &mut self.tx_taken)?;
        let cell = StatsCell::new();
        self.tx_cells.push(cell.clone());
        Ok(Box::new(self.tx_queue(pool, cell)))
    }

    fn queue_stats(&self) -> (Vec<QueueStats>, Vec<QueueStats>) {
        (
            self.rx_cells.iter().map(|c| c.snapshot()).collect(),
            self.tx_cells.iter().map(|c| c.snapshot()).collect(),
        )
    }

    /// The receive queues' flushing ([`memnic_ethdev::flush::xstats`]) and hold-off
    /// ([`memnic_ethdev::holdoff::xstats`]).
    fn xstats(&self) -> Vec<(&'static str, u64)> {
        let mut x = memnic_ethdev::tuner::xstats(
            self.rx_cells.iter().map(|c| c.snapshot()),
            self.tx_cells.iter().map(|c| c.snapshot()),
        );
        x.extend(memnic_ethdev::holdoff::xstats(
            self.rx_cells.iter().map(|c| c.snapshot()),
        ));
        x
    }

    fn queue_memory(&self, rx: bool, q: u16) -> Vec<QueueMemory> {
        if q != 0 {
            return Vec::new();
        }
        let dir = if rx { Dir::Up } else { Dir::Down };
        vec![QueueMemory {
            region: self.shared.region.clone(),
            offset: dir.packets_off(),
            len: NR_PACKET * MAX_PACKET_SIZE,
        }]
    }
}

impl GuestPort {
    fn rx_queue(&self, pool: &Mempool, cell: Arc<StatsCell>) -> GuestRxQueue {
        GuestRxQueue {
            region: self.shared.region.clone(),
            shared: self.shared.clone(),
            gate: self.shared.gate.join(),
            idx: 0,
            framesz: self.framesz(),
            variant: self.cfg.variant,
            cache: pool.lcore_cache(),
            stats: QueueStats::default(),
            cell,
            hold: Holdoff::new(self.cfg.rx_holdoff),
            flush: FlushTuner::new(self.cfg.rx_flush),
        }
    }

    fn tx_queue(&self, pool: &Mempool, cell: Arc<StatsCell>) -> GuestTxQueue {
        GuestTxQueue {
            region: self.shared.region.clone(),
            shared: self.shared.clone(),
            gate: self.shared.gate.join(),
            idx: 0,
            framesz: self.framesz(),
            variant: self.cfg.variant,
            cache: pool.lcore_cache(),
            stats: QueueStats::default(),
            cell,
            spare: Vec::with_capacity(MAX_BURST),
            stream: StreamTuner::new(self.cfg.tx_stream),
        }
    }

    /// The queue pair as concrete types (for the tester, which calls the bursts directly).
    pub fn take_queue_pair(
        &mut self,
        pool: &Mempool,
    ) -> Result<(GuestRxQueue, GuestTxQueue), PortError> {
        if self.rx_taken || self.tx_taken {
            return Err(PortError::QueueTaken {
                port: self.name.clone(),
                dir: "rx/tx",
                queue: 0,
            });
        }
        self.rx_taken = true;
        self.tx_taken = true;
        let (rc, tc) = (StatsCell::new(), StatsCell::new());
        self.rx_cells.push(rc.clone());
        self.tx_cells.push(tc.clone());
        Ok((self.rx_queue(pool, rc), self.tx_queue(pool, tc)))
    }
}

/// Guest receive: reads `up`.
pub struct GuestRxQueue {
    region: Arc<Region>,
    shared: Arc<GuestShared>,
    gate: GateMember,
    idx: usize,
    framesz: u32,
    variant: Variant,
    cache: PoolCache,
    stats: QueueStats,
    cell: Arc<StatsCell>,
    /// The `memnic` variant's hold-off after an empty poll that followed a run (the 2014
    /// variants poll as they did).
    hold: Holdoff,
    /// Whether copied frames are flushed from our caches (`ring::flush_copied`).
    flush: FlushTuner,
}

/// Guest transmit: writes `down`.
pub struct GuestTxQueue {
    region: Arc<Region>,
    shared: Arc<GuestShared>,
    gate: GateMember,
    idx: usize,
    framesz: u32,
    variant: Variant,
    cache: PoolCache,
    stats: QueueStats,
    cell: Arc<StatsCell>,
    /// Second burst vector for the pre-2014 loop (free inside the loop without reallocating).
    spare: Vec<Mbuf>,
    /// Whether short frames are streamed into their slots (`ring::STREAM_MAX`).
    stream: StreamTuner,
}

#[cold]
#[inline(never)]
fn cold_stop() {}

/// The top of every guest burst: gate, then `valid`. False means "do nothing this time" (and
/// the gate is already left); true means run the burst, then `gate.exit()`.
#[inline(always)]
fn ready(
    gate: &mut GateMember,
    shared: &GuestShared,
    idx: &mut usize,
    framesz: &mut u32,
    region: &Region,
) -> bool {
    match gate.enter() {
        Enter::Run => {}
        Enter::Parked => return false,
        Enter::Restart => {
            // Relaxed: the gate's Release/SeqCst ordering publishes the reset's results.
            *framesz = shared.framesz.load(Relaxed);
            *idx = 0;
        }
    }
    // Acquire pairs with the host's Release store of valid = 1 after its sweep.
    if region.u32(HDR_VALID).load(Acquire) == 1 {
        return true;
    }
    gate.exit();
    false
}

impl GuestRxQueue {
    /// `rx_burst` without the trait object, for the tester's inner loop.
    #[inline(always)]
    pub fn burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        if !ready(
            &mut self.gate,
            &self.shared,
            &mut self.idx,
            &mut self.framesz,
            &self.region,
        ) {
            return 0;
        }
        let max = max.min(MAX_BURST);
        let n = match self.variant {
            Variant::Memnic => ring::receive(
                &self.region,
                Dir::Up,
                &mut self.idx,
                self.framesz,
                &mut self.cache,
                pkts,
                max,
                &mut self.stats,
                &mut self.hold,
                &mut self.flush,
            ),
            Variant::After2014 => self.rx_2014_after(pkts, max),
            Variant::Before2014 => self.rx_2014_before(pkts, max),
        };
        self.gate.exit();
        self.cell.publish(&self.stats);
        n
    }

    /// 2014 PMD after the series: per-slot loop, prefetch of the next slot, hints, barrier only.
    #[inline(never)]
    fn rx_2014_after(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        let region = &*self.region;
        let mut idx = self.idx;
        let mut n = 0;
        // Every slot taken counts toward `max`, good or bad (as the 2014 PMD's loop did): a
        // host refilling bad slots as fast as we free them would otherwise keep one burst
        // going for ever.
        let mut taken = 0;
        while taken < max {
            let off = slot_off(Dir::Up, idx);
            if !slot::is_filled(region.u32(off)) {
                break;
            }
            let Some(mut m) = self.cache.alloc() else {
                ring::no_buffers(&mut self.stats, 1);
                break;
            };
            region.prefetch(slot_off(Dir::Up, next(idx)));
            // Relaxed: after the Acquire in is_filled (C1).
            let len = region.u32(off + SLOT_LEN).load(Relaxed);
            let src = region.slice(off + SLOT_DATA, len as usize);
            if len == 0
                || len > self.framesz
                || !matches!(src, Ok(s) if m.fill_from(&s, len as usize))
            {
                ring::bad_length(&mut self.stats);
                self.cache.free(m);
            } else {
                self.stats.bytes += len as u64;
                pkts.push(m);
                n += 1;
            }
            slot::release(region.u32(off));
            idx = next(idx);
            taken += 1;
        }
        self.idx = idx;
        self.stats.packets += n as u64;
        n
    }

    /// 2014 PMD before the series: full fence before handing the slot back, nothing else.
    #[inline(never)]
    fn rx_2014_before(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        let region = &*self.region;
        let mut idx = self.idx;
        let mut n = 0;
        // Every slot taken counts toward `max`, good or bad (as the 2014 PMD's loop did): a
        // host refilling bad slots as fast as we free them would otherwise keep one burst
        // going for ever.
        let mut taken = 0;
        while taken < max {
            let off = slot_off(Dir::Up, idx);
            if !slot::is_filled(region.u32(off)) {
                break;
            }
            let Some(mut m) = self.cache.alloc() else {
                self.stats.nombuf += 1;
                break;
            };
            let len = region.u32(off + SLOT_LEN).load(Relaxed);
            let src = region.slice(off + SLOT_DATA, len as usize);
            if len == 0
                || len > self.framesz
                || !matches!(src, Ok(s) if m.fill_from(&s, len as usize))
            {
                self.stats.errors += 1;
                self.cache.free(m);
            } else {
                self.stats.bytes += len as u64;
                pkts.push(m);
                n += 1;
            }
            // rte_mb(): the full fence the 2014 series removed.
            fence(Ordering::SeqCst);
            region.u32(off).store(PKT_ST_FREE, Relaxed);
            idx = next(idx);
            taken += 1;
        }
        self.idx = idx;
        self.stats.packets += n as u64;
        n
    }

    pub fn stats(&self) -> QueueStats {
        self.stats
    }
}

impl GuestTxQueue {
    /// `tx_burst` without the trait object, for the tester's inner loop.
    #[inline(always)]
    pub fn burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        if !ready(
            &mut self.gate,
            &self.shared,
            &mut self.idx,
            &mut self.framesz,
            &self.region,
        ) {
            return 0;
        }
        let n = match self.variant {
            Variant::Memnic => ring::transmit_single(
                &self.region,
                Dir::Down,
                &mut self.idx,
                self.framesz,
                &mut self.cache,
                pkts,
                Oversize::Stop,
                &mut self.stats,
                &mut self.stream,
            ),
            Variant::After2014 => self.tx_2014_after(pkts),
            Variant::Before2014 => self.tx_2014_before(pkts),
        };
        self.gate.exit();
        self.cell.publish(&self.stats);
        n
    }

    /// The 2014 transmit loop after the series: CAS claim of each slot, Release store of FILLED
    /// (compiler barrier), oversize and full as cold exits, mbufs freed after the copy loop.
    #[inline(never)]
    fn tx_2014_after(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let region = &*self.region;
        let mut idx = self.idx;
        let n = pkts.len().min(MAX_BURST);
        let mut sent = 0;
        while sent < n {
            let m = &pkts[sent];
            let len = m.len() as u32;
            if len > self.framesz {
                cold_stop();
                break;
            }
            let off = slot_off(Dir::Down, idx);
            // The guest is the only producer: a failed claim means full (or garbage): stop.
            if slot::claim_shared(region.u32(off)).is_err() {
                cold_stop();
                break;
            }
            idx = next(idx);
            // Relaxed: published by the Release in `publish` (P1).
            region.u32(off + SLOT_LEN).store(len, Relaxed);
            let dst = region.slice(off + SLOT_DATA, len as usize);
            assert!(
                matches!(dst, Ok(d) if m.copy_to(&d)),
                "len <= framesz <= slot room"
            );
            slot::publish(region.u32(off));
            self.stats.bytes += len as u64;
            sent += 1;
        }
        self.idx = idx;
        self.cache.free_front(pkts, sent);
        self.stats.packets += sent as u64;
        sent
    }

    /// The 2014 transmit loop before the series: CAS claim, `rte_mb()` before FILLED, and each
    /// mbuf freed inside the copy loop.
    #[inline(never)]
    fn tx_2014_before(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let region = &*self.region;
        let mut idx = self.idx;
        let n = pkts.len().min(MAX_BURST);
        // Take the burst out so each mbuf can be freed as soon as it is copied; what is not sent
        // goes back into `pkts` (which now holds the spare's empty allocation).
        std::mem::swap(pkts, &mut self.spare);
        let mut burst = self.spare.drain(..);
        let mut sent = 0;
        while sent < n {
            let Some(m) = burst.as_slice().first() else {
                break;
            };
            let len = m.len() as u32;
            if len > self.framesz {
                break;
            }
            let off = slot_off(Dir::Down, idx);
            if slot::claim_shared(region.u32(off)).is_err() {
                break;
            }
            idx = next(idx);
            region.u32(off + SLOT_LEN).store(len, Relaxed);
            let dst = region.slice(off + SLOT_DATA, len as usize);
            assert!(
                matches!(dst, Ok(d) if m.copy_to(&d)),
                "len <= framesz <= slot room"
            );
            fence(Ordering::SeqCst); // rte_mb()
            region.u32(off).store(PKT_ST_FILLED, Relaxed);
            self.stats.bytes += len as u64;
            let m = burst.next().expect("peeked above");
            self.cache.free(m);
            sent += 1;
        }
        pkts.extend(burst);
        self.idx = idx;
        self.stats.packets += sent as u64;
        sent
    }

    pub fn stats(&self) -> QueueStats {
        self.stats
    }
}

impl RxQueue for GuestRxQueue {
    fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        self.burst(pkts, max)
    }
    fn stats(&self) -> QueueStats {
        self.stats
    }
}

impl TxQueue for GuestTxQueue {
    fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        self.burst(pkts)
    }
    fn stats(&self) -> QueueStats {
        self.stats
    }
}
