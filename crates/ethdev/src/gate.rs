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
//!
//! The loom model in `tests/loom_gate.rs` runs this code on loom's atomics and mutexes
//! (`cfg(loom)`: the `sync` module below); under loom a model can also break one step
//! ([`Step`]) to show that loom catches it.

use std::sync::atomic::Ordering::{self, Acquire, Relaxed, Release, SeqCst};
use std::sync::Arc;
use std::time::Duration;

use sync::{AtomicU64, Mutex, Patience};

/// The primitives the gate is built of: std's, or loom's under `cfg(loom)` (as crossbeam does),
/// so the model runs this very code.
mod sync {
    #[cfg(loom)]
    pub(super) use loom::sync::{
        atomic::{fence, AtomicU64},
        Mutex,
    };
    use std::sync::atomic::Ordering::SeqCst;
    #[cfg(not(loom))]
    pub(super) use std::sync::{
        atomic::{fence, AtomicU64},
        Mutex,
    };
    use std::time::Duration;

    /// The full fence a SeqCst read-modify-write carries. On hardware the RMW is that fence
    /// already (x86 `xchg`; C++20 [atomics.order]: a SeqCst RMW and a SeqCst fence are ordered
    /// in S), so this is nothing. Loom models `fence(SeqCst)` but treats SeqCst accesses as
    /// AcqRel (loom 0.7 `rt/thread.rs`, `seq_cst`), so under loom the fence is written out.
    #[inline(always)]
    pub(super) fn fence_of_seq_cst_rmw() {
        #[cfg(loom)]
        fence(SeqCst);
    }

    /// The reset's fence.
    #[inline(always)]
    pub(super) fn fence_seq_cst() {
        fence(SeqCst);
    }

    /// How long a reset waits for a busy queue. Loom has no clock and must see the same steps
    /// each time it replays an interleaving, so under loom patience counts spins, one a
    /// millisecond.
    pub(super) struct Patience {
        #[cfg(not(loom))]
        deadline: Option<std::time::Instant>,
        #[cfg(loom)]
        spins_left: u128,
    }

    impl Patience {
        pub(super) fn new(patience: Duration) -> Patience {
            Patience {
                // None: further away than an Instant reaches, so never.
                #[cfg(not(loom))]
                deadline: std::time::Instant::now().checked_add(patience),
                #[cfg(loom)]
                spins_left: patience.as_millis(),
            }
        }

        /// False while there is patience left; spins once.
        pub(super) fn run_out(&mut self) -> bool {
            #[cfg(not(loom))]
            {
                if self.deadline.is_some_and(|d| std::time::Instant::now() > d) {
                    return true;
                }
                std::hint::spin_loop();
            }
            #[cfg(loom)]
            {
                if self.spins_left == 0 {
                    return true;
                }
                self.spins_left -= 1;
                loom::hint::spin_loop();
            }
            false
        }
    }
}

/// The steps of the protocol a loom model may break (the negative controls of
/// `tests/loom_gate.rs`); outside loom nothing can be broken and each step is what it says.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The queue's store→load fence in [`GateMember::enter`] (the xchg).
    QueueFence,
    /// The reset's store→load fence.
    ResetFence,
    /// The Release of [`GateMember::exit`] (the burst's accesses before the reset's).
    ExitRelease,
    /// The Release that ends a reset (its accesses before the restarted bursts').
    EndRelease,
}

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
    /// The step a loom model broke.
    #[cfg(loom)]
    broken: Option<Step>,
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

    /// A gate with one step broken: Relaxed for an ordering, nothing for a fence. Only a loom
    /// model's negative controls build one.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn with_broken(step: Step) -> Arc<Gate> {
        Arc::new(Gate {
            broken: Some(step),
            ..Gate::default()
        })
    }

    /// `o`, unless a loom model broke `step`.
    #[inline(always)]
    fn ordering(&self, step: Step, o: Ordering) -> Ordering {
        #[cfg(loom)]
        if self.broken == Some(step) {
            return Relaxed;
        }
        let _ = step;
        o
    }

    /// Whether `step`'s fence is there (always, unless a loom model broke it).
    #[inline(always)]
    fn fenced(&self, step: Step) -> bool {
        #[cfg(loom)]
        if self.broken == Some(step) {
            return false;
        }
        let _ = step;
        true
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
        // Relaxed: only resets store the generation, one at a time (`resetting`).
        let g = self.generation.load(Relaxed) | 1;
        self.generation.store(g, Relaxed);
        // SeqCst fence: orders the generation store before the state loads below; pairs with
        // the fence in `enter` (store→load, Dekker).
        if self.fenced(Step::ResetFence) {
            sync::fence_seq_cst();
        }
        let members: Vec<Arc<State>> = self
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut patience = Patience::new(patience);
        let mut result = None;
        'wait: {
            for m in &members {
                if caller.is_some_and(|c| Arc::ptr_eq(&c.state, m)) {
                    continue;
                }
                // Acquire pairs with the Release in `exit`: the queue's burst is complete.
                while m.0.load(Acquire) == BUSY {
                    if patience.run_out() {
                        break 'wait;
                    }
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
        // Release: the reset's writes are visible to queues that see the new generation (pairs
        // with the load in `enter`).
        self.generation
            .store(next, self.ordering(Step::EndRelease, Release));
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
        if self.gate.fenced(Step::QueueFence) {
            sync::fence_of_seq_cst_rmw();
        }
        // SeqCst (Acquire at least): pairs with the Release that ends `Gate::reset`.
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
        self.state
            .0
            .store(IDLE, self.gate.ordering(Step::ExitRelease, Release));
    }
}

// Real threads and a real clock: not under loom (tests/loom_gate.rs models the gate there).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Instant;

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
