//! The receive-side integrity check: every frame carries (session, flow, seq) and a checksum;
//! the verifier counts frames lost, corrupted, duplicated and reordered per flow.
//!
//! A frame's seq and flow id come from the peer, so they are untrusted: the counters saturate
//! instead of overflowing, and a verifier tracks a fixed number of flows (a table sized when it
//! is built; frames of other flow ids are counted, never tracked).

use crate::pkt::{read_payload, Payload};

/// Flows a [`Verifier::new`] tracks: the flow id our generator writes is its stream's index, and
/// one engine runs far fewer streams than this. Frames of a flow id at or past the cap are
/// counted as corrupted (and in [`VerifyCounts::unknown_flows`]).
pub const DEFAULT_MAX_FLOWS: usize = 1024;

/// Integrity counters. Every counter saturates at `u64::MAX`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyCounts {
    /// Frames that passed the check.
    pub good: u64,
    /// Sequence numbers never seen (gaps), less those that arrived late.
    pub lost: u64,
    /// Frames whose checksum or payload pattern did not match, or whose flow id is past the
    /// verifier's cap.
    pub corrupted: u64,
    /// Sequence numbers seen twice.
    pub duplicated: u64,
    /// Frames that arrived after a later sequence number of their flow.
    pub reordered: u64,
    /// Frames whose flow id is past the verifier's cap (also counted in `corrupted`): a peer
    /// inventing flow ids, or more sending streams than the cap.
    pub unknown_flows: u64,
}

impl VerifyCounts {
    pub fn add(&mut self, o: &VerifyCounts) {
        self.good = self.good.saturating_add(o.good);
        self.lost = self.lost.saturating_add(o.lost);
        self.corrupted = self.corrupted.saturating_add(o.corrupted);
        self.duplicated = self.duplicated.saturating_add(o.duplicated);
        self.reordered = self.reordered.saturating_add(o.reordered);
        self.unknown_flows = self.unknown_flows.saturating_add(o.unknown_flows);
    }
}

#[derive(Clone, Copy)]
struct Flow {
    session: u16,
    /// Highest sequence number seen in this session.
    top: u64,
    /// Bit i set: seq `top - i` was seen. Bit 0 is set once any frame was seen, so 0 means a
    /// flow never seen.
    window: u64,
}

const UNSEEN: Flow = Flow {
    session: 0,
    top: 0,
    window: 0,
};

/// Per-stream verifier: the flows are the sending streams.
pub struct Verifier {
    /// Indexed by flow id; allocated once, so checking a frame never allocates.
    flows: Box<[Flow]>,
    pub counts: VerifyCounts,
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier::new()
    }
}

impl Verifier {
    /// A verifier for flow ids below [`DEFAULT_MAX_FLOWS`].
    pub fn new() -> Self {
        Verifier::with_max_flows(DEFAULT_MAX_FLOWS)
    }

    /// A verifier for flow ids below `max_flows` (at most 65536: flow ids are 16 bits); its
    /// table takes 24 bytes a flow.
    pub fn with_max_flows(max_flows: usize) -> Self {
        Verifier {
            flows: vec![UNSEEN; max_flows.min(1 << 16)].into_boxed_slice(),
            counts: VerifyCounts::default(),
        }
    }

    /// Checks one received frame; returns what its payload says when it is intact (whatever
    /// the counts made of it), so a caller needs no second read.
    pub fn check(&mut self, frame: &[u8]) -> Option<Payload> {
        let c = &mut self.counts;
        let Some(p) = read_payload(frame) else {
            c.corrupted = c.corrupted.saturating_add(1);
            return None;
        };
        let Some(f) = self.flows.get_mut(p.flow as usize) else {
            c.unknown_flows = c.unknown_flows.saturating_add(1);
            c.corrupted = c.corrupted.saturating_add(1);
            return Some(p);
        };
        if f.window == 0 || f.session != p.session {
            // A new sender (or a restarted one): it starts at 0, so the numbers below this one
            // were lost.
            *f = Flow {
                session: p.session,
                top: p.seq,
                window: 1,
            };
            c.lost = c.lost.saturating_add(p.seq);
            c.good = c.good.saturating_add(1);
            return Some(p);
        }
        if p.seq > f.top {
            // `ahead` ≥ 1; the `ahead - 1` numbers in between were not seen (yet).
            let ahead = p.seq - f.top;
            c.lost = c.lost.saturating_add(ahead - 1);
            f.window = if ahead >= 64 {
                1
            } else {
                (f.window << ahead) | 1
            };
            f.top = p.seq;
            c.good = c.good.saturating_add(1);
            return Some(p);
        }
        let back = f.top - p.seq;
        if back < 64 && f.window & (1 << back) != 0 {
            c.duplicated = c.duplicated.saturating_add(1);
        } else {
            c.reordered = c.reordered.saturating_add(1);
            c.lost = c.lost.saturating_sub(1);
            c.good = c.good.saturating_add(1);
            if back < 64 {
                f.window |= 1 << back;
            }
        }
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pkt::{write_headers, write_payload, IP_DST, IP_SRC};
    use memnic_ethdev::MacAddr;

    fn frame(seq: u64, flow: u16, session: u16) -> Vec<u8> {
        let mut f = vec![0u8; 80];
        write_headers(
            &mut f,
            MacAddr::default(),
            MacAddr::default(),
            IP_SRC,
            IP_DST,
            80,
        );
        write_payload(&mut f, seq, flow, session);
        f
    }

    #[test]
    fn in_order_is_clean() {
        let mut v = Verifier::new();
        for s in 0..1000 {
            v.check(&frame(s, 0, 1));
        }
        assert_eq!(
            v.counts,
            VerifyCounts {
                good: 1000,
                ..Default::default()
            }
        );
    }

    #[test]
    fn counts_loss_duplicates_reorder_and_corruption() {
        let mut v = Verifier::new();
        for s in [0, 1, 2, 5, 5, 3, 6, 1] {
            v.check(&frame(s, 0, 1));
        }
        let mut bad = frame(7, 0, 1);
        bad[70] ^= 1;
        v.check(&bad);
        // 3 and 4 were missing when 5 came; 3 arrived late (reordered), 4 is lost.
        assert_eq!(
            v.counts,
            VerifyCounts {
                good: 6,
                lost: 1,
                corrupted: 1,
                duplicated: 2,
                reordered: 1,
                unknown_flows: 0,
            }
        );
    }

    #[test]
    fn flows_are_independent_and_a_new_session_restarts() {
        let mut v = Verifier::new();
        for s in 0..10 {
            v.check(&frame(s, 0, 1));
            v.check(&frame(s, 1, 1));
        }
        v.check(&frame(0, 0, 2));
        v.check(&frame(1, 0, 2));
        assert_eq!(
            v.counts,
            VerifyCounts {
                good: 22,
                ..Default::default()
            }
        );
        v.check(&frame(3, 1, 9));
        assert_eq!(
            v.counts.lost, 3,
            "a new session that starts at 3 lost 0..=2"
        );
    }

    // Crafted frames (a peer can send any seq and flow id with a valid checksum): the counts
    // saturate, nothing overflows (these run with debug overflow checks), memory stays bounded.

    #[test]
    fn seq_at_u64_max_then_zero_does_not_overflow() {
        let mut v = Verifier::new();
        v.check(&frame(u64::MAX, 0, 1));
        v.check(&frame(0, 0, 1));
        v.check(&frame(u64::MAX, 0, 1));
        assert_eq!(
            v.counts,
            VerifyCounts {
                good: 2,
                // 0..u64::MAX were missing when u64::MAX came; 0 then arrived late.
                lost: u64::MAX - 1,
                duplicated: 1,
                reordered: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn gaps_that_sum_past_u64_saturate_lost() {
        let mut v = Verifier::new();
        v.check(&frame(u64::MAX - 1, 0, 1));
        v.check(&frame(u64::MAX - 1, 1, 1));
        // A restarted sender on flow 0 jumps far ahead again.
        v.check(&frame(u64::MAX - 1, 0, 2));
        v.check(&frame(u64::MAX, 0, 2));
        assert_eq!(v.counts.lost, u64::MAX, "lost saturates");
        assert_eq!(v.counts.good, 4);
        assert_eq!(v.counts.duplicated + v.counts.reordered, 0);
        // A late frame takes one off a saturated count; nothing wraps.
        v.check(&frame(5, 1, 1));
        assert_eq!(v.counts.reordered, 1);
        assert_eq!(v.counts.lost, u64::MAX - 1);
    }

    #[test]
    fn adding_saturated_counts_does_not_overflow() {
        let full = VerifyCounts {
            good: u64::MAX,
            lost: u64::MAX,
            corrupted: u64::MAX,
            duplicated: u64::MAX,
            reordered: u64::MAX,
            unknown_flows: u64::MAX,
        };
        let mut sum = full;
        sum.add(&full);
        assert_eq!(sum, full);
    }

    #[test]
    fn every_flow_id_is_counted_and_only_1024_flows_are_tracked() {
        let mut v = Verifier::new();
        for flow in 0..=u16::MAX {
            v.check(&frame(0, flow, 1));
            v.check(&frame(2, flow, 1));
        }
        // Flows 0..1024 are tracked (2 good, 1 lost each); the rest are counted as corrupted.
        assert_eq!(v.counts.good, 2 * 1024);
        assert_eq!(v.counts.lost, 1024);
        assert_eq!(v.counts.corrupted, 2 * (65536 - 1024));
        assert!(
            v.flows.len() <= 1024,
            "{} flow entries for one stream",
            v.flows.len()
        );
    }

    #[test]
    fn the_cap_is_a_constructor_parameter_and_flows_past_it_are_counted_apart() {
        let mut v = Verifier::with_max_flows(2);
        for flow in [0, 1, 2, 3, u16::MAX] {
            v.check(&frame(0, flow, 1));
        }
        assert_eq!(v.counts.good, 2);
        assert_eq!(v.counts.corrupted, 3);
        assert_eq!(
            v.counts.unknown_flows, 3,
            "the unknown flow ids, told apart"
        );
        assert_eq!(Verifier::new().flows.len(), DEFAULT_MAX_FLOWS);
        assert_eq!(
            Verifier::with_max_flows(usize::MAX).flows.len(),
            65536,
            "no more than the flow ids there are"
        );
    }
}
