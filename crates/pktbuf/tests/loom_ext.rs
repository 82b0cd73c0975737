//! Loom model of external segments' completion flags (`memnic_pktbuf::Completions`, the code
//! `ExtPool` runs): a segment is freed on any thread after its last read of the guest's bytes,
//! and the owner reaps it, after which the guest may rewrite the buffer (it sees the used
//! entry). Under `cfg(loom)` the flags are loom's atomics, so the model runs the pool's code.
//!
//! What is checked: the freeing thread's read of a buffer happens before the owner's rewrite
//! of it (loom reports an unordered pair of accesses to the `UnsafeCell`), each slot is reaped
//! exactly once, and the negative control (the Release taken away) is caught.
//!
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p memnic-pktbuf --test loom_ext --release
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use memnic_pktbuf::Completions;

/// A guest buffer a segment points into.
struct Buf(UnsafeCell<u32>);

// SAFETY: read by the freeing thread, then rewritten by the owner once reaped: the claim this
// model checks (loom reports every access the completion flags do not order).
unsafe impl Sync for Buf {}

/// Two segments out, each freed by its own thread; the owner reaps until both came back and
/// rewrites each buffer as soon as it is reaped.
fn model(complete: fn(&Completions, u32)) {
    loom::model(move || {
        let done = Arc::new(Completions::new(2));
        let bufs = Arc::new([Buf(UnsafeCell::new(1)), Buf(UnsafeCell::new(2))]);
        let freers: Vec<_> = (0..2u32)
            .map(|i| {
                let (done, bufs) = (done.clone(), bufs.clone());
                thread::spawn(move || {
                    // SAFETY: see `Buf`.
                    let v = bufs[i as usize].0.with(|p| unsafe { *p });
                    assert_eq!(v, i + 1, "the guest's bytes, unchanged while held");
                    complete(&done, i);
                })
            })
            .collect();
        let mut seen = [0u32; 2];
        while seen.contains(&0) {
            for i in 0..2u32 {
                if done.take(i) {
                    seen[i as usize] += 1;
                    // SAFETY: see `Buf`.
                    bufs[i as usize].0.with_mut(|p| unsafe { *p = 99 });
                }
            }
            thread::yield_now();
        }
        for f in freers {
            f.join().unwrap();
        }
        for i in 0..2 {
            assert!(!done.take(i), "slot {i} reaped twice");
        }
        assert_eq!(seen, [1, 1]);
    });
}

#[test]
fn a_freed_segments_last_read_comes_before_its_buffer_is_reused_and_each_is_reaped_once() {
    model(Completions::complete);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn negative_control_a_completion_without_release_is_caught() {
    model(Completions::complete_unordered);
}
