//! Loom models of virtio's notifications (virtio 1.x's buffer notification suppression)
//! between our backend and a driver: the call after used entries, with the dequeue's deferred
//! check, and the kick before we sleep. The device side runs the very steps the queues use
//! (`memnic_vhost::notify`: `CallCheck::after_publish`, `CallCheck::settle`, `may_sleep`), on
//! loom's atomics behind the `Suppression` trait; the words are a split ring's (avail.flags
//! NO_INTERRUPT and used.flags NO_NOTIFY, or used_event and avail_event with EVENT_IDX), read
//! as `split.rs` reads them. The packed ring's DISABLE/ENABLE words take the same steps as the
//! split ring's flags. The driver side is the spec's (Linux's `virtqueue_enable_cb` and
//! `virtqueue_kick`, DPDK's virtio PMD alike): a store, a full barrier, a look at the device's
//! word.
//!
//! What is checked: a driver that goes to sleep after turning calls on, with used entries it
//! has not seen, is called after the first of them (after one burst or two, and whether the
//! queue polls again or goes to sleep itself); a device that sleeps after asking for kicks,
//! having seen no chain, is kicked. The controls (a step left out) must be caught. The
//! ring's words are a hand copy of `split.rs`'s reads, not the ring itself (guest memory is
//! reached through `memnic_shm` regions, which loom's atomics cannot stand behind); the
//! packed ring's EVENT_IDX mode (DISABLE, then DESC with its window) is not modelled.
//!
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p memnic-vhost --test loom_notify --release
#![cfg(loom)]

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use loom::sync::atomic::{fence, AtomicU16};
use loom::sync::Arc;
use loom::thread;
use memnic_vhost::notify::{may_sleep, CallCheck, Suppression};
use memnic_vhost::split::{AVAIL_F_NO_INTERRUPT, USED_F_NO_NOTIFY};
use memnic_vhost::vring::need_event;

/// Where the indices start: just below the wrap of their `u16`.
const START: u16 = 0xffff;
/// An event index the driver (or we) left far behind: asks for nothing now.
const STALE: u16 = START.wrapping_sub(100);

/// A split ring's notification words on loom's atomics.
struct Words {
    event_idx: bool,
    /// Whether `fence` fences (false: the control without our fence).
    fenced: bool,
    // The driver's.
    avail_flags: AtomicU16,
    used_event: AtomicU16,
    avail_idx: AtomicU16,
    // Ours.
    used_flags: AtomicU16,
    avail_event: AtomicU16,
    used_idx: AtomicU16,
}

impl Words {
    /// Both sides polling: calls and kicks off.
    fn polling(event_idx: bool, fenced: bool) -> Words {
        Words {
            event_idx,
            fenced,
            avail_flags: AtomicU16::new(AVAIL_F_NO_INTERRUPT),
            used_event: AtomicU16::new(STALE),
            avail_idx: AtomicU16::new(START),
            used_flags: AtomicU16::new(USED_F_NO_NOTIFY),
            avail_event: AtomicU16::new(STALE),
            used_idx: AtomicU16::new(START),
        }
    }
}

/// As `SplitRing` reads and writes them.
impl Suppression for Words {
    fn calls_off(&self) -> bool {
        !self.event_idx && self.avail_flags.load(Relaxed) & AVAIL_F_NO_INTERRUPT != 0
    }
    fn wants_call(&self, old: u16, new: u16) -> bool {
        if self.event_idx {
            need_event(self.used_event.load(Relaxed), new, old)
        } else {
            self.avail_flags.load(Relaxed) & AVAIL_F_NO_INTERRUPT == 0
        }
    }
    fn enable_kicks(&self, pos: u16) {
        if self.event_idx {
            self.avail_event.store(pos, Relaxed);
        } else {
            self.used_flags.store(0, Relaxed);
        }
    }
    fn has_avail(&self, pos: u16) -> bool {
        self.avail_idx.load(Acquire) != pos
    }
    fn fence(&self) {
        if self.fenced {
            fence(SeqCst);
        }
    }
}

/// What the queue does after its publishing bursts.
#[derive(Clone, Copy, PartialEq)]
enum Then {
    /// Nothing: the queue is not polled again (the control for the deferred check).
    Stop,
    /// One more poll, which finds the ring empty.
    Poll,
    /// It goes to sleep for a kick (`wait`), settling the check first.
    Sleep,
}

/// How the device side runs in a call model.
#[derive(Clone, Copy)]
struct Device {
    event_idx: bool,
    /// The dequeue's deferral (`defer` of `after_publish`).
    defer: bool,
    /// Bursts that publish one used entry each.
    bursts: u16,
    then: Then,
    fenced: bool,
}

/// The queue publishes `bursts` used entries, one a burst, then does what `then` says;
/// meanwhile the driver, polling with calls off, turns calls on, fences, and looks at used.idx
/// again: it takes what is new and tries again, or sleeps. A driver that sleeps with entries
/// it has not seen must get a call made after the first of them was published (the call
/// wakes it, and it goes round again; with EVENT_IDX it asked for exactly that call).
fn call_model(d: Device) {
    loom::model(move || {
        let w = Arc::new(Words::polling(d.event_idx, d.fenced));
        // The used index published before our latest call.
        let called_at = Arc::new(AtomicU16::new(START));
        let device = {
            let (w, called_at) = (w.clone(), called_at.clone());
            thread::spawn(move || {
                let mut check = CallCheck::default();
                let mut used = START;
                for _ in 0..d.bursts {
                    let new = used.wrapping_add(1);
                    // SplitRing::publish_used.
                    w.used_idx.store(new, Release);
                    if check.after_publish(&*w, true, d.defer, used, new) {
                        called_at.store(new, Relaxed);
                    }
                    used = new;
                }
                let call = match d.then {
                    Then::Stop => false,
                    Then::Poll => check.after_publish(&*w, false, d.defer, used, used),
                    Then::Sleep => check.settle(&*w),
                };
                if call {
                    called_at.store(used, Relaxed);
                }
            })
        };
        // The driver turns calls on (with EVENT_IDX: a call once used.idx passes what it has
        // seen), then looks at used.idx again after a full barrier; it takes what is new and
        // goes round again, or sleeps.
        let mut seen = START;
        loop {
            if d.event_idx {
                w.used_event.store(seen, Relaxed);
            } else {
                w.avail_flags.store(0, Relaxed);
            }
            fence(SeqCst);
            let idx = w.used_idx.load(Acquire);
            if idx == seen {
                break;
            }
            seen = idx;
        }
        device.join().unwrap();
        let last = START.wrapping_add(d.bursts);
        // Woken, it goes round again: a call after the first entry it has not seen will do.
        let called_past_seen = called_at.load(Relaxed).wrapping_sub(seen) as i16 > 0;
        assert!(
            seen == last || called_past_seen,
            "lost wakeup: the driver sleeps with a used entry it was never called for"
        );
    });
}

/// The device asks for kicks and sleeps if the ring is still empty (`may_sleep`); meanwhile
/// the driver makes a chain available, fences, and kicks if we asked. A device that sleeps
/// must have been kicked.
fn kick_model(event_idx: bool, fenced: bool) {
    loom::model(move || {
        let w = Arc::new(Words::polling(event_idx, fenced));
        let device = {
            let w = w.clone();
            thread::spawn(move || may_sleep(&*w, START))
        };
        let new = START.wrapping_add(1);
        w.avail_idx.store(new, Release);
        fence(SeqCst);
        let kicked = if event_idx {
            need_event(w.avail_event.load(Relaxed), new, START)
        } else {
            w.used_flags.load(Relaxed) & USED_F_NO_NOTIFY == 0
        };
        let sleeps = device.join().unwrap();
        assert!(
            !sleeps || kicked,
            "lost wakeup: we sleep with a chain available and no kick coming"
        );
    });
}

#[test]
fn dequeue_calls_a_driver_that_turned_calls_on() {
    for bursts in [1, 2] {
        call_model(Device {
            event_idx: false,
            defer: true,
            bursts,
            then: Then::Poll,
            fenced: true,
        });
    }
}

/// A queue that goes to sleep right after a deferred burst (`wait`) makes the call first.
#[test]
fn dequeue_settles_a_deferred_check_before_it_sleeps() {
    call_model(Device {
        event_idx: false,
        defer: true,
        bursts: 1,
        then: Then::Sleep,
        fenced: true,
    });
}

/// With EVENT_IDX the split ring never defers (its calls are never all off), so dequeue
/// fences every publish as enqueue does.
#[test]
fn dequeue_with_event_idx_calls_once_used_event_is_passed() {
    for bursts in [1, 2] {
        call_model(Device {
            event_idx: true,
            defer: true,
            bursts,
            then: Then::Stop,
            fenced: true,
        });
    }
}

#[test]
fn enqueue_calls_without_a_next_poll() {
    for event_idx in [false, true] {
        call_model(Device {
            event_idx,
            defer: false,
            bursts: 2,
            then: Then::Stop,
            fenced: true,
        });
    }
}

#[test]
fn a_sleeping_device_is_kicked() {
    kick_model(false, true);
    kick_model(true, true);
}

/// Control: the deferred check is only sound because the queue is polled again (or settles
/// before it sleeps); without either a driver that turned calls on as we published sleeps
/// uncalled, and loom must say so.
#[test]
#[should_panic(expected = "lost wakeup")]
fn deferred_check_without_a_next_poll_is_caught() {
    call_model(Device {
        event_idx: false,
        defer: true,
        bursts: 1,
        then: Then::Stop,
        fenced: true,
    });
}

/// Control: without our fence between publishing and looking at the driver's flags, both
/// sides can read the other's old word (store buffering).
#[test]
#[should_panic(expected = "lost wakeup")]
fn call_without_our_fence_is_caught() {
    call_model(Device {
        event_idx: false,
        defer: false,
        bursts: 1,
        then: Then::Stop,
        fenced: false,
    });
}

/// Control: the same with EVENT_IDX.
#[test]
#[should_panic(expected = "lost wakeup")]
fn event_idx_call_without_our_fence_is_caught() {
    call_model(Device {
        event_idx: true,
        defer: false,
        bursts: 1,
        then: Then::Stop,
        fenced: false,
    });
}

/// Control: asking for kicks and looking at avail.idx without a fence between.
#[test]
#[should_panic(expected = "lost wakeup")]
fn kick_without_our_fence_is_caught() {
    kick_model(false, false);
}

/// Control: the same with EVENT_IDX (avail_event).
#[test]
#[should_panic(expected = "lost wakeup")]
fn event_idx_kick_without_our_fence_is_caught() {
    kick_model(true, false);
}
