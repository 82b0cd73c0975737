//! The receiver's hold-off after an empty poll (`rx_holdoff_ns`, both roles): a poll inside the
//! hold leaves the ring alone and returns nothing although a frame waits; the first poll after
//! it takes the frame, whole; with no hold the frame comes with the next poll.

use memnic_test_support as common;

use std::time::{Duration, Instant};

use common::ShmName;
use memnic_ethdev::{Port, RxQueue, TxQueue};
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort};

/// Long enough that the two polls around one tx_burst fall inside it on any machine.
const HOLD: Duration = Duration::from_millis(400);

/// One frame each way: the receiver polls its empty ring, the other side sends, the receiver
/// polls again (held: nothing), then once the hold is over (the frame).
fn one_frame_each_way(hold: Duration) {
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
    for (seq, (way, tx, rx)) in (0u64..).zip(ways) {
        let mut got = Vec::new();
        // Past any hold an earlier empty poll started (the attach's), this poll looks at the
        // ring, finds it empty and starts the hold.
        std::thread::sleep(hold);
        assert_eq!(rx.rx_burst(&mut got, 32), 0, "{way}: the ring is empty");
        let t0 = Instant::now();
        let mut m = pool.alloc().expect("pool");
        assert!(m.set_len(64));
        common::fill(m.as_mut_slice().unwrap(), seq, 7);
        let mut out = vec![m];
        assert_eq!(tx.tx_burst(&mut out), 1, "{way}");
        let n = rx.rx_burst(&mut got, 32);
        if hold.is_zero() {
            assert_eq!(n, 1, "{way}: no hold, the frame comes with the next poll");
        } else {
            if t0.elapsed() < hold {
                assert_eq!(n, 0, "{way}: a poll inside the hold took a frame");
            }
            std::thread::sleep(hold.saturating_sub(t0.elapsed()));
            assert_eq!(
                n + rx.rx_burst(&mut got, 32),
                1,
                "{way}: the first poll after the hold takes the frame"
            );
        }
        assert_eq!(
            common::check_flow(got[0].as_slice().unwrap(), 7),
            Ok(seq),
            "{way}"
        );
    }
    let _ = (&mut host, &mut guest);
}

#[test]
fn an_empty_poll_leaves_the_ring_alone_for_the_hold_off() {
    one_frame_each_way(HOLD);
}

#[test]
fn with_no_hold_off_every_poll_looks_at_the_ring() {
    one_frame_each_way(Duration::ZERO);
}
