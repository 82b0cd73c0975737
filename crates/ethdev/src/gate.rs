//! Keeping a port's queues out of its shared memory while the control path changes it (a reset,
//! a reconnect).
//!
//! The lcores that poll a port's queues and the thread that resets the port are different
//! threads, and a queue may not be polled at all (an rx queue under txonly forwarding, or any
//! queue while forwarding is stopped). Each queue marks itself busy for the length of a burst;
//! the resetter announces the reset, waits until no queue is busy, does the reset and ends it.
//!
//! * queue, at the top of a burst: `state := BUSY`; fence; read the generation. Odd means a reset
//!   is under way: `state := IDLE` and do nothing this burst.
//! * resetter: make the generation odd; fence; wait while any queue is BUSY.
//!
//! The two fenced store→load pairs (Dekker's pattern) mean either the queue sees the odd
//! generation, or the resetter sees the queue busy and waits for its burst to end. On x86 the
//! queue's store+fence is one `xchg` per burst. When the reset ends (generation even again) each
//! queue sees a generation it has not seen, and restarts at slot 0.

use std::sync::atomic::{
    fence, AtomicU64,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const IDLE: u64 = 0;
const BUSY: u64 = 1;

#[derive(Default)]
#[repr(align(64))]
struct State(AtomicU64);

/// Shared by the resetter and the queues of one side of one port.
#[derive(Default)]
pub struct Gate {
    generation: AtomicU64,
    members: Mutex<Vec<Arc<State>>>,
    /// One reset at a time.
    resetting: Mutex<()>,
}

/// What a queue does at the top of a burst.
#[derive(Debug, PartialEq, Eq)]
pub enum Enter {
    Run,
    /// A reset finished since the last burst: zero the ring index, then run.
    Restart,
    /// A reset is under way: return 0 packets (nothing to `exit`).
    Parked,
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    /// Registers a queue.
    pub fn join(self: &Arc<Gate>) -> GateMember {
        let state = Arc::new(State::default());
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(state.clone());
        // Acquire pairs with the Release in `reset`'s end: a new queue sees the swept rings.
        let g = self.generation.load(Acquire) & !1;
        GateMember {
            gate: self.clone(),
            state,
            seen: g,
        }
    }

    /// Runs `f` with every queue out of its burst, except `caller` (a queue that is itself
    /// resetting from inside its burst); `f` returns None when it found nothing to do, and then
    /// the queues carry on where they were. Gives up (returns None) if some queue stays busy past
    /// `patience`; queues resume either way.
    pub fn reset<T>(
        &self,
        caller: Option<&GateMember>,
        patience: Duration,
        f: impl FnOnce() -> Option<T>,
    ) -> Option<T> {
        // Another thread resetting does the work; waiting for it from inside a burst would
        // deadlock (it waits for that burst to end), so give up at once.
        let _one = match self.resetting.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let g = self.generation.load(Relaxed) | 1;
        self.generation.store(g, Relaxed);
        // SeqCst fence: orders the generation store before the state loads below; pairs with
        // the fence in `enter` (store→load, Dekker).
        fence(SeqCst);
        let members: Vec<Arc<State>> = self
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let deadline = Instant::now() + patience;
        let mut result = None;
        'wait: {
            for m in &members {
                if caller.is_some_and(|c| Arc::ptr_eq(&c.state, m)) {
                    continue;
                }
                // Acquire pairs with the Release in `exit`: the queue's burst is complete.
                while m.0.load(Acquire) == BUSY {
                    if Instant::now() > deadline {
                        break 'wait;
                    }
                    std::hint::spin_loop();
                }
            }
            result = f();
        }
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|m| Arc::strong_count(m) > 1);
        // A reset that ran moves to a new even generation: queues restart at slot 0. One that
        // gave up goes back to the old one: queues resume where they were, as nothing changed.
        let next = if result.is_some() { g + 1 } else { g - 1 };
        // Release: the reset's writes are visible to queues that see the new generation.
        self.generation.store(next, Release);
        result
    }
}

/// A queue's handle on its side's gate.
pub struct GateMember {
    gate: Arc<Gate>,
    state: Arc<State>,
    seen: u64,
}

impl GateMember {
    /// The top of a burst. After `Run` or `Restart` the burst must end with [`GateMember::exit`].
    #[inline(always)]
    pub fn enter(&mut self) -> Enter {
        // SeqCst swap: a store followed by a full fence (one xchg); pairs with the fence in
        // `Gate::reset` (store→load, Dekker).
        self.state.0.swap(BUSY, SeqCst);
        let g = self.gate.generation.load(SeqCst);
        if g == self.seen {
            return Enter::Run;
        }
        self.changed(g)
    }

    #[cold]
    fn changed(&mut self, g: u64) -> Enter {
        if g & 1 == 1 {
            self.exit();
            return Enter::Parked;
        }
        self.seen = g;
        Enter::Restart
    }

    /// The end of a burst.
    #[inline(always)]
    pub fn exit(&mut self) {
        // Release pairs with the Acquire load in `Gate::reset`.
        self.state.0.store(IDLE, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_queues_do_not_hold_a_reset_and_resume_with_a_restart() {
        let gate = Gate::new();
        let mut a = gate.join();
        let mut b = gate.join();
        assert_eq!(a.enter(), Enter::Run);
        a.exit();
        // b is never polled: it must not block the reset.
        assert_eq!(
            gate.reset(None, Duration::from_secs(1), || Some(7)),
            Some(7)
        );
        assert_eq!(a.enter(), Enter::Restart);
        a.exit();
        assert_eq!(a.enter(), Enter::Run);
        a.exit();
        assert_eq!(b.enter(), Enter::Restart);
        b.exit();
    }

    #[test]
    fn a_busy_queue_delays_the_reset_and_parks_during_it() {
        let gate = Gate::new();
        let mut a = gate.join();
        assert_eq!(a.enter(), Enter::Run); // busy
        let g2 = gate.clone();
        let t = std::thread::spawn(move || {
            g2.reset(None, Duration::from_secs(5), || Some(Instant::now()))
        });
        std::thread::sleep(Duration::from_millis(50));
        let burst_end = Instant::now();
        a.exit();
        let reset_at = t.join().unwrap().expect("reset ran");
        assert!(reset_at >= burst_end, "the reset waited for the burst");
        assert_eq!(a.enter(), Enter::Restart);
        a.exit();
    }

    #[test]
    fn a_stuck_queue_makes_the_reset_give_up_and_the_caller_is_exempt() {
        let gate = Gate::new();
        let mut a = gate.join();
        let mut b = gate.join();
        assert_eq!(a.enter(), Enter::Run);
        assert_eq!(b.enter(), Enter::Run);
        assert_eq!(
            gate.reset(Some(&a), Duration::from_millis(20), || Some(())),
            None,
            "b is stuck in a burst"
        );
        b.exit();
        assert_eq!(
            b.enter(),
            Enter::Run,
            "a reset that gave up changed nothing: no restart"
        );
        b.exit();
        assert_eq!(
            gate.reset(Some(&a), Duration::from_millis(20), || Some(1)),
            Some(1),
            "a itself is exempt"
        );
        a.exit();
    }

    #[test]
    fn parked_during_a_reset() {
        let gate = Gate::new();
        let mut a = gate.join();
        let g2 = gate.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let (tx2, rx2) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            g2.reset(None, Duration::from_secs(5), || {
                tx.send(()).unwrap();
                rx2.recv().unwrap();
                Some(())
            })
        });
        rx.recv().unwrap();
        assert_eq!(a.enter(), Enter::Parked);
        tx2.send(()).unwrap();
        t.join().unwrap().unwrap();
        assert_eq!(a.enter(), Enter::Restart);
        a.exit();
    }
}
