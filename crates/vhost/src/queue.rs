//! The virtio-net data path: the guest's tx virtqueue behind our rx queue (dequeue: guest
//! frames into our mbufs) and its rx virtqueue behind our tx queue (enqueue: our frames into
//! the guest's buffers), over either ring layout ([`Vring`]). Copies both ways; every burst
//! publishes its used entries with one store and calls the guest at most once.
//!
//! The control thread installs a [`VringConn`] per virtqueue while the queues are parked by
//! the port's gate and takes it away (GET_VRING_BASE, disable, a new memory table,
//! disconnect); a queue reloads it when the gate says "restart", and publishes its
//! `last_avail` for GET_VRING_BASE after every burst.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use memnic_ethdev::flush::{FlushMode, FlushTuner};
use memnic_ethdev::gate::{Enter, GateMember};
use memnic_ethdev::stream::{StreamMode, StreamTuner};
use memnic_ethdev::{Mbuf, PoolCache, QueueStats, RxQueue, StatsCell, TxQueue, MAX_BURST};
use memnic_shm::unix::EventFd;

use crate::chain::{ChainError, Dir, Piece};
use crate::mem::MemTable;
use crate::notify::{may_sleep, CallCheck};
use crate::on_ring;
use crate::vring::{Broken, Next, OnGuest, Ring, Vring, MAX_ENQ_BATCH};
use crate::zerocopy::{ZeroCopy, ZeroCopyConfig};

/// What a virtqueue's poller needs while the ring runs.
#[derive(Clone)]
pub struct VringConn {
    pub ring: Ring,
    pub mem: Arc<MemTable>,
    /// virtio-net header bytes before every frame (10, or 12 with VERSION_1 or MRG_RXBUF).
    pub hdr_len: usize,
    /// Rx: a frame may span several chains (num_buffers).
    pub mrg_rxbuf: bool,
    pub event_idx: bool,
    /// IN_ORDER: chains are used in the order they were made available, so a run of tx
    /// chains goes back as one used entry.
    pub in_order: bool,
    /// The guest's interrupt eventfd (none: the frontend polls).
    pub call: Option<Arc<EventFd>>,
    /// The eventfd the driver kicks (none: it never does); `--rx-interrupt` sleeps on it.
    pub kick: Option<Arc<EventFd>>,
    /// Where the ring starts (SET_VRING_BASE).
    pub base: u16,
    /// Disabled (SET_VRING_ENABLE 0): a tx virtqueue is drained and its frames discarded, an
    /// rx virtqueue gets nothing.
    pub enabled: bool,
    /// Which ring this is, port-wide: the same while the ring runs (a new memory table, a new
    /// call fd), a new one once it was stopped and set up again.
    pub ring_id: u64,
}

/// Shared by the control thread and one queue.
#[derive(Default)]
pub struct VringSlot {
    pub conn: Mutex<Option<VringConn>>,
    /// The queue's next avail index, published after each burst (Relaxed: the control thread
    /// reads it with the queue parked, which the gate orders).
    pub last_avail: AtomicU16,
    /// The queue owes its ring a call check ([`CallCheck::is_due`]): set by a burst that
    /// deferred it, published with `last_avail` (Relaxed, the same way); cleared by the queue
    /// when it makes the check before sleeping, and by the control thread when it makes it
    /// for a ring taken from the queue ([`settle_leaving`]).
    pub call_due: AtomicBool,
    /// The call eventfd the queue is notifying outside its burst (`wait`), for the watchdog.
    pub calling: Mutex<Option<Arc<EventFd>>>,
    /// Chains refused (see `chain`), and rings found broken.
    pub bad_chains: AtomicU64,
    pub broken: AtomicU64,
    /// Why the last chain was refused (for logs and tests).
    pub last_bad: Mutex<Option<ChainError>>,
    /// Dequeue zero copy: chains the stack holds (published after each burst), and while the
    /// control thread drains the queue (no chain is taken without a copy then).
    pub zc_held: AtomicU32,
    pub zc_draining: AtomicBool,
    /// Chains sent up without a copy; chains a stopped ring abandoned (still held when the
    /// drain timed out); segments of abandoned chains that came back later, discarded.
    pub zc_chains: AtomicU64,
    pub zc_abandoned: AtomicU64,
    pub zc_late: AtomicU64,
    /// An in-order run of tx chains the queue took and holds (see [`HeldRun`]), published
    /// after each burst of a queue that may hold one (`rx-hold=1`; [`HeldRun::encode`], 0:
    /// none; Relaxed, as `last_avail`): the control thread hands it back when the ring leaves
    /// the queue ([`settle_leaving`]).
    pub held_run: AtomicU64,
}

impl VringSlot {
    /// Counts a refused chain and remembers why (the cold path: a lock is fine here).
    #[cold]
    #[inline(never)]
    pub fn bad_chain(&self, e: ChainError) {
        // Relaxed: a counter; nothing is ordered by it.
        self.bad_chains.fetch_add(1, Relaxed);
        *self.last_bad.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }
}

/// An IN_ORDER run of tx chains a dequeue took (their frames copied) and has not handed back
/// yet: the chains from the used position `at` up to the one with id `last`, `chains` chains
/// over `descs` ring slots. Dequeue holds a run while its bursts come back full, until the run
/// covers half the ring ([`holds_run`]); then, or at the first burst that is not full (the
/// ring ran dry: a driver waiting for its buffers has sent what it could), the whole run goes
/// back as one used entry. Only with `rx-hold=1` (off by default).
///
/// DPDK's vhost held its packed dequeue's used entries until all but a burst of the ring was
/// taken (19.11) and gave it up in 20.11 ("vhost: fix shadow update"): a Linux driver's byte
/// queue limits stop its transmit while completions are outstanding, and a driver that runs
/// faster than the backend finds no free descriptors, which costs zero-loss (RFC 2544)
/// throughput. Ours hands a run back as soon as the ring runs dry, so a driver that stopped to
/// wait gets it at the next poll, but the second cost stands: while a run is held, the driver
/// has up to half its ring less for frames we have not taken yet (our lossless round trips
/// through DPDK's macswap with a window of the whole ring, 256, lost 96 frames with it on).
///
/// Handed back at every burst, each entry pulled the driver's descriptor line over to our core
/// and back 32 frames later. In-process flip (a variant switched every 250 ms in our process,
/// frames counted per window, B/A of each B window against its two A neighbours, p20/p50/p80;
/// virtio-user txonly -> our rxonly, this Intel Xeon host; B holds):
///
/// ```text
///   hold until      packed 64 B        packed 1518 B      split 64 B         split 1518 B
///   64 slots        0.96/1.01/1.04     1.23/1.25/1.28     0.98/1.00/1.02     1.10/1.22/1.26
///   128 (half)      0.99/1.02/1.05     1.37/1.39/1.41     0.99/1.00/1.01     1.31/1.33/1.34
///   224 (DPDK's)    1.00/1.03/1.12     1.13/1.30/1.41     0.92/1.01/1.07     1.22/1.32/1.40
/// ```
///
/// (224 at 512 B: packed 0.86/0.98/1.10, split 1.03/1.12/1.16.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeldRun {
    at: u16,
    last: u16,
    chains: u16,
    descs: u16,
}

impl HeldRun {
    fn encode(run: Option<HeldRun>) -> u64 {
        run.map_or(0, |h| {
            u64::from(h.at) << 48
                | u64::from(h.last) << 32
                | u64::from(h.chains) << 16
                | u64::from(h.descs)
        })
    }

    /// None for 0 (a run holds at least one chain).
    fn decode(v: u64) -> Option<HeldRun> {
        let h = HeldRun {
            at: (v >> 48) as u16,
            last: (v >> 32) as u16,
            chains: (v >> 16) as u16,
            descs: v as u16,
        };
        (h.chains > 0).then_some(h)
    }

    /// Writes the run's one used entry at `at` and publishes it.
    fn hand_back<V: Vring>(&self, r: &V) {
        let mut used = r.used_at(self.at);
        // (Only the last chain's id is written; the run's slots are `descs`.)
        let last = crate::vring::Chain {
            id: self.last,
            descs: 0,
        };
        r.put_used_run(&mut used, last, self.chains, self.descs);
        r.publish(&mut used);
    }
}

/// Whether a dequeue whose burst came back full keeps its in-order run of `descs` ring slots
/// for the next burst (see [`HeldRun`]): until it covers half of a ring of `size`.
fn holds_run(descs: u16, size: u16) -> bool {
    descs < size / 2
}

/// What a queue's bursts carry from one to the next.
struct State {
    /// Ring positions (see `vring`): the next chain to take, the next used entry to write.
    last_avail: u16,
    used: u16,
    cache: PoolCache,
    /// A batch's chains walked into one list, chain after chain (an enqueue's one-frame path
    /// reuses it once the batch is copied).
    batch: Vec<Piece>,
    stats: QueueStats,
    /// Polls in a row that found the guest's tx ring empty (see [`IDLE_PAUSES`]).
    idle_polls: u32,
    /// Dequeue zero copy (rx queues of a `dequeue-zero-copy=1` port; a reload looks at it).
    zc: Option<ZeroCopy>,
    /// Whether used entries went out without a look at whether the driver wants a call (see
    /// [`publish`]).
    calls: CallCheck,
    /// The in-order run of tx chains dequeue holds (starting at `used`), and whether it may
    /// hold one (`rx-hold`).
    held: Option<HeldRun>,
    hold_runs: bool,
}

/// State of one queue in either direction.
struct Core {
    gate: GateMember,
    slot: Arc<VringSlot>,
    conn: Option<VringConn>,
    s: State,
    cell: Arc<StatsCell>,
}

impl Core {
    fn new(gate: GateMember, slot: Arc<VringSlot>, cache: PoolCache, cell: Arc<StatsCell>) -> Core {
        Core {
            gate,
            slot,
            conn: None,
            s: State {
                last_avail: 0,
                used: 0,
                cache,
                batch: Vec::new(),
                stats: QueueStats::default(),
                idle_polls: 0,
                calls: CallCheck::default(),
                held: None,
                hold_runs: false,
                zc: None,
            },
            cell,
        }
    }

    /// Top of a burst: false means "no ring, do nothing" (gate already left).
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
        let prev = self.conn.as_ref().map(|c| c.ring_id);
        self.conn = self
            .slot
            .conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // Relaxed: the gate orders the control thread's store before this (as `last_avail`).
        if self.s.calls.is_due() && !self.slot.call_due.load(Relaxed) {
            // The control thread made the check when the ring left us (`settle_leaving`), even
            // if it came back since (the same ring, its region removed and added again).
            self.s.calls = CallCheck::default();
        }
        if let Some(c) = &self.conn {
            self.s.last_avail = c.base;
            // A new ring starts where the frontend said: in copy mode every chain we take is
            // returned in the same burst, so the used position follows the avail position. A
            // ring that goes on keeps its own, where chains still held by zero copy return.
            if prev != Some(c.ring_id) {
                self.s.used = c.base;
                // The control thread handed back what the old ring held (settle_leaving).
                self.s.held = None;
            }
            // We poll: ask the driver not to kick.
            on_ring!(&c.ring, r => r.disable_kicks());
        }
        if let Some(zc) = &mut self.s.zc {
            let abandoned = zc.load(self.conn.as_ref().map(|c| (c.ring_id, c.ring.size())));
            // Relaxed: counters.
            self.slot.zc_abandoned.fetch_add(abandoned.into(), Relaxed);
            self.slot.zc_held.store(zc.out().into(), Relaxed);
        }
        self.slot.last_avail.store(self.s.last_avail, Relaxed);
    }

    #[inline(always)]
    fn exit(&mut self) {
        self.slot.last_avail.store(self.s.last_avail, Relaxed);
        if self.s.hold_runs {
            self.slot
                .held_run
                .store(HeldRun::encode(self.s.held), Relaxed);
        }
        self.slot.call_due.store(self.s.calls.is_due(), Relaxed);
        self.gate.exit();
        self.cell.publish(&self.s.stats);
    }

    /// The guest broke the ring: it is dropped until the control thread installs it again.
    #[cold]
    #[inline(never)]
    fn broken(&mut self, _why: Broken) {
        self.s.stats.errors += 1;
        // Relaxed: a counter; nothing is ordered by it.
        self.slot.broken.fetch_add(1, Relaxed);
        self.conn = None;
        // The guest must set the ring up again: nothing it held goes back.
        self.s.held = None;
    }
}

/// Publishes the burst's `entries` used entries and calls the guest if it wants it (`defer`:
/// see [`CallCheck::after_publish`]).
///
/// Deferring the call check at dequeue, in-process flip (virtio-user txonly -> our rxonly, 2-s
/// blocks, B/A p20/p50/p80, B = deferred): packed 64 B 1.01/1.03/1.04, 1.00/1.02/1.03,
/// 1.02/1.03/1.03; 512 B 1.01/1.01/1.02 (19.0 Mpps, fast); 1518 B 1.00/1.02/1.05,
/// 1.04/1.06/1.06, 0.99/1.00/1.02; split level: 64 B 0.97/0.99/1.05, 512 B 0.98/1.01/1.03.
#[inline(always)]
fn publish<V: Vring>(
    r: &V,
    c: &VringConn,
    s: &mut State,
    mut used: V::Used,
    entries: u16,
    defer: bool,
) {
    let old = s.used;
    if entries > 0 {
        r.publish(&mut used);
        s.used = V::used_pos(&used);
    }
    let Some(call) = &c.call else {
        return;
    };
    let words = OnGuest {
        ring: r,
        event_idx: c.event_idx,
    };
    if s.calls
        .after_publish(&words, entries > 0, defer, old, s.used)
    {
        let _ = call.notify();
    }
}

/// With the queue parked, before its ring is taken away (stopped, or replaced by a ring
/// `next` other than the one it runs): hands back the in-order run its dequeue held
/// ([`HeldRun`]), and makes the call check its last burst deferred (or the run needs), which its
/// next poll would have made (see [`CallCheck::after_publish`]) but which the ring would
/// otherwise never get: a driver that turned calls on as that burst published may be waiting
/// for it. A ring that goes on in its queue (a new memory table or call fd) keeps it. Returns
/// the call fd to notify, which the caller does once the queues run again (a frontend can
/// make a notify block: see `EventFd::notify`).
pub(crate) fn settle_leaving(slot: &VringSlot, next: Option<u64>) -> Option<Arc<EventFd>> {
    // Relaxed: the queue is parked, and the gate orders its last stores before these.
    if !slot.call_due.load(Relaxed) && slot.held_run.load(Relaxed) == 0 {
        return None;
    }
    let guard = slot.conn.lock().unwrap_or_else(|p| p.into_inner());
    let c = guard.as_ref().filter(|c| Some(c.ring_id) != next)?;
    // The run the queue held goes back now (its frames were delivered), so the used position
    // is the avail position the frontend reads back; a driver may be waiting for it, so the
    // call check below is owed for it too. Relaxed: as above.
    if let Some(h) = HeldRun::decode(slot.held_run.swap(0, Relaxed)) {
        on_ring!(&c.ring, r => h.hand_back(r));
    }
    // Relaxed: as above.
    slot.call_due.store(false, Relaxed);
    let call = c.call.as_ref()?;
    let wants = on_ring!(&c.ring, r => CallCheck::owed().settle(&OnGuest {
        ring: r,
        event_idx: c.event_idx,
    }));
    wants.then(|| call.clone())
}

/// Our rx queue: the guest's tx virtqueue.
pub struct VhostRxQueue {
    core: Core,
    /// Whether a dequeue flushes its frames' first lines ([`flush_first_line`]).
    flush: FlushTuner,
}

impl VhostRxQueue {
    /// With `zero_copy`, frames go up as external segments over the guest's buffers (see
    /// `zerocopy`); `name` names its pool of segments. `flush`: what dequeue flushes
    /// (`flush_first_line`). `hold_runs`: whether an in-order dequeue holds its run over full
    /// bursts ([`HeldRun`]).
    pub fn new(
        gate: GateMember,
        slot: Arc<VringSlot>,
        cache: PoolCache,
        cell: Arc<StatsCell>,
        zero_copy: Option<(&str, ZeroCopyConfig)>,
        flush: FlushMode,
        hold_runs: bool,
    ) -> Self {
        let mut core = Core::new(gate, slot, cache, cell);
        core.s.zc = zero_copy.map(|(name, cfg)| ZeroCopy::new(name, cfg));
        core.s.hold_runs = hold_runs;
        VhostRxQueue {
            core,
            flush: FlushTuner::new(flush),
        }
    }
}

impl RxQueue for VhostRxQueue {
    fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        let q = &mut self.core;
        if !q.enter() {
            return 0;
        }
        let start = pkts.len();
        let c = q.conn.as_ref().expect("entered");
        let flush = &mut self.flush;
        let r = on_ring!(&c.ring, r => dequeue(r, c, &mut q.s, flush, &q.slot, pkts, max));
        if let Err(b) = r {
            q.broken(b);
        }
        if let Some(zc) = &q.s.zc {
            // Relaxed: the control thread polls it while it drains; the gate orders the rest.
            q.slot.zc_held.store(zc.out().into(), Relaxed);
            // Relaxed: a counter, stored (not added to: a locked add per chain drained the
            // store buffer on the data path) once per burst.
            q.slot.zc_chains.store(zc.chains(), Relaxed);
        }
        q.exit();
        pkts.len() - start
    }

    fn stats(&self) -> QueueStats {
        self.core.s.stats
    }

    /// Interrupt mode: makes a call the last burst deferred, asks the driver to kick
    /// (used.flags 0, or avail_event at our index with EVENT_IDX), re-checks the ring, sleeps
    /// on the kick eventfd while it is empty, then asks for no kicks again. False when there is
    /// no ring or the frontend gave no kick fd.
    fn wait(&mut self, timeout: std::time::Duration) -> bool {
        let Core { conn, s, slot, .. } = &mut self.core;
        let Some(c) = conn.as_ref() else {
            return false;
        };
        let Some(kick) = &c.kick else {
            return false;
        };
        if s.held.is_some() {
            // Not asleep with chains held back: the next burst hands them back (or takes
            // more), and it comes at once.
            return true;
        }
        let at = s.last_avail;
        // Chains held by zero copy come back while we would sleep: look again soon.
        let timeout = match &s.zc {
            Some(zc) if zc.out() > 0 => timeout.min(ZC_WAIT),
            _ => timeout,
        };
        on_ring!(&c.ring, r => {
            let words = OnGuest { ring: r, event_idx: c.event_idx };
            // A call the last burst deferred to its next poll is made before we stop polling.
            if let Some(call) = c.call.as_ref().filter(|_| s.calls.settle(&words)) {
                // Outside the gate, the slot's ring can be replaced while this call is stuck
                // on a jammed eventfd: the watchdog unjams it from here (`unjam_calls`).
                *slot.calling.lock().unwrap_or_else(|p| p.into_inner()) = Some(call.clone());
                let _ = call.notify();
                *slot.calling.lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
            // Made: a ring taken from us while we sleep owes nothing. Relaxed: outside the
            // gate, a control thread that reads the old value makes the check once more (a
            // spurious call at most, never a lost one).
            slot.call_due.store(false, Relaxed);
            if may_sleep(&words, at) && kick.wait(Some(timeout)).unwrap_or(false) {
                let _ = kick.drain();
            }
            // Back to polling.
            r.disable_kicks();
        });
        true
    }
}

/// How long an rx queue sleeps in `wait` while zero-copy chains are out (their completions
/// are written at its bursts).
const ZC_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// Takes up to `max` (and a burst's worth) of the guest's tx chains into `pkts`, in batches of
/// [`DEQ_BATCH`]: each frame copied into our buffers and its chain handed back as used (length
/// 0: the device wrote nothing into it), the lot published once (with IN_ORDER, as one used
/// entry); or, with zero copy, the frame handed up as segments over the guest's buffers and its
/// chain handed back at the first burst after they are all freed.
#[inline(always)]
fn dequeue<V: Vring>(
    r: &V,
    c: &VringConn,
    s: &mut State,
    flush: &mut FlushTuner,
    slot: &VringSlot,
    pkts: &mut Vec<Mbuf>,
    max: usize,
) -> Result<(), Broken> {
    let mut cur = r.cursor(s.last_avail)?;
    let mut used = r.used_at(s.used);
    let want = max.min(MAX_BURST);
    let mut taken: u16 = 0;
    // Of those, frames handed up zero copy (nothing copied, so nothing to flush).
    let mut uncopied: u16 = 0;
    // Zero-copy chains whose segments were all freed go back with this burst's entries.
    let mut returned = 0;
    // Relaxed: a request from the control thread, which then waits for `zc_held`.
    let zc_on = c.enabled && !c.in_order && !slot.zc_draining.load(Relaxed);
    if let Some(zc) = &mut s.zc {
        let got = zc.reap(|chain| r.put_used(&mut used, chain, 0));
        returned = got.chains;
        if got.late > 0 {
            // Relaxed: a counter.
            slot.zc_late.fetch_add(got.late.into(), Relaxed);
        }
    }
    let mut res = Ok(());
    // IN_ORDER: the burst's chains go back as one entry (DPDK's batched in-order dequeue),
    // with the run earlier bursts held (see [`HeldRun`]), whose slots stay within one lap of
    // the ring: an entry cannot say more, and only a driver whose chains run on through slots
    // we already took gets there.
    let lap = c.ring.size();
    let held = s.held.take();
    let mut run = (
        crate::vring::Chain {
            id: held.map_or(0, |h| h.last),
            descs: 0,
        },
        held.map_or(0, |h| h.descs),
    );
    let mut more = true;
    while more && (taken as usize) < want {
        // Take a batch: each chain walked, its pieces kept, a buffer for it on `pkts` (in
        // chain order, filled there) and its frame prefetched (see [`PREFETCH_WHOLE`]). The
        // batch's buffers come at its first chain, all at once (see [`DEQ_BATCH`]); those no
        // chain took go back after the walk.
        let mut took = [Taken::NONE; DEQ_BATCH];
        let base = pkts.len();
        let mut nb = 0;
        s.batch.clear();
        while nb < DEQ_BATCH && (taken as usize) < want {
            let before = cur;
            let start = s.batch.len();
            let (chain, walked) = match r.next(&c.mem, &mut cur, Dir::Readable, &mut s.batch) {
                Next::Chain(chain, walked) => (chain, walked),
                Next::Empty => {
                    if taken == 0 && s.idle_polls < IDLE_PAUSE_POLLS {
                        s.idle_polls += 1;
                        idle_pause();
                    }
                    more = false;
                    break;
                }
                Next::Broken(b) => {
                    res = Err(b);
                    more = false;
                    break;
                }
            };
            if c.in_order && u32::from(run.1) + u32::from(chain.descs) > u32::from(lap) {
                // The chain starts the next burst's run.
                cur = before;
                s.batch.truncate(start);
                more = false;
                break;
            }
            let pieces = &s.batch[start..];
            if let (Some(zc), Ok(total), true) = (&mut s.zc, walked, zc_on) {
                if zc.takes(chain.id, total, pieces, c.hdr_len) {
                    if let Some(m) = zc.attach(&c.mem, pieces, c.hdr_len, chain) {
                        s.batch.truncate(start);
                        taken += 1;
                        uncopied += 1;
                        s.stats.packets += 1;
                        s.stats.bytes += m.len() as u64;
                        pkts.push(m);
                        took[nb] = Taken {
                            zero_copy: true,
                            ..Taken::NONE
                        };
                        nb += 1;
                        continue;
                    }
                }
            }
            // The buffer goes straight onto `pkts` (built there, not moved there). Zero copy
            // takes one at a time: its frames need none.
            if pkts.len() == base + nb {
                let room = if zc_on && s.zc.is_some() {
                    1
                } else {
                    DEQ_BATCH - nb
                };
                s.cache.alloc_up_to(pkts, room.min(want - taken as usize));
            }
            if pkts.len() == base + nb {
                // The chain stays the guest's until we have a buffer for it.
                cur = before;
                s.batch.truncate(start);
                s.stats.nombuf += 1;
                more = false;
                break;
            }
            if c.in_order {
                run = (chain, run.1 + chain.descs);
            } else {
                r.put_used(&mut used, chain, 0);
            }
            taken += 1;
            // A short frame is fetched whole, a long one's first lines (the hardware
            // prefetcher follows its copy).
            let fetch = match walked {
                Ok(total) => match (total as usize).saturating_sub(c.hdr_len) {
                    frame if frame <= PREFETCH_WHOLE => frame,
                    _ => V::DEQ_FETCH_LONG,
                },
                _ => 1,
            };
            prefetch_frame(&c.mem, &s.batch[start..], c.hdr_len, fetch);
            took[nb] = Taken {
                start: start as u32,
                end: s.batch.len() as u32,
                walked,
                zero_copy: false,
            };
            nb += 1;
        }
        while pkts.len() > base + nb {
            s.cache.free(pkts.pop().expect("a spare buffer"));
        }
        // The next batch's first lines, on their way while this batch's frames are copied
        // (zero copy reads none).
        if more && !(zc_on && s.zc.is_some()) {
            r.prefetch_ahead(&c.mem, &cur, c.hdr_len, DEQ_BATCH as u16);
        }
        // Copy the batch's frames.
        let mut dropped = 0u32;
        let flushing = flush.flush();
        for k in 0..nb {
            let t = &took[k];
            if t.zero_copy {
                continue;
            }
            let m = &mut pkts[base + k];
            let pieces = &s.batch[t.start as usize..t.end as usize];
            let got = t
                .walked
                .and_then(|total| read_frame(&c.mem, pieces, c.hdr_len, total, m, &mut s.cache));
            if got.is_ok() && flushing {
                flush_first_line(&c.mem, pieces, c.hdr_len);
            }
            match got {
                Ok(()) if c.enabled => {
                    s.stats.packets += 1;
                    s.stats.bytes += m.len() as u64;
                }
                // A disabled ring is drained and its frames discarded.
                Ok(()) => dropped |= 1 << k,
                Err(e) => {
                    dropped |= 1 << k;
                    s.stats.errors += 1;
                    slot.bad_chain(e);
                }
            }
        }
        // Frames refused or discarded leave `pkts` (the last first, so the indices hold).
        while dropped != 0 {
            let k = 31 - dropped.leading_zeros();
            dropped &= !(1 << k);
            s.cache.free(pkts.remove(base + k as usize));
        }
    }
    if taken > 0 {
        s.idle_polls = 0;
    }
    let mut entries = taken + returned;
    if c.in_order {
        let chains = held.map_or(0, |h| h.chains) + taken;
        // `more`: the burst came back full (a burst that found the ring dry, a chain past the
        // lap or no buffer for a chain hands everything back).
        if s.hold_runs && more && chains > 0 && holds_run(run.1, lap) {
            s.held = Some(HeldRun {
                at: s.used,
                last: run.0.id,
                chains,
                descs: run.1,
            });
            entries = returned;
        } else {
            r.put_used_run(&mut used, run.0, chains, run.1);
            entries = chains + returned;
        }
    }
    s.last_avail = V::cursor_pos(&cur);
    // The tuner judges by the frames its flushing touches: the copied ones.
    flush.polled(taken - uncopied);
    flush.record(&mut s.stats);
    publish(r, c, s, used, entries, true);
    res
}

/// PAUSEs a poll that found the guest's tx ring empty spends before it returns (about 27 ns
/// each on this EPYC).
///
/// An idle poll reads the line the driver writes next (the packed slot it fills, the split
/// ring's `avail.idx`); a tight loop of them takes that line from the driver's core before each
/// of its stores, and the frontend, not us, is then the bottleneck: with virtio-user `txonly`
/// we took a full burst of 32 after some 260 empty polls, and the frontend sent more the less
/// often we looked. DPDK's vhost spends longer per empty poll (it allocates and frees a burst
/// of mbufs first). A/B in one sitting (Mpps p20/p50/p80, 2 rounds x 10 s, no pause / 8):
/// packed 64 B 5.95/5.99/6.22 / 6.23/6.71/6.88, 512 B 5.31/5.64/7.77 / 5.46/7.57/9.44,
/// 1518 B 4.96/6.42/7.51 / 5.47/8.62/8.89; split 64 B 5.84/6.86/7.10 / 9.26/12.04/14.83,
/// 512 B 6.04/6.64/6.96 / 6.38/11.20/11.49. The enqueue side lost with the same pause (packed
/// 64 B p50 8.21 -> 7.03), so it has none.
const IDLE_PAUSES: u32 = 8;

/// Empty polls in a row that pause; past them the ring is taken to be idle (no driver is
/// writing the line we read) and polls return at once. A ring the driver fills is seldom empty
/// for that long, so it keeps its pauses; an idle one (the guest's tx ring beside our `txonly`,
/// which also drains it every burst, or the quiet direction of `io` forwarding) no longer costs
/// the lcore 8 PAUSEs per loop. A/B in one sitting (as for [`DEQ_BATCH`]), always pausing /
/// 64 polls: our txonly -> virtio-user rxonly packed 64 B 1.14x, 1518 B 1.08x; dequeue packed
/// 64 B 1.00x, 512 B 1.03x, split 64 B 1.00x.
const IDLE_PAUSE_POLLS: u32 = 64;

#[inline(always)]
fn idle_pause() {
    for _ in 0..IDLE_PAUSES {
        std::hint::spin_loop();
    }
}

/// Chains a dequeue burst takes before it copies their frames: each walked and its frame
/// prefetched (its first lines, or all of a short frame: [`PREFETCH_WHOLE`]), so the misses
/// on the guest's buffers (lines its driver has just written, on the other core) overlap
/// instead of each copy waiting for its own. One chain at a time, a frame cost one full miss
/// whatever its size: in the slow state of this machine about 5.5 Mpps at 64, 512 and 1518 B
/// alike. A/B in one sitting (variant flipped every 250 ms in one process, median ratio of
/// adjacent windows; DPDK virtio-user txonly, one lcore each): packed 64/512/1518 B
/// 1.43/1.59/1.73x, split 1.06/1.08/1.28x; 16 level with 8, 4 lost 3-5%.
///
/// The batch's buffers are taken from the lcore's cache in one call at its first chain, not
/// one call per chain (perf of packed 512 B in the fast state put 8% of the lcore in that
/// call). In-process flip (virtio-user txonly -> our rxonly, one lcore each; the variant held
/// for 2 s at a time, B/A of each B block against its two A neighbours, p20/p50/p80, B = one
/// call a batch; Mpps of A's blocks): packed 64 B 1.00/1.07/1.07 (9.5), 1.03/1.05/1.06 (9.9),
/// 1.00/1.03/1.04 (10.7); split 64 B 1.06/1.09/1.12 (10.4); packed 512 B 0.97/0.98/0.99,
/// 1.00/1.01/1.03, 0.95/0.99/1.03 (10.0); split 512 B 1.02/1.02/1.04 (11.6); packed 1518 B
/// 0.94/0.98/0.99, 0.97/1.00/1.02, 0.99/1.00/1.00 (7.6-8.2); split 1518 B 0.98/1.03/1.06
/// (8.6). The same build with both blocks alike: 0.97/0.99/1.02, 1.00/1.01/1.02,
/// 0.96/0.99/1.00.
const DEQ_BATCH: usize = 8;
// A batch's dropped frames are marked in a u32.
const _: () = assert!(DEQ_BATCH <= 32);

/// A chain a dequeue batch took: its pieces in the burst's `batch` and the outcome of its
/// walk (its buffer is already in `pkts`); or, with zero copy, a mark that its packet is.
///
/// Kept apart from the buffer, which is filled where it lies in `pkts`: moving a filled `Mbuf`
/// out of an array and into `pkts` compiled to wide loads of fields just written narrow (store
/// forwarding stalls), and so did building the array of `Option<Mbuf>` for every batch.
#[derive(Clone, Copy)]
struct Taken {
    start: u32,
    end: u32,
    walked: Result<u32, ChainError>,
    zero_copy: bool,
}

impl Taken {
    const NONE: Taken = Taken {
        start: 0,
        end: 0,
        walked: Ok(0),
        zero_copy: false,
    };
}

/// Prefetches the cache lines that hold the first `len` bytes of a tx chain's frame (the frame
/// starts after its `hdr_len`-byte header): the first line to L1, the rest to L2 only (a
/// batch's whole short frames, fetched ahead of their copies: see [`PREFETCH_WHOLE`]).
/// Regions are page aligned, so a line of an offset is a line of memory.
#[inline(always)]
fn prefetch_frame(mem: &MemTable, pieces: &[Piece], hdr_len: usize, len: usize) {
    let mut skip = hdr_len;
    let mut left = len;
    let mut first = true;
    for p in pieces {
        if skip >= p.len {
            skip -= p.len;
            continue;
        }
        let map = mem.map(p.region);
        let n = (p.len - skip).min(left);
        let end = p.off + skip + n;
        let mut at = (p.off + skip) & !63;
        while at < end {
            if !first {
                map.prefetch_l2(at);
            } else {
                map.prefetch(at);
            }
            first = false;
            at += 64;
        }
        left -= n;
        skip = 0;
        if left == 0 {
            return;
        }
    }
}

/// Frames up to this length are prefetched whole when their chain is taken (a batch of
/// [`DEQ_BATCH`] chains, so every line of the batch's frames is on its way before the first
/// copy starts); longer ones get their first [`Vring::DEQ_FETCH_LONG`] bytes (the packed
/// ring's first four lines, the split ring's first), and the hardware prefetcher follows
/// their copies.
///
/// 448 since session 31; it was 1024. The whole batch's lines asked for at once (64 at 512 B)
/// had come to cost more than they saved from 512 B on: perf of packed 512 B put 17% of
/// `rx_burst` on the prefetch loop itself (the fill buffers full) beside 17% in the copy. In-
/// process flip (virtio-user txonly -> our rxonly, one lcore each, B/A of adjacent 1-s windows
/// p20/p50/p80, B = first line only above 256 B, A = whole up to 1024 B; Mpps of A's windows):
///
/// ```text
///   packed  512 B  1.01/1.04/1.05 (9.1)  1.02/1.06/1.06 (16.2, fast)  0.95/1.01/1.16
///                  1.00/1.11/1.13 (7.1)  0.98/1.05/1.11 (8.4)  1.04/1.07/1.11 (14.2)
///                  1.02/1.06/1.12 (8.4)
///   split   512 B  0.97/1.03/1.11  1.01/1.03/1.10  0.99/1.02/1.11
///   packed  640 B  1.09/1.11/1.16    768 B  1.06/1.13/1.17    1024 B  1.08/1.11/1.14
///   split   768 B  1.01/1.06/1.12   1024 B  1.05/1.15/1.17
///   packed  448 B  0.99/1.00/1.02    384 B  0.91/0.92/0.94 (lost: whole kept up to here)
///   split   448 B  1.01/1.05/1.06    384 B  0.99/1.04/1.10
///   packed 1518 B  0.99/1.00/1.02 (the same code path: the noise)
/// ```
///
/// Earlier measurements that set it (before the lcore caches and the flush tuner): with
/// only the first line, a 512-B copy waited for the other seven in turn: our backend stayed at
/// 10-11 Mpps where DPDK's reached 18 (perf: 39% of rx_burst on the store after the copy).
/// A/B in one sitting (virtio-user txonly -> our rxonly, 3 rounds alternating, Mpps
/// p20/p50/p80, first line / whole): packed 512 B 10.75/11.28/11.49 / 14.35/15.84/17.35,
/// split 512 B 10.99/11.08/11.26 / 12.54/12.85/13.03; 64 B level (packed 21.89 / 22.88,
/// split 22.08 / 21.92 at p50). Lost: 1024 (2 rounds, 1024-B frames, packed p50 8.34 / 7.79,
/// split 8.79 / 7.75, every line to L1); at 1518 B, 512 bytes (packed 7.6 / 7.2) or the whole
/// frame (6.3).
///
/// The lines past the first go to L2 only (PREFETCHT1): 64 lines for a batch of 8 crowded L1.
/// A/B in one sitting (2 rounds, p20/p50/p80, L1 / L2 past the first line): packed 512 B
/// 10.13/10.85/11.16 / 15.03/15.45/15.99, split 512 B 9.95/11.07/11.19 / 13.56/14.95/15.02;
/// 64 B packed p50 21.80 / 20.78, split 20.63 / 22.29; 1518 B (the same code path) packed
/// 7.55 / 7.58, split 8.10 / 7.56. Every prefetch of the dequeue path to L2 instead lost at
/// 1518 B (packed 7.52 / 6.81, split 7.88 / 7.62).
///
/// Longer frames get nothing more from us: the copy loop used to prefetch the next frame's
/// first 448 bytes while it copied one (then: split 1518 B 5.84 -> 7.17 Mpps at p50, packed
/// 6.05 -> 6.34), but since the lcore caches (a receiver's destinations hot) it only took fill
/// buffers from the copy. In-process flip in one sitting (our rxonly <- virtio-user txonly,
/// one lcore each, B/A of adjacent 1-s windows p20/p50/p80, without / with it): packed 1518 B
/// fast state 1.01/1.02/1.03 (14.77 -> 15.00), slow 1.04/1.07/1.09 (9.60 -> 10.27), and in
/// two more runs 1.01/1.03/1.07, 1.04/1.06/1.08; split 1518 B fast 1.03/1.03/1.05 (15.45 ->
/// 15.95), slow 1.03/1.03/1.03; 1280 B split 0.97/1.04/1.06, packed 1.04/1.06/1.13.
const PREFETCH_WHOLE: usize = 448;

/// Copies a tx chain's frame (after its virtio-net header) into `m`.
#[inline(always)]
fn read_frame(
    mem: &MemTable,
    pieces: &[Piece],
    hdr_len: usize,
    total: u32,
    m: &mut Mbuf,
    cache: &mut PoolCache,
) -> Result<(), ChainError> {
    if (total as usize) < hdr_len {
        return Err(ChainError::ShortHeader(total));
    }
    let mut skip = hdr_len;
    for p in pieces {
        if skip >= p.len {
            skip -= p.len;
            continue;
        }
        let w = mem
            .map(p.region)
            .slice(p.off + skip, p.len - skip)
            .expect("pieces are checked against the table");
        skip = 0;
        if !m.extend_from(&w, cache) {
            return Err(ChainError::TooBig);
        }
    }
    Ok(())
}

/// Flushes the line that holds the first byte of a tx chain's frame (after its header) from
/// every cache, once the frame is copied: the frontend's next store to it then fetches it
/// from memory, not from our core.
///
/// Dequeue flushes each frame's first line from our caches once it is copied, while its
/// queue's [`FlushTuner`] finds that this moves more frames. The first line only: DPDK's
/// `txonly` rewrites a frame's headers and nothing else when its mbuf comes back. In-process
/// flip, always flushed / never, p20/p50/p80, our rxonly <- virtio-user txonly, one lcore each:
///
/// ```text
///   split   64 B  1.94 1.98 2.03 (slow state 5.4 -> 10.8 Mpps); 1.08 1.10 1.11 (fast, 16.9 -> 18.5)
///   packed  64 B  0.83 0.89 1.69 (fast 17.1 -> 14.8, slow 5.4 -> 8.7); 0.82 0.83 0.85 (fast)
///   split  512 B  0.96 1.00 2.04 (slow 5.5 -> 11.3, fast level)
///   packed 512 B  0.86 1.80 1.88 (slow 5.4 -> 10.1, fast 15.7 -> 13.5); 0.73 0.77 0.81 (fast)
///   split 1518 B  1.70 1.76 1.78 (slow 5.3 -> 9.3)
///   packed 1518 B 0.79 0.81 1.06 (fast 12.9 -> 10.1)
/// ```
///
/// and tuned / never (40 s each, the tuner's trial windows 2 ms): split 64 B 1.03 1.15 1.92
/// (slow 5.3 -> 10.0, fast 17.8 -> 18.5), packed 64 B 0.99 1.01 1.88 (slow 5.6 -> 10.6, fast
/// level), packed 512 B 1.40 1.83 1.93 (slow 5.3 -> 9.6), split 512 B 0.98 1.00 1.00 (all
/// fast); with 1-ms windows, packed 1518 B over 150 s 1.41 1.75 1.78 (slow 5.4 -> 9.4), its
/// eight fast seconds level (12.8-13.2 against 13.1-13.2).
#[inline(always)]
fn flush_first_line(mem: &MemTable, pieces: &[Piece], hdr_len: usize) {
    let mut skip = hdr_len;
    for p in pieces {
        if skip >= p.len {
            skip -= p.len;
            continue;
        }
        if let Ok(w) = mem
            .map(p.region)
            .slice(p.off + skip, (p.len - skip).min(64))
        {
            w.flush_lines();
        }
        return;
    }
}

/// Our tx queue: the guest's rx virtqueue.
pub struct VhostTxQueue {
    core: Core,
    /// With MRG_RXBUF: the chains of a frame that spans several.
    spans: Vec<Span>,
    /// Whether an enqueue streams its short frames ([`Vring::STREAM_TUNED`]).
    stream: StreamTuner,
}

impl VhostTxQueue {
    /// `stream`: whether enqueue streams short frames into the guest's buffers
    /// ([`Vring::STREAM_TUNED`]).
    pub fn new(
        gate: GateMember,
        slot: Arc<VringSlot>,
        cache: PoolCache,
        cell: Arc<StatsCell>,
        stream: StreamMode,
    ) -> Self {
        VhostTxQueue {
            core: Core::new(gate, slot, cache, cell),
            spans: Vec::new(),
            stream: StreamTuner::new(stream),
        }
    }
}

impl TxQueue for VhostTxQueue {
    fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let q = &mut self.core;
        if !q.enter() {
            return 0;
        }
        let c = q.conn.as_ref().expect("entered");
        let (spans, stream) = (&mut self.spans, &mut self.stream);
        let (sent, r) =
            on_ring!(&c.ring, r => enqueue(r, c, &mut q.s, stream, &q.slot, spans, pkts));
        if let Err(b) = r {
            q.broken(b);
        }
        q.s.cache.free_front(pkts, sent);
        q.exit();
        sent
    }

    fn stats(&self) -> QueueStats {
        self.core.s.stats
    }
}

/// Copies frames from the front of `pkts` into the guest's rx chains until one does not fit
/// (it waits: DPDK's back-pressure) or a burst's worth is sent; returns how many were sent.
///
/// Frames that each fit one chain go in batches of the ring's [`Vring::ENQ_BATCH`] (walk and
/// prefetch, then copy); a frame that needs several chains (MRG_RXBUF) or meets a bad or
/// short chain takes the one-frame path.
#[inline(always)]
fn enqueue<V: Vring>(
    r: &V,
    c: &VringConn,
    s: &mut State,
    stream: &mut StreamTuner,
    slot: &VringSlot,
    spans: &mut Vec<Span>,
    pkts: &[Mbuf],
) -> (usize, Result<(), Broken>) {
    let mut cur = match r.cursor(s.last_avail) {
        Ok(cur) => cur,
        Err(b) => return (0, Err(b)),
    };
    let mut used = r.used_at(s.used);
    let mut entries: u16 = 0;
    let mut sent = 0;
    let mut res = Ok(());
    let limit = pkts.len().min(MAX_BURST);
    // Frames up to this length go out with streaming stores.
    let stream_max = if stream.on() { V::STREAM_TUNED } else { 0 };
    // Frames that went out with streaming stores, which the publish must be fenced after.
    let mut streamed = 0u32;
    // Each batch's chains and the ranges of their pieces in `s.batch` (only `..nb` is read).
    let mut placed = [(crate::vring::Chain { id: 0, descs: 0 }, 0u32, 0u32); MAX_ENQ_BATCH];
    // A disabled rx ring gets nothing.
    while c.enabled && sent < limit {
        // Place a batch: each frame's chain walked, its pieces kept, its buffer prefetched.
        let mut nb = 0;
        s.batch.clear();
        r.prefetch_batch(&cur, sent == 0, sent + V::ENQ_BATCH < limit);
        while nb < V::ENQ_BATCH && sent + nb < limit {
            let need = c.hdr_len + pkts[sent + nb].len();
            let mut look = cur;
            let start = s.batch.len();
            let Next::Chain(chain, Ok(total)) =
                r.next(&c.mem, &mut look, Dir::Writable, &mut s.batch)
            else {
                s.batch.truncate(start);
                break;
            };
            if (total as usize) < need {
                s.batch.truncate(start);
                break;
            }
            cur = look;
            // A frame written with streaming stores fetches no line (asking for them ahead
            // only pulled them over from the frontend; A/B not asked/asked, split 64 B
            // 0.95/1.09/1.23, 128 B 1.06/1.14/1.25).
            if streamed_bytes(&pkts[sent + nb], stream_max).is_none() {
                prefetch_pieces(&c.mem, &s.batch[start..], c.hdr_len, need, V::ENQ_FETCH);
            }
            placed[nb] = (chain, start as u32, s.batch.len() as u32);
            nb += 1;
        }
        // Copy the batch.
        for (k, &(chain, start, end)) in placed[..nb].iter().enumerate() {
            let m = &pkts[sent + k];
            let pieces = &s.batch[start as usize..end as usize];
            write_header(&c.mem, pieces, c.hdr_len, 1);
            if streamed_bytes(m, stream_max)
                .is_some_and(|src| stream_frame(&c.mem, pieces, c.hdr_len, src))
            {
                streamed += 1;
            } else {
                write_pieces(&c.mem, pieces, c.hdr_len, m, 0, m.len());
            }
            r.put_used(&mut used, chain, (c.hdr_len + m.len()) as u32);
            s.stats.packets += 1;
            s.stats.bytes += m.len() as u64;
        }
        entries += nb as u16;
        sent += nb;
        if nb == V::ENQ_BATCH || sent == limit {
            continue;
        }
        // The next frame needs more than one chain, or its chain is short, bad or missing.
        let m = &pkts[sent];
        let w = if c.mrg_rxbuf {
            write_merged(r, c, &mut cur, &mut used, m, &mut s.batch, spans)
        } else {
            write_one(r, c, &mut cur, &mut used, m, &mut s.batch)
        };
        match w {
            Written::Chains(n) => {
                entries += n;
                s.stats.packets += 1;
                s.stats.bytes += m.len() as u64;
                sent += 1;
            }
            // The chains available now are too small: the frame waits and the chains stay
            // the guest's.
            Written::NoRoom => break,
            // A bad chain goes back unused; the frame tries the next one.
            Written::Bad(e) => {
                entries += 1;
                s.stats.errors += 1;
                slot.bad_chain(e);
            }
            Written::Broken(b) => {
                res = Err(b);
                break;
            }
        }
    }
    s.last_avail = V::cursor_pos(&cur);
    if streamed > 0 {
        // Before used.idx (or a used flag) says the frames are there.
        memnic_shm::store_fence();
    }
    publish(r, c, s, used, entries, false);
    stream.polled(sent as u16, streamed);
    stream.record(&mut s.stats);
    (sent, res)
}

/// Prefetches for writing the lines of a chain's first buffer that the frame's `need` bytes
/// (header included) will fill, up to the header and `max` bytes of the frame
/// ([`Vring::ENQ_FETCH`]), from the line where the
/// frame starts: the header's own line is usually left as it is ([`write_header`]), and
/// taking it for writing would undo that. That line, when it is another, is asked for to
/// read: [`write_header`]'s compare otherwise waits for it (17% of our txonly's samples into
/// virtio-user's packed ring at 64 B, this Intel Xeon host: DPDK's virtio PMD puts the header
/// in the line before its mbuf's data, which it reads on receive). In-process flip, with/without
/// (250-ms windows, B/A p20/p50/p80, our txonly -> virtio-user rxonly): packed 64 B
/// 1.04/1.08/1.12, 512 B 1.00/1.03/1.05, 1518 B 0.99/1.03/1.06; split 64 B 0.98/1.03/1.14,
/// 512 B 0.98/1.00/1.07, 1518 B 0.93/1.02/1.05.
#[inline(always)]
fn prefetch_pieces(mem: &MemTable, pieces: &[Piece], hdr_len: usize, need: usize, max: usize) {
    if let Some(p) = pieces.first() {
        let map = mem.map(p.region);
        let end = p.off + need.min(p.len).min(hdr_len + max);
        let mut at = (p.off + hdr_len.min(p.len)) & !63;
        if p.off & !63 != at {
            map.prefetch(p.off);
        }
        while at < end {
            map.prefetch_write(at);
            at += 64;
        }
    }
}

/// The bytes an enqueue batch writes with streaming stores: a one-segment frame of private
/// memory, up to `max` bytes ([`Vring::STREAM_TUNED`] while the queue's tuner streams, else 0:
/// none; [`stream_frame`] still falls back when the buffer is short).
#[inline(always)]
fn streamed_bytes(m: &Mbuf, max: usize) -> Option<&[u8]> {
    m.frame_slice().filter(|s| max > 0 && s.len() <= max)
}

/// Writes a frame's bytes (`src`, [`streamed_bytes`]) after its header in the chain's first
/// buffer with streaming stores; false (nothing written) when the buffer does not hold them
/// with the header.
#[inline(always)]
fn stream_frame(mem: &MemTable, pieces: &[Piece], hdr_len: usize, src: &[u8]) -> bool {
    let Some(p) = pieces.first() else {
        return false;
    };
    p.len >= hdr_len + src.len()
        && mem
            .map(p.region)
            .write_bytes_streaming(p.off + hdr_len, src)
            .is_ok()
}

/// What writing one frame into the guest's rx chains did.
enum Written {
    /// Written across this many chains (their used elements set).
    Chains(u16),
    /// Not written: the chains available now are too small; nothing consumed.
    NoRoom,
    /// The first chain was bad: returned unused (one used element of length 0).
    Bad(ChainError),
    /// The ring cannot be followed (nothing consumed).
    Broken(Broken),
}

/// Copies `src[..]` into the pieces from byte `at` on; returns bytes written.
#[inline(always)]
fn write_pieces(
    mem: &MemTable,
    pieces: &[Piece],
    mut at: usize,
    m: &Mbuf,
    mut from: usize,
    len: usize,
) -> usize {
    let mut left = len;
    for p in pieces {
        if left == 0 {
            break;
        }
        if at >= p.len {
            at -= p.len;
            continue;
        }
        let n = (p.len - at).min(left);
        let w = mem
            .map(p.region)
            .slice(p.off + at, n)
            .expect("pieces are checked against the table");
        assert!(m.copy_out_to(from, &w), "from + n <= frame length");
        at = 0;
        from += n;
        left -= n;
    }
    len - left
}

/// Writes the virtio-net header of a received frame at the start of the pieces: no offloads,
/// and (with a 12-byte header) `num_buffers` chains.
///
/// A header that fits the first piece (every driver's layout) is written with stores of fixed
/// size; one split across pieces goes byte range by byte range. Building the header in an
/// array and copying a slice of it compiled to a `memcpy` call for 10-12 bytes whose loads
/// met the array's narrower stores (a store forwarding stall per frame).
///
/// A header already there is left alone: a driver that refills its ring with the buffers it
/// just freed (DPDK's virtio PMD takes them from its pool's cache) hands us back the header we
/// wrote a lap before, which it has read but not written. Stored again, its line would come
/// back to our core exclusive and the driver's next read fetch it again; compared, it stays
/// shared in both caches. What we read is only compared (the guest may change the bytes
/// after that, as it may after a store). A/B in one sitting (variant flipped every 250 ms in
/// one process, ratio of adjacent windows p20/p50/p80; our txonly -> virtio-user rxonly, the
/// header's line no longer prefetched for writing either): packed 64 B 1.00/1.17/1.25 and
/// 1.02/1.14/1.28, split 64 B 0.94/1.12/1.20 and 1.01/1.13/1.36, packed 512 B
/// 0.98/1.04/1.17, split 512 B 1.01/1.20/1.47, packed 1518 B 0.81/1.01/1.27, split 1518 B
/// 1.18/1.39/1.53. (Compared through a variable-length read, it lost: packed 64 B p50 0.87.)
///
/// The header is read by value ([`memnic_shm::Region::read_array`]): read into a local array,
/// it went through two overlapping stores to the stack and a load across both, a failed store
/// forward on every frame. In-process flip, the array read against this (B/A as above, Intel
/// Xeon): packed 64 B 0.89/0.95/1.04, 512 B 0.94/0.96/1.00, 1518 B 0.96/0.99/1.00; split 64 B
/// 0.95/0.96/0.97, 512 B 0.93/0.96/0.98, 1518 B 0.94/0.98/1.02.
#[inline(always)]
fn write_header(mem: &MemTable, pieces: &[Piece], hdr_len: usize, num_buffers: u16) {
    let nb = num_buffers.to_le_bytes();
    if let Some(p) = pieces.first().filter(|p| p.len >= hdr_len) {
        let map = mem.map(p.region);
        // Fixed-size reads into registers and compares (10 or 12 bytes), no calls.
        let held = if hdr_len >= 12 {
            map.read_array::<12>(p.off)
                .is_ok_and(|now| now[..10] == [0; 10] && now[10..] == nb)
        } else {
            map.read_array::<10>(p.off).is_ok_and(|now| now == [0; 10])
        };
        if held {
            return;
        }
        let ok = map.write_bytes(p.off, &[0u8; 10]).is_ok()
            && (hdr_len < 12 || map.write_bytes(p.off + 10, &nb).is_ok());
        assert!(ok, "pieces are checked against the table");
        return;
    }
    let mut h = [0u8; 12];
    h[10..12].copy_from_slice(&nb);
    let bytes = &h[..hdr_len.min(12)];
    let mut done = 0;
    for p in pieces {
        if done == bytes.len() {
            break;
        }
        let n = p.len.min(bytes.len() - done);
        mem.map(p.region)
            .write_bytes(p.off, &bytes[done..done + n])
            .expect("pieces are checked against the table");
        done += n;
    }
}

/// Without MRG_RXBUF: the frame and its header go into one chain, which must hold both.
#[inline(always)]
fn write_one<V: Vring>(
    r: &V,
    c: &VringConn,
    cur: &mut V::Cursor,
    used: &mut V::Used,
    m: &Mbuf,
    pieces: &mut Vec<Piece>,
) -> Written {
    let mut next = *cur;
    pieces.clear();
    let (chain, walked) = match r.next(&c.mem, &mut next, Dir::Writable, pieces) {
        Next::Chain(chain, walked) => (chain, walked),
        Next::Empty => return Written::NoRoom,
        Next::Broken(b) => return Written::Broken(b),
    };
    let total = match walked {
        Ok(t) => t as usize,
        Err(e) => {
            r.put_used(used, chain, 0);
            *cur = next;
            return Written::Bad(e);
        }
    };
    // A chain with no room past the header can never take a frame: refused, not waited on
    // (the frame behind it would wait for ever).
    if total <= c.hdr_len {
        r.put_used(used, chain, 0);
        *cur = next;
        return Written::Bad(ChainError::Empty);
    }
    let need = c.hdr_len + m.len();
    if total < need {
        return Written::NoRoom;
    }
    write_header(&c.mem, pieces, c.hdr_len, 1);
    write_pieces(&c.mem, pieces, c.hdr_len, m, 0, m.len());
    r.put_used(used, chain, need as u32);
    *cur = next;
    Written::Chains(1)
}

/// With MRG_RXBUF: the frame spans as many chains as it needs; the first holds the header,
/// whose num_buffers says how many. Each chain is walked once and its pieces kept in `batch`
/// until the frame is known to fit, so the count and the bytes written are those of the very
/// chains we checked, whatever the guest writes into its ring meanwhile.
fn write_merged<V: Vring>(
    r: &V,
    c: &VringConn,
    cur: &mut V::Cursor,
    used: &mut V::Used,
    m: &Mbuf,
    batch: &mut Vec<Piece>,
    spans: &mut Vec<Span>,
) -> Written {
    let need = c.hdr_len + m.len();
    batch.clear();
    spans.clear();
    let mut room = 0;
    let mut look = *cur;
    while room < need {
        let start = batch.len();
        match r.next(&c.mem, &mut look, Dir::Writable, batch) {
            Next::Empty => return Written::NoRoom,
            Next::Broken(b) => return Written::Broken(b),
            Next::Chain(chain, Ok(total)) if total > 0 => {
                spans.push(Span {
                    chain,
                    start: start as u32,
                    end: batch.len() as u32,
                    total,
                });
                room += total as usize;
            }
            Next::Chain(chain, walked) => {
                if spans.is_empty() {
                    r.put_used(used, chain, 0);
                    *cur = look;
                    return Written::Bad(walked.err().unwrap_or(ChainError::Empty));
                }
                // A bad chain behind good ones: the frame waits (the good chains stay the
                // guest's, and the bad one is returned once it is first in line).
                return Written::NoRoom;
            }
        }
    }
    let mut from = 0;
    for (k, sp) in spans.iter().enumerate() {
        let ps = &batch[sp.start as usize..sp.end as usize];
        let at = if k == 0 {
            c.hdr_len.min(sp.total as usize)
        } else {
            0
        };
        let len = (sp.total as usize - at).min(m.len() - from);
        let wrote = write_pieces(&c.mem, ps, at, m, from, len);
        from += wrote;
        r.put_used(used, sp.chain, (at + wrote) as u32);
    }
    let n = spans.len() as u16;
    let first = &spans[0];
    let ps = &batch[first.start as usize..first.end as usize];
    write_header(&c.mem, ps, c.hdr_len, n);
    *cur = look;
    Written::Chains(n)
}

/// One rx chain of a frame that spans several: its pieces in the burst's `batch`.
#[derive(Clone, Copy)]
struct Span {
    chain: crate::vring::Chain,
    start: u32,
    end: u32,
    total: u32,
}
