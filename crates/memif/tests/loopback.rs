//! A memif server and client in one process (threads), over a real socket and memfd.

use std::time::Duration;

use memnic_ethdev::ahead::AheadMode;
use memnic_ethdev::demote::DemoteMode;
use memnic_ethdev::flush::FlushMode;
use memnic_ethdev::stream::StreamMode;
use memnic_ethdev::Port;
use memnic_memif::{MemifConfig, MemifPort, Role};
use memnic_pktbuf::{Mempool, PoolConfig};

fn pool() -> Mempool {
    memnic_test_support::pool("t", 4096, 2048)
}

/// Runs the handshake (the server waiting on a thread of its own) and asserts both ends
/// connected; returns the server.
fn connect(mut server: MemifPort, client: &mut MemifPort) -> MemifPort {
    let srv = std::thread::spawn(move || {
        let ok = server.wait_connected(Duration::from_secs(10));
        (ok, server)
    });
    assert!(
        client.wait_connected(Duration::from_secs(10)),
        "client: {:?}",
        client.last_reason
    );
    let (ok, server) = srv.join().unwrap();
    assert!(ok, "server: {:?}", server.last_reason);
    server
}

#[test]
fn handshake_connects_both_sides() {
    let sock = format!("/tmp/memif-test-{}.sock", std::process::id());
    let mut server = MemifPort::new("s", MemifConfig::new(Role::Server, &sock)).unwrap();
    let mut client = MemifPort::new("c", MemifConfig::new(Role::Client, &sock)).unwrap();
    let p = pool();
    let _srx = server.take_rx_queue(0, &p).unwrap();
    let _stx = server.take_tx_queue(0, &p).unwrap();
    let _crx = client.take_rx_queue(0, &p).unwrap();
    let _ctx = client.take_tx_queue(0, &p).unwrap();
    let _server = connect(server, &mut client);
    assert!(client.is_connected(), "client: {:?}", client.last_reason);
    let _ = std::fs::remove_file(&sock);
}

/// The control thread can sleep on the port: a server waiting for a client offers its
/// listening socket and asks to be served every few milliseconds; once connected, both offer
/// the connection and ask seldom (the next look for jammed interrupt lines), and the peer's
/// leaving makes the connection readable at once, well before that.
#[test]
fn control_descriptors_wake_the_control_thread_when_the_peer_leaves() {
    use memnic_shm::unix::{poll, PollFd};
    let sock = format!("/tmp/memif-test-fds-{}.sock", std::process::id());
    let mut server = MemifPort::new("s", MemifConfig::new(Role::Server, &sock)).unwrap();
    let mut client = MemifPort::new("c", MemifConfig::new(Role::Client, &sock)).unwrap();
    assert_eq!(server.control_fds().len(), 1, "the listening socket");
    assert_eq!(server.service_interval(), Some(Duration::from_millis(5)));
    assert_eq!(client.service_interval(), Some(Duration::from_millis(5)));
    let p = pool();
    let _srx = server.take_rx_queue(0, &p).unwrap();
    let _stx = server.take_tx_queue(0, &p).unwrap();
    let crx = client.take_rx_queue(0, &p).unwrap();
    let ctx = client.take_tx_queue(0, &p).unwrap();
    let mut server = connect(server, &mut client);
    assert_eq!(
        server.control_fds().len(),
        2,
        "the connection and the listening socket"
    );
    assert_eq!(client.control_fds().len(), 1, "the connection");
    for port in [&server, &client] {
        let every = port.service_interval().expect("asks");
        assert!(
            every > Duration::from_millis(5) && every <= Duration::from_millis(50),
            "{every:?}"
        );
    }
    // Nothing to read while the client stays.
    let quiet = {
        let fds = server.control_fds();
        let mut set: Vec<PollFd<'_>> = fds.iter().map(|&fd| PollFd::readable(fd)).collect();
        poll(&mut set, Some(Duration::from_millis(20))).unwrap()
    };
    assert_eq!(quiet, 0);
    drop((crx, ctx));
    drop(client);
    let t = std::time::Instant::now();
    let woke = {
        let fds = server.control_fds();
        let mut set: Vec<PollFd<'_>> = fds.iter().map(|&fd| PollFd::readable(fd)).collect();
        poll(&mut set, Some(Duration::from_secs(5))).unwrap()
    };
    assert!(
        woke > 0 && t.elapsed() < Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );
    server.service();
    assert!(!server.is_connected());
    assert_eq!(server.control_fds().len(), 1, "listening again");
    let _ = std::fs::remove_file(&sock);
}

/// Frame `seq` (the one payload format: memnic-fwd's, through memnic-test-support), any
/// length from 60 bytes, chained over the pool's buffers when longer than one; the pool may be
/// one a peer sees, so the frame is copied in.
fn frame(pool: &mut memnic_pktbuf::PoolCache, seq: u64, len: usize) -> memnic_pktbuf::Mbuf {
    memnic_test_support::frame_packet(pool, seq, FLOW, len)
}

fn check(m: &memnic_pktbuf::Mbuf, expect_seq: u64, len: usize) {
    assert_eq!(m.len(), len, "frame {expect_seq}: length");
    assert_eq!(
        m.nb_segs(),
        len.div_ceil(2048),
        "frame {expect_seq}: segments of 2 KiB"
    );
    assert_eq!(
        memnic_test_support::read_frame(m, FLOW),
        Ok(expect_seq),
        "frame {expect_seq}: intact and in order"
    );
}

const FLOW: u64 = 7;

fn big_pool() -> Mempool {
    memnic_test_support::pool("big", 16384, 2048)
}

/// Both directions, several queue pairs, sizes 60..9000 (a 9000-byte frame is one packet of five
/// 2 KiB segments on both sides, and a chain of 2 KiB memif slots between them): every frame
/// arrives, in order, intact, as one packet.
#[test]
fn poll_frames_cross_both_ways_on_every_queue_in_order() {
    let sock = format!("/tmp/memif-test-data-{}.sock", std::process::id());
    let nq = 3u16;
    // The server's rx queues flush every frame they copy, the client's none; the client's tx
    // queues stream every frame up to 128 B, the server's none, both demote the first lines of
    // every frame they write with plain stores, and the client's ask for the lines of the frames they
    // write ahead in shared state, the server's in exclusive: the counters say so.
    let mut scfg = MemifConfig::new(Role::Server, &sock);
    scfg.rx_flush = FlushMode::On;
    scfg.tx_stream = StreamMode::Off;
    scfg.tx_demote = DemoteMode::On;
    scfg.tx_ahead_shared = AheadMode::Off;
    let mut ccfg = MemifConfig::new(Role::Client, &sock);
    ccfg.rx_flush = FlushMode::Off;
    ccfg.tx_stream = StreamMode::On;
    ccfg.tx_demote = DemoteMode::On;
    ccfg.tx_ahead_shared = AheadMode::On;
    let mut server = MemifPort::new("s", scfg).unwrap();
    let mut client = MemifPort::new("c", ccfg).unwrap();
    let p = big_pool();
    let mut sq = Vec::new();
    let mut cq = Vec::new();
    for q in 0..nq {
        sq.push((
            server.take_rx_queue(q, &p).unwrap(),
            server.take_tx_queue(q, &p).unwrap(),
        ));
        cq.push((
            client.take_rx_queue(q, &p).unwrap(),
            client.take_tx_queue(q, &p).unwrap(),
        ));
    }
    let server = connect(server, &mut client);
    let sizes = [60usize, 64, 200, 1518, 2048, 2049, 4096, 9000];
    const N: u64 = 20_000;
    let mut cache = p.cache();
    let mut next_tx = vec![[0u64; 2]; nq as usize]; // [client->server, server->client]
    let mut next_rx = vec![[0u64; 2]; nq as usize];
    let mut pending: Vec<[Vec<memnic_pktbuf::Mbuf>; 2]> =
        (0..nq).map(|_| [Vec::new(), Vec::new()]).collect();
    let mut got = Vec::with_capacity(64);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while next_rx.iter().any(|r| r[0] < N || r[1] < N) {
        assert!(
            std::time::Instant::now() < deadline,
            "stalled at {next_rx:?}"
        );
        for q in 0..nq as usize {
            for dir in 0..2 {
                while pending[q][dir].len() < 32 && next_tx[q][dir] < N {
                    let s = next_tx[q][dir];
                    pending[q][dir].push(frame(
                        &mut cache,
                        s,
                        sizes[(s as usize + q) % sizes.len()],
                    ));
                    next_tx[q][dir] += 1;
                }
                let (tx, rx) = if dir == 0 {
                    (&mut cq[q].1, &mut sq[q].0)
                } else {
                    (&mut sq[q].1, &mut cq[q].0)
                };
                tx.tx_burst(&mut pending[q][dir]);
                rx.rx_burst(&mut got, 64);
                for m in got.drain(..) {
                    let s = next_rx[q][dir];
                    check(&m, s, sizes[(s as usize + q) % sizes.len()]);
                    next_rx[q][dir] += 1;
                    cache.free(m);
                }
            }
        }
    }
    let (srx, stx) = server.queue_stats();
    assert_eq!(srx.iter().map(|s| s.packets).sum::<u64>(), N * nq as u64);
    assert_eq!(stx.iter().map(|s| s.packets).sum::<u64>(), N * nq as u64);
    assert!(srx.iter().chain(&stx).all(|s| s.errors == 0));
    assert!(srx.iter().all(|s| s.tuned == N), "{srx:?}");
    let sent = |keep: fn(usize) -> bool| {
        (0..nq as u64)
            .flat_map(|q| (0..N).map(move |s| sizes[((s + q) % sizes.len() as u64) as usize]))
            .filter(|&len| keep(len))
            .count() as u64
    };
    assert_eq!(
        server.xstats(),
        vec![
            ("rx_flushed_packets", N * nq as u64),
            ("rx_flush_switches", 0),
            ("tx_streamed_packets", 0),
            ("tx_stream_switches", 0),
            ("tx_demoted_packets", N * nq as u64),
            ("tx_demote_switches", 0),
            ("tx_shared_ahead_packets", 0),
            ("tx_ahead_switches", 0),
            // The harness's ports poll without hold-off.
            ("rx_holdoffs", 0),
            ("rx_holdoffs_unpaid", 0)
        ]
    );
    assert_eq!(
        client.xstats(),
        vec![
            ("rx_flushed_packets", 0),
            ("rx_flush_switches", 0),
            ("tx_streamed_packets", sent(|len| len <= 128)),
            ("tx_stream_switches", 0),
            ("tx_demoted_packets", sent(|len| len > 128)),
            ("tx_demote_switches", 0),
            ("tx_shared_ahead_packets", N * nq as u64),
            ("tx_ahead_switches", 0),
            ("rx_holdoffs", 0),
            ("rx_holdoffs_unpaid", 0)
        ]
    );
    drop(server);
    drop(client);
    let _ = std::fs::remove_file(&sock);
}

/// Interrupt mode: an idle rx queue sleeps on its eventfd and the peer's transmit wakes it.
#[test]
fn poll_idle_rx_queue_sleeps_until_the_peer_kicks() {
    let sock = format!("/tmp/memif-test-irq-{}.sock", std::process::id());
    let mut server = MemifPort::new("s", MemifConfig::new(Role::Server, &sock)).unwrap();
    let mut client = MemifPort::new("c", MemifConfig::new(Role::Client, &sock)).unwrap();
    let p = pool();
    let mut srx = server.take_rx_queue(0, &p).unwrap();
    let _stx = server.take_tx_queue(0, &p).unwrap();
    let _crx = client.take_rx_queue(0, &p).unwrap();
    let mut ctx = client.take_tx_queue(0, &p).unwrap();
    let _server = connect(server, &mut client);
    let mut got = Vec::new();
    assert_eq!(srx.rx_burst(&mut got, 32), 0);
    // Nothing sent: the wait times out (it really sleeps rather than returning at once).
    let t = std::time::Instant::now();
    assert!(srx.wait(Duration::from_millis(200)));
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "woke after {:?} with nothing sent",
        t.elapsed()
    );
    // A frame sent from another thread while we sleep wakes us well before the timeout.
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let mut c = p.cache();
        let mut v = vec![frame(&mut c, 7, 64)];
        assert_eq!(ctx.tx_burst(&mut v), 1);
        ctx
    });
    let t = std::time::Instant::now();
    assert!(srx.wait(Duration::from_secs(10)));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the kick did not wake the queue"
    );
    let _ctx = sender.join().unwrap();
    assert_eq!(srx.rx_burst(&mut got, 32), 1);
    check(&got[0], 7, 64);
    let _ = std::fs::remove_file(&sock);
}

/// A server may transmit the moment it is connected, before the client's first rx burst: the
/// client posts its S2C ring at connect, so nothing is refused (copy and zero copy).
#[test]
fn poll_server_sends_before_the_client_first_polls() {
    for zero_copy in [false, true] {
        let sock = format!(
            "/tmp/memif-test-early-{}-{zero_copy}.sock",
            std::process::id()
        );
        let mut server = MemifPort::new("s", MemifConfig::new(Role::Server, &sock)).unwrap();
        let mut cfg = MemifConfig::new(Role::Client, &sock);
        cfg.zero_copy = zero_copy;
        let mut client = MemifPort::new("c", cfg).unwrap();
        let mut c = PoolConfig::new("early", 4096);
        c.huge = false;
        c.shared = true;
        let p = Mempool::new(&c).unwrap();
        let _srx = server.take_rx_queue(0, &p).unwrap();
        let mut stx = server.take_tx_queue(0, &p).unwrap();
        let mut crx = client.take_rx_queue(0, &p).unwrap();
        let _ctx = client.take_tx_queue(0, &p).unwrap();
        let server = connect(server, &mut client);

        let mut cache = p.cache();
        let mut burst: Vec<_> = (0..32).map(|s| frame(&mut cache, s, 100)).collect();
        assert_eq!(stx.tx_burst(&mut burst), 32, "zero_copy={zero_copy}");
        let mut got = Vec::new();
        for _ in 0..1000 {
            crx.rx_burst(&mut got, 32);
            if got.len() == 32 {
                break;
            }
        }
        assert_eq!(got.len(), 32, "zero_copy={zero_copy}");
        for (s, m) in got.drain(..).enumerate() {
            check(&m, s as u64, 100);
            cache.free(m);
        }
        drop((server, client));
        let _ = std::fs::remove_file(&sock);
    }
}

/// A server whose pool runs dry takes the frames it has buffers for, counts the shortfall and
/// leaves the rest in the ring; once the application frees what it holds they arrive, in order
/// and whole. A chained frame's further slots take their buffers from what the burst set aside
/// for its slots, never from the frames behind it (none is dropped for want of a segment).
#[test]
fn poll_a_server_short_of_buffers_takes_what_it_can_and_the_rest_waits() {
    let sock = format!("/tmp/memif-test-dry-{}.sock", std::process::id());
    let mut server = MemifPort::new("s", MemifConfig::new(Role::Server, &sock)).unwrap();
    let mut client = MemifPort::new("c", MemifConfig::new(Role::Client, &sock)).unwrap();
    let (big, small) = (pool(), memnic_test_support::pool("dry", 9, 2048));
    let mut srx = server.take_rx_queue(0, &small).unwrap();
    let _stx = server.take_tx_queue(0, &big).unwrap();
    let _crx = client.take_rx_queue(0, &big).unwrap();
    let mut ctx = client.take_tx_queue(0, &big).unwrap();
    let server = connect(server, &mut client);

    // 1518 B takes one 2 KiB buffer, 4096 B two (and two memif slots): 9 buffers hold 6 frames.
    let size = |s: u64| if s.is_multiple_of(2) { 1518 } else { 4096 };
    const N: u64 = 24;
    let mut cache = big.cache();
    let mut burst: Vec<_> = (0..N).map(|s| frame(&mut cache, s, size(s))).collect();
    assert_eq!(ctx.tx_burst(&mut burst), N as usize);
    let mut held = Vec::new();
    let mut next = 0u64;
    let mut dry_polls = 0;
    for _ in 0..1000 {
        if srx.rx_burst(&mut held, 64) == 0 {
            dry_polls += 1;
            // Nothing more fits: check and free what the application held.
            assert_eq!(held.len(), 6, "frames {next}..: as many as 9 buffers hold");
            let mut rx_cache = small.cache();
            for m in held.drain(..) {
                check(&m, next, size(next));
                next += 1;
                rx_cache.free(m);
            }
        }
        if next == N {
            break;
        }
    }
    assert_eq!(next, N, "every frame arrived");
    let stats = srx.stats();
    assert_eq!((stats.packets, stats.errors), (N, 0));
    assert!(stats.nombuf >= 3, "each dry poll counted: {stats:?}");
    assert!(dry_polls >= 4);
    drop((server, client));
    let _ = std::fs::remove_file(&sock);
}
