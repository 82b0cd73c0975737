//! A peer that shrinks the memory it shared with us (SIGBUS on our next access, without shm's
//! guard) is dropped with a reason, and the next peer is served. In the client role there is
//! nothing a server can shrink: everything we share is in memfds sealed against shrinking.

mod common;

use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memnic_ethdev::Port;
use memnic_memif::msg::Msg;
use memnic_memif::ring::{ring_bytes, Desc, Ring};
use memnic_memif::{MemifConfig, MemifPort, Role, PEER_SHRANK};
use memnic_shm::unix::EventFd;
use memnic_shm::Region;
use memnic_test_support::{frame_packet, read_frame, ShmName};

/// Our server, a fake client whose region 0 is a plain tmpfs file (unsealed, as DPDK's
/// zero-copy client's EAL memory is): frames flow, the client truncates the file, the server
/// disconnects it with PEER_SHRANK, then serves a real client.
#[test]
fn poll_server_drops_a_client_that_shrinks_its_region_and_serves_the_next() {
    let sock = format!("/tmp/memnic-shrink-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let mut server = MemifPort::new("s", MemifConfig::new(Role::Server, &sock)).unwrap();
    let pool = memnic_test_support::pool("shrink", 1024, 2048);
    let mut rxq = server.take_rx_queue(0, &pool).unwrap();
    let _txq = server.take_tx_queue(0, &pool).unwrap();
    server.service(); // listening

    // The hostile client's memory: C2S ring, S2C ring, then 16 buffers of 2 KiB.
    let shm = ShmName::new("memif-shrink");
    let len = 1 << 16;
    let reg = Region::create_shared(shm.name(), len, 0o600).unwrap();
    assert!(!reg.is_shrink_sealed());
    let ev = EventFd::new().unwrap();
    let mut fake = std::thread::scope(|s| {
        let h = s.spawn(|| common::connect_good(&sock, &reg, &ev));
        while !h.is_finished() {
            server.service();
            std::thread::sleep(Duration::from_millis(1));
        }
        h.join().unwrap()
    });
    for _ in 0..10 {
        server.service();
    }
    assert!(server.is_connected(), "{:?}", server.last_reason);

    // Four frames on the C2S ring, as a client would put them.
    let c2s = Ring::new(
        Arc::new(Region::open_shared(shm.name(), len).unwrap()),
        0,
        4,
    )
    .unwrap();
    let bufs = 2 * ring_bytes(4);
    let mut cache = pool.cache();
    for seq in 0..4u16 {
        let m = frame_packet(&mut cache, seq as u64, 9, 100);
        let off = bufs + seq as usize * 2048;
        reg.write_bytes(off, &m.to_vec()).unwrap();
        c2s.write_desc(
            seq,
            Desc {
                flags: 0,
                region: 0,
                length: 100,
                offset: off as u32,
            },
        );
        cache.free(m);
    }
    // Release pairs with the server's Acquire load of head.
    c2s.head().store(4, Release);
    let mut got = Vec::new();
    for _ in 0..100 {
        rxq.rx_burst(&mut got, 32);
    }
    assert_eq!(got.len(), 4);
    for (seq, m) in got.drain(..).enumerate() {
        assert_eq!(read_frame(&m, 9), Ok(seq as u64));
        cache.free(m);
    }

    // The client shrinks its file under the mapping; the server's next accesses fault.
    std::fs::OpenOptions::new()
        .write(true)
        .open(shm.path())
        .unwrap()
        .set_len(0)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.is_connected() {
        assert!(Instant::now() < deadline, "the server kept the shrunk peer");
        rxq.rx_burst(&mut got, 32);
        server.service();
    }
    assert!(got.is_empty(), "nothing handed up from the shrunk region");
    assert_eq!(server.last_reason.as_deref(), Some(PEER_SHRANK));
    match fake.recv() {
        Some(Msg::Disconnect(d)) => assert_eq!(d.reason.to_string_lossy(), PEER_SHRANK),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
    // The test's own views of the file are guarded too: they read zeros now. (Acquire: no
    // store to pair with; whatever the zero page holds.)
    assert_eq!(c2s.head().load(Acquire), 0);
    drop((c2s, reg));

    // The next client is served.
    let mut client = MemifPort::new("c", MemifConfig::new(Role::Client, &sock)).unwrap();
    let _crx = client.take_rx_queue(0, &pool).unwrap();
    let mut ctx = client.take_tx_queue(0, &pool).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(client.is_connected() && server.is_connected()) {
        assert!(Instant::now() < deadline, "{:?}", server.last_reason);
        client.service();
        server.service();
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut burst: Vec<_> = (0..8)
        .map(|s| frame_packet(&mut cache, s, 10, 200))
        .collect();
    assert_eq!(ctx.tx_burst(&mut burst), 8);
    for _ in 0..100 {
        rxq.rx_burst(&mut got, 32);
    }
    assert_eq!(got.len(), 8);
    for (seq, m) in got.drain(..).enumerate() {
        assert_eq!(read_frame(&m, 10), Ok(seq as u64));
        cache.free(m);
    }
    let _ = std::fs::remove_file(&sock);
}

/// In the client role the server could only shrink what we share with it: region 0, a memfd
/// sealed against shrinking. A server that tries gets EPERM, and the client goes on.
#[test]
fn a_server_cannot_shrink_what_our_client_shares() {
    use memnic_memif::msg::{Hello, Name};
    use memnic_shm::unix::{poll, PollFd, SeqpacketListener, SocketAddrSpec};
    use std::os::fd::AsFd;

    let sock = format!("/tmp/memnic-shrink-client-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let l = SeqpacketListener::bind(&SocketAddrSpec::memif(&sock, false)).unwrap();
    let fake = std::thread::spawn(move || {
        let c = l.accept().unwrap();
        let recv = || {
            let mut pfd = [PollFd::readable(c.as_fd())];
            assert!(poll(&mut pfd, Some(Duration::from_secs(5))).unwrap() > 0);
            let mut buf = [0u8; 256];
            let got = c.recv(&mut buf).unwrap();
            (Msg::decode(&buf[..got.len]).unwrap(), got.fds)
        };
        c.send(
            &Msg::Hello(Hello::new(Name::truncated("fake"))).encode(),
            &[],
        )
        .unwrap();
        assert!(matches!(recv().0, Msg::Init(_)));
        c.send(&Msg::Ack.encode(), &[]).unwrap();
        let (m, mut fds) = recv();
        assert!(matches!(m, Msg::AddRegion(_)), "{m:?}");
        let fd = fds.pop().expect("region 0's fd");
        let file = std::fs::File::from(fd);
        let before = file.metadata().unwrap().len();
        let err = file.set_len(0).expect_err("region 0 must be sealed");
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
        assert_eq!(file.metadata().unwrap().len(), before);
        let r = Region::from_fd(file.into(), before as usize).unwrap();
        assert!(r.is_shrink_sealed() && !r.is_peer_controlled());
    });
    let mut client = MemifPort::new("c", MemifConfig::new(Role::Client, &sock)).unwrap();
    let pool = memnic_test_support::pool("c", 256, 2048);
    let _q = (
        client.take_rx_queue(0, &pool).unwrap(),
        client.take_tx_queue(0, &pool).unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fake.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the fake server never got region 0"
        );
        client.service();
        std::thread::sleep(Duration::from_millis(1));
    }
    fake.join().unwrap();
    client.service(); // the client lives on
    let _ = std::fs::remove_file(&sock);
}
