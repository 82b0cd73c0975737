//! A client's own counter lives in private memory: a server that rewrites the client's S2C head
//! in the ring (right after connect, before the client's first burst) cannot move the bound the
//! client checks the server's tail against.

mod harness;

use harness::{Harness, Kind};

#[test]
fn a_server_rewriting_the_clients_head_cannot_widen_its_window() {
    for kind in [Kind::ClientCopy, Kind::ClientZeroCopy] {
        let mut h = Harness::new(kind, 4, 2048);
        h.connect(); // the control path posted every S2C slot: head = 16 (size)
        let size = h.size();
        // Before the queue's first burst, the server doubles the head it sees and publishes a
        // tail one past the real head: a client that re-read its head from the ring would take
        // the 17 slots as frames (16 of them a second time around the ring).
        h.poke_counter(true, true, size.wrapping_mul(2), false);
        h.poke_counter(true, false, size + 1, false);
        // The model holds the head the control path posted: the burst must report the
        // violation and hand up nothing.
        h.rx(32);
    }
}
