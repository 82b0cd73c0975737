//! The receiver's hold-off (`rx_holdoff_ns`, both roles): after a poll that took a run of frames
//! and a poll that then found the ring empty, a poll inside the hold leaves the ring alone and
//! returns nothing although a frame waits, and the first poll after it takes the frame, whole.
//! A frame that came alone (a request, a ping) is followed by no hold; with no hold-off the
//! frame comes with the next poll.

use memnic_test_support as common;

use std::time::{Duration, Instant};

use common::ShmName;
use memnic_ethdev::{Mempool, Port, RxQueue, TxQueue};
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort};

/// Long enough that the polls around one tx_burst fall inside it on any machine.
const HOLD: Duration = Duration::from_millis(400);

/// Sends `n` 64-byte frames numbered from `seq`.
fn send(tx: &mut dyn TxQueue, pool: &Mempool, seq: u64, n: u64) {
    let mut out: Vec<_> = (seq..seq + n)
        .map(|s| {
            let mut m = pool.alloc().expect("pool");
            assert!(m.set_len(64));
            common::fill(m.as_mut_slice().unwrap(), s, 7);
            m
        })
        .collect();
    assert_eq!(tx.tx_burst(&mut out), n as usize);
}

/// Each way: after a poll that took `first` frames and an empty poll, one more frame is sent;
/// returns, per way, whether the poll right after it came back empty. Checks that the frame
/// arrives whole once any hold is over.
fn next_poll_after(first: u64, hold: Duration) -> [bool; 2] {
    let shm = ShmName::new("holdoff");
    let mut hcfg = HostConfig::new(shm.name());
    hcfg.rx_holdoff = hold;
    let mut host = HostPort::create("h", &hcfg).unwrap();
    let pool = common::pool("holdoff", 4096, 2048);
    let mut hrx = host.take_rx_queue(0, &pool).unwrap();
    let mut htx = host.take_tx_queue(0, &pool).unwrap();
    let mut gcfg = GuestConfig::new(shm.name());
    gcfg.rx_holdoff = hold;
    let mut guest =
        common::with_polling_host(&mut *hrx, Some(&mut *htx), || GuestPort::attach("g", &gcfg))
            .expect("attach");
    let mut grx = guest.take_rx_queue(0, &pool).unwrap();
    let mut gtx = guest.take_tx_queue(0, &pool).unwrap();
    let ways: [(&str, &mut dyn TxQueue, &mut dyn RxQueue); 2] = [
        ("host->guest", &mut *htx, &mut *grx),
        ("guest->host", &mut *gtx, &mut *hrx),
    ];
    let mut held = [false; 2];
    for (w, (way, tx, rx)) in ways.into_iter().enumerate() {
        let mut got = Vec::new();
        // Past any hold an earlier poll started (the attach's).
        std::thread::sleep(hold);
        send(tx, &pool, 0, first);
        assert_eq!(rx.rx_burst(&mut got, 32), first as usize, "{way}: one poll");
        assert_eq!(rx.rx_burst(&mut got, 32), 0, "{way}: the ring is empty");
        let t0 = Instant::now();
        send(tx, &pool, first, 1);
        let n = rx.rx_burst(&mut got, 32);
        // (A machine that stalled us past the hold leaves nothing to tell: counted as held.)
        let stalled = first >= 2 && !hold.is_zero() && t0.elapsed() >= hold;
        held[w] = n == 0 || stalled;
        if n == 0 {
            assert!(
                !hold.is_zero(),
                "{way}: no hold-off, yet the frame did not come"
            );
            std::thread::sleep(hold.saturating_sub(t0.elapsed()));
            assert_eq!(
                rx.rx_burst(&mut got, 32),
                1,
                "{way}: the first poll after the hold takes the frame"
            );
        }
        for (seq, m) in (0..).zip(&got) {
            assert_eq!(
                common::check_flow(m.as_slice().unwrap(), 7),
                Ok(seq),
                "{way}"
            );
        }
    }
    let _ = (&mut host, &mut guest);
    held
}

#[test]
fn an_empty_poll_after_a_run_leaves_the_ring_alone_for_the_hold_off() {
    assert_eq!(next_poll_after(2, HOLD), [true; 2]);
}

#[test]
fn a_frame_that_came_alone_is_followed_by_no_hold() {
    assert_eq!(next_poll_after(1, HOLD), [false; 2]);
}

#[test]
fn with_no_hold_off_every_poll_looks_at_the_ring() {
    assert_eq!(next_poll_after(2, Duration::ZERO), [false; 2]);
}
