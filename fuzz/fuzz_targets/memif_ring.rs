//! Fuzz target: the memif data path (every burst kind, both roles, copy and zero copy) against a
//! peer that writes arbitrary bytes into the rings, descriptors, buffers and counters.
//!
//! Run from `fuzz/` (needs `cargo install cargo-fuzz` and a nightly toolchain):
//! `cargo +nightly fuzz run memif_ring corpus/memif_ring seeds/memif_ring -- -max_total_time=60`.
//!
//! The input is a program for the harness of `crates/memif/tests/harness/mod.rs`, the same one
//! `tests/ring_harness.rs` runs under proptest (and which runs every seed here as a test).
//! Contract: no input panics; every burst does exactly what the harness's reference model of
//! `specs/memif.md` says: the frames handed up, the frames sent, every byte written into the
//! shared region, the counters, and the DISCONNECT reason of each violation.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/memif/tests/harness/mod.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    harness::run_reusing(data);
});
