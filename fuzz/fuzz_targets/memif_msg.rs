//! Fuzz target: the memif control-message decoder on arbitrary bytes.
//!
//! Run from `fuzz/` (needs `cargo install cargo-fuzz` and a nightly toolchain):
//! `cargo +nightly fuzz run memif_msg corpus/memif_msg seeds/memif_msg -- -max_total_time=60`.
//! `seeds/memif_msg` holds one hand-built message of each type (checked by a memif test). The same contract is checked in
//! CI by the proptest properties in `crates/memif/tests/msg_props.rs`.
//!
//! Contract: no input panics; an input that decodes re-encodes to 128 bytes that decode to the
//! same message, and re-encoding that is a fixed point.

#![no_main]

use libfuzzer_sys::fuzz_target;
use memnic_memif::msg::{Msg, MsgError, MSG_SIZE};

fuzz_target!(|data: &[u8]| {
    match Msg::decode(data) {
        Ok(m) => {
            assert_eq!(data.len(), MSG_SIZE);
            assert_eq!(m.validate(), Ok(()));
            let bytes = m.encode();
            let again = Msg::decode(&bytes).expect("an encoded valid message decodes");
            assert_eq!(again, m);
            assert_eq!(again.encode(), bytes);
            assert!(m.check_fds(m.expected_fds()).is_ok());
        }
        Err(MsgError::WrongSize { len }) => assert_eq!(len, data.len()),
        Err(e) => {
            assert_eq!(data.len(), MSG_SIZE);
            assert!(!e.reason().is_empty());
        }
    }
});
