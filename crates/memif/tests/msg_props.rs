//! Property tests of the control-message codec: the CI-run stand-in for the cargo-fuzz target
//! (`fuzz/fuzz_targets/memif_msg.rs`).
//!
//! * any byte string decodes to a message or an error, without panicking, and a decoded message
//!   re-encodes to bytes that decode to the same message;
//! * every valid message survives encode → decode unchanged, with zero padding.

use memnic_memif::msg::{
    msg_type, AddRegion, AddRing, Disconnect, Hello, Init, InterfaceMode, Msg, MsgError, Name,
    Reason, RingDirection, Secret, MAX_LOG2_RING_SIZE, MAX_REGION_INDEX, MAX_RING_INDEX, MSG_SIZE,
    RING_OFFSET_ALIGN,
};
use proptest::prelude::*;

/// Checks the decode contract on one input; returns whether it decoded.
fn decode_contract(bytes: &[u8]) -> bool {
    match Msg::decode(bytes) {
        Ok(m) => {
            assert_eq!(bytes.len(), MSG_SIZE);
            assert_eq!(m.validate(), Ok(()));
            let again = m.encode();
            assert_eq!(Msg::decode(&again), Ok(m.clone()), "re-decode of {m:?}");
            // The type word is kept, and re-encoding is a fixed point.
            assert_eq!(again[..2], bytes[..2]);
            assert_eq!(Msg::decode(&again).unwrap().encode(), again);
            true
        }
        Err(MsgError::WrongSize { len }) => {
            assert_eq!(len, bytes.len());
            assert_ne!(len, MSG_SIZE);
            false
        }
        Err(e) => {
            assert_eq!(bytes.len(), MSG_SIZE);
            assert!(!e.to_string().is_empty() && !e.reason().is_empty());
            false
        }
    }
}

/// 128 bytes that often decode: a known type and mostly zero bytes (so strings end and
/// limits hold), with random bytes sprinkled in.
fn near_valid() -> impl Strategy<Value = Vec<u8>> {
    (
        0u16..=10,
        proptest::collection::vec(prop_oneof![4 => Just(0u8), 1 => any::<u8>()], MSG_SIZE),
    )
        .prop_map(|(ty, mut b)| {
            b[..2].copy_from_slice(&ty.to_ne_bytes());
            b
        })
}

fn fixed<const N: usize>() -> impl Strategy<Value = memnic_memif::FixedStr<N>> {
    proptest::collection::vec(1u8..=255, 0..N)
        .prop_map(|v| memnic_memif::FixedStr::<N>::new(&v).expect("no NUL, short enough"))
}

fn mode() -> impl Strategy<Value = InterfaceMode> {
    prop_oneof![
        Just(InterfaceMode::Ethernet),
        Just(InterfaceMode::Ip),
        Just(InterfaceMode::PuntInject)
    ]
}

fn valid_msg() -> impl Strategy<Value = Msg> {
    let hello = (fixed::<32>(), any::<(u16, u16, u16, u16, u16, u8)>()).prop_map(
        |(name, (min, max, reg, s2c, c2s, log2)): (Name, _)| {
            Msg::Hello(Hello {
                name,
                min_version: min,
                max_version: max,
                max_region: reg,
                max_s2c_ring: s2c,
                max_c2s_ring: c2s,
                max_log2_ring_size: log2,
            })
        },
    );
    let init = (
        any::<u16>(),
        any::<u32>(),
        mode(),
        fixed::<24>(),
        fixed::<32>(),
    )
        .prop_map(
            |(version, id, mode, secret, name): (_, _, _, Secret, Name)| {
                Msg::Init(Init {
                    version,
                    id,
                    mode,
                    secret,
                    name,
                })
            },
        );
    let region = (0..=MAX_REGION_INDEX, 1..=u64::MAX)
        .prop_map(|(index, size)| Msg::AddRegion(AddRegion { index, size }));
    let ring = (
        any::<bool>(),
        0..=MAX_RING_INDEX,
        0..=MAX_REGION_INDEX,
        0..=u32::MAX / RING_OFFSET_ALIGN,
        0..=MAX_LOG2_RING_SIZE,
    )
        .prop_map(|(c2s, index, region, slot, log2)| {
            Msg::AddRing(AddRing {
                direction: if c2s {
                    RingDirection::C2S
                } else {
                    RingDirection::S2C
                },
                index,
                region,
                offset: slot * RING_OFFSET_ALIGN,
                log2_ring_size: log2,
            })
        });
    let disconnect = (any::<u32>(), fixed::<96>())
        .prop_map(|(code, reason): (_, Reason)| Msg::Disconnect(Disconnect { code, reason }));
    prop_oneof![
        Just(Msg::Ack),
        hello,
        init,
        region,
        ring,
        fixed::<32>().prop_map(|if_name| Msg::Connect { if_name }),
        fixed::<32>().prop_map(|if_name| Msg::Connected { if_name }),
        disconnect,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        decode_contract(&bytes);
    }

    #[test]
    fn arbitrary_128_byte_messages_never_panic(
        ty in 0u16..=10,
        mut bytes in proptest::collection::vec(any::<u8>(), MSG_SIZE),
    ) {
        bytes[..2].copy_from_slice(&ty.to_ne_bytes());
        decode_contract(&bytes);
    }

    #[test]
    fn near_valid_messages_round_trip(bytes in near_valid()) {
        decode_contract(&bytes);
    }

    #[test]
    fn valid_messages_round_trip(m in valid_msg()) {
        prop_assert_eq!(m.validate(), Ok(()));
        let b = m.encode();
        prop_assert_eq!(Msg::decode(&b), Ok(m.clone()));
        prop_assert_eq!(u16::from_ne_bytes([b[0], b[1]]), m.msg_type().code());
        // Nothing is written past the longest payload (DISCONNECT: 2 + 100 bytes).
        prop_assert!(b[102..].iter().all(|&x| x == 0));
        prop_assert_eq!(m.expected_fds(), usize::from(matches!(m, Msg::AddRegion(_) | Msg::AddRing(_))));
    }

    #[test]
    fn disconnect_reasons_always_fit(reason in ".{0,200}", code in any::<u32>()) {
        let m = Msg::Disconnect(Disconnect::new(code, &reason));
        let Ok(Msg::Disconnect(d)) = Msg::decode(&m.encode()) else {
            return Err(TestCaseError::fail("DISCONNECT did not round-trip"));
        };
        prop_assert!(d.reason.len() <= 95);
        let expected = reason.split('\0').next().unwrap_or("");
        prop_assert!(expected.as_bytes().starts_with(d.reason.as_bytes()));
        prop_assert!(std::str::from_utf8(d.reason.as_bytes()).is_ok());
    }
}

/// The hit rate of the biased generator, so the round-trip property is not vacuous.
#[test]
fn near_valid_inputs_mostly_decode() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = near_valid();
    let mut decoded = [0usize; 11];
    for _ in 0..2000 {
        let b = strategy.new_tree(&mut runner).unwrap().current();
        if decode_contract(&b) {
            decoded[usize::from(b[0])] += 1;
        }
    }
    for ty in [
        msg_type::ACK,
        msg_type::HELLO,
        msg_type::INIT,
        msg_type::ADD_REGION,
        msg_type::ADD_RING,
        msg_type::CONNECT,
        msg_type::CONNECTED,
        msg_type::DISCONNECT,
    ] {
        assert!(decoded[usize::from(ty)] > 10, "type {ty}: {decoded:?}");
    }
}

/// The fuzz seeds (`fuzz/seeds/memif_msg`, built by hand from the spec's offsets, one per
/// message type) all decode, and re-encode to exactly their bytes.
#[test]
fn fuzz_seeds_decode_to_themselves() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/memif_msg");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let m = Msg::decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            m.encode().as_slice(),
            bytes.as_slice(),
            "{}",
            path.display()
        );
        seen += 1;
    }
    assert!(seen >= 8);
}
