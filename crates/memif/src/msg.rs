//! memif v2.0 control messages: the constants of the protocol, the eight messages, and their
//! 128-byte wire form (`shared/specs/memif.md` §1–§3, checked against DPDK's
//! `drivers/net/memif/memif.h`, whose packed structs give the same offsets).
//!
//! Pure code, no I/O: [`Msg::decode`] turns any byte string into a message or a [`MsgError`]
//! (never a panic), [`Msg::encode`] gives the 128 bytes to send.
//!
//! # What decoding checks, and what it leaves to the session
//!
//! [`Msg::decode`] rejects what is wrong in a message by itself: a size other than 128, an
//! unknown type, a string field without its NUL, an unknown interface mode or ADD_RING flag, and
//! values outside memif's hard limits (region index over 255, ring index over 255, ring size over
//! 2^14, an empty region, a ring offset that is not a multiple of 16, a private ring header).
//!
//! What needs session state or configuration stays with the caller, with a helper for each: the
//! version ([`Hello::check_version`], [`Init::check_version`]), ethernet mode
//! ([`Init::check_mode`]), the secret ([`Init::check_secret`]), region order and file size
//! ([`AddRegion::check_next`], [`AddRegion::check_file_size`]), a ring's region, its place in the
//! region, its index and size against what was configured and advertised
//! ([`AddRing::check_region`], [`AddRing::check_in_region`], [`AddRing::check_index`],
//! [`AddRing::check_size`]), the descriptors that came with a message ([`Msg::check_fds`]), and
//! message order ([`MsgError::UnexpectedMessage`]). Every error has the short reason a DISCONNECT
//! should carry ([`MsgError::reason`]; DPDK's wording where DPDK has one).
//!
//! # Strings
//!
//! Names, the secret and the disconnect reason are C strings in fixed fields. A field must hold
//! a NUL (so at most `size - 1` bytes of text, as DPDK's `strlcpy` writes them); bytes after the
//! first NUL are ignored. The text is **not required to be UTF-8**: it is kept as the exact bytes
//! ([`FixedStr`]), so a peer's odd name neither breaks the session nor changes on re-encoding,
//! and the secret is compared byte for byte as DPDK's `strncmp` does. Display is lossy.
//!
//! # Padding
//!
//! The bytes after a message's payload (up to 128) are written as zero and ignored on decode.
//!
//! All integers are in host byte order (spec §1: memif is local-only).

use std::borrow::Cow;
use std::fmt;

// ---------------------------------------------------------------------------------------------
// Constants (spec §1 unless noted)

/// Every control message is exactly this long (spec §2).
pub const MSG_SIZE: usize = 128;
pub const VERSION_MAJOR: u16 = 2;
pub const VERSION_MINOR: u16 = 0;
/// Wire version 2.0: `(major << 8) | minor` = 0x0200.
pub const VERSION: u16 = (VERSION_MAJOR << 8) | VERSION_MINOR;
/// First word of every ring (spec §4.1).
pub const COOKIE: u32 = 0x3E31F20;
/// Size of the interface / application name fields (HELLO, INIT, CONNECT, CONNECTED).
pub const NAME_SIZE: usize = 32;
/// Size of INIT's secret field.
pub const SECRET_SIZE: usize = 24;
/// Size of DISCONNECT's reason field.
pub const REASON_SIZE: usize = 96;
/// Largest ring size (log2) a ring may have; DPDK's and libmemif's limit.
pub const MAX_LOG2_RING_SIZE: u8 = 14;
/// Largest region index: DPDK accepts 256 regions (indices 0..=255) and advertises 255 in HELLO,
/// VPP the same.
pub const MAX_REGION_INDEX: u16 = 255;
/// Largest ring index in one direction: HELLO's ring fields are counts minus one and DPDK and VPP
/// advertise 255, so indices 0..=255.
pub const MAX_RING_INDEX: u16 = 255;
/// Most queue pairs DPDK's `net_memif` configures.
pub const MAX_QUEUE_PAIRS: u16 = 255;
/// Ring header flag: the ring's receiver polls; the transmitter need not kick its eventfd.
pub const RING_FLAG_MASK_INT: u16 = 1;
/// Descriptor flag: the frame continues in the next slot (spec §6).
pub const DESC_FLAG_NEXT: u16 = 1;
/// ADD_RING flag bit 0: the ring is client-to-server (C2S, DPDK's `S2M`).
pub const ADD_RING_FLAG_C2S: u16 = 1;
/// Bytes of a ring header before its descriptors, with 64-byte cache lines (spec §4.1).
pub const RING_HEADER_SIZE: u64 = 128;
/// Bytes of one descriptor (spec §4.2).
pub const DESC_SIZE: u64 = 16;
/// Rings start at multiples of this within their region: every known peer lays rings out back
/// to back from offset 0 in steps of `128 + 16·2^k` (spec §4), and it keeps all ring words and
/// descriptors naturally aligned for atomic access (project rule, inferred from the layouts).
pub const RING_OFFSET_ALIGN: u32 = 16;

/// Message type codes (spec §1). 0 is `NONE`, never valid on the wire.
pub mod msg_type {
    pub const NONE: u16 = 0;
    pub const ACK: u16 = 1;
    pub const HELLO: u16 = 2;
    pub const INIT: u16 = 3;
    pub const ADD_REGION: u16 = 4;
    pub const ADD_RING: u16 = 5;
    pub const CONNECT: u16 = 6;
    pub const CONNECTED: u16 = 7;
    pub const DISCONNECT: u16 = 8;
}

/// Byte offsets within the 128-byte message (spec §2 table; `memif.h` packed structs).
mod off {
    pub const TYPE: usize = 0;
    pub const HELLO_NAME: usize = 2;
    pub const HELLO_MIN_VERSION: usize = 34;
    pub const HELLO_MAX_VERSION: usize = 36;
    pub const HELLO_MAX_REGION: usize = 38;
    pub const HELLO_MAX_S2C_RING: usize = 40;
    pub const HELLO_MAX_C2S_RING: usize = 42;
    pub const HELLO_MAX_LOG2_RING_SIZE: usize = 44;
    pub const INIT_VERSION: usize = 2;
    pub const INIT_ID: usize = 4;
    pub const INIT_MODE: usize = 8;
    pub const INIT_SECRET: usize = 9;
    pub const INIT_NAME: usize = 33;
    pub const ADD_REGION_INDEX: usize = 2;
    pub const ADD_REGION_SIZE: usize = 4;
    pub const ADD_RING_FLAGS: usize = 2;
    pub const ADD_RING_INDEX: usize = 4;
    pub const ADD_RING_REGION: usize = 6;
    pub const ADD_RING_OFFSET: usize = 8;
    pub const ADD_RING_LOG2_RING_SIZE: usize = 12;
    pub const ADD_RING_PRIVATE_HDR_SIZE: usize = 13;
    pub const CONNECT_IF_NAME: usize = 2;
    pub const DISCONNECT_CODE: usize = 2;
    pub const DISCONNECT_REASON: usize = 6;
}

// ---------------------------------------------------------------------------------------------
// Errors

/// Why a control message, or a step of the handshake, was refused. Each has a short
/// [`reason`](MsgError::reason) for the DISCONNECT to send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    #[error("a memif control message is 128 bytes, but {len} bytes arrived")]
    WrongSize { len: usize },
    #[error("message type {ty} is not a memif v2.0 control message")]
    UnknownType { ty: u16 },
    #[error("the {field} field of {msg} has no terminating NUL within its {size} bytes")]
    Unterminated {
        msg: MsgType,
        field: &'static str,
        size: usize,
    },
    #[error("interface mode {mode} is not a memif mode (0 ethernet, 1 ip, 2 punt/inject)")]
    UnknownMode { mode: u8 },
    #[error("ADD_RING flags {flags:#x} set bits other than bit 0 (ring is client-to-server)")]
    UnknownRingFlags { flags: u16 },
    #[error("a ring of 2^{log2} slots was asked for, but memif allows at most 2^{max}")]
    RingSizeTooLarge { log2: u8, max: u8 },
    #[error("ring index {index} is above memif's limit of {max}")]
    RingIndexOverLimit { index: u16, max: u16 },
    #[error("region index {index} is above memif's limit of {max}")]
    RegionIndexOverLimit { index: u16, max: u16 },
    #[error("ADD_REGION announced an empty region (size 0)")]
    EmptyRegion,
    #[error("ADD_RING places a ring at offset {offset:#x}, which is not a multiple of {align}")]
    MisalignedRing { offset: u32, align: u32 },
    #[error("ADD_RING declares a {size}-byte private header, which memif v2.0 peers never use")]
    PrivateHeader { size: u16 },
    #[error("{msg} needs {expected} file descriptor(s), but {got} came with it")]
    FdCount {
        msg: MsgType,
        expected: usize,
        got: usize,
    },
    #[error("a {field} of {len} bytes does not fit its field, which holds at most {max} bytes")]
    StringTooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("a {field} cannot contain a NUL byte")]
    StringHasNul { field: &'static str },
    #[error(
        "the peer speaks memif versions {min:#06x} to {max:#06x}, but this side speaks only 0x0200"
    )]
    IncompatibleVersion { min: u16, max: u16 },
    #[error("the client asked for interface mode {mode}, but only ethernet is supported")]
    NotEthernet { mode: InterfaceMode },
    #[error("this interface requires a secret, but the client sent none")]
    SecretRequired,
    #[error("the client's secret does not match this interface's")]
    IncorrectSecret,
    #[error("ADD_REGION for region {index} is out of order: region {expected} comes next")]
    RegionOutOfOrder { index: u16, expected: usize },
    #[error("region {index} is announced as {size} bytes, but its file has only {file_len}")]
    RegionFileTooSmall {
        index: u16,
        size: u64,
        file_len: u64,
    },
    #[error("ring {index} refers to region {region}, but only {regions} region(s) were added")]
    UnknownRingRegion {
        index: u16,
        region: u16,
        regions: usize,
    },
    #[error("ring {index} ({bytes} bytes at offset {offset:#x}) does not fit in its {region_size}-byte region")]
    RingOutsideRegion {
        index: u16,
        offset: u32,
        bytes: u64,
        region_size: u64,
    },
    #[error("ring index {index} is not below this interface's {count} ring(s) in that direction")]
    RingIndexOverCount { index: u16, count: u16 },
    #[error("{direction:?} ring {index} was already added in this handshake")]
    DuplicateRing {
        direction: RingDirection,
        index: u16,
    },
    #[error("a ring of 2^{log2} slots exceeds the 2^{max} this side allows")]
    RingSizeOverAdvertised { log2: u8, max: u8 },
    #[error("{got} arrived where the handshake does not allow it")]
    UnexpectedMessage { got: MsgType },
}

impl MsgError {
    /// The reason to put in the DISCONNECT answering this error: DPDK's text where DPDK has one
    /// (so logs on both sides read alike), a short phrase otherwise. Fits [`REASON_SIZE`].
    pub fn reason(&self) -> &'static str {
        match self {
            MsgError::WrongSize { .. } => "Invalid message size",
            MsgError::UnknownType { .. } => "Unknown message type",
            MsgError::Unterminated { .. } => "Unterminated string in message",
            MsgError::UnknownMode { .. } | MsgError::NotEthernet { .. } => {
                "Only ethernet mode supported"
            }
            MsgError::UnknownRingFlags { .. } => "Invalid ring flags",
            MsgError::RingSizeTooLarge { .. } | MsgError::RingSizeOverAdvertised { .. } => {
                "Invalid ring size"
            }
            MsgError::RingIndexOverLimit { .. } | MsgError::RingIndexOverCount { .. } => {
                "Invalid ring index"
            }
            MsgError::RegionIndexOverLimit { .. } | MsgError::RegionOutOfOrder { .. } => {
                "Invalid region index"
            }
            MsgError::EmptyRegion | MsgError::RegionFileTooSmall { .. } => "Invalid region size",
            MsgError::MisalignedRing { .. } | MsgError::RingOutsideRegion { .. } => {
                "Invalid ring offset"
            }
            MsgError::UnknownRingRegion { .. } => "Invalid ring region",
            MsgError::DuplicateRing { .. } => "Duplicate ring",
            MsgError::PrivateHeader { .. } => "Private ring header not supported",
            MsgError::FdCount { msg, got, .. } => match (msg, got) {
                (MsgType::AddRegion, 0) => "Missing region fd",
                (MsgType::AddRing, 0) => "Missing interrupt fd",
                _ => "Unexpected file descriptor",
            },
            MsgError::StringTooLong { .. } | MsgError::StringHasNul { .. } => "Invalid string",
            MsgError::IncompatibleVersion { .. } => "Incompatible memif version",
            MsgError::SecretRequired => "Secret required",
            MsgError::IncorrectSecret => "Incorrect secret",
            MsgError::UnexpectedMessage { .. } => "Unexpected message",
        }
    }

    /// The DISCONNECT message answering this error (code 0, as DPDK sends).
    pub fn to_disconnect(&self) -> Msg {
        Msg::Disconnect(Disconnect::new(0, self.reason()))
    }
}

// ---------------------------------------------------------------------------------------------
// Fixed-size C strings

/// The text of a fixed-size, NUL-terminated string field of `N` bytes: at most `N - 1` bytes,
/// none of them NUL, not necessarily UTF-8 (see the module docs).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct FixedStr<const N: usize> {
    /// The text, then zeros to the end: equal texts have equal arrays.
    buf: [u8; N],
    len: usize,
}

/// An interface or application name (32-byte field).
pub type Name = FixedStr<NAME_SIZE>;

/// The application name we put in HELLO and INIT.
pub const APP_NAME: &str = "memnic";

/// INIT's secret (24-byte field).
pub type Secret = FixedStr<SECRET_SIZE>;
/// DISCONNECT's reason (96-byte field).
pub type Reason = FixedStr<REASON_SIZE>;

impl<const N: usize> FixedStr<N> {
    /// Most bytes of text the field holds (one is kept for the NUL).
    pub const CAPACITY: usize = N - 1;

    /// The empty string.
    pub fn empty() -> Self {
        FixedStr {
            buf: [0; N],
            len: 0,
        }
    }

    /// Exactly `bytes`, or an error if they are too long or contain a NUL.
    pub fn new(bytes: &[u8]) -> Result<Self, MsgError> {
        if bytes.contains(&0) {
            return Err(MsgError::StringHasNul {
                field: Self::field_name(),
            });
        }
        if bytes.len() > Self::CAPACITY {
            return Err(MsgError::StringTooLong {
                field: Self::field_name(),
                len: bytes.len(),
                max: Self::CAPACITY,
            });
        }
        let mut buf = [0; N];
        buf[..bytes.len()].copy_from_slice(bytes);
        Ok(FixedStr {
            buf,
            len: bytes.len(),
        })
    }

    /// `text` cut at its first NUL and to [`CAPACITY`](Self::CAPACITY) bytes, at a character
    /// boundary (what `strlcpy` does, without splitting a character).
    pub fn truncated(text: &str) -> Self {
        let text = text.split('\0').next().unwrap_or("");
        let mut end = text.len().min(Self::CAPACITY);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut buf = [0; N];
        buf[..end].copy_from_slice(&text.as_bytes()[..end]);
        FixedStr { buf, len: end }
    }

    /// The text's bytes, without the NUL.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The text, with invalid UTF-8 replaced (for logs and display).
    pub fn to_string_lossy(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(self.as_bytes())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The field as sent: the text, then zeros.
    fn field(&self) -> &[u8; N] {
        &self.buf
    }

    /// Reads a field: the bytes before the first NUL; no NUL at all is an error.
    fn from_field(field: &[u8], msg: MsgType, name: &'static str) -> Result<Self, MsgError> {
        debug_assert_eq!(field.len(), N);
        let Some(len) = field.iter().position(|&b| b == 0) else {
            return Err(MsgError::Unterminated {
                msg,
                field: name,
                size: N,
            });
        };
        let mut buf = [0; N];
        buf[..len].copy_from_slice(&field[..len]);
        Ok(FixedStr { buf, len })
    }

    fn field_name() -> &'static str {
        match N {
            NAME_SIZE => "name",
            SECRET_SIZE => "secret",
            REASON_SIZE => "disconnect reason",
            _ => "string",
        }
    }
}

impl<const N: usize> Default for FixedStr<N> {
    fn default() -> Self {
        Self::empty()
    }
}

impl<const N: usize> fmt::Debug for FixedStr<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string_lossy(), f)
    }
}

impl<const N: usize> fmt::Display for FixedStr<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_lossy())
    }
}

impl<const N: usize> TryFrom<&str> for FixedStr<N> {
    type Error = MsgError;
    fn try_from(s: &str) -> Result<Self, MsgError> {
        Self::new(s.as_bytes())
    }
}

// ---------------------------------------------------------------------------------------------
// Messages

/// The type of a message, for errors and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgType {
    Ack,
    Hello,
    Init,
    AddRegion,
    AddRing,
    Connect,
    Connected,
    Disconnect,
}

impl MsgType {
    /// The wire code ([`msg_type`]).
    pub fn code(self) -> u16 {
        match self {
            MsgType::Ack => msg_type::ACK,
            MsgType::Hello => msg_type::HELLO,
            MsgType::Init => msg_type::INIT,
            MsgType::AddRegion => msg_type::ADD_REGION,
            MsgType::AddRing => msg_type::ADD_RING,
            MsgType::Connect => msg_type::CONNECT,
            MsgType::Connected => msg_type::CONNECTED,
            MsgType::Disconnect => msg_type::DISCONNECT,
        }
    }

    /// The type for a wire code; `None` for NONE (0) and unknown codes.
    pub fn from_code(code: u16) -> Option<MsgType> {
        Some(match code {
            msg_type::ACK => MsgType::Ack,
            msg_type::HELLO => MsgType::Hello,
            msg_type::INIT => MsgType::Init,
            msg_type::ADD_REGION => MsgType::AddRegion,
            msg_type::ADD_RING => MsgType::AddRing,
            msg_type::CONNECT => MsgType::Connect,
            msg_type::CONNECTED => MsgType::Connected,
            msg_type::DISCONNECT => MsgType::Disconnect,
            _ => return None,
        })
    }
}

impl fmt::Display for MsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MsgType::Ack => "ACK",
            MsgType::Hello => "HELLO",
            MsgType::Init => "INIT",
            MsgType::AddRegion => "ADD_REGION",
            MsgType::AddRing => "ADD_RING",
            MsgType::Connect => "CONNECT",
            MsgType::Connected => "CONNECTED",
            MsgType::Disconnect => "DISCONNECT",
        })
    }
}

/// What kind of descriptor a message carries (spec §2: at most one per message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdKind {
    /// ADD_REGION: the region's memfd (or any mappable file).
    RegionMemfd,
    /// ADD_RING: the ring's interrupt eventfd.
    InterruptEventfd,
}

/// INIT's interface mode (spec §1). DPDK and this crate serve only ethernet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InterfaceMode {
    Ethernet,
    Ip,
    PuntInject,
}

impl InterfaceMode {
    pub fn code(self) -> u8 {
        match self {
            InterfaceMode::Ethernet => 0,
            InterfaceMode::Ip => 1,
            InterfaceMode::PuntInject => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<InterfaceMode> {
        match code {
            0 => Some(InterfaceMode::Ethernet),
            1 => Some(InterfaceMode::Ip),
            2 => Some(InterfaceMode::PuntInject),
            _ => None,
        }
    }
}

impl fmt::Display for InterfaceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InterfaceMode::Ethernet => "ethernet",
            InterfaceMode::Ip => "ip",
            InterfaceMode::PuntInject => "punt/inject",
        })
    }
}

/// Direction of a ring (spec §1; DPDK's older names in brackets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RingDirection {
    /// Client to server (`S2M`); ring type 0.
    C2S,
    /// Server to client (`M2S`); ring type 1.
    S2C,
}

/// HELLO (server → client, first message): the server's name and limits.
///
/// The ring and region fields are **counts minus one** (DPDK's server sends 255, 255, 255, 14).
/// The values are advertised caps, taken as sent; [`Hello::negotiate`] applies them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The server's application name (DPDK: its version string, "DPDK 22.11.11").
    pub name: Name,
    pub min_version: u16,
    pub max_version: u16,
    /// Highest region index the server accepts (count - 1).
    pub max_region: u16,
    /// Highest S2C ring index the server accepts (count - 1).
    pub max_s2c_ring: u16,
    /// Highest C2S ring index the server accepts (count - 1).
    pub max_c2s_ring: u16,
    /// Largest ring size (log2) the server accepts.
    pub max_log2_ring_size: u8,
}

/// Ring counts and size a client settles on after HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub c2s_rings: u16,
    pub s2c_rings: u16,
    pub log2_ring_size: u8,
}

impl Hello {
    /// A server's HELLO with this crate's limits: version 2.0 only, 256 regions, 256 rings each
    /// way, rings up to 2^14 (what DPDK advertises).
    pub fn new(name: Name) -> Hello {
        Hello {
            name,
            min_version: VERSION,
            max_version: VERSION,
            max_region: MAX_REGION_INDEX,
            max_s2c_ring: MAX_RING_INDEX,
            max_c2s_ring: MAX_RING_INDEX,
            max_log2_ring_size: MAX_LOG2_RING_SIZE,
        }
    }

    /// Whether the server's version range includes 2.0; the client's answer to a HELLO that
    /// fails this is DISCONNECT "Incompatible memif version".
    pub fn check_version(&self) -> Result<(), MsgError> {
        if self.min_version <= VERSION && VERSION <= self.max_version {
            Ok(())
        } else {
            Err(MsgError::IncompatibleVersion {
                min: self.min_version,
                max: self.max_version,
            })
        }
    }

    /// What a client uses, as DPDK's client computes it: `min(max + 1, wanted)` rings each way
    /// and `min(max_log2, wanted, 14)` for the ring size.
    pub fn negotiate(&self, c2s_wanted: u16, s2c_wanted: u16, log2_wanted: u8) -> Negotiated {
        let cap = |max: u16, wanted: u16| (u32::from(max) + 1).min(u32::from(wanted)) as u16;
        Negotiated {
            c2s_rings: cap(self.max_c2s_ring, c2s_wanted),
            s2c_rings: cap(self.max_s2c_ring, s2c_wanted),
            log2_ring_size: self
                .max_log2_ring_size
                .min(log2_wanted)
                .min(MAX_LOG2_RING_SIZE),
        }
    }
}

/// INIT (client → server): which interface the client wants and how.
#[derive(Clone, PartialEq, Eq)]
pub struct Init {
    /// The client's version; the server requires exactly [`VERSION`].
    pub version: u16,
    /// The interface id, chosen among the server interfaces on this socket.
    pub id: u32,
    pub mode: InterfaceMode,
    /// Empty when the client has none.
    pub secret: Secret,
    /// The client's application name.
    pub name: Name,
}

impl fmt::Debug for Init {
    /// The secret is never printed, only whether there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Init")
            .field("version", &self.version)
            .field("id", &self.id)
            .field("mode", &self.mode)
            .field(
                "secret",
                &if self.secret.is_empty() {
                    "<none>"
                } else {
                    "<set>"
                },
            )
            .field("name", &self.name)
            .finish()
    }
}

impl Init {
    /// The server's version check: exactly 2.0 ("Incompatible memif version").
    pub fn check_version(&self) -> Result<(), MsgError> {
        if self.version == VERSION {
            Ok(())
        } else {
            Err(MsgError::IncompatibleVersion {
                min: self.version,
                max: self.version,
            })
        }
    }

    /// Ethernet only ("Only ethernet mode supported").
    pub fn check_mode(&self) -> Result<(), MsgError> {
        match self.mode {
            InterfaceMode::Ethernet => Ok(()),
            mode => Err(MsgError::NotEthernet { mode }),
        }
    }

    /// The secret check of a server whose interface has secret `expected` (empty: none
    /// configured, anything is accepted), as DPDK does it: "Secret required" when the client sent
    /// none, "Incorrect secret" when they differ. The comparison takes the same time whatever
    /// the bytes.
    pub fn check_secret(&self, expected: &Secret) -> Result<(), MsgError> {
        if expected.is_empty() {
            return Ok(());
        }
        if self.secret.is_empty() {
            return Err(MsgError::SecretRequired);
        }
        let diff = expected
            .field()
            .iter()
            .zip(self.secret.field())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff == 0 {
            Ok(())
        } else {
            Err(MsgError::IncorrectSecret)
        }
    }
}

/// ADD_REGION (client → server, with the region's fd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddRegion {
    /// 0, 1, 2… in order; at most [`MAX_REGION_INDEX`].
    pub index: u16,
    /// Bytes to map; not 0.
    pub size: u64,
}

impl AddRegion {
    /// Regions must come in order: this one must be region number `regions_so_far`
    /// ("Invalid region index").
    pub fn check_next(&self, regions_so_far: usize) -> Result<(), MsgError> {
        if usize::from(self.index) == regions_so_far {
            Ok(())
        } else {
            Err(MsgError::RegionOutOfOrder {
                index: self.index,
                expected: regions_so_far,
            })
        }
    }

    /// The file behind the received fd (its `fstat` size) must hold the whole region, or
    /// touching the mapping past its end would raise SIGBUS (spec §8).
    pub fn check_file_size(&self, file_len: u64) -> Result<(), MsgError> {
        if self.size <= file_len {
            Ok(())
        } else {
            Err(MsgError::RegionFileTooSmall {
                index: self.index,
                size: self.size,
                file_len,
            })
        }
    }
}

/// ADD_RING (client → server, with the ring's interrupt eventfd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddRing {
    pub direction: RingDirection,
    /// Queue index in that direction; at most [`MAX_RING_INDEX`].
    pub index: u16,
    /// Region holding the ring; at most [`MAX_REGION_INDEX`].
    pub region: u16,
    /// Where the ring header starts in the region; a multiple of [`RING_OFFSET_ALIGN`].
    pub offset: u32,
    /// Ring size as log2; at most [`MAX_LOG2_RING_SIZE`].
    pub log2_ring_size: u8,
}

impl AddRing {
    /// Slots in the ring (`2^log2_ring_size`; saturates for absurd unvalidated values).
    pub fn slots(&self) -> u64 {
        1u64.checked_shl(u32::from(self.log2_ring_size))
            .unwrap_or(u64::MAX)
    }

    /// Bytes of the ring: header and descriptors, `128 + 16·2^k` (spec §4).
    pub fn ring_bytes(&self) -> u64 {
        self.slots()
            .saturating_mul(DESC_SIZE)
            .saturating_add(RING_HEADER_SIZE)
    }

    /// The ring's region must have been added: `region < regions_received`.
    pub fn check_region(&self, regions_received: usize) -> Result<(), MsgError> {
        if usize::from(self.region) < regions_received {
            Ok(())
        } else {
            Err(MsgError::UnknownRingRegion {
                index: self.index,
                region: self.region,
                regions: regions_received,
            })
        }
    }

    /// The whole ring (`offset + 128 + 16·2^k`) must lie inside its region of `region_size`
    /// bytes (spec §8).
    pub fn check_in_region(&self, region_size: u64) -> Result<(), MsgError> {
        let bytes = self.ring_bytes();
        match u64::from(self.offset).checked_add(bytes) {
            Some(end) if end <= region_size => Ok(()),
            _ => Err(MsgError::RingOutsideRegion {
                index: self.index,
                offset: self.offset,
                bytes,
                region_size,
            }),
        }
    }

    /// The index must name one of the `count` queues configured in this ring's direction
    /// ("Invalid ring index").
    pub fn check_index(&self, count: u16) -> Result<(), MsgError> {
        if self.index < count {
            Ok(())
        } else {
            Err(MsgError::RingIndexOverCount {
                index: self.index,
                count,
            })
        }
    }

    /// The ring must not repeat one `added` earlier in this handshake (same direction and
    /// index): at CONNECT a repeat would replace the first, and each holds an eventfd
    /// ("Duplicate ring").
    pub fn check_not_added<'a>(
        &self,
        added: impl IntoIterator<Item = &'a AddRing>,
    ) -> Result<(), MsgError> {
        match added
            .into_iter()
            .any(|r| r.direction == self.direction && r.index == self.index)
        {
            false => Ok(()),
            true => Err(MsgError::DuplicateRing {
                direction: self.direction,
                index: self.index,
            }),
        }
    }

    /// The ring may not be larger than this side advertised or allows (`max_log2`).
    pub fn check_size(&self, max_log2: u8) -> Result<(), MsgError> {
        if self.log2_ring_size <= max_log2 {
            Ok(())
        } else {
            Err(MsgError::RingSizeOverAdvertised {
                log2: self.log2_ring_size,
                max: max_log2,
            })
        }
    }
}

/// DISCONNECT (either way): an error code (DPDK sends 0) and a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    pub code: u32,
    pub reason: Reason,
}

impl Disconnect {
    /// A DISCONNECT whose reason is `reason` cut to the field (95 bytes, at a character boundary).
    pub fn new(code: u32, reason: &str) -> Disconnect {
        Disconnect {
            code,
            reason: Reason::truncated(reason),
        }
    }
}

/// A memif v2.0 control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Server → client: the previous INIT / ADD_REGION / ADD_RING was accepted.
    Ack,
    Hello(Hello),
    Init(Init),
    AddRegion(AddRegion),
    AddRing(AddRing),
    /// Client → server, last of the handshake: the client's interface name.
    Connect {
        if_name: Name,
    },
    /// Server → client, answering CONNECT: the server's interface name.
    Connected {
        if_name: Name,
    },
    Disconnect(Disconnect),
}

fn get_u16(b: &[u8; MSG_SIZE], at: usize) -> u16 {
    let mut w = [0; 2];
    w.copy_from_slice(&b[at..at + 2]);
    u16::from_ne_bytes(w)
}

fn get_u32(b: &[u8; MSG_SIZE], at: usize) -> u32 {
    let mut w = [0; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(w)
}

fn get_u64(b: &[u8; MSG_SIZE], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

fn put(b: &mut [u8; MSG_SIZE], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

impl Msg {
    /// The DISCONNECT with `reason` (cut to 95 bytes) and code 0.
    pub fn disconnect(reason: &str) -> Msg {
        Msg::Disconnect(Disconnect::new(0, reason))
    }

    pub fn msg_type(&self) -> MsgType {
        match self {
            Msg::Ack => MsgType::Ack,
            Msg::Hello(_) => MsgType::Hello,
            Msg::Init(_) => MsgType::Init,
            Msg::AddRegion(_) => MsgType::AddRegion,
            Msg::AddRing(_) => MsgType::AddRing,
            Msg::Connect { .. } => MsgType::Connect,
            Msg::Connected { .. } => MsgType::Connected,
            Msg::Disconnect(_) => MsgType::Disconnect,
        }
    }

    /// The descriptor this message must carry, if any (spec §2).
    pub fn fd_kind(&self) -> Option<FdKind> {
        match self {
            Msg::AddRegion(_) => Some(FdKind::RegionMemfd),
            Msg::AddRing(_) => Some(FdKind::InterruptEventfd),
            _ => None,
        }
    }

    /// How many descriptors must come with this message: 1 for ADD_REGION and ADD_RING, else 0.
    pub fn expected_fds(&self) -> usize {
        usize::from(self.fd_kind().is_some())
    }

    /// Checks the number of descriptors that came with the message: a missing one gives DPDK's
    /// "Missing region fd" / "Missing interrupt fd", extra ones are refused as well.
    pub fn check_fds(&self, received: usize) -> Result<(), MsgError> {
        let expected = self.expected_fds();
        if received == expected {
            Ok(())
        } else {
            Err(MsgError::FdCount {
                msg: self.msg_type(),
                expected,
                got: received,
            })
        }
    }

    /// Decodes one received message. Any input gives a message or an error, never a panic; the
    /// checks are listed in the module docs.
    pub fn decode(bytes: &[u8]) -> Result<Msg, MsgError> {
        let b: &[u8; MSG_SIZE] = bytes
            .try_into()
            .map_err(|_| MsgError::WrongSize { len: bytes.len() })?;
        let ty = get_u16(b, off::TYPE);
        let kind = MsgType::from_code(ty).ok_or(MsgError::UnknownType { ty })?;
        let name =
            |at: usize, field: &'static str| Name::from_field(&b[at..at + NAME_SIZE], kind, field);
        let msg = match kind {
            MsgType::Ack => Msg::Ack,
            MsgType::Hello => Msg::Hello(Hello {
                name: name(off::HELLO_NAME, "name")?,
                min_version: get_u16(b, off::HELLO_MIN_VERSION),
                max_version: get_u16(b, off::HELLO_MAX_VERSION),
                max_region: get_u16(b, off::HELLO_MAX_REGION),
                max_s2c_ring: get_u16(b, off::HELLO_MAX_S2C_RING),
                max_c2s_ring: get_u16(b, off::HELLO_MAX_C2S_RING),
                max_log2_ring_size: b[off::HELLO_MAX_LOG2_RING_SIZE],
            }),
            MsgType::Init => {
                let mode = b[off::INIT_MODE];
                Msg::Init(Init {
                    version: get_u16(b, off::INIT_VERSION),
                    id: get_u32(b, off::INIT_ID),
                    mode: InterfaceMode::from_code(mode).ok_or(MsgError::UnknownMode { mode })?,
                    secret: Secret::from_field(
                        &b[off::INIT_SECRET..off::INIT_SECRET + SECRET_SIZE],
                        kind,
                        "secret",
                    )?,
                    name: name(off::INIT_NAME, "name")?,
                })
            }
            MsgType::AddRegion => Msg::AddRegion(AddRegion {
                index: get_u16(b, off::ADD_REGION_INDEX),
                size: get_u64(b, off::ADD_REGION_SIZE),
            }),
            MsgType::AddRing => {
                let flags = get_u16(b, off::ADD_RING_FLAGS);
                if flags & !ADD_RING_FLAG_C2S != 0 {
                    return Err(MsgError::UnknownRingFlags { flags });
                }
                let private = get_u16(b, off::ADD_RING_PRIVATE_HDR_SIZE);
                if private != 0 {
                    return Err(MsgError::PrivateHeader { size: private });
                }
                Msg::AddRing(AddRing {
                    direction: if flags & ADD_RING_FLAG_C2S != 0 {
                        RingDirection::C2S
                    } else {
                        RingDirection::S2C
                    },
                    index: get_u16(b, off::ADD_RING_INDEX),
                    region: get_u16(b, off::ADD_RING_REGION),
                    offset: get_u32(b, off::ADD_RING_OFFSET),
                    log2_ring_size: b[off::ADD_RING_LOG2_RING_SIZE],
                })
            }
            MsgType::Connect => Msg::Connect {
                if_name: name(off::CONNECT_IF_NAME, "if_name")?,
            },
            MsgType::Connected => Msg::Connected {
                if_name: name(off::CONNECT_IF_NAME, "if_name")?,
            },
            MsgType::Disconnect => Msg::Disconnect(Disconnect {
                code: get_u32(b, off::DISCONNECT_CODE),
                reason: Reason::from_field(
                    &b[off::DISCONNECT_REASON..off::DISCONNECT_REASON + REASON_SIZE],
                    kind,
                    "reason",
                )?,
            }),
        };
        msg.validate()?;
        Ok(msg)
    }

    /// The per-message limits [`decode`](Self::decode) enforces, for a message built in code
    /// (its fields are public): region and ring indices, empty regions, ring size and alignment.
    /// Strings and modes are valid by construction.
    pub fn validate(&self) -> Result<(), MsgError> {
        match self {
            Msg::AddRegion(r) => {
                if r.index > MAX_REGION_INDEX {
                    return Err(MsgError::RegionIndexOverLimit {
                        index: r.index,
                        max: MAX_REGION_INDEX,
                    });
                }
                if r.size == 0 {
                    return Err(MsgError::EmptyRegion);
                }
            }
            Msg::AddRing(r) => {
                if r.index > MAX_RING_INDEX {
                    return Err(MsgError::RingIndexOverLimit {
                        index: r.index,
                        max: MAX_RING_INDEX,
                    });
                }
                if r.region > MAX_REGION_INDEX {
                    return Err(MsgError::RegionIndexOverLimit {
                        index: r.region,
                        max: MAX_REGION_INDEX,
                    });
                }
                if r.log2_ring_size > MAX_LOG2_RING_SIZE {
                    return Err(MsgError::RingSizeTooLarge {
                        log2: r.log2_ring_size,
                        max: MAX_LOG2_RING_SIZE,
                    });
                }
                if r.offset % RING_OFFSET_ALIGN != 0 {
                    return Err(MsgError::MisalignedRing {
                        offset: r.offset,
                        align: RING_OFFSET_ALIGN,
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The 128 bytes to send: type, payload at the spec's offsets, zeros after. A message that
    /// fails [`validate`](Self::validate) is written as given (and its peer will refuse it).
    pub fn encode(&self) -> [u8; MSG_SIZE] {
        let mut b = [0u8; MSG_SIZE];
        put(&mut b, off::TYPE, &self.msg_type().code().to_ne_bytes());
        match self {
            Msg::Ack => {}
            Msg::Hello(h) => {
                put(&mut b, off::HELLO_NAME, h.name.field());
                put(&mut b, off::HELLO_MIN_VERSION, &h.min_version.to_ne_bytes());
                put(&mut b, off::HELLO_MAX_VERSION, &h.max_version.to_ne_bytes());
                put(&mut b, off::HELLO_MAX_REGION, &h.max_region.to_ne_bytes());
                put(
                    &mut b,
                    off::HELLO_MAX_S2C_RING,
                    &h.max_s2c_ring.to_ne_bytes(),
                );
                put(
                    &mut b,
                    off::HELLO_MAX_C2S_RING,
                    &h.max_c2s_ring.to_ne_bytes(),
                );
                b[off::HELLO_MAX_LOG2_RING_SIZE] = h.max_log2_ring_size;
            }
            Msg::Init(i) => {
                put(&mut b, off::INIT_VERSION, &i.version.to_ne_bytes());
                put(&mut b, off::INIT_ID, &i.id.to_ne_bytes());
                b[off::INIT_MODE] = i.mode.code();
                put(&mut b, off::INIT_SECRET, i.secret.field());
                put(&mut b, off::INIT_NAME, i.name.field());
            }
            Msg::AddRegion(r) => {
                put(&mut b, off::ADD_REGION_INDEX, &r.index.to_ne_bytes());
                put(&mut b, off::ADD_REGION_SIZE, &r.size.to_ne_bytes());
            }
            Msg::AddRing(r) => {
                let flags = match r.direction {
                    RingDirection::C2S => ADD_RING_FLAG_C2S,
                    RingDirection::S2C => 0,
                };
                put(&mut b, off::ADD_RING_FLAGS, &flags.to_ne_bytes());
                put(&mut b, off::ADD_RING_INDEX, &r.index.to_ne_bytes());
                put(&mut b, off::ADD_RING_REGION, &r.region.to_ne_bytes());
                put(&mut b, off::ADD_RING_OFFSET, &r.offset.to_ne_bytes());
                b[off::ADD_RING_LOG2_RING_SIZE] = r.log2_ring_size;
                // private_hdr_size stays 0.
            }
            Msg::Connect { if_name } | Msg::Connected { if_name } => {
                put(&mut b, off::CONNECT_IF_NAME, if_name.field());
            }
            Msg::Disconnect(d) => {
                put(&mut b, off::DISCONNECT_CODE, &d.code.to_ne_bytes());
                put(&mut b, off::DISCONNECT_REASON, d.reason.field());
            }
        }
        b
    }
}

// The payloads fit in the message (spec §2 sizes): the last field of each ends inside 128 bytes.
const _: () = {
    assert!(off::HELLO_MAX_LOG2_RING_SIZE + 1 == 2 + 43);
    assert!(off::INIT_NAME + NAME_SIZE == 2 + 63);
    assert!(off::ADD_REGION_SIZE + 8 == 2 + 10);
    assert!(off::ADD_RING_PRIVATE_HDR_SIZE + 2 == 2 + 13);
    assert!(off::CONNECT_IF_NAME + NAME_SIZE == 2 + 32);
    assert!(off::DISCONNECT_REASON + REASON_SIZE == 2 + 100);
    assert!(2 + 100 <= MSG_SIZE);
};

#[cfg(test)]
mod tests {
    use super::*;

    /// A zeroed message with `ty` in its first two bytes (little-endian, as on x86).
    fn raw(ty: u8) -> [u8; MSG_SIZE] {
        let mut b = [0u8; MSG_SIZE];
        b[0] = ty;
        b
    }

    fn name(s: &str) -> Name {
        Name::new(s.as_bytes()).unwrap()
    }

    /// Checks both directions against a hand-built message: it decodes to `msg`, and `msg`
    /// encodes to exactly these bytes.
    fn check_layout(bytes: [u8; MSG_SIZE], msg: Msg) {
        assert_eq!(Msg::decode(&bytes), Ok(msg.clone()));
        assert_eq!(msg.encode(), bytes, "{msg:?}");
    }

    // Byte layouts, hand-built from the spec §2 table (little-endian host).
    #[cfg(target_endian = "little")]
    mod layout {
        use super::*;

        #[test]
        fn ack() {
            check_layout(raw(1), Msg::Ack);
        }

        #[test]
        fn hello() {
            let mut b = raw(2);
            b[2..15].copy_from_slice(b"DPDK 22.11.11"); // name[32] at 2
            b[34..36].copy_from_slice(&[0x00, 0x02]); // min_version at 34
            b[36..38].copy_from_slice(&[0x00, 0x02]); // max_version at 36
            b[38..40].copy_from_slice(&[0xff, 0x00]); // max_region at 38
            b[40..42].copy_from_slice(&[0xfe, 0x00]); // max_s2c_ring at 40
            b[42..44].copy_from_slice(&[0xfd, 0x00]); // max_c2s_ring at 42
            b[44] = 14; // max_log2_ring_size at 44
            check_layout(
                b,
                Msg::Hello(Hello {
                    name: name("DPDK 22.11.11"),
                    min_version: 0x0200,
                    max_version: 0x0200,
                    max_region: 255,
                    max_s2c_ring: 254,
                    max_c2s_ring: 253,
                    max_log2_ring_size: 14,
                }),
            );
        }

        #[test]
        fn init() {
            let mut b = raw(3);
            b[2..4].copy_from_slice(&[0x00, 0x02]); // version at 2
            b[4..8].copy_from_slice(&[0x78, 0x56, 0x34, 0x12]); // id at 4
            b[8] = 0; // mode at 8: ethernet
            b[9..15].copy_from_slice(b"s3cret"); // secret[24] at 9
            b[33..39].copy_from_slice(b"client"); // name[32] at 33
            check_layout(
                b,
                Msg::Init(Init {
                    version: 0x0200,
                    id: 0x1234_5678,
                    mode: InterfaceMode::Ethernet,
                    secret: Secret::new(b"s3cret").unwrap(),
                    name: name("client"),
                }),
            );
            b[8] = 2;
            assert!(matches!(
                Msg::decode(&b),
                Ok(Msg::Init(Init {
                    mode: InterfaceMode::PuntInject,
                    ..
                }))
            ));
        }

        #[test]
        fn add_region() {
            let mut b = raw(4);
            b[2..4].copy_from_slice(&[0x03, 0x00]); // index at 2
            b[4..12].copy_from_slice(&[0x00, 0x80, 0x40, 0x00, 0x01, 0, 0, 0]); // size at 4
            check_layout(
                b,
                Msg::AddRegion(AddRegion {
                    index: 3,
                    size: 0x01_0040_8000,
                }),
            );
        }

        #[test]
        fn add_ring() {
            let mut b = raw(5);
            b[2..4].copy_from_slice(&[0x01, 0x00]); // flags at 2: C2S
            b[4..6].copy_from_slice(&[0x07, 0x00]); // index at 4
            b[6..8].copy_from_slice(&[0x00, 0x00]); // region at 6
            b[8..12].copy_from_slice(&[0x80, 0x40, 0x00, 0x00]); // offset at 8
            b[12] = 10; // log2_ring_size at 12
            b[13..15].copy_from_slice(&[0, 0]); // private_hdr_size at 13
            check_layout(
                b,
                Msg::AddRing(AddRing {
                    direction: RingDirection::C2S,
                    index: 7,
                    region: 0,
                    offset: 0x4080,
                    log2_ring_size: 10,
                }),
            );
            b[2] = 0;
            b[6] = 1;
            check_layout(
                b,
                Msg::AddRing(AddRing {
                    direction: RingDirection::S2C,
                    index: 7,
                    region: 1,
                    offset: 0x4080,
                    log2_ring_size: 10,
                }),
            );
        }

        #[test]
        fn connect_and_connected() {
            let mut b = raw(6);
            b[2..8].copy_from_slice(b"memif0"); // if_name[32] at 2
            check_layout(
                b,
                Msg::Connect {
                    if_name: name("memif0"),
                },
            );
            b[0] = 7;
            check_layout(
                b,
                Msg::Connected {
                    if_name: name("memif0"),
                },
            );
        }

        #[test]
        fn disconnect() {
            let mut b = raw(8);
            b[2..6].copy_from_slice(&[0x2a, 0, 0, 0]); // code at 2
            b[6..24].copy_from_slice(b"Invalid ring index"); // reason[96] at 6
            check_layout(
                b,
                Msg::Disconnect(Disconnect {
                    code: 42,
                    reason: Reason::new(b"Invalid ring index").unwrap(),
                }),
            );
        }

        #[test]
        fn full_length_strings_end_at_the_field_end() {
            let mut b = raw(6);
            b[2..33].copy_from_slice(&[b'x'; 31]); // 31 bytes + NUL at 33
            let m = Msg::decode(&b).unwrap();
            assert_eq!(m.encode(), b);
            b[33] = b'x'; // no NUL left in the 32-byte field
            assert!(matches!(
                Msg::decode(&b),
                Err(MsgError::Unterminated {
                    field: "if_name",
                    size: 32,
                    ..
                })
            ));

            let mut b = raw(8);
            b[6..101].copy_from_slice(&[b'r'; 95]);
            assert!(Msg::decode(&b).is_ok());
            b[101] = b'r';
            assert!(matches!(
                Msg::decode(&b),
                Err(MsgError::Unterminated {
                    field: "reason",
                    ..
                })
            ));

            let mut b = raw(3);
            b[9..33].copy_from_slice(&[b's'; 24]); // secret without NUL
            assert!(matches!(
                Msg::decode(&b),
                Err(MsgError::Unterminated {
                    field: "secret",
                    ..
                })
            ));
        }
    }

    #[test]
    fn sizes_other_than_128_are_refused() {
        for len in [0, 1, 2, 127, 129, 256] {
            assert_eq!(
                Msg::decode(&vec![0u8; len]),
                Err(MsgError::WrongSize { len })
            );
        }
        assert_eq!(
            MsgError::WrongSize { len: 3 }.reason(),
            "Invalid message size"
        );
    }

    #[test]
    fn unknown_types_and_none_are_refused() {
        for ty in [0u16, 9, 0x100, u16::MAX] {
            let mut b = [0u8; MSG_SIZE];
            b[..2].copy_from_slice(&ty.to_ne_bytes());
            assert_eq!(Msg::decode(&b), Err(MsgError::UnknownType { ty }));
        }
        assert_eq!(
            MsgError::UnknownType { ty: 9 }.reason(),
            "Unknown message type"
        );
    }

    #[test]
    fn out_of_range_values_are_refused() {
        let ring = AddRing {
            direction: RingDirection::S2C,
            index: 0,
            region: 0,
            offset: 0,
            log2_ring_size: 10,
        };
        let bad = |r: AddRing| Msg::decode(&Msg::AddRing(r).encode());
        assert!(bad(ring).is_ok());
        assert_eq!(
            bad(AddRing {
                log2_ring_size: 15,
                ..ring
            }),
            Err(MsgError::RingSizeTooLarge { log2: 15, max: 14 })
        );
        assert_eq!(
            bad(AddRing { index: 256, ..ring }),
            Err(MsgError::RingIndexOverLimit {
                index: 256,
                max: 255
            })
        );
        assert_eq!(
            bad(AddRing {
                region: 256,
                ..ring
            }),
            Err(MsgError::RegionIndexOverLimit {
                index: 256,
                max: 255
            })
        );
        assert_eq!(
            bad(AddRing { offset: 8, ..ring }),
            Err(MsgError::MisalignedRing {
                offset: 8,
                align: 16
            })
        );
        let region = |index, size| Msg::decode(&Msg::AddRegion(AddRegion { index, size }).encode());
        assert_eq!(region(0, 0), Err(MsgError::EmptyRegion));
        assert_eq!(
            region(256, 4096),
            Err(MsgError::RegionIndexOverLimit {
                index: 256,
                max: 255
            })
        );
        assert!(region(255, 4096).is_ok());

        // Unknown mode, unknown ADD_RING flag bits, a private header.
        let mut b = Msg::Init(Init {
            version: VERSION,
            id: 0,
            mode: InterfaceMode::Ethernet,
            secret: Secret::empty(),
            name: name("x"),
        })
        .encode();
        b[8] = 3;
        assert_eq!(Msg::decode(&b), Err(MsgError::UnknownMode { mode: 3 }));
        let mut b = Msg::AddRing(ring).encode();
        b[2] = 0x03;
        assert_eq!(
            Msg::decode(&b),
            Err(MsgError::UnknownRingFlags { flags: 3 })
        );
        let mut b = Msg::AddRing(ring).encode();
        b[13] = 64;
        assert_eq!(Msg::decode(&b), Err(MsgError::PrivateHeader { size: 64 }));
    }

    #[test]
    fn bytes_after_the_nul_and_after_the_payload_are_ignored() {
        let mut b = Msg::Connect {
            if_name: name("abc"),
        }
        .encode();
        b[10] = 0xee; // inside if_name, after the NUL
        b[100] = 0x55; // padding
        assert_eq!(
            Msg::decode(&b),
            Ok(Msg::Connect {
                if_name: name("abc")
            })
        );
    }

    #[test]
    fn non_utf8_names_are_kept_byte_for_byte() {
        let mut b = raw(7);
        b[2..6].copy_from_slice(&[0xff, b'a', 0xc3, 0x28]);
        let m = Msg::decode(&b).unwrap();
        let Msg::Connected { if_name } = &m else {
            panic!("{m:?}")
        };
        assert_eq!(if_name.as_bytes(), &[0xff, b'a', 0xc3, 0x28]);
        assert_eq!(if_name.to_string_lossy(), "\u{fffd}a\u{fffd}(");
        assert_eq!(m.encode(), b);
    }

    #[test]
    fn fixed_strings_refuse_nul_and_overlong_text() {
        assert!(Name::new(&[b'a'; 31]).is_ok());
        assert_eq!(
            Name::new(&[b'a'; 32]),
            Err(MsgError::StringTooLong {
                field: "name",
                len: 32,
                max: 31
            })
        );
        assert_eq!(
            Secret::new(b"a\0b"),
            Err(MsgError::StringHasNul { field: "secret" })
        );
        assert_eq!(Name::CAPACITY, 31);
        assert_eq!(Reason::CAPACITY, 95);
        assert!(Name::default().is_empty());
        assert_eq!(Name::try_from("eth0").unwrap().to_string(), "eth0");
    }

    #[test]
    fn disconnect_reasons_are_truncated_to_the_field() {
        let long = "é".repeat(60); // 120 bytes of 2-byte characters
        let d = Disconnect::new(7, &long);
        // 95 bytes would split a character: cut to 94.
        assert_eq!(d.reason.len(), 94);
        assert_eq!(d.reason.to_string_lossy(), "é".repeat(47));
        let b = Msg::Disconnect(d.clone()).encode();
        assert_eq!(b[6 + 94], 0);
        assert_eq!(Msg::decode(&b), Ok(Msg::Disconnect(d)));
        assert_eq!(Disconnect::new(0, "bad\0tail").reason.as_bytes(), b"bad");
        let ascii = "x".repeat(200);
        assert_eq!(Disconnect::new(0, &ascii).reason.len(), 95);
        // Every error's reason fits uncut.
        assert_eq!(
            MsgError::IncorrectSecret.to_disconnect(),
            Msg::disconnect("Incorrect secret")
        );
    }

    #[test]
    fn descriptors_each_message_carries() {
        let region = Msg::AddRegion(AddRegion { index: 0, size: 1 });
        let ring = Msg::AddRing(AddRing {
            direction: RingDirection::C2S,
            index: 0,
            region: 0,
            offset: 0,
            log2_ring_size: 0,
        });
        assert_eq!(region.fd_kind(), Some(FdKind::RegionMemfd));
        assert_eq!(ring.fd_kind(), Some(FdKind::InterruptEventfd));
        assert_eq!((region.expected_fds(), ring.expected_fds()), (1, 1));
        assert_eq!(Msg::Ack.expected_fds(), 0);
        assert_eq!(Msg::disconnect("x").expected_fds(), 0);
        assert!(region.check_fds(1).is_ok());
        assert_eq!(
            region.check_fds(0).unwrap_err().reason(),
            "Missing region fd"
        );
        assert_eq!(
            ring.check_fds(0).unwrap_err().reason(),
            "Missing interrupt fd"
        );
        assert_eq!(
            ring.check_fds(2).unwrap_err().reason(),
            "Unexpected file descriptor"
        );
        assert_eq!(
            Msg::Ack.check_fds(1),
            Err(MsgError::FdCount {
                msg: MsgType::Ack,
                expected: 0,
                got: 1
            })
        );
    }

    #[test]
    fn hello_version_and_negotiation() {
        let mut h = Hello::new(name("DPDK 22.11.11"));
        assert!(h.check_version().is_ok());
        // DPDK's server: 255 means 256 rings; the client takes the smaller of that and its own.
        assert_eq!(
            h.negotiate(2, 300, 12),
            Negotiated {
                c2s_rings: 2,
                s2c_rings: 256,
                log2_ring_size: 12
            }
        );
        h.max_c2s_ring = 0;
        h.max_log2_ring_size = 200;
        assert_eq!(
            h.negotiate(4, 4, 20),
            Negotiated {
                c2s_rings: 1,
                s2c_rings: 4,
                log2_ring_size: 14
            }
        );
        h.min_version = 0x0201;
        h.max_version = 0x0300;
        assert_eq!(
            h.check_version().unwrap_err().reason(),
            "Incompatible memif version"
        );
        h.min_version = 0x0300;
        h.max_version = 0x0100; // empty range
        assert!(h.check_version().is_err());
    }

    #[test]
    fn init_checks_version_mode_and_secret() {
        let mut i = Init {
            version: VERSION,
            id: 0,
            mode: InterfaceMode::Ethernet,
            secret: Secret::empty(),
            name: name("c"),
        };
        let none = Secret::empty();
        let want = Secret::new(b"hunter2").unwrap();
        assert!(i.check_version().is_ok() && i.check_mode().is_ok());
        assert!(i.check_secret(&none).is_ok());
        assert_eq!(i.check_secret(&want), Err(MsgError::SecretRequired));
        i.secret = Secret::new(b"hunter3").unwrap();
        assert_eq!(i.check_secret(&want), Err(MsgError::IncorrectSecret));
        i.secret = Secret::new(b"hunter22").unwrap(); // a longer secret with the same prefix
        assert_eq!(i.check_secret(&want), Err(MsgError::IncorrectSecret));
        i.secret = want.clone();
        assert!(i.check_secret(&want).is_ok());
        assert!(i.check_secret(&none).is_ok());
        assert!(
            !format!("{i:?}").contains("hunter"),
            "secret must not be logged"
        );
        i.version = 0x0100;
        assert!(i.check_version().is_err());
        i.mode = InterfaceMode::Ip;
        assert_eq!(
            i.check_mode().unwrap_err().reason(),
            "Only ethernet mode supported"
        );
    }

    #[test]
    fn region_and_ring_session_checks() {
        let r = AddRegion {
            index: 1,
            size: 8192,
        };
        assert!(r.check_next(1).is_ok());
        assert_eq!(
            r.check_next(0),
            Err(MsgError::RegionOutOfOrder {
                index: 1,
                expected: 0
            })
        );
        assert!(r.check_file_size(8192).is_ok());
        assert_eq!(
            r.check_file_size(4096).unwrap_err().reason(),
            "Invalid region size"
        );

        // Spec §4: k=10 -> 16,512-byte rings; two rings and the buffers fill 4,227,328 bytes.
        let ring = AddRing {
            direction: RingDirection::S2C,
            index: 0,
            region: 0,
            offset: 16_512,
            log2_ring_size: 10,
        };
        assert_eq!(ring.slots(), 1024);
        assert_eq!(ring.ring_bytes(), 16_512);
        assert!(ring.check_in_region(33_024).is_ok());
        assert!(ring.check_in_region(4_227_328).is_ok());
        assert!(ring.check_in_region(33_023).is_err());
        let top = AddRing {
            offset: u32::MAX - 15,
            ..ring
        };
        assert!(top.check_in_region(u64::MAX).is_ok());
        assert!(top.check_in_region(u64::from(u32::MAX)).is_err());
        assert!(ring.check_region(1).is_ok());
        assert_eq!(
            ring.check_region(0).unwrap_err().reason(),
            "Invalid ring region"
        );
        assert!(ring.check_index(1).is_ok());
        assert_eq!(
            ring.check_index(0).unwrap_err().reason(),
            "Invalid ring index"
        );
        assert!(ring.check_size(10).is_ok());
        assert!(ring.check_size(9).is_err());
        // Unvalidated absurd sizes saturate instead of overflowing.
        let absurd = AddRing {
            log2_ring_size: 255,
            ..ring
        };
        assert_eq!(absurd.slots(), u64::MAX);
        assert!(absurd.check_in_region(u64::MAX).is_err());
    }

    #[test]
    fn error_messages_are_single_sentences() {
        let errors = [
            MsgError::WrongSize { len: 3 },
            MsgError::Unterminated {
                msg: MsgType::Hello,
                field: "name",
                size: 32,
            },
            MsgError::RingOutsideRegion {
                index: 1,
                offset: 0x100,
                bytes: 16_512,
                region_size: 4096,
            },
            MsgError::UnexpectedMessage {
                got: MsgType::Connected,
            },
        ];
        for e in errors {
            let s = e.to_string();
            assert!(!s.contains('\n') && !s.ends_with('.'), "{s}");
            assert!(e.reason().len() < REASON_SIZE);
        }
        assert_eq!(
            MsgError::UnexpectedMessage {
                got: MsgType::AddRing
            }
            .to_string(),
            "ADD_RING arrived where the handshake does not allow it"
        );
    }
}
