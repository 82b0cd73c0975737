//! The memif data path behind the burst API: copy mode for both roles, and zero-copy for a
//! client (`specs/memif.md` §5–§8).
//!
//! The control path installs a [`Conn`] for each queue while the queues are parked by the gate,
//! and takes it away again on disconnect; a queue reloads it when the gate says "restart". A
//! queue that finds the peer breaking the protocol (a counter out of range, a descriptor outside
//! its region) stops using the rings, counts an error and flags the port for DISCONNECT.

use std::sync::atomic::{
    fence, AtomicBool,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::sync::{Arc, Mutex};

use memnic_ethdev::gate::{Enter, GateMember};
use memnic_ethdev::{Mbuf, PoolCache, QueueStats, RxQueue, StatsCell, TxQueue, MAX_BURST};
use memnic_shm::unix::EventFd;

use crate::ring::{Desc, Regions, Ring, DESC_FLAG_NEXT, RING_FLAG_MASK_INT};

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
}

impl Broken {
    #[cold]
    pub fn set(&self, why: &'static str) {
        *self.why.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        // Release pairs with the Acquire in `take`: the reason is visible with the flag.
        self.flag.store(true, Release);
    }

    /// The reason, once, if a queue flagged one.
    pub fn take(&self) -> Option<&'static str> {
        // Acquire pairs with the Release in `set`.
        if !self.flag.swap(false, Acquire) {
            return None;
        }
        self.why.lock().unwrap_or_else(|p| p.into_inner()).take()
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
    fn protocol_error(&mut self, why: &'static str) {
        self.stats.errors += 1;
        self.conn = None;
        for m in self.parked.drain(..).flatten() {
            self.cache.free(m);
        }
        self.broken.set(why);
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

/// Copy-mode rx: how many slots ahead of the copy their buffers are prefetched (measured: 8
/// beat 1 by 10-30% at 64 and 256 bytes, and is no worse at 1518).
const PREFETCH_FRAMES: u16 = 8;

/// Prefetches the first lines of the buffer a descriptor points at.
#[inline(always)]
fn prefetch_buffer(regions: &Regions, d: Desc) {
    if let Some(r) = regions.0.get(d.region as usize) {
        let lines = (d.length as usize).div_ceil(64).min(4);
        for line in 0..lines {
            r.prefetch(d.offset as usize + line * 64);
        }
    }
}

/// A memif rx queue (either role).
pub struct MemifRxQueue {
    core: QueueCore,
}

/// A memif tx queue (either role).
pub struct MemifTxQueue {
    core: QueueCore,
}

impl MemifRxQueue {
    pub fn new(core: QueueCore) -> Self {
        MemifRxQueue { core }
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
            Role::Server => c.ring.head().load(Acquire) != self.core.seen,
            Role::Client => c.ring.tail().load(Acquire) != self.core.seen,
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
    ) -> Result<usize, &'static str> {
        let QueueCore {
            conn,
            seen,
            cache,
            stats,
            ..
        } = q;
        let c = conn.as_ref().expect("entered");
        let ring = &c.ring;
        // Acquire pairs with the client's Release store of head: descriptors and data are there.
        let head = ring.head().load(Acquire);
        let avail = head.wrapping_sub(*seen);
        if avail > ring.size() {
            return Err("Ring head out of range");
        }
        if avail == 0 {
            return Ok(0); // the common idle poll: touch nothing else
        }
        let start = pkts.len();
        let mut used: u16 = 0;
        // Buffers the client published are finished: pull the next PREFETCH_FRAMES over from
        // its core ahead of the copies, so several transfers overlap (one ahead left the copy
        // waiting on each).
        let mut pf_next: u16 = 0;
        while pf_next < avail.min(PREFETCH_FRAMES) {
            prefetch_buffer(&c.regions, ring.read_desc(seen.wrapping_add(pf_next)));
            pf_next += 1;
        }
        while used < avail && pkts.len() - start < max {
            let Some(mut m) = cache.alloc() else {
                stats.nombuf += 1;
                break;
            };
            let mut fits = true;
            loop {
                if used == avail {
                    // A chain must be published whole.
                    cache.free(m);
                    return Err("Chained buffer runs past head");
                }
                let d = ring.read_desc(seen.wrapping_add(used));
                used += 1;
                let Some(src) = c.regions.locate(d.region, d.offset, d.length) else {
                    cache.free(m);
                    return Err("Descriptor outside its region");
                };
                if pf_next < avail {
                    // Keep PREFETCH_FRAMES in flight (a hint only: an out-of-range offset is
                    // ignored).
                    prefetch_buffer(&c.regions, ring.read_desc(seen.wrapping_add(pf_next)));
                    pf_next += 1;
                }
                // A frame larger than one of our buffers continues in chained segments.
                let src = src
                    .slice(d.offset as usize, d.length as usize)
                    .expect("located");
                fits = fits && m.extend_from(&src, cache);
                if d.flags & DESC_FLAG_NEXT == 0 {
                    break;
                }
            }
            if fits {
                stats.bytes += m.len() as u64;
                pkts.push(m);
            } else {
                stats.nombuf += 1; // the pool ran dry in the middle of a chain: dropped
                cache.free(m);
            }
        }
        if used > 0 {
            *seen = seen.wrapping_add(used);
            // Release pairs with the client's Acquire load of tail: we are done with these
            // slots. Only when it moved: a store, even of the same value, takes the line away
            // from the client, whose every tx burst then misses on it.
            ring.tail().store(*seen, Release);
        }
        let n = pkts.len() - start;
        stats.packets += n as u64;
        Ok(n)
    }

    /// Client: take frames the server wrote into our S2C slots, then refill the ring.
    fn rx_client(
        q: &mut QueueCore,
        pkts: &mut Vec<Mbuf>,
        max: usize,
    ) -> Result<usize, &'static str> {
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
        // Acquire pairs with the server's Release store of tail.
        let tail = ring.tail().load(Acquire);
        let avail = tail.wrapping_sub(*seen);
        if avail > own.wrapping_sub(*seen) {
            return Err("Ring tail passed head");
        }
        let start = pkts.len();
        let mut used: u16 = 0;
        let mut pf_next: u16 = 0;
        'frames: while used < avail && pkts.len() - start < max {
            let first = used;
            let mut frame: Option<Mbuf> = None;
            let mut fits = true;
            loop {
                if used == avail {
                    if let Some(m) = frame.take() {
                        cache.free(m);
                    }
                    return Err("Chained buffer runs past tail");
                }
                let slot = seen.wrapping_add(used);
                let d = ring.read_desc(slot);
                used += 1;
                if let (None, Some((base, bsize))) = (c.zero_copy_region, c.buffers) {
                    if d.length > bsize {
                        if let Some(m) = frame.take() {
                            cache.free(m);
                        }
                        return Err("Descriptor longer than its buffer");
                    }
                    if frame.is_none() {
                        match cache.alloc() {
                            Some(m) => frame = Some(m),
                            None => {
                                stats.nombuf += 1;
                                used = first;
                                break 'frames;
                            }
                        }
                    }
                    let m = frame.as_mut().expect("set above");
                    // Read from our own layout, not the offset in the descriptor.
                    let off = base + (slot & ring.mask()) as usize * bsize as usize;
                    // Keep PREFETCH_FRAMES slots' buffers on their way from the server's core.
                    while pf_next < avail && pf_next < used + PREFETCH_FRAMES {
                        let next = base
                            + (seen.wrapping_add(pf_next) & ring.mask()) as usize * bsize as usize;
                        for line in 0..4 {
                            c.regions.0[0].prefetch(next + line * 64);
                        }
                        pf_next += 1;
                    }
                    let src = c.regions.0[0]
                        .slice(off, d.length as usize)
                        .expect("own layout");
                    fits = fits && m.extend_from(&src, cache);
                } else {
                    let Some(mut m) = parked[(slot & ring.mask()) as usize].take() else {
                        if let Some(f) = frame.take() {
                            cache.free(f);
                        }
                        return Err("Tail moved over an empty slot");
                    };
                    if !m.set_len(d.length as usize) {
                        cache.free(m);
                        if let Some(f) = frame.take() {
                            cache.free(f);
                        }
                        return Err("Descriptor longer than its buffer");
                    }
                    match &mut frame {
                        None => frame = Some(m),
                        // A chain in zero copy: the buffers become the packet's segments.
                        Some(f) => {
                            if let Err(m) = f.chain(m) {
                                fits = false;
                                cache.free(m);
                            }
                        }
                    }
                }
                if d.flags & DESC_FLAG_NEXT == 0 {
                    break;
                }
            }
            let m = frame.expect("at least one slot");
            if fits {
                stats.bytes += m.len() as u64;
                pkts.push(m);
            } else {
                stats.nombuf += 1; // no buffer for the rest of a chain: dropped
                cache.free(m);
            }
        }
        *seen = seen.wrapping_add(used);
        Self::refill(c, own, *seen, parked, cache);
        let n = pkts.len() - start;
        stats.packets += n as u64;
        Ok(n)
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
            // Release pairs with the server's Acquire load of head: the descriptors are set.
            ring.head().store(head, Release);
        }
    }
}

impl RxQueue for MemifRxQueue {
    fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        if !self.core.enter() {
            return 0;
        }
        let max = max.min(MAX_BURST);
        let start = pkts.len();
        let res = match self.core.conn.as_ref().map(|c| c.role) {
            Some(Role::Server) => Self::rx_server(&mut self.core, pkts, max),
            Some(Role::Client) => Self::rx_client(&mut self.core, pkts, max),
            None => Ok(0),
        };
        let n = res.unwrap_or_else(|why| {
            // Frames taken before the violation came from a ring we no longer trust.
            for m in pkts.drain(start..) {
                self.core.cache.free(m);
            }
            self.core.protocol_error(why);
            0
        });
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
    pub fn new(core: QueueCore) -> Self {
        MemifTxQueue { core }
    }

    /// Client: queue frames on a C2S ring (copy or zero copy), publish head.
    fn tx_client(q: &mut QueueCore, pkts: &mut Vec<Mbuf>) -> Result<usize, &'static str> {
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
        // Acquire pairs with the server's Release store of tail: it is done with those slots.
        let tail = ring.tail().load(Acquire);
        let in_flight = own.wrapping_sub(tail);
        if in_flight > ring.size() || tail.wrapping_sub(*seen) > ring.size() {
            return Err("Ring tail out of range");
        }
        // Zero copy: buffers the server has finished with go back to the pool.
        while *seen != tail {
            if let Some(m) = parked[(*seen & ring.mask()) as usize].take() {
                cache.free(m);
            }
            *seen = seen.wrapping_add(1);
        }
        let mut free = ring.size() - in_flight;
        let mut head = *own;
        let mut sent = 0;
        let n = pkts.len().min(MAX_BURST);
        // Zero copy: the slot each sent frame is parked in (+1), 0 for frames that were copied.
        let mut park = [0u16; MAX_BURST];
        let (base, bsize) = c.buffers.unwrap_or((0, 0));
        let region0 = &c.regions.0[0];
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
                park[sent] = slot + 1;
                head = head.wrapping_add(1);
                free -= 1;
            } else {
                if bsize == 0 {
                    break;
                }
                let len = m.len();
                let slots = len.div_ceil(bsize as usize).max(1);
                if slots > free as usize {
                    break;
                }
                if slots < free as usize && sent + 1 < n {
                    // Ask for the next frame's buffer lines in exclusive state now: the server
                    // read them last, and fetching them one store at a time serialises the copy.
                    let next = base
                        + (head.wrapping_add(slots as u16) & ring.mask()) as usize * bsize as usize;
                    let len = pkts[sent + 1].len().min(bsize as usize);
                    for line in (0..len).step_by(64) {
                        region0.prefetch_write(next + line);
                    }
                }
                let mut done = 0;
                for k in 0..slots {
                    let slot = head & ring.mask();
                    let off = base + slot as usize * bsize as usize;
                    let chunk = (len - done).min(bsize as usize);
                    let dst = region0.slice(off, chunk).expect("own layout");
                    m.copy_out_to(done, &dst);
                    let flags = if k + 1 < slots { DESC_FLAG_NEXT } else { 0 };
                    ring.write_desc(
                        slot,
                        Desc {
                            flags,
                            region: 0,
                            length: chunk as u32,
                            // Region 0's layout was checked to fit u32 offsets at connect.
                            offset: off as u32,
                        },
                    );
                    done += chunk;
                    head = head.wrapping_add(1);
                }
                free -= slots as u16;
            }
            stats.bytes += m.len() as u64;
            sent += 1;
        }
        for (m, p) in pkts.drain(..sent).zip(park) {
            if p == 0 {
                cache.free(m);
            } else {
                parked[(p - 1) as usize] = Some(m);
            }
        }
        if head != *own {
            *own = head;
            // Release pairs with the server's Acquire load of head.
            ring.head().store(head, Release);
            QueueCore::kick(c);
        }
        stats.packets += sent as u64;
        Ok(sent)
    }

    /// Server: write frames into the slots the client handed us on an S2C ring, publish tail.
    fn tx_server(q: &mut QueueCore, pkts: &mut Vec<Mbuf>) -> Result<usize, &'static str> {
        let QueueCore {
            conn,
            own,
            cache,
            stats,
            ..
        } = q;
        let c = conn.as_ref().expect("entered");
        let ring = &c.ring;
        // Acquire pairs with the client's Release store of head: its descriptors are set.
        let head = ring.head().load(Acquire);
        let avail = head.wrapping_sub(*own);
        if avail > ring.size() {
            return Err("Ring head out of range");
        }
        let mut tail = *own;
        let mut used: u16 = 0;
        let mut sent = 0;
        let n = pkts.len().min(MAX_BURST);
        'frames: while sent < n {
            let m = &pkts[sent];
            let len = m.len();
            let mut done = 0usize;
            let mut slots: u16 = 0;
            loop {
                if used + slots == avail {
                    break 'frames; // no room for the whole frame: it stays with the caller
                }
                let slot = tail.wrapping_add(slots);
                let d = ring.read_desc(slot);
                let Some(dst) = c.regions.locate(d.region, d.offset, d.length) else {
                    return Err("Descriptor outside its region");
                };
                let k = (len - done).min(d.length as usize);
                if k == 0 && len > done {
                    return Err("Descriptor with no room");
                }
                let window = dst.slice(d.offset as usize, k).expect("located");
                m.copy_out_to(done, &window);
                done += k;
                slots += 1;
                let more = done < len;
                ring.write_len_flags(slot, k as u32, if more { DESC_FLAG_NEXT } else { 0 });
                if !more {
                    break;
                }
            }
            tail = tail.wrapping_add(slots);
            used += slots;
            stats.bytes += len as u64;
            sent += 1;
        }
        for m in pkts.drain(..sent) {
            cache.free(m);
        }
        if tail != *own {
            *own = tail;
            // Release pairs with the client's Acquire load of tail.
            ring.tail().store(tail, Release);
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
        let res = match self.core.conn.as_ref().map(|c| c.role) {
            Some(Role::Client) => Self::tx_client(&mut self.core, pkts),
            Some(Role::Server) => Self::tx_server(&mut self.core, pkts),
            None => Ok(0),
        };
        let n = res.unwrap_or_else(|why| {
            self.core.protocol_error(why);
            0
        });
        self.core.exit();
        n
    }

    fn stats(&self) -> QueueStats {
        self.core.stats
    }
}
