//! Notifications both ways (virtio 1.x: the split ring's used and available buffer
//! notification suppression, the packed ring's event suppression structures): when we call
//! the driver after handing back used entries, and when we may sleep waiting for its kick.
//! Each is a store→load handshake with the driver's own (Dekker's pattern): one side writes
//! its index or its wish, a full fence, then reads the other's; with both fences, at least one
//! side sees the other's store, so a chain is never left unseen by a sleeper.
//!
//! The steps are generic over [`Suppression`], the words of a ring they read and write, so the
//! loom model in `tests/loom_notify.rs` runs these very steps on loom's atomics beside a
//! driver written from the spec (`queue` runs them on the guest's memory).

/// The words of a virtqueue the notification steps use, and the fence between them.
pub trait Suppression {
    /// Whether the driver turned every call off (packed: DISABLE; split without EVENT_IDX:
    /// NO_INTERRUPT; never with EVENT_IDX on the split ring). Relaxed: a look before or after
    /// [`Suppression::fence`], as the step needs.
    fn calls_off(&self) -> bool;
    /// After [`Suppression::fence`]: whether the driver wants a call for the used position
    /// moving from `old` to `new`.
    fn wants_call(&self, old: u16, new: u16) -> bool;
    /// Asks the driver to kick once it makes a chain available at `pos`.
    fn enable_kicks(&self, pos: u16);
    /// After [`Suppression::fence`]: whether a chain is available at `pos`.
    fn has_avail(&self, pos: u16) -> bool;
    /// The full fence (store→load) between our stores and our looks at the driver's words.
    /// Calls: our used index (or the packed used flags) before our look at the driver's call
    /// suppression, pairing with the driver's fence between turning calls on (avail.flags,
    /// used_event, its event structure) and looking at our used index again. Kicks: our kick
    /// request (used.flags, avail_event, our event structure) before our look at the ring,
    /// pairing with the driver's fence between making a chain available and looking at our
    /// request.
    fn fence(&self);
}

/// Whether a queue owes the driver a look at its call suppression.
#[derive(Debug, Default)]
pub struct CallCheck {
    /// Entries went out without the fenced look (see [`CallCheck::after_publish`]).
    due: bool,
}

impl CallCheck {
    /// A check owed by a queue whose last burst deferred it ([`CallCheck::is_due`]), for the
    /// control thread to settle once the queue stops polling that ring.
    pub fn owed() -> CallCheck {
        CallCheck { due: true }
    }

    /// Whether a burst deferred its look at the driver's call suppression (see
    /// [`CallCheck::after_publish`]) and no poll has made it since.
    #[inline(always)]
    pub fn is_due(&self) -> bool {
        self.due
    }

    /// After a burst that published used entries (`published`, the used position moving from
    /// `old` to `new`) or none: whether to call the driver.
    ///
    /// With `defer` (dequeue, whose queue is polled again and again, empty or not), a burst
    /// whose unfenced look finds every call off (DPDK's virtio PMD polls with calls off) skips
    /// the fence and leaves the question to the queue's next poll: the next burst that
    /// publishes, or the next empty one, fences and calls if the driver turned calls on
    /// meanwhile; a queue about to sleep instead settles it first ([`CallCheck::settle`]). The
    /// look may be stale only for a driver that turned calls on as we published and then
    /// missed our entries; it sleeps until that next poll, a loop later (longer only while the
    /// queue is not polled at all: its port stopped or parked for a reconfiguration; a ring
    /// taken from its queue, stopped or replaced, has the check made by the control thread
    /// instead). Without `defer` (enqueue: nothing promises a next `tx_burst`) every publish
    /// fences.
    #[inline(always)]
    pub fn after_publish(
        &mut self,
        ring: &impl Suppression,
        published: bool,
        defer: bool,
        old: u16,
        new: u16,
    ) -> bool {
        if !published && !self.due {
            return false;
        }
        if defer && published && ring.calls_off() {
            self.due = true;
            return false;
        }
        // Our used entries before our look at whether the driver wants them (store→load):
        // pairs with the driver's fence between turning calls on and looking at our used
        // index again, so either it sees our entries or we see its calls on.
        ring.fence();
        let wants = if self.due {
            // Some of the entries since the last check went out unchecked: the driver gets a
            // call if it takes any (one more than it asked for at worst).
            !ring.calls_off()
        } else {
            ring.wants_call(old, new)
        };
        self.due = false;
        wants
    }

    /// Before the queue stops polling (it sleeps for a kick): the check a deferred burst left
    /// for its next poll, made now; true if the driver is to be called.
    #[inline]
    pub fn settle(&mut self, ring: &impl Suppression) -> bool {
        self.after_publish(ring, false, false, 0, 0)
    }
}

/// Before sleeping on the kick eventfd with the next chain expected at `pos`: asks the driver
/// to kick, then looks at the ring again; true if it is still empty, so that sleeping is safe
/// (a chain made available after the look comes with a kick). The caller turns kicks off
/// again ([`crate::vring::Vring::disable_kicks`]) when it wakes.
#[inline]
pub fn may_sleep(ring: &impl Suppression, pos: u16) -> bool {
    ring.enable_kicks(pos);
    // Our request before we look at the ring again (store→load): pairs with the driver's full
    // barrier between making a chain available and reading whether we want a kick, so either
    // we see its chain or it sees our request and kicks.
    ring.fence();
    !ring.has_avail(pos)
}
