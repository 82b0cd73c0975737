//! memif v2.0, the shared-memory packet interface of FD.io VPP and DPDK's `net_memif`
//! (`shared/specs/memif.md`).
//!
//! * [`msg`]: the control messages and their 128-byte wire form (pure, fuzzable code). The
//!   socket side (SEQPACKET, descriptor passing, eventfds) is `memnic_shm::unix`.
//! * [`ring`]: rings and descriptors in shared memory, bounds-checked.
//! * [`queue`]: the data path behind the burst API (copy mode, both roles): one [`window`] check
//!   of the peer's counter per burst, one chain walker for both rx roles (`chain`), one slot
//!   writer for both tx roles (`writer`), typed errors ([`DataError`]).
//! * [`port`]: the control channel (client and server handshakes, disconnect, reconnect) and the
//!   `memif` driver for devargs; server interfaces share a listening socket (`socket`).

#![forbid(unsafe_code)]

mod chain;
pub mod error;
pub mod msg;
pub mod port;
pub mod queue;
pub mod ring;
mod socket;
pub mod window;
mod writer;

/// The longest frame a memif port sends or takes (its `max_frame_len`: 9000 bytes of MTU and
/// an Ethernet header with a VLAN tag); received frames past it are dropped uncopied.
pub const MAX_FRAME_LEN: usize = 9018;

pub use error::DataError;
pub use port::{
    MemifConfig, MemifError, MemifPort, CLOSERS_BUSY, DRIVER, GREETINGS_BUSY, PEER_JAMMED,
    PEER_SHRANK,
};
pub use queue::{Role, DEFAULT_RX_HOLDOFF};

pub use msg::{
    AddRegion, AddRing, Disconnect, FdKind, FixedStr, Hello, Init, InterfaceMode, Msg, MsgError,
    MsgType, Name, Negotiated, Reason, RingDirection, Secret, MSG_SIZE,
};
