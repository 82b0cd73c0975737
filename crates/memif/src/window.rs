//! The ring window: the peer's counter, read once per burst against ours and checked once.
//!
//! Both counters are free-running `u16`s (`specs/memif.md` §5); what a burst may touch is the
//! distance from where we are to the peer's counter, mod 2^16. The peer can write any value, so
//! that distance is checked here, in one place, before any slot is read or written (§8):
//!
//! * a **server** reads the client's head: at most a ring ahead of the server's position (its
//!   last head on C2S, its tail on S2C);
//! * a **client** reads the server's tail: between its last tail and its own head, which it
//!   keeps in private memory (a tail that passes head is never a huge burst).

use crate::error::DataError;
use crate::msg::RingDirection;
use crate::ring::{acquire, Counter};

/// The slots `start, start + 1, …, end - 1` (mod 2^16) that the peer's counter hands us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Our position: the first slot of the window.
    pub start: u16,
    /// The peer's counter, as read (once).
    pub end: u16,
    /// `end - start`: how many slots are available, at most the ring size.
    pub avail: u16,
}

impl Window {
    /// Server: the client's `head` against our position `from`, in a ring of `size` slots.
    #[inline(always)]
    pub fn server(head: &impl Counter, from: u16, size: u16) -> Result<Window, DataError> {
        let end = acquire(head);
        let avail = end.wrapping_sub(from);
        if avail > size {
            return Err(head_out_of_range(end, from, size));
        }
        Ok(Window {
            start: from,
            end,
            avail,
        })
    }

    /// Client: the server's `tail` against our last tail `from` and our own `head` (private),
    /// on the ring `dir` of `size` slots. Needs `head - from <= size`, which the client keeps.
    #[inline(always)]
    pub fn client(
        tail: &impl Counter,
        from: u16,
        head: u16,
        size: u16,
        dir: RingDirection,
    ) -> Result<Window, DataError> {
        let end = acquire(tail);
        let avail = end.wrapping_sub(from);
        if avail > head.wrapping_sub(from) {
            return Err(tail_out_of_range(dir, head, end, from, size));
        }
        Ok(Window {
            start: from,
            end,
            avail,
        })
    }

    /// Slot (counter value) `i` of the window.
    #[inline(always)]
    pub fn slot(&self, i: u16) -> u16 {
        self.start.wrapping_add(i)
    }

    /// Client transmit: the slots free after our `head` once the peer is at `end`.
    #[inline(always)]
    pub fn room(&self, head: u16, size: u16) -> u16 {
        // The client window guarantees end ∈ [start, head] and head - start <= size.
        size - head.wrapping_sub(self.end)
    }
}

#[cold]
#[inline(never)]
fn head_out_of_range(head: u16, tail: u16, size: u16) -> DataError {
    DataError::HeadOutOfRange { head, tail, size }
}

#[cold]
#[inline(never)]
fn tail_out_of_range(dir: RingDirection, head: u16, tail: u16, seen: u16, size: u16) -> DataError {
    DataError::TailOutOfRange {
        dir,
        head,
        tail,
        seen,
        size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU16;

    #[test]
    fn a_server_accepts_at_most_a_ring_ahead_across_the_wrap() {
        let at = |head: u16, from: u16| Window::server(&AtomicU16::new(head), from, 16);
        assert_eq!(at(5, 5).unwrap().avail, 0);
        assert_eq!(at(4, 0xfff8).unwrap().avail, 12, "wraps");
        assert_eq!(at(8, 0xfff8).unwrap().avail, 16, "a full ring");
        assert_eq!(
            at(9, 0xfff8),
            Err(DataError::HeadOutOfRange {
                head: 9,
                tail: 0xfff8,
                size: 16
            })
        );
        assert!(at(4, 5).is_err(), "head behind us is a huge distance");
        let w = at(3, 0xffff).unwrap();
        assert_eq!((w.slot(0), w.slot(1), w.slot(3)), (0xffff, 0, 2));
    }

    #[test]
    fn a_client_accepts_a_tail_only_between_its_last_tail_and_its_head() {
        let at = |tail: u16, from: u16, head: u16| {
            Window::client(&AtomicU16::new(tail), from, head, 16, RingDirection::C2S)
        };
        assert_eq!(at(0xfffe, 0xfffe, 4).unwrap().avail, 0);
        assert_eq!(at(2, 0xfffe, 4).unwrap().avail, 4, "wraps");
        assert_eq!(at(4, 0xfffe, 4).unwrap().avail, 6, "up to head");
        assert_eq!(
            at(5, 0xfffe, 4),
            Err(DataError::TailOutOfRange {
                dir: RingDirection::C2S,
                head: 4,
                tail: 5,
                seen: 0xfffe,
                size: 16
            }),
            "one past head"
        );
        assert!(at(0xfffd, 0xfffe, 4).is_err(), "behind the last tail");
        // Room after our head: 16 - in flight.
        assert_eq!(at(2, 0xfffe, 4).unwrap().room(4, 16), 14);
        assert_eq!(at(0xfffe, 0xfffe, 0xfffe).unwrap().room(0xfffe, 16), 16);
        assert_eq!(at(0xfffe, 0xfffe, 14).unwrap().room(14, 16), 0, "full");
    }
}
