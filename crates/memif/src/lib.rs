//! memif v2.0, the shared-memory packet interface of FD.io VPP and DPDK's `net_memif`
//! (`shared/specs/memif.md`).
//!
//! * [`msg`]: the control messages and their 128-byte wire form (pure, fuzzable code). The
//!   socket side (SEQPACKET, descriptor passing, eventfds) is `memnic_shm::unix`.

#![forbid(unsafe_code)]

pub mod msg;

pub use msg::{
    AddRegion, AddRing, Disconnect, FdKind, FixedStr, Hello, Init, InterfaceMode, Msg, MsgError,
    MsgType, Name, Negotiated, Reason, RingDirection, Secret, MSG_SIZE,
};
