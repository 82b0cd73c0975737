//! Per-queue counters: plain integers on the hot path, published as a snapshot for readers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub packets: u64,
    pub bytes: u64,
    /// Packets dropped by the queue (tx: peer not ready; rx: oversize from the peer).
    pub drops: u64,
    /// Malformed input from the peer (bad length, bad descriptor).
    pub errors: u64,
    /// Receives that stopped because the pool had no buffer (DPDK's `rx_nombuf`).
    pub nombuf: u64,
    /// Received frames whose lines the queue flushed from our caches once it had copied them
    /// ([`FlushTuner`](crate::flush::FlushTuner)); 0 for queues that never flush.
    pub flushed: u64,
    /// Times the queue's [`FlushTuner`](crate::flush::FlushTuner) changed its way.
    pub flush_switches: u64,
}

impl QueueStats {
    pub fn add(&mut self, o: &QueueStats) {
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.drops += o.drops;
        self.errors += o.errors;
        self.nombuf += o.nombuf;
        self.flushed += o.flushed;
        self.flush_switches += o.flush_switches;
    }
}

/// A published snapshot of one queue's counters: written by the polling lcore only, read by
/// anyone. One cache line, so a reader costs the writer at most one line transfer per read.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct StatsCell {
    packets: AtomicU64,
    bytes: AtomicU64,
    drops: AtomicU64,
    errors: AtomicU64,
    nombuf: AtomicU64,
    flushed: AtomicU64,
    flush_switches: AtomicU64,
}

impl StatsCell {
    pub fn new() -> Arc<StatsCell> {
        Arc::new(StatsCell::default())
    }

    /// Publishes `s`. Single writer: plain stores, no read-modify-write.
    #[inline(always)]
    pub fn publish(&self, s: &QueueStats) {
        // Relaxed: each counter is read independently; readers need no order between them.
        self.packets.store(s.packets, Ordering::Relaxed);
        self.bytes.store(s.bytes, Ordering::Relaxed);
        self.drops.store(s.drops, Ordering::Relaxed);
        self.errors.store(s.errors, Ordering::Relaxed);
        self.nombuf.store(s.nombuf, Ordering::Relaxed);
        self.flushed.store(s.flushed, Ordering::Relaxed);
        self.flush_switches
            .store(s.flush_switches, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> QueueStats {
        // Relaxed: pairs with the Relaxed stores in publish(); a slightly torn snapshot across
        // counters is acceptable for statistics.
        QueueStats {
            packets: self.packets.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            drops: self.drops.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            nombuf: self.nombuf.load(Ordering::Relaxed),
            flushed: self.flushed.load(Ordering::Relaxed),
            flush_switches: self.flush_switches.load(Ordering::Relaxed),
        }
    }
}
