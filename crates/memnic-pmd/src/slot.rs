//! The per-slot handshake (`specs/memnic.md` §5–§6), as the small steps both sides compose.
//!
//! Each step names the order it needs. They are generic over [`StatusWord`] so the loom model in
//! `tests/loom_slot.rs` runs exactly these steps with loom's atomics.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::layout::{PKT_ST_FILLED, PKT_ST_FREE, PKT_ST_USED};

/// A slot's `status` word.
pub trait StatusWord {
    fn load(&self, o: core::sync::atomic::Ordering) -> u32;
    fn store(&self, v: u32, o: core::sync::atomic::Ordering);
    fn compare_exchange(
        &self,
        cur: u32,
        new: u32,
        s: core::sync::atomic::Ordering,
        f: core::sync::atomic::Ordering,
    ) -> Result<u32, u32>;
}

impl StatusWord for core::sync::atomic::AtomicU32 {
    #[inline(always)]
    fn load(&self, o: core::sync::atomic::Ordering) -> u32 {
        self.load(o)
    }
    #[inline(always)]
    fn store(&self, v: u32, o: core::sync::atomic::Ordering) {
        self.store(v, o)
    }
    #[inline(always)]
    fn compare_exchange(
        &self,
        cur: u32,
        new: u32,
        s: core::sync::atomic::Ordering,
        f: core::sync::atomic::Ordering,
    ) -> Result<u32, u32> {
        self.compare_exchange(cur, new, s, f)
    }
}

/// Consumer: is the slot ours? Only FILLED means yes; FREE, USED and garbage mean "not yet".
#[inline(always)]
pub fn is_filled(s: &impl StatusWord) -> bool {
    // Acquire pairs with the producer's Release in `publish`: len/data loads that follow see the
    // producer's writes (C1).
    s.load(Acquire) == PKT_ST_FILLED
}

/// Consumer: hand the slot back after reading it.
#[inline(always)]
pub fn release(s: &impl StatusWord) {
    // Release pairs with the producer's Acquire in `claim_single`/`claim_shared`: our len/data
    // loads complete before the producer may overwrite them (C2).
    s.store(PKT_ST_FREE, Release)
}

/// Single producer: the slot is free to write. No store is needed (nobody else writes a FREE
/// slot of this ring), so this is a plain load on x86.
#[inline(always)]
pub fn claim_single(s: &impl StatusWord) -> bool {
    // Acquire pairs with the consumer's Release in `release` (C2).
    s.load(Acquire) == PKT_ST_FREE
}

/// Several producers: claim FREE → USED atomically. On failure returns the value seen.
#[inline(always)]
pub fn claim_shared(s: &impl StatusWord) -> Result<(), u32> {
    // Acquire on success pairs with the consumer's Release in `release` (C2); a failed claim
    // reads nothing from the slot, so Relaxed.
    s.compare_exchange(PKT_ST_FREE, PKT_ST_USED, Acquire, Relaxed)
        .map(|_| ())
}

/// Producer: undo a claim (the multi-producer false positive).
#[inline(always)]
pub fn unclaim(s: &impl StatusWord) {
    // Release, although nothing was written under this claim: the claim's Acquire synchronized
    // with the consumer's `release` of the frame before, and a plain store does not continue
    // that release sequence. The next producer's Acquire claim pairs with this store, so its
    // payload writes stay ordered after the consumer's reads (C2). Relaxed here is a data race
    // (tests/loom_slot.rs, two_producers_false_positive_then_reuse).
    s.store(PKT_ST_FREE, Release)
}

/// Producer: publish the slot after writing len and data.
#[inline(always)]
pub fn publish(s: &impl StatusWord) {
    // Release pairs with the consumer's Acquire in `is_filled` (P1).
    s.store(PKT_ST_FILLED, Release)
}

/// Host reset sweep: every slot FREE.
#[inline(always)]
pub fn sweep(s: &impl StatusWord) -> bool {
    // Relaxed: the sweep is published as a whole by the Release store of `valid = 1`.
    let was_filled = s.load(Relaxed) == PKT_ST_FILLED;
    s.store(PKT_ST_FREE, Relaxed);
    was_filled
}
