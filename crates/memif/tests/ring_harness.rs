//! The data-path harness under proptest: arbitrary programs of ring writes, counter writes and
//! bursts of every kind, in both roles (`tests/harness/mod.rs` says what is checked).

mod harness;

use harness::{run, Kind};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any bytes: a program over any kind, ring size and buffer size.
    #[test]
    fn arbitrary_programs_match_the_model(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        run(&data);
    }
}

/// xorshift64*: a fixed stream of programs, the same on every run.
fn programs(n: usize, len: usize) -> impl Iterator<Item = Vec<u8>> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n).map(move |_| {
        (0..len)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
            })
            .collect()
    })
}

/// The harness is not vacuous: over a fixed set of random programs, every kind moves frames
/// both ways and every check the peer can trigger fires (each one asserted by the model).
#[test]
fn random_programs_reach_every_check_and_move_frames() {
    use std::collections::BTreeMap;
    let mut per_kind: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let mut reasons: BTreeMap<&'static str, u64> = BTreeMap::new();
    for p in programs(2000, 400) {
        let h = run(&p);
        let e = per_kind.entry(format!("{:?}", h.kind)).or_default();
        e.0 += h.frames_rx;
        e.1 += h.frames_tx;
        e.2 += h.violations;
        for r in h.reasons {
            *reasons.entry(r).or_default() += 1;
        }
    }
    println!("{per_kind:?}\n{reasons:#?}");
    for kind in [Kind::Server, Kind::ClientCopy, Kind::ClientZeroCopy] {
        let (rx, tx, bad) = per_kind[&format!("{kind:?}")];
        assert!(
            rx > 100 && tx > 100 && bad > 10,
            "{kind:?}: rx {rx} tx {tx} violations {bad}"
        );
    }
    for r in [
        "Ring head out of range",
        "Ring tail passed head",
        "Ring tail out of range",
        "Chained buffer runs past head",
        "Chained buffer runs past tail",
        "Descriptor outside its region",
        "Descriptor longer than its buffer",
        "Descriptor with no room",
    ] {
        assert!(reasons.contains_key(r), "never reached: {r}");
    }
}

/// The fuzz target's seeds (`fuzz/seeds/memif_ring`) run clean, and the traffic seeds move
/// frames both ways.
#[test]
fn fuzz_seeds_run_clean() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/memif_ring");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let h = run(&std::fs::read(&path).unwrap());
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with("_traffic") {
            assert!(
                h.frames_rx >= 3 && h.frames_tx >= 3,
                "{name}: rx {} tx {}",
                h.frames_rx,
                h.frames_tx
            );
            assert_eq!(h.violations, 0, "{name}: {:?}", h.reasons);
        } else {
            let want = match name.as_str() {
                "server_wild_head" => "Ring head out of range",
                "client_chain_past_tail" => "Chained buffer runs past tail",
                "server_desc_outside" => "Descriptor outside its region",
                other => panic!("a seed without an expectation: {other}"),
            };
            assert_eq!(h.reasons.first(), Some(&want), "{name}");
        }
        n += 1;
    }
    assert!(n >= 6, "seeds in {}", dir.display());
}

/// Zero copy: the server's tail over a slot with no parked buffer is refused with its reason
/// (unreachable from a peer while the control path posts every slot it announces: this is the
/// check behind that promise).
#[test]
fn zero_copy_tail_over_a_slot_without_a_buffer_is_refused() {
    let mut h = harness::Harness::new(Kind::ClientZeroCopy, 2, 256);
    h.connect_unposted();
    h.poke_counter(true, false, 1, false); // the server's S2C tail: one slot filled
    h.rx(32);
    assert_eq!(h.reasons, ["Tail moved over an empty slot"]);
    // A proper connection afterwards works.
    h.connect();
    h.peer_send(&[100, 3000]);
    h.rx(32);
    assert_eq!(h.frames_rx, 2);
}

/// Found by the proptest above (its minimal input): a burst whose frame limit is below the
/// slots available, with a chain among them, hands up as many frames as the model (the chain's
/// further slots must not leave the last frame without a buffer while the pool has plenty).
#[test]
fn a_chain_under_a_frame_limit_leaves_the_next_frame_its_buffer() {
    run(&[
        30, 1, 182, 0, 0, 0, 0, 19, 8, 0, 0, 0, 0, 0, 52, 0, 218, 6, 0, 0, 0, 19, 110, 184, 11, 0,
        1, 57, 12, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 101, 29, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        218, 48, 0, 0, 0, 16, 2,
    ]);
}
