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
    /// Frames moved the way a [`Tuner`](crate::tuner::Tuner) chooses: received frames whose
    /// lines an rx queue flushed from our caches once it had copied them
    /// ([`FlushTuner`](crate::flush::FlushTuner)); short frames a tx queue wrote into its
    /// peer's buffers with streaming stores while its tuner streams
    /// ([`StreamTuner`](crate::stream::StreamTuner), vhost's `Tuner`). 0 for queues that do
    /// neither.
    pub tuned: u64,
    /// Times the queue's tuner changed its way.
    pub tuner_switches: u64,
    /// Frames whose destination lines a tx queue asked for ahead of its copy in shared state
    /// ([`AheadTuner`](crate::ahead::AheadTuner)); 0 for queues that ask in exclusive state
    /// or not at all.
    pub shared_ahead: u64,
    /// Times the queue's [`AheadTuner`](crate::ahead::AheadTuner) changed its way.
    pub ahead_switches: u64,
    /// Short frames a tx queue demoted to the shared cache once written
    /// ([`DemoteTuner`](crate::demote::DemoteTuner)); 0 for queues that never do.
    pub demoted: u64,
    /// Times the queue's [`DemoteTuner`](crate::demote::DemoteTuner) changed its way.
    pub demote_switches: u64,
    /// Holds an rx queue's [`Holdoff`](crate::holdoff::Holdoff) started, and those of them
    /// that did not pay (each starts a quiet spell); 0 for queues that never hold.
    pub holds: u64,
    pub holds_unpaid: u64,
}

impl QueueStats {
    pub fn add(&mut self, o: &QueueStats) {
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.drops += o.drops;
        self.errors += o.errors;
        self.nombuf += o.nombuf;
        self.tuned += o.tuned;
        self.tuner_switches += o.tuner_switches;
        self.shared_ahead += o.shared_ahead;
        self.ahead_switches += o.ahead_switches;
        self.demoted += o.demoted;
        self.demote_switches += o.demote_switches;
        self.holds += o.holds;
        self.holds_unpaid += o.holds_unpaid;
    }
}

/// A published snapshot of one queue's counters: written by the polling lcore only, read by
/// anyone. Two cache lines, so a reader costs the writer at most two line transfers per read
/// (readers read once a second or so). Thirteen counters: 104 bytes.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct StatsCell {
    packets: AtomicU64,
    bytes: AtomicU64,
    drops: AtomicU64,
    errors: AtomicU64,
    nombuf: AtomicU64,
    tuned: AtomicU64,
    tuner_switches: AtomicU64,
    shared_ahead: AtomicU64,
    ahead_switches: AtomicU64,
    demoted: AtomicU64,
    demote_switches: AtomicU64,
    holds: AtomicU64,
    holds_unpaid: AtomicU64,
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
        self.tuned.store(s.tuned, Ordering::Relaxed);
        self.tuner_switches
            .store(s.tuner_switches, Ordering::Relaxed);
        self.shared_ahead.store(s.shared_ahead, Ordering::Relaxed);
        self.ahead_switches
            .store(s.ahead_switches, Ordering::Relaxed);
        self.demoted.store(s.demoted, Ordering::Relaxed);
        self.demote_switches
            .store(s.demote_switches, Ordering::Relaxed);
        self.holds.store(s.holds, Ordering::Relaxed);
        self.holds_unpaid.store(s.holds_unpaid, Ordering::Relaxed);
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
            tuned: self.tuned.load(Ordering::Relaxed),
            tuner_switches: self.tuner_switches.load(Ordering::Relaxed),
            shared_ahead: self.shared_ahead.load(Ordering::Relaxed),
            ahead_switches: self.ahead_switches.load(Ordering::Relaxed),
            demoted: self.demoted.load(Ordering::Relaxed),
            demote_switches: self.demote_switches.load(Ordering::Relaxed),
            holds: self.holds.load(Ordering::Relaxed),
            holds_unpaid: self.holds_unpaid.load(Ordering::Relaxed),
        }
    }
}
