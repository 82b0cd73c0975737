//! Parking a side's queues while its rings are reset.
//!
//! The lcores that poll a port's queues and the thread that resets the port are different
//! threads. Before the rings are swept and the private indices zeroed, every queue must be
//! outside its burst. The gate does that by message passing, so the hot path pays one load:
//!
//! * the coordinator makes the generation odd (`begin`): a reset is under way;
//! * a queue that sees an odd generation at the top of a burst acknowledges it and returns 0
//!   packets; once every queue has acknowledged (`all_parked`), none is inside a burst;
//! * the coordinator makes it even again (`finish`); each queue sees the new even generation,
//!   zeroes its ring index and resumes.

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex};

#[derive(Default)]
#[repr(align(64))]
struct Ack(AtomicU64);

/// Shared by the coordinator and the queues of one side of one port.
#[derive(Default)]
pub(crate) struct Gate {
    generation: AtomicU64,
    acks: Mutex<Vec<Arc<Ack>>>,
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    /// Registers a queue; it starts at the current generation.
    pub fn join(self: &Arc<Gate>) -> GateMember {
        // Acquire pairs with `finish`: a queue joining after a reset sees the swept rings.
        let g = self.generation.load(Acquire) & !1;
        let ack = Arc::new(Ack(AtomicU64::new(g)));
        self.acks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ack.clone());
        GateMember {
            gate: self.clone(),
            ack,
            seen: g,
        }
    }

    /// Starts a reset; returns its generation (odd). Queues park at their next burst.
    pub fn begin(&self) -> u64 {
        let g = self.generation.load(Relaxed);
        let g = if g & 1 == 1 { g } else { g + 1 };
        // Release pairs with the Acquire in `GateMember::check`.
        self.generation.store(g, Release);
        g
    }

    /// Whether every queue has acknowledged reset generation `g` (and so is outside its burst).
    pub fn all_parked(&self, g: u64) -> bool {
        let acks = self.acks.lock().unwrap_or_else(|p| p.into_inner());
        // Acquire pairs with the Release store of the ack: the queue's last burst is complete.
        acks.iter()
            .all(|a| Arc::strong_count(a) == 1 || a.0.load(Acquire) == g)
    }

    /// Ends reset `g`: queues zero their indices and resume.
    pub fn finish(&self, g: u64) {
        self.acks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|a| Arc::strong_count(a) > 1);
        // Release pairs with the Acquire in `check`: the sweep is visible before queues resume.
        self.generation.store(g + 1, Release);
    }
}

/// A queue's handle on its side's gate.
pub(crate) struct GateMember {
    gate: Arc<Gate>,
    ack: Arc<Ack>,
    seen: u64,
}

/// What a queue must do at the top of a burst.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum GateState {
    Run,
    /// A reset is under way: do nothing this burst.
    Parked,
    /// A reset finished: zero the ring index, then run.
    Restart,
}

impl GateMember {
    #[inline(always)]
    pub fn check(&mut self) -> GateState {
        // Acquire pairs with the Release in `begin`/`finish`.
        let g = self.gate.generation.load(Acquire);
        if g == self.seen && g & 1 == 0 {
            return GateState::Run;
        }
        self.changed(g)
    }

    #[cold]
    fn changed(&mut self, g: u64) -> GateState {
        if g == self.seen {
            return GateState::Parked;
        }
        self.seen = g;
        // Release pairs with the Acquire in `all_parked`: this queue's burst work is done.
        self.ack.0.store(g, Release);
        if g & 1 == 1 {
            GateState::Parked
        } else {
            GateState::Restart
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_park_then_restart() {
        let gate = Gate::new();
        let mut a = gate.join();
        let mut b = gate.join();
        assert_eq!(a.check(), GateState::Run);
        let g = gate.begin();
        assert!(!gate.all_parked(g));
        assert_eq!(a.check(), GateState::Parked);
        assert!(!gate.all_parked(g));
        assert_eq!(b.check(), GateState::Parked);
        assert!(gate.all_parked(g));
        assert_eq!(a.check(), GateState::Parked, "stays parked until finish");
        gate.finish(g);
        assert_eq!(a.check(), GateState::Restart);
        assert_eq!(a.check(), GateState::Run);
        assert_eq!(b.check(), GateState::Restart);
    }

    #[test]
    fn dropped_queue_does_not_block_a_reset() {
        let gate = Gate::new();
        let a = gate.join();
        drop(a);
        let g = gate.begin();
        assert!(gate.all_parked(g));
        gate.finish(g);
    }
}
