//! The host (vSwitch) side: creates the region, serves resets, sends into `up`, receives from
//! `down`.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memnic_ethdev::{
    LinkStatus, MacAddr, Mbuf, Mempool, PoolCache, Port, PortError, PortInfo, QueueMemory,
    QueueStats, RxQueue, StatsCell, TxQueue,
};
use memnic_shm::Region;

use crate::layout::*;
use crate::ring::{self, Oversize};
use crate::{slot, MemnicError};
use memnic_ethdev::flush::{FlushMode, FlushTuner};
use memnic_ethdev::gate::{Enter, Gate, GateMember};
use memnic_ethdev::holdoff::Holdoff;
use memnic_ethdev::stream::{StreamMode, StreamTuner};

/// Most host tx queues one port offers (several host lcores sending into one `up` ring).
pub const MAX_HOST_TX_QUEUES: u16 = 16;

/// How the host side is set up.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// POSIX shm name (`vm1` → `/dev/shm/vm1`) or a file path.
    pub path: String,
    /// Permission bits of a newly created region.
    pub mode: u32,
    /// Offer the frame-size feature (`features = FEAT_ALL`); a v1 host offers nothing.
    pub frame_size_feature: bool,
    /// How long the rx queue leaves the ring alone after an empty poll that followed a run
    /// ([`crate::DEFAULT_RX_HOLDOFF`]; zero polls without pause).
    pub rx_holdoff: Duration,
    /// Whether rx flushes the frames it copied from our caches (`ring::flush_copied`).
    pub rx_flush: FlushMode,
    /// Whether tx writes short frames with streaming stores (`ring::STREAM_MAX`; a queue that
    /// shares the ring with other producers never does).
    pub tx_stream: StreamMode,
}

impl HostConfig {
    pub fn new(path: impl Into<String>) -> Self {
        HostConfig {
            path: path.into(),
            mode: 0o600,
            frame_size_feature: true,
            rx_holdoff: ring::DEFAULT_RX_HOLDOFF,
            rx_flush: FlushMode::Auto,
            tx_stream: StreamMode::Auto,
        }
    }
}

/// Lays out a fresh header if `region` does not already hold a MEMNIC v1 header (so a restarted
/// host keeps its MAC), then marks the device not valid and sweeps both rings.
pub fn init_region(region: &Region, frame_size_feature: bool) -> Result<MacAddr, MemnicError> {
    if region.len() < AREA_SIZE {
        return Err(MemnicError::TooSmall { len: region.len() });
    }
    let features = if frame_size_feature { FEAT_ALL } else { 0 };
    // Acquire pairs with the Release store of `magic` below, by an earlier host.
    let fresh = region.u32(HDR_MAGIC).load(Acquire) != MAGIC
        || region.u32(HDR_VERSION).load(Relaxed) != VERSION_1;
    // The MAC a restarted host keeps is read once; the guest can write the header too, so one
    // that is no unicast address of a port (multicast, broadcast, zero) is not taken over.
    let kept = (!fresh)
        .then(|| read_mac(region))
        .filter(|m| !m.is_multicast() && m.0 != [0; 6]);
    let mac = match kept {
        Some(mac) => mac,
        None => {
            let mut mac = rand::random::<u64>().to_le_bytes();
            mac[0] = (mac[0] & !1) | 2; // unicast, locally administered
            let mac = MacAddr(mac[..6].try_into().expect("6 bytes"));
            write_header(region, mac);
            mac
        }
    };
    // Relaxed: the features word is read by the guest after it sees valid (Release below later).
    region.u32(HDR_FEATURES).store(features, Relaxed);
    region.u32(HDR_VALID).store(0, Release);
    sweep(region);
    Ok(mac)
}

/// Lays out a fresh v1 header with `mac` and empty ring info (not valid yet).
fn write_header(region: &Region, mac: MacAddr) {
    region
        .fill(HEADER_OFF, HDR_SIZE, 0)
        .expect("header inside region");
    region
        .write_bytes(HDR_MAC, &mac.0)
        .expect("header inside region");
    region.u32(HDR_FRAMESZ).store(MAX_FRAME_LEN, Relaxed);
    region.u32(HDR_VERSION).store(VERSION_1, Relaxed);
    // Release: a guest that sees the magic (Acquire) sees the rest of the header.
    region.u32(HDR_MAGIC).store(MAGIC, Release);
    region
        .fill(UP_INFO_OFF, INFO_SIZE, 0)
        .expect("info inside region");
    region
        .fill(DOWN_INFO_OFF, INFO_SIZE, 0)
        .expect("info inside region");
}

/// The MAC address in the header.
pub fn read_mac(region: &Region) -> MacAddr {
    let mut mac = [0u8; 8];
    region
        .read_bytes(HDR_MAC, &mut mac)
        .expect("header inside region");
    MacAddr([mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]])
}

/// Every slot of both rings FREE. Returns how many FILLED slots were discarded (up, down).
fn sweep(region: &Region) -> (u64, u64) {
    let mut lost = [0u64; 2];
    for (k, dir) in [Dir::Up, Dir::Down].into_iter().enumerate() {
        for i in 0..NR_PACKET {
            lost[k] += slot::sweep(region.u32(slot_off(dir, i))) as u64;
        }
    }
    (lost[0], lost[1])
}

/// Whether the guest asks for a reset.
#[inline(always)]
pub fn reset_requested(region: &Region) -> bool {
    // Acquire pairs with the guest's Release store of `reset = 1`: its request/framesz are visible.
    region.u32(HDR_RESET).load(Acquire) != 0
}

/// What a served reset agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetOutcome {
    pub framesz: u32,
    /// FILLED slots discarded by the sweep: (up: sent by the host, down: sent by the guest).
    pub discarded: (u64, u64),
}

/// Serves a reset request (`specs/memnic.md` §4). The caller guarantees that no host queue is
/// inside a burst on this region.
pub fn serve_reset(region: &Region, frame_size_feature: bool) -> ResetOutcome {
    region.u32(HDR_VALID).store(0, Relaxed);
    // Rewritten at every reset, so a value the guest scribbled over it does not last.
    let features = if frame_size_feature { FEAT_ALL } else { 0 };
    region.u32(HDR_FEATURES).store(features, Relaxed);
    let discarded = sweep(region);
    let mut framesz = MAX_FRAME_LEN;
    let request = region.u32(HDR_REQUEST).load(Relaxed);
    if frame_size_feature && request & FEAT_FRAME_SIZE != 0 {
        let want = region.u32(HDR_FRAMESZ).load(Relaxed);
        if (MAX_FRAME_LEN..=MAX_JUMBO_FRAME_LEN).contains(&want) {
            framesz = want;
        }
    }
    region.u32(HDR_REQUEST).store(0, Relaxed);
    region.u32(HDR_FRAMESZ).store(framesz, Relaxed);
    // Release: the sweep and the accepted framesz are visible to a guest that sees reset == 0
    // and valid == 1 with Acquire.
    region.u32(HDR_RESET).store(0, Release);
    region.u32(HDR_VALID).store(1, Release);
    ResetOutcome { framesz, discarded }
}

struct HostShared {
    region: Arc<Region>,
    gate: Arc<Gate>,
    frame_size_feature: bool,
    /// The accepted frame size: the host's private copy, never the shared field.
    framesz: AtomicU32,
    /// Next `up` slot, shared by the tx queues (several host lcores).
    up_head: HeadLine,
    /// Tx queues taken; more than one switches to compare-and-swap claims.
    producers: AtomicU32,
    /// FILLED `up` slots thrown away by resets (sent by us, never received by the guest).
    reset_discards: AtomicU64,
    /// FILLED `down` slots thrown away by resets (sent by the guest, never received by us).
    down_discards: AtomicU64,
    resets: AtomicU64,
    /// When the next reset may be served ([`RESET_INTERVAL`] after the last), in nanoseconds
    /// since `born`.
    next_reset_ns: AtomicU64,
    born: Instant,
    /// Times the region file was cut under us and laid out anew.
    shrinks: AtomicU64,
}

/// The least time between two resets the host serves. Each sweeps both rings (2048 status
/// words, 2048 lines, most of them the guest's) on the lcore that polls the port's rx, which
/// may poll other ports too; a guest that asks again as soon as each reset is served
/// (`reset = 1` in a loop) would otherwise have one at every poll and keep that lcore sweeping.
/// A reset asked for sooner waits (the port receives nothing meanwhile, as during any reset);
/// an honest guest asks rarely (when it starts, or changes its frame size) and waits for
/// `valid` far longer than this.
///
/// Measured (`tests/hostile.rs`, release build, a guest thread setting `reset = 1` whenever it
/// reads 0, the rx queue polled for 500 ms): without the interval 52,622 sweeps (about 9.5 us
/// each) and 79,713 polls, where the same lcore makes 9.2 million polls with the interval and
/// 490 sweeps (about 1% of it).
pub const RESET_INTERVAL: Duration = Duration::from_millis(1);

/// How soon the control thread serves a host port again while its guest is up: a reset the
/// guest asks for while no lcore polls the rx queue (txonly), or a shrunk region, waits that
/// long at most (the guest waits seconds for a reset).
const UP_SERVICE: Duration = Duration::from_millis(50);
/// While the guest is not up.
const DOWN_SERVICE: Duration = Duration::from_millis(5);

#[repr(align(64))]
struct HeadLine(AtomicU32);

/// The host end of one MEMNIC region.
pub struct HostPort {
    name: String,
    mac: MacAddr,
    shared: Arc<HostShared>,
    rx_taken: bool,
    rx_cells: Vec<Arc<StatsCell>>,
    tx_cells: Vec<Arc<StatsCell>>,
    /// Why the link last went down on our side, if it did (a region cut under us).
    pub last_reason: Option<String>,
    /// The rx queue's hold-off after an empty poll that followed a run
    /// (`HostConfig::rx_holdoff`).
    rx_holdoff: Duration,
    /// `HostConfig::rx_flush`.
    rx_flush: FlushMode,
    /// `HostConfig::tx_stream`.
    tx_stream: StreamMode,
}

/// Why the host dropped its guest when the region file was cut under it.
pub const REGION_SHRUNK: &str =
    "the region file was shrunk under the host (by the guest or another process): laid out anew, waiting for the next guest";

impl HostPort {
    /// Creates (or re-opens, keeping the MAC) the region named in `cfg`.
    pub fn create(name: &str, cfg: &HostConfig) -> Result<HostPort, MemnicError> {
        let region = Region::create_shared(&cfg.path, AREA_SIZE, cfg.mode)?;
        let mut port = Self::on_region(name, Arc::new(region), cfg.frame_size_feature)?;
        port.rx_holdoff = cfg.rx_holdoff;
        port.rx_flush = cfg.rx_flush;
        port.tx_stream = cfg.tx_stream;
        Ok(port)
    }

    /// Host side over an already mapped region.
    pub fn on_region(
        name: &str,
        region: Arc<Region>,
        frame_size_feature: bool,
    ) -> Result<HostPort, MemnicError> {
        let mac = init_region(&region, frame_size_feature)?;
        let shared = Arc::new(HostShared {
            region,
            gate: Gate::new(),
            frame_size_feature,
            framesz: AtomicU32::new(MAX_FRAME_LEN),
            up_head: HeadLine(AtomicU32::new(0)),
            producers: AtomicU32::new(0),
            reset_discards: AtomicU64::new(0),
            down_discards: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            next_reset_ns: AtomicU64::new(0),
            born: Instant::now(),
            shrinks: AtomicU64::new(0),
        });
        Ok(HostPort {
            name: name.to_string(),
            mac,
            shared,
            rx_taken: false,
            rx_cells: Vec::new(),
            tx_cells: Vec::new(),
            last_reason: None,
            rx_holdoff: ring::DEFAULT_RX_HOLDOFF,
            rx_flush: FlushMode::Auto,
            tx_stream: StreamMode::Auto,
        })
    }

    /// Times the region file was cut under us and laid out anew.
    pub fn shrinks(&self) -> u64 {
        self.shared.shrinks.load(Relaxed)
    }

    /// The region was cut under us (shm's SIGBUS guard put zero pages in its place, so the
    /// guest is gone): with every queue out of its burst, map the file again, grown back, and
    /// lay out a fresh header with our MAC for the next guest.
    #[cold]
    fn recover_from_shrink(&mut self) {
        let sh = &self.shared;
        let mac = self.mac;
        let done = sh.gate.reset(None, Duration::from_secs(1), || {
            let r = sh.region.restore_after_fault();
            if r.is_ok() {
                write_header(&sh.region, mac);
                let features = if sh.frame_size_feature { FEAT_ALL } else { 0 };
                // Relaxed: queues are out of their bursts; the gate's Release publishes these,
                // and a guest reads them only after valid (set by the reset it asks for).
                sh.region.u32(HDR_FEATURES).store(features, Relaxed);
                sh.region.u32(HDR_VALID).store(0, Release);
                sh.up_head.0.store(0, Relaxed);
                sh.framesz.store(MAX_FRAME_LEN, Relaxed);
                sh.shrinks.fetch_add(1, Relaxed);
            }
            Some(r)
        });
        self.last_reason = Some(match done {
            Some(Ok(())) => REGION_SHRUNK.to_string(),
            Some(Err(e)) => {
                format!("the region file was shrunk under the host and cannot be restored: {e}")
            }
            None => return, // a queue stayed in its burst: try again at the next service
        });
    }

    pub fn region(&self) -> &Arc<Region> {
        &self.shared.region
    }

    /// Frames the host sent that a reset discarded before the guest read them.
    pub fn reset_discards(&self) -> u64 {
        self.shared.reset_discards.load(Relaxed)
    }

    /// Resets served so far.
    pub fn resets(&self) -> u64 {
        self.shared.resets.load(Relaxed)
    }

    /// The frame size agreed at the last reset.
    pub fn framesz(&self) -> u32 {
        self.shared.framesz.load(Relaxed)
    }
}

impl Port for HostPort {
    fn info(&self) -> PortInfo {
        PortInfo {
            driver: "net_memnic",
            name: self.name.clone(),
            mac: self.mac,
            max_frame_len: self.framesz(),
            max_rx_queues: 1,
            max_tx_queues: MAX_HOST_TX_QUEUES,
        }
    }

    fn link(&self) -> LinkStatus {
        // Relaxed: a status snapshot; no data is read on the strength of it.
        LinkStatus {
            up: self.shared.region.u32(HDR_VALID).load(Relaxed) == 1,
            speed_mbps: 10_000,
        }
    }

    fn take_rx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn RxQueue>, PortError> {
        PortError::take_only_queue(&self.name, "rx", q, &mut self.rx_taken)?;
        let cell = StatsCell::new();
        self.rx_cells.push(cell.clone());
        Ok(Box::new(HostRxQueue {
            shared: self.shared.clone(),
            idx: 0,
            cache: pool.lcore_cache(),
            stats: QueueStats::default(),
            cell,
            gate: self.shared.gate.join(),
            // Relaxed: queues are set up before forwarding starts.
            down_seen: self.shared.down_discards.load(Relaxed),
            hold: Holdoff::new(self.rx_holdoff),
            flush: FlushTuner::new(self.rx_flush),
        }))
    }

    fn take_tx_queue(&mut self, q: u16, pool: &Mempool) -> Result<Box<dyn TxQueue>, PortError> {
        if q >= MAX_HOST_TX_QUEUES {
            return Err(PortError::NoSuchQueue {
                port: self.name.clone(),
                dir: "tx",
                queue: q,
                max: MAX_HOST_TX_QUEUES,
            });
        }
        // Relaxed: queues are set up before forwarding starts (as with DPDK's queue setup).
        self.shared.producers.fetch_add(1, Relaxed);
        let cell = StatsCell::new();
        self.tx_cells.push(cell.clone());
        Ok(Box::new(HostTxQueue {
            shared: self.shared.clone(),
            gate: self.shared.gate.join(),
            framesz: self.shared.framesz.load(Acquire),
            private_idx: 0,
            cache: pool.lcore_cache(),
            stats: QueueStats::default(),
            cell,
            stream: StreamTuner::new(self.tx_stream),
        }))
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

    /// Serves the guest's resets from the control thread while no lcore polls the rx queue
    /// (txonly forwarding); otherwise the rx queue serves them.
    fn service(&mut self) {
        if self.shared.region.peer_faulted() {
            self.recover_from_shrink();
            return;
        }
        if reset_requested(&self.shared.region) {
            self.shared.serve(None);
        }
    }

    /// Every few milliseconds while the guest is not up (its first reset waits for it when no
    /// lcore polls the rx queue); every [`UP_SERVICE`] once it is.
    fn service_interval(&self) -> Option<Duration> {
        Some(if self.link().up {
            UP_SERVICE
        } else {
            DOWN_SERVICE
        })
    }

    fn queue_memory(&self, rx: bool, q: u16) -> Vec<QueueMemory> {
        let dir = if rx { Dir::Down } else { Dir::Up };
        if (rx && q != 0) || q >= MAX_HOST_TX_QUEUES {
            return Vec::new();
        }
        vec![QueueMemory {
            region: self.shared.region.clone(),
            offset: dir.packets_off(),
            len: NR_PACKET * MAX_PACKET_SIZE,
        }]
    }
}

/// Receives from `down` and serves the guest's reset requests.
pub struct HostRxQueue {
    shared: Arc<HostShared>,
    idx: usize,
    cache: PoolCache,
    stats: QueueStats,
    cell: Arc<StatsCell>,
    gate: GateMember,
    /// `HostShared::down_discards` already counted in `stats.drops`.
    down_seen: u64,
    /// The hold-off after an empty poll that followed a run.
    hold: Holdoff,
    /// Whether copied frames are flushed from our caches (`ring::flush_copied`).
    flush: FlushTuner,
}

impl HostShared {
    /// Serves the guest's reset request with every host queue out of its burst (`caller` is the
    /// rx queue when it serves from inside its own burst). Returns the outcome, or None when no
    /// request was pending any more, a queue stayed busy too long (the guest asks again), or
    /// the last reset was served less than [`RESET_INTERVAL`] ago (a later poll serves it).
    fn serve(&self, caller: Option<&GateMember>) -> Option<ResetOutcome> {
        // The cheap look, before the gate is taken; it is made again inside, where one reset
        // runs at a time (a thread that passed it here may find a reset just served there).
        if !self.reset_due() {
            return None;
        }
        self.gate.reset(caller, Duration::from_secs(1), || {
            // Another thread may have served it while this one waited for the gate.
            if !reset_requested(&self.region) || !self.reset_due() {
                return None;
            }
            let out = serve_reset(&self.region, self.frame_size_feature);
            // Relaxed: queues are out of their bursts; the gate's Release publishes these.
            self.up_head.0.store(0, Relaxed);
            self.framesz.store(out.framesz, Relaxed);
            self.reset_discards.fetch_add(out.discarded.0, Relaxed);
            self.down_discards.fetch_add(out.discarded.1, Relaxed);
            self.resets.fetch_add(1, Relaxed);
            let next = self
                .now_ns()
                .saturating_add(RESET_INTERVAL.as_nanos() as u64);
            self.next_reset_ns.store(next, Relaxed);
            Some(out)
        })
    }

    /// Whether [`RESET_INTERVAL`] has passed since the last reset served.
    fn reset_due(&self) -> bool {
        // Relaxed: stored inside the gate's reset by whoever served the last one; the gate's
        // `resetting` lock orders that store before the look made inside the next reset.
        // Outside it a stale value only sends a thread on to that look, or to the next poll.
        self.now_ns() >= self.next_reset_ns.load(Relaxed)
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl HostRxQueue {
    #[cold]
    #[inline(never)]
    fn serve_reset(&mut self) {
        if self.shared.serve(Some(&self.gate)).is_some() {
            self.idx = 0;
            self.count_down_discards();
        }
    }

    /// Frames the guest sent that a reset swept before we received them count as our rx drops,
    /// whoever served the reset (this queue, or the control thread through `Port::service`).
    #[cold]
    fn count_down_discards(&mut self) {
        // Relaxed: written before the gate's Release that ended the reset, which this queue's
        // `enter` has seen (or this queue served the reset itself).
        let total = self.shared.down_discards.load(Relaxed);
        self.stats.drops += total - self.down_seen;
        self.down_seen = total;
    }
}

impl RxQueue for HostRxQueue {
    fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        match self.gate.enter() {
            Enter::Run => {}
            Enter::Parked => return 0,
            Enter::Restart => {
                self.idx = 0;
                self.count_down_discards();
            }
        }
        let region = &*self.shared.region;
        let mut n = 0;
        if reset_requested(region) {
            self.serve_reset();
        } else if region.u32(HDR_VALID).load(Acquire) == 1 {
            // Acquire (above) pairs with serve_reset's Release store of valid = 1.
            // Relaxed: published by the gate together with the reset that set it.
            let framesz = self.shared.framesz.load(Relaxed);
            n = ring::receive(
                region,
                Dir::Down,
                &mut self.idx,
                framesz,
                &mut self.cache,
                pkts,
                max,
                &mut self.stats,
                &mut self.hold,
                &mut self.flush,
            );
        }
        self.gate.exit();
        self.cell.publish(&self.stats);
        n
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }
}

/// Sends into `up`; several may share the ring (one per host lcore).
pub struct HostTxQueue {
    shared: Arc<HostShared>,
    gate: GateMember,
    framesz: u32,
    /// Ring index when this is the only producer.
    private_idx: usize,
    cache: PoolCache,
    stats: QueueStats,
    cell: Arc<StatsCell>,
    /// Whether short frames are streamed into their slots while this is the only producer
    /// (`ring::STREAM_MAX`).
    stream: StreamTuner,
}

impl HostTxQueue {
    /// Compare-and-swap claims on the shared head, with the v1 false-positive retry.
    fn transmit_shared(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let region = &*self.shared.region;
        let head = &self.shared.up_head.0;
        let mut taken = 0;
        'pkts: while taken < pkts.len() {
            let len = pkts[taken].len() as u32;
            if len > self.framesz {
                self.stats.drops += 1;
                taken += 1;
                continue;
            }
            // A bounded number of tries: a hostile guest can park garbage in a slot.
            let mut claimed = None;
            for _ in 0..64 {
                // Acquire pairs with the Release store of the head by another producer.
                let h = head.load(Acquire) as usize % NR_PACKET;
                let s = region.u32(slot_off(Dir::Up, h));
                match slot::claim_shared(s) {
                    Ok(()) => {
                        if head.load(Acquire) as usize % NR_PACKET != h {
                            // False positive: the slot was already filled and consumed behind the head.
                            slot::unclaim(s);
                            continue;
                        }
                        // Release pairs with the Acquire loads of the other producers.
                        head.store(next(h) as u32, Release);
                        claimed = Some(h);
                        break;
                    }
                    Err(PKT_ST_FILLED) if head.load(Acquire) as usize % NR_PACKET == h => {
                        break 'pkts
                    } // full
                    Err(_) => std::hint::spin_loop(),
                }
            }
            let Some(h) = claimed else { break };
            let off = slot_off(Dir::Up, h);
            // Relaxed: published by the Release in `publish` (P1).
            region.u32(off + SLOT_LEN).store(len, Relaxed);
            let dst = region.slice(off + SLOT_DATA, len as usize);
            assert!(
                matches!(dst, Ok(d) if pkts[taken].copy_to(&d)),
                "len <= framesz <= slot room"
            );
            slot::publish(region.u32(off));
            self.stats.packets += 1;
            self.stats.bytes += len as u64;
            taken += 1;
        }
        self.cache.free_front(pkts, taken);
        taken
    }
}

impl TxQueue for HostTxQueue {
    fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        match self.gate.enter() {
            Enter::Run => {}
            // Link down (reset under way): take nothing; the caller retries or drops (DPDK tx).
            Enter::Parked => return 0,
            Enter::Restart => {
                // Relaxed: the gate (SeqCst in `enter`, Release when the reset ends) orders it.
                self.framesz = self.shared.framesz.load(Relaxed);
                self.private_idx = 0;
            }
        }
        let region = &*self.shared.region;
        // Acquire pairs with serve_reset's Release store of valid = 1 (the swept rings).
        if region.u32(HDR_VALID).load(Acquire) == 0 {
            self.gate.exit();
            return 0; // link down: back-pressure, as above
        }
        // Relaxed: fixed once queues are set up.
        let n = if self.shared.producers.load(Relaxed) > 1 {
            self.transmit_shared(pkts)
        } else {
            let mut idx = self.private_idx;
            let n = ring::transmit_single(
                region,
                Dir::Up,
                &mut idx,
                self.framesz,
                &mut self.cache,
                pkts,
                Oversize::Drop,
                &mut self.stats,
                &mut self.stream,
            );
            self.private_idx = idx;
            n
        };
        self.gate.exit();
        self.cell.publish(&self.stats);
        n
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }
}
