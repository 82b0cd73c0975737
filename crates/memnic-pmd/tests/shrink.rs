//! The region file cut under the host mid-traffic (by the guest, or any process that can open
//! it): the host survives (shm's SIGBUS guard), drops that guest with a reason, lays the region
//! out anew with its MAC, and serves the next guest. The old guest survives too: its view is
//! zero pages, so its link is down.

use memnic_test_support as common;

use std::time::{Duration, Instant};

use common::{Receiver, Sender, ShmName, DOWN, UP};
use memnic_ethdev::Port;
use memnic_pmd::host::REGION_SHRUNK;
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort};

/// Moves `n` frames each way between the host's and the guest's queues, verified.
fn exchange(
    h: (
        &mut dyn memnic_ethdev::RxQueue,
        &mut dyn memnic_ethdev::TxQueue,
    ),
    g: (
        &mut dyn memnic_ethdev::RxQueue,
        &mut dyn memnic_ethdev::TxQueue,
    ),
    pool: &memnic_ethdev::Mempool,
    n: u64,
) {
    let seed = common::seed();
    let (mut up, mut down) = (
        Sender::new(pool, seed, UP, n),
        Sender::new(pool, seed, DOWN, n),
    );
    let (mut g_rx, mut h_rx) = (
        Receiver::new(pool, seed, UP),
        Receiver::new(pool, seed, DOWN),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(up.done() && down.done() && g_rx.count == n && h_rx.count == n) {
        assert!(Instant::now() < deadline, "exchange stalled");
        up.poll(h.1);
        down.poll(g.1);
        g_rx.poll(g.0);
        h_rx.poll(h.0);
    }
}

#[test]
fn poll_host_survives_a_cut_region_and_serves_the_next_guest() {
    let _serial = common::serial();
    let shm = ShmName::new("shrink");
    let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let mac = host.info().mac;
    let pool = common::pool("p", 8192, 2048);
    let mut hrx = host.take_rx_queue(0, &pool).unwrap();
    let mut htx = host.take_tx_queue(0, &pool).unwrap();
    let mut gcfg = GuestConfig::new(shm.name());
    gcfg.reset_timeout = Duration::from_secs(20);
    let attach = |hrx: &mut dyn memnic_ethdev::RxQueue, htx: &mut dyn memnic_ethdev::TxQueue| {
        common::with_polling_host(hrx, Some(htx), || GuestPort::attach("g", &gcfg)).unwrap()
    };
    let mut guest = attach(&mut *hrx, &mut *htx);
    let mut grx = guest.take_rx_queue(0, &pool).unwrap();
    let mut gtx = guest.take_tx_queue(0, &pool).unwrap();
    exchange((&mut *hrx, &mut *htx), (&mut *grx, &mut *gtx), &pool, 500);

    // Someone cuts the file; both sides go on polling.
    std::fs::OpenOptions::new()
        .write(true)
        .open(shm.path())
        .unwrap()
        .set_len(4096)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut v = Vec::new();
    while host.shrinks() == 0 {
        assert!(Instant::now() < deadline, "the host never noticed");
        hrx.rx_burst(&mut v, 32);
        htx.tx_burst(&mut Vec::new());
        grx.rx_burst(&mut v, 32);
        host.service();
    }
    assert!(v.is_empty(), "nothing received out of a cut region");
    assert_eq!(host.last_reason.as_deref(), Some(REGION_SHRUNK));
    assert!(!host.link().up);
    assert!(!guest.link().up, "the old guest sees zero pages: link down");
    assert_eq!(
        std::fs::metadata(shm.path()).unwrap().len(),
        16 << 20,
        "grown back"
    );
    drop((grx, gtx, guest));

    // The next guest attaches to the laid-out region, sees our MAC, and traffic flows.
    let mut guest = attach(&mut *hrx, &mut *htx);
    assert!(guest.link().up && host.link().up);
    assert_eq!(
        memnic_pmd::host::read_mac(host.region()),
        mac,
        "the host keeps its MAC"
    );
    let mut grx = guest.take_rx_queue(0, &pool).unwrap();
    let mut gtx = guest.take_tx_queue(0, &pool).unwrap();
    exchange((&mut *hrx, &mut *htx), (&mut *grx, &mut *gtx), &pool, 2000);
    assert_eq!(host.shrinks(), 1);
}
