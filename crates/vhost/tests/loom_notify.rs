//! Loom models of virtio's notifications (virtio 1.x's buffer notification suppression)
//! between our backend and a driver: the call after used entries, with the dequeue's deferred
//! check, and the kick before we sleep. The device side runs the very steps the queues use
//! (`memnic_vhost::notify`: `CallCheck::after_publish`, `CallCheck::settle`, `may_sleep`), on
//! loom's atomics behind the `Suppression` trait. The words are a split ring's (avail.flags
//! NO_INTERRUPT and used.flags NO_NOTIFY, or used_event and avail_event with EVENT_IDX) or, for
//! calls, a packed ring's driver event structure (DISABLE, ENABLE, or DESC with off_wrap, its
//! window judged by `packed::wants_call_for`, the function the ring uses), read in the order
//! the rings read them; the used position stands for the used index or the burst's head
//! flags. The driver side is the spec's (Linux's `virtqueue_enable_cb` and `virtqueue_kick`,
//! DPDK's virtio PMD alike): a store, a full barrier, a look at the device's word.
//!
//! What is checked: a driver that goes to sleep after turning calls on, with used entries it
//! has not seen, is called after the first of them (after one burst or two, whether the
//! queue polls again or goes to sleep itself, on either layout, with and without EVENT_IDX;
//! the packed ring's used position wraps); a device that sleeps after asking for kicks,
//! having seen no chain, is kicked (split words). The controls (a step left out) must be
//! caught. The words' loads are a hand copy of the rings' (written before the rings reached
//! guest memory through `RingMemory`, on which `loom_handoff.rs` runs their own accessors).
//!
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p memnic-vhost --test loom_notify --release
#![cfg(loom)]

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use loom::sync::atomic::{fence, AtomicU16};
use loom::sync::Arc;
use loom::thread;
use memnic_vhost::notify::{may_sleep, CallCheck, Suppression};
use memnic_vhost::packed::{wants_call_for, EVENT_F_DESC, EVENT_F_DISABLE, EVENT_F_ENABLE, WRAP};
use memnic_vhost::split::{AVAIL_F_NO_INTERRUPT, USED_F_NO_NOTIFY};
use memnic_vhost::vring::need_event;

/// Where the split ring's indices start: just below the wrap of their `u16`.
const START: u16 = 0xffff;
/// An event index the driver (or we) left far behind: asks for nothing now.
const STALE: u16 = START.wrapping_sub(100);
/// The packed ring's size in the model, and where its used position starts: its last slot,
/// wrap counter 1, so the first entry wraps the ring.
const PACKED_SIZE: u16 = 4;
const PACKED_START: u16 = (PACKED_SIZE - 1) | WRAP;

/// Which ring's words.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    Split,
    Packed,
}

/// A ring's notification words on loom's atomics: the split ring's, or the packed ring's
/// event suppression structures (calls only: the packed kick side takes no index).
struct Words {
    layout: Layout,
    event_idx: bool,
    /// Whether `fence` fences (false: the control without our fence).
    fenced: bool,
    // The driver's: split avail.flags / packed driver event flags; split used_event / packed
    // off_wrap; avail.idx.
    call_flags: AtomicU16,
    call_event: AtomicU16,
    avail_idx: AtomicU16,
    // Ours.
    used_flags: AtomicU16,
    avail_event: AtomicU16,
    /// Where our used entries end (split used.idx; packed: the slot and wrap counter after
    /// the last used descriptor, standing for that descriptor's flags).
    used: AtomicU16,
}

impl Words {
    /// Both sides polling: calls and kicks off.
    fn polling(layout: Layout, event_idx: bool, fenced: bool) -> Words {
        let (call_flags, start) = match layout {
            Layout::Split => (AVAIL_F_NO_INTERRUPT, START),
            Layout::Packed => (EVENT_F_DISABLE, PACKED_START),
        };
        Words {
            layout,
            event_idx,
            fenced,
            call_flags: AtomicU16::new(call_flags),
            call_event: AtomicU16::new(STALE),
            avail_idx: AtomicU16::new(START),
            used_flags: AtomicU16::new(USED_F_NO_NOTIFY),
            avail_event: AtomicU16::new(STALE),
            used: AtomicU16::new(start),
        }
    }

    /// The used position after `pos`, one entry on.
    fn next(&self, pos: u16) -> u16 {
        match self.layout {
            Layout::Split => pos.wrapping_add(1),
            Layout::Packed if pos & !WRAP == PACKED_SIZE - 1 => (pos & WRAP) ^ WRAP,
            Layout::Packed => pos + 1,
        }
    }

    /// The driver turns calls on, asking (with EVENT_IDX) for a call once the entry at `seen`
    /// is used: split, used_event then nothing more; packed (Linux's
    /// `virtqueue_enable_cb_prepare_packed`), off_wrap, a write barrier, then the flags.
    fn driver_enables_calls(&self, seen: u16) {
        match (self.layout, self.event_idx) {
            (Layout::Split, true) => self.call_event.store(seen, Relaxed),
            (Layout::Split, false) => self.call_flags.store(0, Relaxed),
            (Layout::Packed, true) => {
                self.call_event.store(seen, Relaxed);
                self.call_flags.store(EVENT_F_DESC, Release);
            }
            (Layout::Packed, false) => self.call_flags.store(EVENT_F_ENABLE, Relaxed),
        }
    }
}

/// As `SplitRing` and `PackedRing` read and write them.
impl Suppression for Words {
    fn calls_off(&self) -> bool {
        match self.layout {
            Layout::Split => {
                !self.event_idx && self.call_flags.load(Relaxed) & AVAIL_F_NO_INTERRUPT != 0
            }
            Layout::Packed => self.call_flags.load(Relaxed) == EVENT_F_DISABLE,
        }
    }
    fn wants_call(&self, old: u16, new: u16) -> bool {
        match self.layout {
            Layout::Split if self.event_idx => need_event(self.call_event.load(Relaxed), new, old),
            Layout::Split => self.call_flags.load(Relaxed) & AVAIL_F_NO_INTERRUPT == 0,
            Layout::Packed => {
                // PackedRing::driver_event: off_wrap, then flags.
                let off_wrap = self.call_event.load(Relaxed);
                let flags = self.call_flags.load(Relaxed);
                wants_call_for(PACKED_SIZE, off_wrap, flags, old, new, self.event_idx)
            }
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
    layout: Layout,
    event_idx: bool,
    /// The dequeue's deferral (`defer` of `after_publish`).
    defer: bool,
    /// Bursts that publish one used entry each.
    bursts: u16,
    then: Then,
    fenced: bool,
}

/// One dequeue burst on a split ring without EVENT_IDX, deferring, then nothing: the cases
/// below say how they differ from it.
const DEQUEUE: Device = Device {
    layout: Layout::Split,
    event_idx: false,
    defer: true,
    bursts: 1,
    then: Then::Stop,
    fenced: true,
};

/// Enqueue: every publish fences, nothing promises a next burst.
const ENQUEUE: Device = Device {
    defer: false,
    ..DEQUEUE
};

/// The queue publishes `bursts` used entries, one a burst, then does what `then` says;
/// meanwhile the driver, polling with calls off, turns calls on, fences, and looks at used.idx
/// again: it takes what is new and tries again, or sleeps. A driver that sleeps with entries
/// it has not seen must get a call made after the first of them was published (the call
/// wakes it, and it goes round again; with EVENT_IDX it asked for exactly that call).
fn call_model(d: Device) {
    loom::model(move || {
        let w = Arc::new(Words::polling(d.layout, d.event_idx, d.fenced));
        // The used positions, entry by entry.
        let mut positions = vec![w.used.load(Relaxed)];
        for _ in 0..d.bursts {
            positions.push(w.next(*positions.last().unwrap()));
        }
        // Entries published before our latest call.
        let called_at = Arc::new(AtomicU16::new(0));
        let device = {
            let (w, called_at, positions) = (w.clone(), called_at.clone(), positions.clone());
            thread::spawn(move || {
                let mut check = CallCheck::default();
                for n in 1..=d.bursts {
                    let (old, new) = (positions[n as usize - 1], positions[n as usize]);
                    // SplitRing::publish_used, PackedRing::publish (the burst's head flags).
                    w.used.store(new, Release);
                    if check.after_publish(&*w, true, d.defer, old, new) {
                        called_at.store(n, Relaxed);
                    }
                }
                let last = positions[d.bursts as usize];
                let call = match d.then {
                    Then::Stop => false,
                    Then::Poll => check.after_publish(&*w, false, d.defer, last, last),
                    Then::Sleep => check.settle(&*w),
                };
                if call {
                    called_at.store(d.bursts, Relaxed);
                }
            })
        };
        // The driver turns calls on (with EVENT_IDX: a call once the entry it expects next is
        // used), then looks at the used ring again after a full barrier; it takes what is new
        // and goes round again, or sleeps.
        let mut seen = positions[0];
        loop {
            w.driver_enables_calls(seen);
            fence(SeqCst);
            let now = w.used.load(Acquire);
            if now == seen {
                break;
            }
            seen = now;
        }
        device.join().unwrap();
        let seen_n = positions.iter().position(|&p| p == seen).unwrap() as u16;
        // Woken, it goes round again: a call after the first entry it has not seen will do.
        assert!(
            seen_n == d.bursts || called_at.load(Relaxed) > seen_n,
            "lost wakeup: the driver sleeps with a used entry it was never called for"
        );
    });
}

/// The device asks for kicks and sleeps if the ring is still empty (`may_sleep`); meanwhile
/// the driver makes a chain available, fences, and kicks if we asked. A device that sleeps
/// must have been kicked.
fn kick_model(event_idx: bool, fenced: bool) {
    loom::model(move || {
        let w = Arc::new(Words::polling(Layout::Split, event_idx, fenced));
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
            bursts,
            then: Then::Poll,
            ..DEQUEUE
        });
    }
}

/// A queue that goes to sleep right after a deferred burst (`wait`) makes the call first.
#[test]
fn dequeue_settles_a_deferred_check_before_it_sleeps() {
    call_model(Device {
        then: Then::Sleep,
        ..DEQUEUE
    });
}

/// With EVENT_IDX the split ring never defers (its calls are never all off), so dequeue
/// fences every publish as enqueue does.
#[test]
fn dequeue_with_event_idx_calls_once_used_event_is_passed() {
    for bursts in [1, 2] {
        call_model(Device {
            event_idx: true,
            bursts,
            ..DEQUEUE
        });
    }
}

#[test]
fn enqueue_calls_without_a_next_poll() {
    for event_idx in [false, true] {
        call_model(Device {
            event_idx,
            bursts: 2,
            ..ENQUEUE
        });
    }
}

/// The packed ring defers with EVENT_IDX too (the driver polls with DISABLE and asks for a
/// call at a descriptor with DESC), and its used position wraps the ring in the model.
#[test]
fn packed_dequeue_calls_a_driver_that_turned_calls_on() {
    for (event_idx, bursts) in [(false, 1), (false, 2), (true, 1), (true, 2)] {
        for then in [Then::Poll, Then::Sleep] {
            call_model(Device {
                layout: Layout::Packed,
                event_idx,
                bursts,
                then,
                ..DEQUEUE
            });
        }
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
    call_model(DEQUEUE);
}

/// Control: the same on the packed ring with EVENT_IDX.
#[test]
#[should_panic(expected = "lost wakeup")]
fn packed_deferred_check_without_a_next_poll_is_caught() {
    call_model(Device {
        layout: Layout::Packed,
        event_idx: true,
        ..DEQUEUE
    });
}

/// Control: without our fence between publishing and looking at the driver's flags, both
/// sides can read the other's old word (store buffering).
#[test]
#[should_panic(expected = "lost wakeup")]
fn call_without_our_fence_is_caught() {
    call_model(Device {
        fenced: false,
        ..ENQUEUE
    });
}

/// Control: the same with EVENT_IDX.
#[test]
#[should_panic(expected = "lost wakeup")]
fn event_idx_call_without_our_fence_is_caught() {
    call_model(Device {
        event_idx: true,
        fenced: false,
        ..ENQUEUE
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
