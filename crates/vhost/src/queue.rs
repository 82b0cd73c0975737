//! The virtio-net data path: the guest's tx virtqueue behind our rx queue (dequeue: guest
//! frames into our mbufs) and its rx virtqueue behind our tx queue (enqueue: our frames into
//! the guest's buffers). Copies both ways; every burst reads avail.idx once, publishes
//! used.idx once and calls the guest at most once.
//!
//! The control thread installs a [`VringConn`] per virtqueue while the queues are parked by
//! the port's gate and takes it away (GET_VRING_BASE, disable, a new memory table,
//! disconnect); a queue reloads it when the gate says "restart", and publishes its
//! `last_avail` for GET_VRING_BASE after every burst.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use memnic_ethdev::gate::{Enter, GateMember};
use memnic_ethdev::{Mbuf, PoolCache, QueueStats, RxQueue, StatsCell, TxQueue, MAX_BURST};
use memnic_shm::unix::EventFd;

use crate::chain::{walk, ChainError, Dir, Piece};
use crate::mem::MemTable;
use crate::split::{need_event, SplitRing, AVAIL_F_NO_INTERRUPT, USED_F_NO_NOTIFY};

/// What a virtqueue's poller needs while the ring runs.
#[derive(Clone)]
pub struct VringConn {
    pub ring: SplitRing,
    pub mem: Arc<MemTable>,
    /// virtio-net header bytes before every frame (10, or 12 with VERSION_1 or MRG_RXBUF).
    pub hdr_len: usize,
    /// Rx: a frame may span several chains (num_buffers).
    pub mrg_rxbuf: bool,
    pub event_idx: bool,
    /// The guest's interrupt eventfd (none: the frontend polls).
    pub call: Option<Arc<EventFd>>,
    /// The eventfd the driver kicks (none: it never does); `--rx-interrupt` sleeps on it.
    pub kick: Option<Arc<EventFd>>,
    /// Where the ring starts (SET_VRING_BASE).
    pub base: u16,
    /// Disabled (SET_VRING_ENABLE 0): a tx virtqueue is drained and its frames discarded, an
    /// rx virtqueue gets nothing.
    pub enabled: bool,
}

/// Shared by the control thread and one queue.
#[derive(Default)]
pub struct VringSlot {
    pub conn: Mutex<Option<VringConn>>,
    /// The queue's next avail index, published after each burst (Relaxed: the control thread
    /// reads it with the queue parked, which the gate orders).
    pub last_avail: AtomicU16,
    /// Chains refused (see `chain`), and rings found broken.
    pub bad_chains: AtomicU64,
    pub broken: AtomicU64,
    /// Why the last chain was refused (for logs and tests).
    pub last_bad: Mutex<Option<ChainError>>,
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

/// Why a queue stopped using its ring until the control thread installs it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    /// avail.idx moved by more than the queue size.
    AvailJump,
}

/// State of one queue in either direction.
struct Core {
    gate: GateMember,
    slot: Arc<VringSlot>,
    conn: Option<VringConn>,
    last_avail: u16,
    used: u16,
    cache: PoolCache,
    pieces: Vec<Piece>,
    stats: QueueStats,
    cell: Arc<StatsCell>,
}

impl Core {
    fn new(gate: GateMember, slot: Arc<VringSlot>, cache: PoolCache, cell: Arc<StatsCell>) -> Core {
        Core {
            gate,
            slot,
            conn: None,
            last_avail: 0,
            used: 0,
            cache,
            pieces: Vec::new(),
            stats: QueueStats::default(),
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
        self.conn = self
            .slot
            .conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(c) = &self.conn {
            self.last_avail = c.base;
            // In copy mode every chain we take is returned in the same burst, so the used
            // index follows the avail index.
            self.used = c.base;
            // We poll: ask the driver not to kick.
            c.ring.set_used_flags(USED_F_NO_NOTIFY);
        }
        self.slot.last_avail.store(self.last_avail, Relaxed);
    }

    #[inline(always)]
    fn exit(&mut self) {
        self.slot.last_avail.store(self.last_avail, Relaxed);
        self.gate.exit();
        self.cell.publish(&self.stats);
    }

    /// Chains available to us now, or None when the guest moved avail.idx by more than the
    /// queue (then the ring is dropped until the control thread installs it again).
    #[inline(always)]
    fn available(&mut self) -> Option<u16> {
        let c = self.conn.as_ref().expect("entered");
        let n = c.ring.avail_idx().wrapping_sub(self.last_avail);
        if n > c.ring.size() {
            self.broken(Broken::AvailJump);
            return None;
        }
        Some(n)
    }

    #[cold]
    #[inline(never)]
    fn broken(&mut self, _why: Broken) {
        self.stats.errors += 1;
        // Relaxed: a counter; nothing is ordered by it.
        self.slot.broken.fetch_add(1, Relaxed);
        self.conn = None;
    }

    /// Publishes the used index after `n` new elements, and calls the guest if it wants it.
    #[inline(always)]
    fn publish(&mut self, n: u16) {
        if n == 0 {
            return;
        }
        let c = self.conn.as_ref().expect("entered");
        let old = self.used;
        self.used = old.wrapping_add(n);
        c.ring.publish_used(self.used);
        if let Some(call) = &c.call {
            c.ring.notify_fence();
            let wants = if c.event_idx {
                need_event(c.ring.used_event(), self.used, old)
            } else {
                c.ring.avail_flags() & AVAIL_F_NO_INTERRUPT == 0
            };
            if wants {
                let _ = call.notify();
            }
        }
    }
}

/// Our rx queue: the guest's tx virtqueue.
pub struct VhostRxQueue {
    core: Core,
}

impl VhostRxQueue {
    pub fn new(
        gate: GateMember,
        slot: Arc<VringSlot>,
        cache: PoolCache,
        cell: Arc<StatsCell>,
    ) -> Self {
        VhostRxQueue {
            core: Core::new(gate, slot, cache, cell),
        }
    }
}

impl RxQueue for VhostRxQueue {
    fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        let q = &mut self.core;
        if !q.enter() {
            return 0;
        }
        let Some(avail) = q.available() else {
            q.exit();
            return 0;
        };
        let want = (avail as usize).min(max).min(MAX_BURST);
        let start = pkts.len();
        let mut taken: u16 = 0;
        let Core {
            conn,
            cache,
            pieces,
            stats,
            slot,
            last_avail,
            used,
            ..
        } = q;
        let c = conn.as_ref().expect("entered");
        while (taken as usize) < want {
            let Some(mut m) = cache.alloc() else {
                stats.nombuf += 1;
                break;
            };
            let head = c.ring.avail_head(last_avail.wrapping_add(taken));
            let got = walk(&c.ring, &c.mem, head, Dir::Readable, pieces)
                .and_then(|total| read_frame(&c.mem, pieces, c.hdr_len, total, &mut m, cache));
            // A tx chain goes back with length 0 (the device wrote nothing into it).
            c.ring.set_used_elem(used.wrapping_add(taken), head, 0);
            taken += 1;
            match got {
                Ok(()) if c.enabled => {
                    stats.packets += 1;
                    stats.bytes += m.len() as u64;
                    pkts.push(m);
                }
                // A disabled ring is drained and its frames discarded.
                Ok(()) => cache.free(m),
                Err(e) => {
                    cache.free(m);
                    stats.errors += 1;
                    slot.bad_chain(e);
                }
            }
        }
        *last_avail = last_avail.wrapping_add(taken);
        q.publish(taken);
        q.exit();
        pkts.len() - start
    }

    fn stats(&self) -> QueueStats {
        self.core.stats
    }

    /// Interrupt mode: asks the driver to kick (used.flags 0, or avail_event at our index with
    /// EVENT_IDX), re-checks the ring, sleeps on the kick eventfd while it is empty, then asks
    /// for no kicks again. False when there is no ring or the frontend gave no kick fd.
    fn wait(&mut self, timeout: std::time::Duration) -> bool {
        let q = &self.core;
        let Some(c) = q.conn.as_ref() else {
            return false;
        };
        let Some(kick) = &c.kick else {
            return false;
        };
        if c.event_idx {
            c.ring.set_avail_event(q.last_avail);
        } else {
            c.ring.set_used_flags(0);
        }
        // Our request before we look at avail.idx again (store→load): pairs with the driver's
        // full barrier between publishing avail.idx and reading whether we want a kick, so
        // either we see its new chains or it sees our request and kicks.
        c.ring.notify_fence();
        if c.ring.avail_idx() == q.last_avail && kick.wait(Some(timeout)).unwrap_or(false) {
            let _ = kick.drain();
        }
        // Back to polling. (With EVENT_IDX the stale avail_event costs at most one kick per
        // 65536 chains.)
        c.ring.set_used_flags(USED_F_NO_NOTIFY);
        true
    }
}

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

/// Our tx queue: the guest's rx virtqueue.
pub struct VhostTxQueue {
    core: Core,
    /// With MRG_RXBUF: the pieces of a frame's first chain (its header goes there last).
    first: Vec<Piece>,
}

impl VhostTxQueue {
    pub fn new(
        gate: GateMember,
        slot: Arc<VringSlot>,
        cache: PoolCache,
        cell: Arc<StatsCell>,
    ) -> Self {
        VhostTxQueue {
            core: Core::new(gate, slot, cache, cell),
            first: Vec::new(),
        }
    }
}

impl TxQueue for VhostTxQueue {
    fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let q = &mut self.core;
        if !q.enter() {
            return 0;
        }
        let Some(mut avail) = q.available() else {
            q.exit();
            return 0;
        };
        let mut chains: u16 = 0;
        let mut sent = 0;
        let Core {
            conn,
            pieces,
            stats,
            slot,
            last_avail,
            used,
            ..
        } = &mut *q;
        let c = conn.as_ref().expect("entered");
        if c.enabled {
            while sent < pkts.len().min(MAX_BURST) && avail > 0 {
                let m = &pkts[sent];
                let (a, u) = (last_avail.wrapping_add(chains), used.wrapping_add(chains));
                let r = if c.mrg_rxbuf {
                    write_merged(c, a, u, avail, m, pieces, &mut self.first)
                } else {
                    write_one(c, a, u, m, pieces)
                };
                match r {
                    Written::Chains(n) => {
                        chains += n;
                        avail -= n;
                        stats.packets += 1;
                        stats.bytes += m.len() as u64;
                        sent += 1;
                    }
                    // The chains available now are too small: the frame waits (DPDK's
                    // back-pressure) and the chains stay the guest's.
                    Written::NoRoom => break,
                    // A bad chain goes back unused; the frame tries the next one.
                    Written::Bad(e) => {
                        chains += 1;
                        avail -= 1;
                        stats.errors += 1;
                        slot.bad_chain(e);
                    }
                }
            }
        }
        *last_avail = last_avail.wrapping_add(chains);
        q.publish(chains);
        for m in pkts.drain(..sent) {
            q.cache.free(m);
        }
        q.exit();
        sent
    }

    fn stats(&self) -> QueueStats {
        self.core.stats
    }
}

/// What writing one frame into the guest's rx chains did.
enum Written {
    /// Written across this many chains (their used elements set).
    Chains(u16),
    /// Not written: the chains available now are too small; nothing consumed.
    NoRoom,
    /// The first chain was bad: returned unused (one used element of length 0).
    Bad(ChainError),
}

/// The virtio-net header for a received frame: no offloads, `num_buffers` chains.
fn rx_header(hdr_len: usize, num_buffers: u16) -> [u8; 12] {
    let mut h = [0u8; 12];
    if hdr_len >= 12 {
        h[10..12].copy_from_slice(&num_buffers.to_le_bytes());
    }
    h
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

/// Writes `bytes` at the start of the pieces (a header: at most 12 bytes).
fn write_header(mem: &MemTable, pieces: &[Piece], bytes: &[u8]) {
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
fn write_one(
    c: &VringConn,
    avail_at: u16,
    used_at: u16,
    m: &Mbuf,
    pieces: &mut Vec<Piece>,
) -> Written {
    let head = c.ring.avail_head(avail_at);
    let total = match walk(&c.ring, &c.mem, head, Dir::Writable, pieces) {
        Ok(t) => t as usize,
        Err(e) => {
            c.ring.set_used_elem(used_at, head, 0);
            return Written::Bad(e);
        }
    };
    let need = c.hdr_len + m.len();
    if total < need {
        return Written::NoRoom;
    }
    write_header(&c.mem, pieces, &rx_header(c.hdr_len, 1)[..c.hdr_len]);
    write_pieces(&c.mem, pieces, c.hdr_len, m, 0, m.len());
    c.ring.set_used_elem(used_at, head, need as u32);
    Written::Chains(1)
}

/// With MRG_RXBUF: the frame spans as many chains as it needs (at most `avail`); the first
/// holds the header, whose num_buffers says how many.
fn write_merged(
    c: &VringConn,
    avail_at: u16,
    used_at: u16,
    avail: u16,
    m: &Mbuf,
    pieces: &mut Vec<Piece>,
    first: &mut Vec<Piece>,
) -> Written {
    let need = c.hdr_len + m.len();
    let mut done = 0; // bytes of header + frame placed
    let mut n: u16 = 0;
    // First pass: check the chains and add up their room, so a frame that does not fit
    // consumes none.
    while done < need {
        if n == avail {
            return Written::NoRoom;
        }
        let head = c.ring.avail_head(avail_at.wrapping_add(n));
        match walk(&c.ring, &c.mem, head, Dir::Writable, pieces) {
            Ok(t) if t > 0 => {
                done += t as usize;
                n += 1;
            }
            Ok(_) => {
                if n == 0 {
                    c.ring.set_used_elem(used_at, head, 0);
                    return Written::Bad(ChainError::Empty);
                }
                return Written::NoRoom;
            }
            Err(e) => {
                if n == 0 {
                    c.ring.set_used_elem(used_at, head, 0);
                    return Written::Bad(e);
                }
                // A bad chain behind good ones: write what fits before it next time.
                return Written::NoRoom;
            }
        }
    }
    // Second pass: write. (The guest could rewrite its chains between the passes; a chain
    // that walks differently now just gets fewer bytes: every write is still checked.)
    let mut from = 0;
    for k in 0..n {
        let head = c.ring.avail_head(avail_at.wrapping_add(k));
        let Ok(total) = walk(&c.ring, &c.mem, head, Dir::Writable, pieces) else {
            c.ring.set_used_elem(used_at.wrapping_add(k), head, 0);
            continue;
        };
        let mut at = 0;
        if k == 0 {
            first.clear();
            first.extend_from_slice(pieces);
            write_header(&c.mem, first, &rx_header(c.hdr_len, n)[..c.hdr_len]);
            at = c.hdr_len.min(total as usize);
        }
        let len = (total as usize - at).min(m.len() - from);
        let wrote = write_pieces(&c.mem, pieces, at, m, from, len);
        from += wrote;
        c.ring
            .set_used_elem(used_at.wrapping_add(k), head, (at + wrote) as u32);
    }
    Written::Chains(n)
}
