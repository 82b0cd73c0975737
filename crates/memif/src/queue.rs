//! The memif data path behind the burst API: copy mode for both roles, and zero-copy for a
//! client (`specs/memif.md` §5–§8).
//!
//! The control path installs a [`Conn`] for each queue while the queues are parked by the gate,
//! and takes it away again on disconnect; a queue reloads it when the gate says "restart". A
//! queue that finds the peer breaking the protocol (a counter out of range, a descriptor outside
//! its region) stops using the rings, counts an error and flags the port for DISCONNECT.
//!
//! Every burst has the same shape in both roles: read the peer's counter once and check it
//! ([`Window`]); receive whole frames through the one chain walker (`chain::receive`, with the
//! role's `chain::Source` of bytes) or write frames through the one slot writer
//! (`writer::write_frame`, with the role's `writer::Dest`); publish our counter
//! ([`publish`]). A violation is a [`DataError`] carrying the values the peer wrote; its
//! `reason()` is what DISCONNECT says.

use std::sync::atomic::{
    fence, AtomicBool,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use memnic_ethdev::ahead::{AheadMode, AheadTuner};
use memnic_ethdev::demote::{DemoteMode, DemoteTuner};
use memnic_ethdev::flush::{FlushMode, FlushTuner};
use memnic_ethdev::gate::{Enter, GateMember};
use memnic_ethdev::holdoff::Holdoff;
use memnic_ethdev::stream::{StreamMode, StreamTuner};
use memnic_ethdev::{Mbuf, PoolCache, QueueStats, RxQueue, StatsCell, TxQueue, MAX_BURST};
use memnic_shm::unix::EventFd;

use crate::chain::{receive, FromLayout, FromParked, FromRegions};
use crate::error::DataError;
use crate::msg::RingDirection;
use crate::ring::{acquire, publish, Desc, Regions, Ring, RING_FLAG_MASK_INT};
use crate::window::Window;
use crate::writer::{
    prefetch_burst, prefetch_following, prefetch_next, write_frame, Ahead, ShortWrites,
    ToDescriptors, ToLayout, STREAM_MAX,
};

/// Which end of the connection this port is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// Everything a queue needs while connected.
#[derive(Clone)]
pub struct Conn {
    pub role: Role,
    pub ring: Ring,
    pub regions: Regions,
    /// Client, copy mode: where slot 0's buffer starts in region 0, and the buffer size.
    pub buffers: Option<(usize, u32)>,
    /// The ring's interrupt eventfd (kick the peer unless it masks; wait on it when idle).
    pub irq: Option<Arc<EventFd>>,
    /// Client zero copy: descriptors point at pool buffers in this region index.
    pub zero_copy_region: Option<u16>,
}

/// Shared between the control path and one queue.
#[derive(Default)]
pub struct QueueSlot {
    pub conn: Mutex<Option<Conn>>,
    /// Client: what the control path posted on the S2C ring at connect.
    pub prefilled: Mutex<Prefilled>,
}

/// A client's S2C ring as the control path left it at connect.
#[derive(Default)]
pub struct Prefilled {
    /// Zero copy: the pool buffer parked in each slot.
    pub parked: Vec<Option<Mbuf>>,
    /// The head it published: the queue's own counter from then on (never re-read from the
    /// ring, which the peer can write).
    pub head: u16,
}

/// Set by a queue that saw the peer break the protocol; the control path disconnects.
#[derive(Default)]
pub struct Broken {
    flag: AtomicBool,
    why: Mutex<Option<&'static str>>,
    /// The violation itself, with the values the peer wrote (for logs and tests).
    error: Mutex<Option<DataError>>,
}

impl Broken {
    #[cold]
    pub fn set(&self, why: &'static str) {
        *self.why.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        // Release pairs with the Acquire in `take`: the reason is visible with the flag.
        self.flag.store(true, Release);
    }

    /// Records a data-path violation and flags it with its DISCONNECT reason.
    #[cold]
    pub fn set_error(&self, e: DataError) {
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        self.set(e.reason());
    }

    /// The reason, once, if a queue flagged one.
    pub fn take(&self) -> Option<&'static str> {
        // Acquire pairs with the Release in `set`.
        if !self.flag.swap(false, Acquire) {
            return None;
        }
        self.why.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The last data-path violation recorded (kept after `take`).
    pub fn last_error(&self) -> Option<DataError> {
        *self.error.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// State common to rx and tx queues.
pub struct QueueCore {
    gate: GateMember,
    slot: Arc<QueueSlot>,
    broken: Arc<Broken>,
    conn: Option<Conn>,
    /// Our own counter: the client's head, or the server's tail.
    own: u16,
    /// Where we are in the peer's counter: the server's last_head, the client's last_tail.
    seen: u16,
    /// Client zero copy: the buffer parked in each slot.
    parked: Vec<Option<Mbuf>>,
    cache: PoolCache,
    stats: QueueStats,
    cell: Arc<StatsCell>,
}

impl QueueCore {
    pub fn new(
        gate: GateMember,
        slot: Arc<QueueSlot>,
        broken: Arc<Broken>,
        cache: PoolCache,
        cell: Arc<StatsCell>,
    ) -> QueueCore {
        QueueCore {
            gate,
            slot,
            broken,
            conn: None,
            own: 0,
            seen: 0,
            parked: Vec::new(),
            cache,
            stats: QueueStats::default(),
            cell,
        }
    }

    /// Top of a burst: false means "not connected, do nothing" (gate already left).
    #[inline(always)]
    fn enter(&mut self) -> bool {
        match self.gate.enter() {
            Enter::Run => {}
            Enter::Parked => return false,
            Enter::Restart => self.reload(),
        }
        if self.conn.is_some() {
            return true;
        }
        self.gate.exit();
        false
    }

    #[cold]
    fn reload(&mut self) {
        for m in self.parked.drain(..).flatten() {
            self.cache.free(m);
        }
        self.conn = self
            .slot
            .conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // Both sides start at tail = 0 after CONNECT; a client's S2C head is where the control
        // path's prefill left it (0 everywhere else), as it recorded it in private memory.
        self.seen = 0;
        let prefilled = std::mem::take(
            &mut *self
                .slot
                .prefilled
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        self.own = prefilled.head;
        self.parked = prefilled.parked;
        if let Some(c) = &self.conn {
            self.parked.resize_with(c.ring.size() as usize, || None);
        }
    }

    #[inline(always)]
    fn exit(&mut self) {
        self.gate.exit();
        self.cell.publish(&self.stats);
    }

    /// The peer broke the protocol: stop using the rings until the control path reconnects.
    #[cold]
    #[inline(never)]
    fn protocol_error(&mut self, e: DataError) {
        self.stats.errors += 1;
        self.conn = None;
        for m in self.parked.drain(..).flatten() {
            self.cache.free(m);
        }
        self.broken.set_error(e);
    }

    fn kick(c: &Conn) {
        if let Some(irq) = &c.irq {
            // SeqCst fence: our counter store must be visible before we read the peer's
            // MASK_INT, or a peer going to sleep could miss this frame (store→load, pairs with
            // the fence in `RxQueue::arm_interrupt`).
            fence(SeqCst);
            // Relaxed: ordered by the fence above.
            if c.ring.flags().load(Relaxed) & RING_FLAG_MASK_INT == 0 {
                let _ = irq.notify();
            }
        }
    }
}

/// A client hands its S2C slots back to the server (refill, then its `head`) once this share of
/// the ring is free: an eighth, 128 slots of the default 1024 (every burst below 8 slots). The
/// server still has seven eighths of the ring posted, and our `head` line, which it reads every
/// burst, moves a few times a ring instead of every burst (each store takes it back from the
/// server's core), the descriptors in runs of 128. DPDK's client refills every burst.
///
/// A/B in one sitting (session 42, Intel Xeon host; in-process flip of 250-ms windows, our
/// client rxonly counted, B/A p20/p50/p80, every burst / an eighth):
///
/// ```text
///   our server txonly     64 B  0.94/1.03/1.10  1.00/1.03/1.06  0.96/1.05/1.11  0.98/1.04/1.10
///                        512 B  0.92/0.97/1.02  0.97/1.00/1.03  0.98/1.00/1.02
///                       1518 B  0.98/1.00/1.02
///   DPDK's server txonly  64 B  0.99/1.05/1.11  0.98/1.02/1.06
///                        512 B  0.95/1.00/1.01   1518 B 0.99/1.00/1.03
/// ```
///
/// A quarter of the ring (256) was 1.01/1.02 at 64 B (ours/DPDK's), 32 slots 1.00/1.00.
pub const REFILL_SHARE: u16 = 8;

/// How long an rx queue leaves its ring alone after a poll that found it empty, when the poll
/// before took a run of frames (and no quiet spell is on: holds that do not pay start one),
/// unless the port's `rx-holdoff-ns` devarg says otherwise ([`memnic_ethdev::holdoff`]).
///
/// A caught-up receiver polls the ring's head and the descriptor line the sender writes next;
/// where the sender is the pair's bound (DPDK's memif transmit at 64 B, which reads every
/// descriptor it writes), each look takes a line it is about to store to. In-process flip in
/// one sitting (the Intel Xeon host of session 45, 250-ms windows, our side rxonly counted,
/// holding off 5 us / not at all, p20/p50/p80):
///
/// ```text
///   64 B  our server <- DPDK's client  1.04/1.07/1.13   (2 us 1.05/1.06/1.07, 10 us 1.04/1.10/1.12)
///         our client <- DPDK's server  1.17/1.19/1.20   (2 us 0.99/1.05/1.18, 10 us 1.09/1.15/1.18)
///         our client <- our server     1.01/1.10/1.11   (2 us 0.93/1.06/1.14, 10 us 1.02/1.10/1.20)
///         our server <- our client     0.90/0.99/1.01
///  512 B  our server <- DPDK's client  1.00/1.01/1.04, our client <- DPDK's server 0.98/1.00/1.01
///         our server <- our client     0.93/1.00/1.01, our client <- our server    0.97/1.00/1.01
/// 1518 B  our server <- DPDK's client  1.00/1.00/1.09, our client <- our server    0.99/1.01/1.10
/// ```
///
/// (From 512 B the receiver is the bound and rarely catches up: nothing changes.) 5 us, as
/// MEMNIC's (`memnic_pmd::DEFAULT_RX_HOLDOFF`): 10 us was no better, 2 us less.
pub const DEFAULT_RX_HOLDOFF: Duration = Duration::from_micros(5);

/// A memif rx queue (either role).
pub struct MemifRxQueue {
    core: QueueCore,
    /// Whether the frames received are flushed from our caches once copied out
    /// (`chain::FromRegions::flush`).
    flush: FlushTuner,
    /// The hold-off after an empty poll that followed a run ([`DEFAULT_RX_HOLDOFF`]).
    hold: Holdoff,
}

/// A memif tx queue (either role).
pub struct MemifTxQueue {
    core: QueueCore,
    /// Whether short frames go into the peer's buffers with streaming stores
    /// (`writer::STREAM_MAX`).
    stream: StreamTuner,
    /// Whether short frames written with plain stores are demoted to the shared cache
    /// (`memnic_ethdev::demote::DEMOTE_BYTES`).
    demote: DemoteTuner,
    /// How the write-ahead asks for the peer's buffer lines (`writer::Ahead`).
    ahead: AheadTuner,
}

impl MemifRxQueue {
    pub fn new(core: QueueCore, flush: FlushMode, holdoff: Duration) -> Self {
        MemifRxQueue {
            core,
            flush: FlushTuner::new(flush),
            hold: Holdoff::new(holdoff),
        }
    }

    /// Interrupt mode: clears MASK_INT so the peer kicks the eventfd, then says whether frames
    /// are already waiting (if so, poll instead of sleeping). Returns None when not connected.
    pub fn arm_interrupt(&mut self) -> Option<bool> {
        let c = self.core.conn.as_ref()?;
        // Relaxed: ordered by the fence below.
        c.ring.flags().store(0, Relaxed);
        // SeqCst fence: MASK_INT cleared before we re-read the peer's counter (store→load);
        // pairs with the fence in `QueueCore::kick`.
        fence(SeqCst);
        let pending = match c.role {
            Role::Server => acquire(c.ring.head()) != self.core.seen,
            Role::Client => acquire(c.ring.tail()) != self.core.seen,
        };
        Some(pending)
    }

    /// Back to polling: sets MASK_INT (the peer stops kicking).
    pub fn disarm_interrupt(&mut self) {
        if let Some(c) = &self.core.conn {
            // Relaxed: a hint to the peer; a late kick is harmless.
            c.ring.flags().store(RING_FLAG_MASK_INT, Relaxed);
        }
    }

    /// The eventfd to wait on while armed.
    pub fn interrupt(&self) -> Option<Arc<EventFd>> {
        self.core.conn.as_ref().and_then(|c| c.irq.clone())
    }

    /// Server: consume frames the client queued on a C2S ring, then publish tail.
    fn rx_server(
        q: &mut QueueCore,
        pkts: &mut Vec<Mbuf>,
        max: usize,
        flush: bool,
    ) -> Result<(usize, bool), DataError> {
        let QueueCore {
            conn,
            seen,
            cache,
            stats,
            ..
        } = q;
        let c = conn.as_ref().expect("entered");
        let ring = &c.ring;
        let win = Window::server(ring.head(), *seen, ring.size())?;
        if win.avail == 0 {
            return Ok((0, false)); // the common idle poll: touch nothing else
        }
        let start = pkts.len();
        let mut src = FromRegions {
            regions: &c.regions,
            flush,
        };
        let used = receive(&mut src, ring, &win, pkts, max, cache, stats)?;
        if used > 0 {
            *seen = seen.wrapping_add(used);
            // We are done with these slots. Only when it moved: a store, even of the same
            // value, takes the line away from the client, whose every tx burst then misses on it.
            publish(ring.tail(), *seen);
        }
        let n = pkts.len() - start;
        stats.packets += n as u64;
        Ok((n, used < win.avail))
    }

    /// Client: take frames the server wrote into our S2C slots, then refill the ring.
    fn rx_client(
        q: &mut QueueCore,
        pkts: &mut Vec<Mbuf>,
        max: usize,
        flush: bool,
    ) -> Result<(usize, bool), DataError> {
        let QueueCore {
            conn,
            own,
            seen,
            parked,
            cache,
            stats,
            ..
        } = q;
        let c = conn.as_ref().expect("entered");
        let ring = &c.ring;
        let win = Window::client(ring.tail(), *seen, *own, ring.size(), RingDirection::S2C)?;
        let start = pkts.len();
        let used = match (c.zero_copy_region, c.buffers) {
            (None, Some((base, bsize))) => {
                let mut src = FromLayout {
                    region: &c.regions.0[0],
                    base,
                    bsize,
                    mask: ring.mask(),
                    flush,
                };
                receive(&mut src, ring, &win, pkts, max, cache, stats)?
            }
            _ => {
                let mut src = FromParked {
                    parked,
                    mask: ring.mask(),
                };
                receive(&mut src, ring, &win, pkts, max, cache, stats)?
            }
        };
        *seen = seen.wrapping_add(used);
        let free = ring.size() - own.wrapping_sub(*seen);
        if free >= ring.size() / REFILL_SHARE {
            Self::refill(c, own, *seen, parked, cache);
        }
        let n = pkts.len() - start;
        stats.packets += n as u64;
        Ok((n, used < win.avail))
    }

    /// Client, at connect: post the whole S2C ring before the server can send, so frames it
    /// transmits before our first rx burst are not dropped.
    pub fn prefill_client_rx(c: &Conn, pool: &memnic_ethdev::Mempool) -> Prefilled {
        let mut parked = Vec::new();
        parked.resize_with(c.ring.size() as usize, || None);
        let mut head = 0;
        // Zero copy takes buffers from the queue's pool; copy mode posts its own layout.
        Self::refill(c, &mut head, 0, &mut parked, &mut pool.cache());
        Prefilled { parked, head }
    }

    /// Client: hand every free S2C slot back to the server with its capacity, publish head.
    fn refill(
        c: &Conn,
        own: &mut u16,
        seen: u16,
        parked: &mut [Option<Mbuf>],
        cache: &mut PoolCache,
    ) {
        let ring = &c.ring;
        let size = ring.size();
        let mut head = *own;
        while head.wrapping_sub(seen) < size {
            let slot = head & ring.mask();
            let d = match (c.zero_copy_region, c.buffers) {
                (None, Some((base, bsize))) => Desc {
                    flags: 0,
                    region: 0,
                    length: bsize,
                    offset: (base + slot as usize * bsize as usize) as u32,
                },
                (Some(region), _) => {
                    let Some(m) = cache.alloc() else { break };
                    // The pool is sent as a region only if its offsets fit a descriptor.
                    let Ok(offset) = u32::try_from(m.region_offset()) else {
                        cache.free(m);
                        break;
                    };
                    let d = Desc {
                        flags: 0,
                        region,
                        length: m.capacity() as u32,
                        offset,
                    };
                    parked[slot as usize] = Some(m);
                    d
                }
                (None, None) => break,
            };
            ring.write_desc(slot, d);
            head = head.wrapping_add(1);
        }
        if head != *own {
            *own = head;
            // The descriptors are set: the server may fill these slots.
            publish(ring.head(), head);
        }
    }
}

impl RxQueue for MemifRxQueue {
    fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        if self.hold.holding() {
            return 0;
        }
        if !self.core.enter() {
            return 0;
        }
        let max = max.min(MAX_BURST);
        let start = pkts.len();
        let flush = self.flush.flush();
        // A zero-copy client copies nothing, so it has nothing to flush: its tuner is left
        // out (it never tries, and counts no frame as flushed).
        let copies = self
            .core
            .conn
            .as_ref()
            .is_some_and(|c| c.role == Role::Server || c.zero_copy_region.is_none());
        let res = match self.core.conn.as_ref().map(|c| c.role) {
            Some(Role::Server) => Self::rx_server(&mut self.core, pkts, max, flush),
            Some(Role::Client) => Self::rx_client(&mut self.core, pkts, max, flush),
            None => Ok((0, false)),
        };
        // And whether frames were left in the ring: more than the poll could take.
        let (n, left) = res.unwrap_or_else(|e| {
            // Frames taken before the violation came from a ring we no longer trust.
            for m in pkts.drain(start..) {
                self.core.cache.free(m);
            }
            self.core.protocol_error(e);
            (0, false)
        });
        if copies {
            self.flush.polled(n as u16);
            self.flush.record(&mut self.core.stats);
        }
        self.hold.polled(n, left);
        self.hold.record(&mut self.core.stats);
        self.core.exit();
        n
    }

    fn stats(&self) -> QueueStats {
        self.core.stats
    }

    /// Clears MASK_INT (the peer kicks our eventfd), re-checks the ring, sleeps on the eventfd
    /// if it is empty, then sets MASK_INT again: polling resumes.
    fn wait(&mut self, timeout: std::time::Duration) -> bool {
        let Some(pending) = self.arm_interrupt() else {
            return false;
        };
        if !pending {
            if let Some(irq) = self.interrupt() {
                if irq.wait(Some(timeout)).unwrap_or(false) {
                    let _ = irq.drain();
                }
            }
        }
        self.disarm_interrupt();
        true
    }
}

impl MemifTxQueue {
    pub fn new(core: QueueCore, stream: StreamMode, demote: DemoteMode, ahead: AheadMode) -> Self {
        MemifTxQueue {
            core,
            stream: StreamTuner::new(stream),
            demote: DemoteTuner::new(demote),
            ahead: AheadTuner::new(ahead),
        }
    }

    /// Client: queue frames on a C2S ring (copy or zero copy), publish head.
    ///
    /// In copy mode the server's tail is read only when the room known from the last read
    /// runs out, not every burst: the server writes that line after each of its bursts, so a
    /// read per burst was a cross-core miss per burst (35% of the client's tx samples at 64 B
    /// sat right after it). A tail out of range is then caught at the next read, at the latest
    /// once a ring's worth of slots has been sent past the last good one; it never gives us
    /// room we did not have (the check is the same as before), and zero copy, which frees
    /// parked buffers as the tail passes them, reads it every burst. A/B in one sitting (ours
    /// client txonly -> ours server rxonly, 3 rounds alternating, Mpps p20/p50/p80, every
    /// burst / lazy): 64 B 32.71/32.94/33.52 / 34.30/38.39/39.77, 512 B 15.07/15.58/15.91 /
    /// 15.34/15.63/16.57, 1518 B 7.14/7.23/7.35 / 7.18/7.22/7.52.
    fn tx_client(
        q: &mut QueueCore,
        pkts: &mut Vec<Mbuf>,
        short: &mut ShortWrites,
        ahead: Ahead,
    ) -> Result<usize, DataError> {
        let QueueCore {
            conn,
            own,
            seen,
            parked,
            cache,
            stats,
            ..
        } = q;
        let c = conn.as_ref().expect("entered");
        let ring = &c.ring;
        // The room we know of without reading the server's tail: the slots it had handed back
        // when we last read it.
        let mut free = ring.size() - own.wrapping_sub(*seen);
        let mut tail_read = false;
        if c.zero_copy_region.is_some() {
            // Zero copy: buffers the server has finished with go back to the pool, every burst.
            let win = Window::client(ring.tail(), *seen, *own, ring.size(), RingDirection::C2S)?;
            for i in 0..win.avail {
                if let Some(m) = parked[(win.slot(i) & ring.mask()) as usize].take() {
                    cache.free(m);
                }
            }
            *seen = win.end;
            free = win.room(*own, ring.size());
            tail_read = true;
        }
        let mut head = *own;
        let mut sent = 0;
        let mut bytes = 0;
        let n = pkts.len().min(MAX_BURST);
        // Zero copy: the slot each sent frame is parked in (+1), 0 for frames that were copied.
        // Copy mode parks nothing (and zeroes no array per burst).
        let mut park = c.zero_copy_region.is_some().then_some([0u16; MAX_BURST]);
        let (base, bsize) = c.buffers.unwrap_or((0, 0));
        let layout = ToLayout {
            ring,
            region: &c.regions.0[0],
            base,
            bsize,
            ahead,
        };
        // Copy mode: the burst's first buffers asked for at once (zero copy writes none).
        let asked = match c.zero_copy_region {
            None if bsize > 0 => prefetch_burst(&layout, &pkts[..n], head, free, short.stream_max),
            _ => 0,
        };
        while sent < n {
            let m = &pkts[sent];
            let zc_offset = c
                .zero_copy_region
                .filter(|_| m.nb_segs() == 1 && cache.pool().owns(m))
                .and_then(|r| Some((r, u32::try_from(m.region_offset()).ok()?)));
            if let Some((region, offset)) = zc_offset {
                // One slot pointing at the mbuf itself; it is freed once tail passes it.
                if free == 0 {
                    break;
                }
                let slot = head & ring.mask();
                let d = Desc {
                    flags: 0,
                    region,
                    length: m.len() as u32,
                    offset,
                };
                ring.write_desc(slot, d);
                if let Some(park) = park.as_mut() {
                    park[sent] = slot + 1;
                }
                head = head.wrapping_add(1);
                free -= 1;
            } else {
                if bsize == 0 {
                    break;
                }
                let slots = layout.slots_for(m.len());
                if slots > free as usize && !tail_read {
                    // Copy mode reads the server's tail only when the room it knows of runs
                    // out (see [`MemifTxQueue::tx_client`]); a bad tail read here still sends
                    // nothing: the frames written so far are past our published head.
                    let win =
                        Window::client(ring.tail(), *seen, *own, ring.size(), RingDirection::C2S)?;
                    *seen = win.end;
                    free = win.room(head, ring.size());
                    tail_read = true;
                }
                if slots > free as usize {
                    break;
                }
                prefetch_next(
                    &layout,
                    &pkts[..n],
                    (sent, asked),
                    head.wrapping_add(slots as u16),
                    slots < free as usize,
                    short.stream_max,
                );
                let Some(used) = write_frame(&layout, m, (head, free), short)? else {
                    break;
                };
                head = head.wrapping_add(used);
                free -= used;
            }
            bytes += m.len() as u64;
            sent += 1;
        }
        stats.bytes += bytes;
        match park {
            None => {
                cache.free_front(pkts, sent);
            }
            Some(park) => {
                for (m, p) in pkts.drain(..sent).zip(park) {
                    if p == 0 {
                        cache.free(m);
                    } else {
                        parked[(p - 1) as usize] = Some(m);
                    }
                }
            }
        }
        if head != *own {
            *own = head;
            // Frames written with streaming stores, before the counter that says they are there.
            if short.streamed > 0 {
                memnic_shm::store_fence();
            }
            // The frames are in their slots: the server may read them.
            publish(ring.head(), head);
            QueueCore::kick(c);
            // Copy mode: the next burst's first buffers on their way while it is built.
            if c.zero_copy_region.is_none() && bsize > 0 && short.streamed == 0 {
                prefetch_following(&layout, head, free);
            }
        }
        stats.packets += sent as u64;
        Ok(sent)
    }

    /// Server: write frames into the slots the client handed us on an S2C ring, publish tail.
    fn tx_server(
        q: &mut QueueCore,
        pkts: &mut Vec<Mbuf>,
        short: &mut ShortWrites,
        ahead: Ahead,
    ) -> Result<usize, DataError> {
        let QueueCore {
            conn,
            own,
            cache,
            stats,
            ..
        } = q;
        let c = conn.as_ref().expect("entered");
        let ring = &c.ring;
        let win = Window::server(ring.head(), *own, ring.size())?;
        let dst = ToDescriptors {
            ring,
            regions: &c.regions,
            ahead,
        };
        let mut used: u16 = 0;
        let mut sent = 0;
        let n = pkts.len().min(MAX_BURST);
        // The burst's first buffers asked for at once, later ones a frame ahead.
        let asked = prefetch_burst(&dst, &pkts[..n], win.slot(0), win.avail, short.stream_max);
        while sent < n {
            let m = &pkts[sent];
            // (One slot a frame, as far as the hint knows: see `ToDescriptors::extent`.)
            prefetch_next(
                &dst,
                &pkts[..n],
                (sent, asked),
                win.slot(used + 1),
                used + 1 < win.avail,
                short.stream_max,
            );
            // No room for the whole frame: it and the rest stay with the caller.
            let room = (win.slot(used), win.avail - used);
            let Some(slots) = write_frame(&dst, m, room, short)? else {
                break;
            };
            used += slots;
            stats.bytes += m.len() as u64;
            sent += 1;
        }
        cache.free_front(pkts, sent);
        if used > 0 {
            *own = win.slot(used);
            // Frames written with streaming stores, before the counter that says they are there.
            if short.streamed > 0 {
                memnic_shm::store_fence();
            }
            // The frames are in the client's buffers: it may take them.
            publish(ring.tail(), *own);
            QueueCore::kick(c);
        }
        stats.packets += sent as u64;
        Ok(sent)
    }
}

impl TxQueue for MemifTxQueue {
    fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        if !self.core.enter() {
            return 0;
        }
        let mut short = ShortWrites {
            stream_max: if self.stream.on() { STREAM_MAX } else { 0 },
            demote_bytes: self.demote.demote_bytes(),
            ..Default::default()
        };
        let ahead = if self.ahead.shared() {
            Ahead::Shared
        } else {
            Ahead::Exclusive
        };
        let res = match self.core.conn.as_ref().map(|c| c.role) {
            Some(Role::Client) => Self::tx_client(&mut self.core, pkts, &mut short, ahead),
            Some(Role::Server) => Self::tx_server(&mut self.core, pkts, &mut short, ahead),
            None => Ok(0),
        };
        let n = res.unwrap_or_else(|e| {
            self.core.protocol_error(e);
            // Nothing of the burst was published.
            short = ShortWrites::default();
            0
        });
        // The tuners judge by what the peer takes: a full ring sends only as it frees slots.
        self.stream.polled(n as u16, short.streamed);
        self.stream.record(&mut self.core.stats);
        self.demote.polled(n as u16, short.demoted);
        self.demote.record(&mut self.core.stats);
        self.ahead.polled(n as u16);
        self.ahead.record(&mut self.core.stats);
        self.core.exit();
        n
    }

    fn stats(&self) -> QueueStats {
        self.core.stats
    }
}
