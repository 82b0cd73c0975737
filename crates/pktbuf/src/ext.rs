//! [`ExtPool`]: external segments, memory we do not own handed up the stack without a copy
//! (DPDK's `rte_pktmbuf_attach_extbuf` with its free callback).
//!
//! The owner (the lcore polling one queue) attaches a range of a peer's region as a read-only
//! [`Mbuf`] with a `tag` (a vhost descriptor head, say). Whoever frees that segment, on whatever
//! thread and in whatever order relative to the rest of its chain, sets its slot's completion
//! flag: exactly once, because an `Mbuf` is not `Clone`. The owner collects the tags with
//! [`ExtPool::reap`], which looks at the flags of the slots it has out, and reuses the slots.
//! Nothing is allocated and no lock or read-modify-write is taken per segment: slots are
//! preallocated, a free is one Release store, and a reap costs one load per segment out.
//!
//! Each slot keeps the region it last pointed into (an `Arc`, replaced only when a later attach
//! names another region), so a mapping stays mapped while any segment can still read it; a
//! replaced memory table is unmapped only once every segment into it has come back and its slot
//! was reused or [`ExtPool::release_idle_regions`] ran. If the pool is dropped with segments still
//! out, it is leaked (and those regions stay mapped) rather than freed under them.

use std::ptr::NonNull;
use std::sync::Arc;

use memnic_shm::Region;

use crate::mbuf::{Links, Mbuf};

/// Why an external segment could not be attached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtError {
    #[error("external pool {name}: all {slots} slots are out (free some packets first)")]
    Exhausted { name: String, slots: u32 },
    #[error("external pool {name}: {len} bytes at offset {offset:#x} are not inside the {region_len}-byte region")]
    OutOfBounds {
        name: String,
        offset: usize,
        len: usize,
        region_len: usize,
    },
}

/// The atomics of [`Completions`]: std's, or loom's under `cfg(loom)`, so that the model in
/// `tests/loom_ext.rs` runs this very code.
mod sync {
    #[cfg(loom)]
    pub(super) use loom::sync::atomic::AtomicBool;
    #[cfg(not(loom))]
    pub(super) use std::sync::atomic::AtomicBool;
}

/// The completion flags of an external pool's slots: set by whoever frees a slot's segment (any
/// thread), taken by the owner when it reaps. The one cross-thread protocol of external
/// segments: a flag set with Release and seen with Acquire puts the freeing thread's last read
/// of the segment's bytes before the owner reports the slot, after which the peer may rewrite
/// the buffer.
#[doc(hidden)]
pub struct Completions(Box<[sync::AtomicBool]>);

impl Completions {
    pub fn new(slots: u32) -> Completions {
        Completions((0..slots).map(|_| sync::AtomicBool::new(false)).collect())
    }

    /// Slot `idx`'s segment was freed (once per attach).
    #[inline(always)]
    pub fn complete(&self, idx: u32) {
        use std::sync::atomic::Ordering::{Relaxed, Release};
        let flag = &self.0[idx as usize];
        debug_assert!(
            !flag.load(Relaxed),
            "a slot completes at most once per attach"
        );
        // Release: pairs with the Acquire in `take`; the reads of the segment come first. A
        // plain store: a swap would be a locked instruction, a full barrier per segment freed.
        flag.store(true, Release);
    }

    /// The negative control of the loom model: `complete` with the Release taken away.
    #[cfg(loom)]
    pub fn complete_unordered(&self, idx: u32) {
        self.0[idx as usize].store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether slot `idx` completed since it was last taken; if so it is the owner's again.
    #[inline(always)]
    pub fn take(&self, idx: u32) -> bool {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let flag = &self.0[idx as usize];
        // Acquire: pairs with the Release in `complete`.
        if !flag.load(Acquire) {
            return false;
        }
        // Relaxed: no one else writes the flag until the owner attaches the slot again, and
        // that attach (this thread) hands the segment over with its own synchronisation.
        flag.store(false, Relaxed);
        true
    }

    /// Whether slot `idx` completed, without taking it.
    pub fn is_done(&self, idx: u32) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        // Relaxed: a count for statistics; `take` orders what follows a completion.
        self.0[idx as usize].load(Relaxed)
    }
}

/// The part of an external pool that segments reach from any thread.
pub(crate) struct ExtInner {
    pub(crate) links: Links,
    done: Completions,
}

impl ExtInner {
    #[inline(always)]
    pub(crate) fn complete(&self, idx: u32) {
        self.done.complete(idx);
    }
}

/// External segments of one queue; owned by the lcore that attaches and reaps.
pub struct ExtPool {
    inner: NonNull<ExtInner>,
    name: String,
    free: Vec<u32>,
    /// Slots attached and not yet reaped.
    out: Vec<u32>,
    tags: Box<[u64]>,
    regions: Box<[Option<Arc<Region>>]>,
    outstanding: u32,
}

// SAFETY: ExtInner is Sync (links: see Links; done: a lock-free queue); the rest is owned.
unsafe impl Send for ExtPool {}

impl std::fmt::Debug for ExtPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtPool")
            .field("name", &self.name)
            .field("slots", &self.tags.len())
            .field("outstanding", &self.outstanding)
            .finish()
    }
}

impl ExtPool {
    /// A pool of `slots` external segments (at least one).
    pub fn new(name: impl Into<String>, slots: u32) -> ExtPool {
        let slots = slots.max(1);
        let inner = Box::new(ExtInner {
            links: Links::new(slots),
            done: Completions::new(slots),
        });
        ExtPool {
            inner: NonNull::from(Box::leak(inner)),
            name: name.into(),
            free: (0..slots).rev().collect(),
            out: Vec::with_capacity(slots as usize),
            tags: vec![0; slots as usize].into_boxed_slice(),
            regions: (0..slots).map(|_| None).collect(),
            outstanding: 0,
        }
    }

    #[inline(always)]
    fn inner(&self) -> &ExtInner {
        // SAFETY: the allocation lives until this pool's drop (or forever, if leaked there).
        unsafe { self.inner.as_ref() }
    }

    pub fn capacity(&self) -> u32 {
        self.tags.len() as u32
    }

    /// Segments attached and not yet reaped (out in the stack, or freed and queued).
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// Segments freed and waiting for [`ExtPool::reap`] (one load per segment out).
    pub fn pending(&self) -> usize {
        let done = &self.inner().done;
        self.out.iter().filter(|&&i| done.is_done(i)).count()
    }

    /// A read-only segment over `len` bytes at `offset` of `region`, carrying `tag`.
    #[inline(always)]
    pub fn attach(
        &mut self,
        region: &Arc<Region>,
        offset: usize,
        len: u32,
        tag: u64,
    ) -> Result<Mbuf, ExtError> {
        let window = region
            .slice(offset, len as usize)
            .map_err(|_| ExtError::OutOfBounds {
                name: self.name.clone(),
                offset,
                len: len as usize,
                region_len: region.len(),
            })?;
        let Some(idx) = self.free.pop() else {
            return Err(self.exhausted());
        };
        let slot = idx as usize;
        self.tags[slot] = tag;
        if !self.regions[slot]
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, region))
        {
            self.regions[slot] = Some(region.clone());
        }
        self.outstanding += 1;
        self.out.push(idx);
        let buf = NonNull::new(window.addr() as *mut u8).expect("inside a mapping");
        Ok(Mbuf::from_ext(self.inner, idx, buf, len))
    }

    #[cold]
    fn exhausted(&self) -> ExtError {
        ExtError::Exhausted {
            name: self.name.clone(),
            slots: self.capacity(),
        }
    }

    /// Appends the tags of the segments freed since the last call to `out` (in no particular
    /// order) and makes their slots reusable; returns how many.
    #[inline(always)]
    pub fn reap(&mut self, out: &mut Vec<u64>) -> usize {
        // SAFETY: the allocation lives until this pool's drop (see `inner`); borrowed apart from
        // the fields the loop changes.
        let done = unsafe { &self.inner.as_ref().done };
        let mut n = 0;
        let mut i = 0;
        while i < self.out.len() {
            let idx = self.out[i];
            if done.take(idx) {
                out.push(self.tags[idx as usize]);
                self.free.push(idx);
                self.out.swap_remove(i);
                n += 1;
            } else {
                i += 1;
            }
        }
        self.outstanding -= n as u32;
        n
    }

    /// Drops the region handles of slots not in use, so a replaced memory table can be unmapped
    /// once no segment points into it. Returns whether any slot still holds a region (some
    /// segment is still out).
    pub fn release_idle_regions(&mut self) -> bool {
        for &idx in &self.free {
            self.regions[idx as usize] = None;
        }
        self.regions.iter().any(|r| r.is_some())
    }
}

impl Drop for ExtPool {
    fn drop(&mut self) {
        let mut tags = Vec::new();
        self.reap(&mut tags);
        if self.outstanding == 0 {
            // SAFETY: every segment came back (none can reach the allocation any more), and the
            // pointer came from Box::leak in new.
            drop(unsafe { Box::from_raw(self.inner.as_ptr()) });
        } else {
            // Segments are still out: they will complete into a queue no one reads, and the
            // regions they point into must stay mapped, so both are leaked.
            std::mem::forget(std::mem::take(&mut self.regions));
        }
    }
}
