//! A hostile client floods ADD_RING or ADD_REGION messages, each carrying a file descriptor,
//! without waiting for the replies: the fds our server holds stay bounded, and the client is
//! disconnected with the reason. In a file of its own (its own process), since it counts this
//! process's open fds; the tests here run one at a time.

mod common;

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{add_ring, region, Fake, Server};
use memnic_memif::msg::{AddRegion, Msg, RingDirection, MSG_SIZE};
use memnic_shm::unix::EventFd;

static SERIAL: Mutex<()> = Mutex::new(());

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Sends `msg(i)` with `fd`, for i in 0..n, without reading replies, until the server hangs up.
/// Returns how many were sent and the most fds this process had open meanwhile.
fn flood(
    f: &Fake,
    n: usize,
    msg: impl Fn(usize) -> [u8; MSG_SIZE],
    fd: BorrowedFd<'_>,
) -> (usize, usize) {
    let mut peak = open_fds();
    for i in 0..n {
        if f.conn.send(&msg(i), &[fd]).is_err() {
            return (i, peak.max(open_fds()));
        }
        if i % 50 == 0 {
            peak = peak.max(open_fds());
        }
    }
    (n, peak.max(open_fds()))
}

/// Reads past the ACKs to the DISCONNECT and returns its reason.
fn disconnect_reason(f: &mut Fake) -> String {
    loop {
        match f.recv() {
            Some(Msg::Ack) => continue,
            Some(Msg::Disconnect(d)) => return d.reason.to_string_lossy().to_string(),
            other => panic!("expected DISCONNECT, got {other:?}"),
        }
    }
}

/// The fds this process has open come back to `baseline` (give or take a few) once the
/// server has dropped the client.
fn fds_return_to(baseline: usize) {
    let end = Instant::now() + Duration::from_secs(5);
    while open_fds() > baseline + 4 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        open_fds() <= baseline + 4,
        "{} fds open after the disconnect, {baseline} before the flood",
        open_fds()
    );
}

#[test]
fn a_flood_of_add_ring_keeps_our_fd_count_bounded_and_is_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let srv = Server::start("flood-ring");
    let reg = region(1 << 20);
    let ev = EventFd::new().unwrap();
    let mut f = Fake::connect(&srv.sock);
    f.init_with_region(&reg);
    let baseline = open_fds();
    // The same ring (C2S 0) again and again, each time with an eventfd.
    let ring = add_ring(RingDirection::C2S, 0, 0, 4).encode();
    let (sent, peak) = flood(&f, 10_000, |_| ring, ev.as_fd());
    eprintln!("ADD_RING flood: {sent} sent, {peak} fds at most, {baseline} before");
    assert!(
        peak <= baseline + 16,
        "{peak} fds open during a flood of {sent} ADD_RING, {baseline} before"
    );
    assert_eq!(disconnect_reason(&mut f), "Duplicate ring");
    drop(f);
    fds_return_to(baseline);
}

#[test]
fn a_flood_of_add_region_stops_at_the_256_regions_hello_allows() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let srv = Server::start("flood-region");
    let reg = region(1 << 16);
    let mut f = Fake::connect(&srv.sock);
    f.init(0);
    assert!(matches!(f.recv(), Some(Msg::Ack)));
    let baseline = open_fds();
    // Regions 0, 1, 2, ... all the same memfd, in order as the protocol wants.
    let (sent, peak) = flood(
        &f,
        10_000,
        |i| {
            Msg::AddRegion(AddRegion {
                index: i as u16,
                size: 1 << 16,
            })
            .encode()
        },
        reg.fd().unwrap(),
    );
    eprintln!("ADD_REGION flood: {sent} sent, {peak} fds at most, {baseline} before");
    assert!(
        peak <= baseline + 256 + 16,
        "{peak} fds open during a flood of {sent} ADD_REGION, {baseline} before"
    );
    assert_eq!(disconnect_reason(&mut f), "Invalid region index");
    drop(f);
    fds_return_to(baseline);
}
