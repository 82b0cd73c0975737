//! [`DataError`]: what a peer did wrong on the rings, with the values it wrote.
//!
//! Every check of the data path ends in one of these. The message (`Display`) is for people and
//! logs: it carries the bad values (counters, ring size, descriptor fields). [`DataError::reason`]
//! is the short, fixed text sent to the peer in DISCONNECT (`specs/memif.md` §3, §8), the same
//! wording the driver has always sent.

use crate::msg::RingDirection;

/// Which counter a frame's chain ran past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerCounter {
    /// The client's head (the server receiving on a C2S ring).
    Head,
    /// The server's tail (the client receiving on an S2C ring).
    Tail,
}

impl std::fmt::Display for PeerCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PeerCounter::Head => "head",
            PeerCounter::Tail => "tail",
        })
    }
}

/// A protocol violation found on the rings: the queue stops using them and the port sends
/// DISCONNECT with [`DataError::reason`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// Server: the client's head is more than a ring ahead of where we are.
    #[error(
        "the client's head {head} is more than a ring of {size} slots ahead of the server's \
         position {tail}"
    )]
    HeadOutOfRange { head: u16, tail: u16, size: u16 },
    /// Client: the server's tail is not between our last tail and our own head.
    #[error(
        "the server's tail {tail} on the {dir:?} ring is not between the client's last tail \
         {seen} and its head {head} (ring of {size} slots)"
    )]
    TailOutOfRange {
        dir: RingDirection,
        head: u16,
        tail: u16,
        seen: u16,
        size: u16,
    },
    /// A frame's last published slot still says NEXT: the chain runs past the peer's counter.
    #[error(
        "the chain that starts at slot {first} runs past the peer's {counter} {end}: its last \
         published slot has NEXT set"
    )]
    ChainPastEnd {
        counter: PeerCounter,
        first: u16,
        end: u16,
    },
    /// A descriptor names a region we do not have, or a range outside it.
    #[error(
        "descriptor {slot} points outside its region: region {region}, offset {offset:#x}, \
         length {length}"
    )]
    OutsideRegion {
        slot: u16,
        region: u16,
        offset: u32,
        length: u32,
    },
    /// A descriptor is longer than the buffer behind its slot.
    #[error("descriptor {slot} says {length} bytes, its buffer holds {capacity}")]
    TooLong {
        slot: u16,
        length: u32,
        capacity: u32,
    },
    /// Zero copy: the server's tail moved over a slot we parked no buffer in.
    #[error("the server's tail moved over slot {slot}, which holds no buffer")]
    EmptySlot { slot: u16 },
    /// Server transmit: a slot the client handed us has no room for the rest of a frame.
    #[error("descriptor {slot} has no room (length 0) for the {left} bytes left of a frame")]
    NoRoom { slot: u16, left: u32 },
}

impl DataError {
    /// The reason sent in DISCONNECT (at most 95 bytes; the wording the driver has always used).
    pub fn reason(&self) -> &'static str {
        match self {
            DataError::HeadOutOfRange { .. } => "Ring head out of range",
            DataError::TailOutOfRange {
                dir: RingDirection::S2C,
                ..
            } => "Ring tail passed head",
            DataError::TailOutOfRange {
                dir: RingDirection::C2S,
                ..
            } => "Ring tail out of range",
            DataError::ChainPastEnd {
                counter: PeerCounter::Head,
                ..
            } => "Chained buffer runs past head",
            DataError::ChainPastEnd {
                counter: PeerCounter::Tail,
                ..
            } => "Chained buffer runs past tail",
            DataError::OutsideRegion { .. } => "Descriptor outside its region",
            DataError::TooLong { .. } => "Descriptor longer than its buffer",
            DataError::EmptySlot { .. } => "Tail moved over an empty slot",
            DataError::NoRoom { .. } => "Descriptor with no room",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_keep_the_wire_wording_and_messages_carry_the_values() {
        let e = DataError::TailOutOfRange {
            dir: RingDirection::S2C,
            head: 16,
            tail: 17,
            seen: 0,
            size: 16,
        };
        assert_eq!(e.reason(), "Ring tail passed head");
        let text = e.to_string();
        for v in ["17", "16", "S2C"] {
            assert!(text.contains(v), "'{text}' lacks {v}");
        }
        let e = DataError::OutsideRegion {
            slot: 3,
            region: 2,
            offset: 0x1000,
            length: 64,
        };
        assert_eq!(e.reason(), "Descriptor outside its region");
        assert!(e.to_string().contains("0x1000"));
        let all = [
            DataError::HeadOutOfRange {
                head: 0,
                tail: 0,
                size: 0,
            },
            DataError::TailOutOfRange {
                dir: RingDirection::C2S,
                head: 0,
                tail: 0,
                seen: 0,
                size: 0,
            },
            DataError::ChainPastEnd {
                counter: PeerCounter::Head,
                first: 0,
                end: 0,
            },
            DataError::ChainPastEnd {
                counter: PeerCounter::Tail,
                first: 0,
                end: 0,
            },
            DataError::TooLong {
                slot: 0,
                length: 0,
                capacity: 0,
            },
            DataError::EmptySlot { slot: 0 },
            DataError::NoRoom { slot: 0, left: 0 },
        ];
        for e in all {
            assert!(e.reason().len() < crate::msg::REASON_SIZE, "{e:?}");
        }
    }
}
