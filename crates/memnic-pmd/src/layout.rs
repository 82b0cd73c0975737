//! MEMNIC v1 wire layout (`specs/memnic.md` §1–§2): every constant and offset in one place.

/// `"vNIC"` read as little-endian bytes.
pub const MAGIC: u32 = 0x4349_4e76;
pub const VERSION_1: u32 = 1;
/// Slots per direction.
pub const NR_PACKET: usize = 1024;
/// The whole shared region.
pub const AREA_SIZE: usize = 16 << 20;
/// Bytes per slot, 8-byte slot header included.
pub const MAX_PACKET_SIZE: usize = 4096;
/// Default (and v1) largest frame: 1500 + 14 + 4, no FCS.
pub const MAX_FRAME_LEN: u32 = 1518;
/// Largest frame with the frame-size feature: a whole slot minus its header.
pub const MAX_JUMBO_FRAME_LEN: u32 = (MAX_PACKET_SIZE - SLOT_DATA) as u32;

pub const PKT_ST_FREE: u32 = 0;
pub const PKT_ST_USED: u32 = 1;
pub const PKT_ST_FILLED: u32 = 2;

pub const FEAT_FRAME_SIZE: u32 = 0x1;
pub const FEAT_ALL: u32 = FEAT_FRAME_SIZE;

/// Header field offsets (§2.1).
pub const HDR_MAGIC: usize = 0x00;
pub const HDR_VERSION: usize = 0x04;
pub const HDR_VALID: usize = 0x08;
pub const HDR_RESET: usize = 0x0C;
pub const HDR_FEATURES: usize = 0x10;
pub const HDR_REQUEST: usize = 0x14;
pub const HDR_MAC: usize = 0x18;
pub const HDR_FRAMESZ: usize = 0x20;
/// Size of the header struct with the frame-size feature (32 B in v1).
pub const HDR_SIZE: usize = 0x24;
pub const HDR_SIZE_V1: usize = 0x20;

/// Area offsets (§2).
pub const HEADER_OFF: usize = 0x000000;
pub const UP_INFO_OFF: usize = 0x100000;
pub const UP_PACKETS_OFF: usize = 0x200000;
pub const DOWN_INFO_OFF: usize = 0x900000;
pub const DOWN_PACKETS_OFF: usize = 0xA00000;

/// `info` field offsets (§2.2), relative to an info block.
pub const INFO_FLAGS: usize = 0;
pub const INFO_FREE: usize = 4;
pub const INFO_PKTS: usize = 8;
pub const INFO_BYTES: usize = 16;
pub const INFO_SIZE: usize = 24;

/// Slot field offsets, relative to a slot.
pub const SLOT_STATUS: usize = 0;
pub const SLOT_LEN: usize = 4;
pub const SLOT_DATA: usize = 8;

/// The two rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// host → guest
    Up,
    /// guest → host
    Down,
}

impl Dir {
    pub const fn info_off(self) -> usize {
        match self {
            Dir::Up => UP_INFO_OFF,
            Dir::Down => DOWN_INFO_OFF,
        }
    }
    pub const fn packets_off(self) -> usize {
        match self {
            Dir::Up => UP_PACKETS_OFF,
            Dir::Down => DOWN_PACKETS_OFF,
        }
    }
}

/// Offset of slot `idx` (taken modulo [`NR_PACKET`]) of ring `dir`.
#[inline(always)]
pub const fn slot_off(dir: Dir, idx: usize) -> usize {
    dir.packets_off() + (idx % NR_PACKET) * MAX_PACKET_SIZE
}

/// Next ring index.
#[inline(always)]
pub const fn next(idx: usize) -> usize {
    (idx + 1) % NR_PACKET
}
