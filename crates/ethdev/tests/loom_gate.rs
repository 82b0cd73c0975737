//! Loom models of the reset gate (`memnic_ethdev::gate`): its Dekker pair (a queue marks itself
//! busy, then reads the generation; the resetter makes the generation odd, then reads the
//! queues' states) and the Release/Acquire pairs around it. Under `cfg(loom)` the gate itself
//! runs on loom's atomics and mutexes, so these models run the driver's code, not a copy.
//!
//! What is checked:
//! * mutual exclusion: the ring memory a reset rewrites is a `loom::cell::UnsafeCell`, and loom
//!   reports any access to it from a burst that the gate's orderings do not order against the
//!   reset's sweep ("Causality violation");
//! * no lost restart: a burst on a ring swept since the queue's last restart must itself be a
//!   restart, and a restart needs a sweep it has not seen (no spurious one);
//! * progress: once a reset has ended (its thread joined) a queue is not parked, and a reset
//!   that no queue holds up runs.
//!
//! The negative controls break one step of the gate each (`Gate::with_broken`): loom must find
//! the interleaving where a burst and the sweep touch the ring unordered.
//!
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p memnic-ethdev --test loom_gate --release
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use loom::cell::UnsafeCell;
use loom::thread;
use memnic_ethdev::gate::{Enter, Gate, GateMember, Step};

/// Longer than any model runs: the reset never gives up (under loom patience counts spins).
const PATIENT: Duration = Duration::from_secs(3600);

/// The memory a reset rewrites and a burst uses (a ring: its slots, its indices).
#[derive(Default)]
struct Ring(UnsafeCell<u32>);

// SAFETY: shared between the queue's lcore and the resetter, which the gate keeps apart: the
// claim this model checks (loom reports every access to the cell that the gate does not order).
unsafe impl Sync for Ring {}

impl Ring {
    /// The reset's work: rewrite the ring (count the sweeps).
    fn sweep(&self) -> Option<()> {
        // SAFETY: the gate keeps this ring's queue out of its burst while the reset runs (or the
        // caller is that queue); loom checks this access against every burst's.
        self.0.with_mut(|sweeps| unsafe { *sweeps += 1 });
        Some(())
    }

    fn sweeps(&self) -> u32 {
        // SAFETY: called with every other thread joined.
        self.0.with(|sweeps| unsafe { *sweeps })
    }
}

/// One lcore's queue.
struct Queue {
    member: GateMember,
    /// The ring's sweep count when this queue last restarted (zeroed its ring index).
    synced: u32,
    restarts: u32,
}

impl Queue {
    fn new(member: GateMember) -> Queue {
        Queue {
            member,
            synced: 0,
            restarts: 0,
        }
    }

    /// One burst: enter, use the ring unless parked, exit.
    fn burst(&mut self, ring: &Ring) -> Enter {
        let e = self.burst_with(ring, |_| {});
        if e != Enter::Parked {
            self.member.exit();
        }
        e
    }

    /// The top of a burst and its use of the ring, then `inside` (still in the burst).
    fn burst_with(&mut self, ring: &Ring, inside: impl FnOnce(&Self)) -> Enter {
        let e = self.member.enter();
        if e == Enter::Parked {
            return e;
        }
        ring.0.with_mut(|sweeps| {
            // SAFETY: inside a burst (entered, not parked): the gate keeps the reset out; loom
            // checks this access against the reset's sweep.
            let sweeps = unsafe { &mut *sweeps };
            if e == Enter::Restart {
                assert!(*sweeps > self.synced, "a restart without a reset that ran");
                self.synced = *sweeps;
                self.restarts += 1;
            }
            assert_eq!(
                *sweeps, self.synced,
                "a burst on a ring swept since the queue last restarted: a lost restart"
            );
        });
        inside(self);
        e
    }
}

/// Runs `f` under every interleaving loom explores and checks that there was more than one.
/// At most 5 preemptions (all of these models in seconds) unless LOOM_MAX_PREEMPTIONS says
/// otherwise; with 20, about all there are (690,000 interleavings for the largest model), they
/// pass in about a minute.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(5);
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    b.check(move || {
        // Relaxed: a plain counter (std's atomic, outside the model), read after `check`.
        counted.fetch_add(1, Relaxed);
        f()
    });
    let runs = runs.load(Relaxed);
    eprintln!("{runs} interleavings");
    assert!(runs > 1, "the model explored only {runs} interleaving");
}

fn gate(broken: Option<Step>) -> Arc<Gate> {
    match broken {
        None => Gate::new(),
        Some(step) => Gate::with_broken(step),
    }
}

/// A queue runs `bursts` bursts while the control thread runs `resets` resets with `patience`;
/// then (the lcore joined) the queue runs once more.
fn one_queue(broken: Option<Step>, bursts: usize, resets: usize, patience: Duration) {
    model(move || {
        let gate = gate(broken);
        let ring = Arc::new(Ring::default());
        let mut q = Queue::new(gate.join());
        let lcore = {
            let ring = ring.clone();
            thread::spawn(move || {
                for _ in 0..bursts {
                    q.burst(&ring);
                }
                q
            })
        };
        let mut ran = 0;
        for _ in 0..resets {
            let done = gate.reset(None, patience, || ring.sweep());
            if patience == PATIENT {
                assert_eq!(done, Some(()), "no queue is stuck: a patient reset runs");
            }
            ran += u32::from(done.is_some());
        }
        let mut q = lcore.join().unwrap();
        assert_eq!(
            ring.sweeps(),
            ran,
            "the sweep ran exactly when reset said so"
        );
        // The resets have ended: the queue is not parked, and restarts unless it did already
        // (the burst checks that it is in step with the ring).
        assert_ne!(
            q.burst(&ring),
            Enter::Parked,
            "parked after the reset ended"
        );
        assert!(q.restarts <= ran, "one restart at most per reset that ran");
    });
}

#[test]
fn a_reset_against_two_bursts() {
    one_queue(None, 2, 1, PATIENT);
}

#[test]
fn two_resets_against_three_bursts() {
    // The generation goes 0→1→2→3→4: a queue may restart once for both resets, never miss one.
    one_queue(None, 3, 2, PATIENT);
}

#[test]
fn an_impatient_reset_gives_up_or_runs_and_changes_nothing_when_it_gives_up() {
    // Patience 0: the reset gives up the first time it sees the queue busy; then the queue
    // carries on without a restart (checked in every burst: it is in step with the ring).
    one_queue(None, 2, 2, Duration::ZERO);
}

#[test]
fn two_queues_and_a_reset() {
    // Each queue has its own ring; the reset sweeps both.
    model(|| {
        let gate = Gate::new();
        let rings = Arc::new([Ring::default(), Ring::default()]);
        let lcores: Vec<_> = (0..2)
            .map(|i| {
                let mut q = Queue::new(gate.join());
                let rings = rings.clone();
                thread::spawn(move || {
                    q.burst(&rings[i]);
                    q
                })
            })
            .collect();
        let sweep = || rings[0].sweep().and(rings[1].sweep());
        assert_eq!(gate.reset(None, PATIENT, sweep), Some(()));
        for (i, l) in lcores.into_iter().enumerate() {
            let mut q = l.join().unwrap();
            assert_ne!(q.burst(&rings[i]), Enter::Parked);
            assert_eq!(q.restarts, 1);
        }
    });
}

#[test]
fn two_resetters_one_at_a_time() {
    // A second resetter that finds a reset under way gives up at once (None); the one that ran
    // is the only sweep, and the queue restarts for it.
    model(|| {
        let gate = Gate::new();
        let ring = Arc::new(Ring::default());
        let mut q = Queue::new(gate.join());
        let lcore = {
            let ring = ring.clone();
            thread::spawn(move || {
                q.burst(&ring);
                q
            })
        };
        let other = {
            let (gate, ring) = (gate.clone(), ring.clone());
            thread::spawn(move || gate.reset(None, PATIENT, || ring.sweep()))
        };
        let mine = gate.reset(None, PATIENT, || ring.sweep());
        let other = other.join().unwrap();
        let mut q = lcore.join().unwrap();
        let ran = u32::from(mine.is_some()) + u32::from(other.is_some());
        assert!(ran >= 1, "one of the two resets ran");
        assert_eq!(ring.sweeps(), ran);
        assert_ne!(q.burst(&ring), Enter::Parked);
        assert!(q.restarts >= 1);
    });
}

#[test]
fn a_queue_resetting_from_inside_its_burst_is_exempt() {
    // Queue a finds its peer gone mid-burst and resets the port itself (caller = a): the reset
    // waits for b only, sweeps both rings, and a restarts at its next burst.
    model(|| {
        let gate = Gate::new();
        let rings = Arc::new([Ring::default(), Ring::default()]);
        let mut b = Queue::new(gate.join());
        let lcore_b = {
            let rings = rings.clone();
            thread::spawn(move || {
                b.burst(&rings[1]);
                b
            })
        };
        let mut a = Queue::new(gate.join());
        let e = a.burst_with(&rings[0], |a| {
            let done = gate.reset(Some(&a.member), PATIENT, || {
                rings[0].sweep().and(rings[1].sweep())
            });
            assert_eq!(done, Some(()), "the caller does not wait for itself");
        });
        assert_eq!(e, Enter::Run);
        a.member.exit();
        assert_eq!(a.burst(&rings[0]), Enter::Restart);
        let mut b = lcore_b.join().unwrap();
        assert_ne!(b.burst(&rings[1]), Enter::Parked);
        assert_eq!(b.restarts, 1);
    });
}

#[test]
fn a_queue_that_joins_during_a_reset() {
    // The reset may or may not see the new member; either way that queue's burst stays out of
    // the sweep (a queue that joins after a reset starts in step: no restart due).
    model(|| {
        let gate = Gate::new();
        let ring = Arc::new(Ring::default());
        let lcore = {
            let (gate, ring) = (gate.clone(), ring.clone());
            thread::spawn(move || {
                let mut q = Queue::new(gate.join());
                if q.member.enter() != Enter::Parked {
                    // SAFETY: inside a burst; loom checks this read against the sweep.
                    let _ = ring.0.with(|sweeps| unsafe { *sweeps });
                    q.member.exit();
                }
            })
        };
        assert_eq!(gate.reset(None, PATIENT, || ring.sweep()), Some(()));
        lcore.join().unwrap();
    });
}

// Negative controls: each breaks one step of the gate; loom must find the interleaving where a
// burst and the sweep touch the ring unordered.

/// The resetter's store→load fence: the Dekker pair fails, a burst runs during the sweep.
#[test]
#[should_panic(expected = "Causality violation")]
fn no_reset_fence_is_caught() {
    one_queue(Some(Step::ResetFence), 1, 1, PATIENT);
}

/// The queue's store→load fence (a plain Release store instead of the xchg): the same, from the
/// other side.
#[test]
#[should_panic(expected = "Causality violation")]
fn no_queue_fence_is_caught() {
    one_queue(Some(Step::QueueFence), 1, 1, PATIENT);
}

/// `exit` Relaxed: the reset sees the queue idle but not the burst's accesses.
#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_exit_is_caught() {
    one_queue(Some(Step::ExitRelease), 1, 1, PATIENT);
}

/// The reset's end Relaxed: a restarted burst sees the new generation but not the sweep.
#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_end_of_reset_is_caught() {
    one_queue(Some(Step::EndRelease), 1, 1, PATIENT);
}
