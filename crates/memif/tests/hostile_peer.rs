//! A fake memif client that breaks the protocol in every way we could think of, against our
//! server: each mistake is answered with DISCONNECT and a reason, the server never crashes, and
//! it serves a well-behaved client afterwards. Plus a property test of descriptor validation.

mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{add_ring, connect_good, region, Fake, Server};
use memnic_ethdev::Port;
use memnic_memif::msg::{AddRegion, Init, InterfaceMode, Msg, Name, RingDirection, Secret};
use memnic_memif::ring::{ring_bytes, Desc, Regions, Ring};
use memnic_memif::{MemifConfig, MemifPort, Role, CLOSERS_BUSY, GREETINGS_BUSY, PEER_JAMMED};
use memnic_pktbuf::{Mempool, PoolConfig};
use memnic_shm::unix::{
    closers_busy, closes_done_within, closes_waiting_from, lingering_socket, on_a_thread_as_uid,
    EventFd, Sender, SeqpacketConn, SocketAddrSpec, MAX_CLOSERS,
};
use memnic_shm::Region;
use proptest::prelude::*;

#[test]
fn poll_every_protocol_mistake_gets_disconnect_and_the_server_survives() {
    let srv = Server::start("mistakes");
    let s = &srv.sock;
    let ev = EventFd::new().unwrap();
    let reg = region(1 << 20);

    let mut f = Fake::connect(s);
    f.send(&[0u8; 100], &[]);
    f.expect_disconnect("Invalid message size");

    let mut f = Fake::connect(s);
    let mut bad = Msg::Ack.encode();
    bad[0] = 77;
    f.send(&bad, &[]);
    f.expect_disconnect("Unknown message type");

    let mut f = Fake::connect(s);
    f.send_connect();
    f.expect_disconnect("Unexpected message");

    let mut f = Fake::connect(s);
    f.init(7);
    f.expect_disconnect("ID not found");

    let mut f = Fake::connect(s);
    let mut m = Msg::Init(Init {
        version: 0x0100,
        id: 0,
        mode: InterfaceMode::Ethernet,
        secret: Secret::empty(),
        name: Name::truncated("old"),
    })
    .encode();
    m[2..4].copy_from_slice(&0x0100u16.to_le_bytes());
    f.send(&m, &[]);
    f.expect_disconnect("Incompatible memif version");

    refuse_region(
        s,
        AddRegion {
            index: 0,
            size: 1 << 20,
        },
        &[],
        "Missing region fd",
    );

    refuse_region(
        s,
        AddRegion {
            index: 0,
            size: 1 << 20,
        },
        &[reg.fd().unwrap(), ev.as_fd()],
        "Unexpected file descriptor",
    );

    refuse_region(
        s,
        AddRegion {
            index: 0,
            size: 2 << 20,
        },
        &[reg.fd().unwrap()],
        "Invalid region size",
    );

    refuse_region(
        s,
        AddRegion {
            index: 1,
            size: 1 << 20,
        },
        &[reg.fd().unwrap()],
        "Invalid region index",
    );

    // Rings: outside the region, missing eventfd, a wrong cookie at CONNECT.
    for (ring, fd_too, reason) in [
        (
            add_ring(RingDirection::C2S, 0, (1 << 20) - 256, 10),
            true,
            "Invalid ring offset",
        ),
        (
            add_ring(RingDirection::C2S, 3, 0, 10),
            true,
            "Invalid ring region",
        ),
        (
            add_ring(RingDirection::C2S, 0, 0, 10),
            false,
            "Missing interrupt fd",
        ),
    ] {
        let mut f = Fake::connect(s);
        f.init_with_region(&reg);
        let fds = if fd_too { vec![ev.as_fd()] } else { vec![] };
        f.send(&ring.encode(), &fds);
        f.expect_disconnect(reason);
    }
    let mut f = Fake::connect(s);
    f.init(0);
    assert!(matches!(f.recv(), Some(Msg::Ack)));
    let blank = region(1 << 20);
    f.send(
        &Msg::AddRegion(AddRegion {
            index: 0,
            size: 1 << 20,
        })
        .encode(),
        &[blank.fd().unwrap()],
    );
    assert!(matches!(f.recv(), Some(Msg::Ack)));
    for (dir, at) in [(RingDirection::C2S, 0), (RingDirection::S2C, 1 << 16)] {
        f.send(&add_ring(dir, 0, at, 10).encode(), &[ev.as_fd()]);
        assert!(matches!(f.recv(), Some(Msg::Ack)));
    }
    f.send_connect();
    f.expect_disconnect("Wrong ring");

    // CONNECT without a ring each way: the link would be up with nothing to move frames on.
    let mut f = Fake::connect(s);
    f.init_with_region(&reg);
    f.send(
        &add_ring(RingDirection::C2S, 0, 0, 10).encode(),
        &[ev.as_fd()],
    );
    assert!(matches!(f.recv(), Some(Msg::Ack)));
    f.send_connect();
    f.expect_disconnect("No S2C ring");

    // A region in a plain file (not memfd, tmpfs or hugetlbfs): refused before we ask its
    // filesystem anything (one the peer serves, FUSE, could hang us).
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let plain = memnic_test_support::unlinked_file(dir, "plain-region", 1 << 20);
    if !Region::is_shared_memory_fd(plain.as_fd()) {
        refuse_region(
            s,
            AddRegion {
                index: 0,
                size: 1 << 20,
            },
            &[plain.as_fd()],
            "Region fd is not shared memory",
        );
    }
    drop(plain);

    // A region past what one peer may make us map (a sparse file), refused before mapping.
    let huge = Region::memfd("huge", 1 << 20, false).unwrap();
    let size = memnic_shm::MAX_PEER_BYTES + 4096;
    std::fs::File::from(huge.fd().unwrap().try_clone_to_owned().unwrap())
        .set_len(size)
        .unwrap();
    let huge_region = AddRegion { index: 0, size };
    refuse_region(s, huge_region, &[huge.fd().unwrap()], "Regions too large");

    // After all that, a well-formed client still connects.
    let good = connect_good(s, &region(1 << 20), &ev);
    drop(good);
    let p = srv.port.lock().unwrap();
    assert!(p.connects >= 1);
}

#[test]
fn poll_descriptors_outside_the_region_and_wild_counters_disconnect() {
    let srv = Server::start("desc");
    let ev = EventFd::new().unwrap();
    for case in 0..3 {
        let reg = region(1 << 16);
        let mut f = connect_good(&srv.sock, &reg, &ev);
        let c2s = Ring::new(
            Arc::new(
                Region::from_fd(reg.fd().unwrap().try_clone_to_owned().unwrap(), reg.len())
                    .unwrap(),
            ),
            0,
            4,
        )
        .unwrap();
        match case {
            // A descriptor pointing past the end of the region.
            0 => c2s.write_desc(
                0,
                Desc {
                    flags: 0,
                    region: 0,
                    length: 64,
                    offset: (1 << 16) - 32,
                },
            ),
            // A descriptor naming a region that was never added.
            1 => c2s.write_desc(
                0,
                Desc {
                    flags: 0,
                    region: 5,
                    length: 64,
                    offset: 0,
                },
            ),
            // A chain that runs past head.
            _ => c2s.write_desc(
                0,
                Desc {
                    flags: 1,
                    region: 0,
                    length: 64,
                    offset: 4096,
                },
            ),
        }
        c2s.head().store(1, Relaxed);
        if case == 2 {
            // Also move head far beyond the ring for good measure on the next connection.
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let reason = loop {
            match f.recv() {
                Some(Msg::Disconnect(d)) => break d.reason.to_string_lossy().to_string(),
                Some(_) => continue,
                None => assert!(Instant::now() < deadline, "case {case}: no DISCONNECT"),
            }
        };
        let want = ["outside its region", "outside its region", "runs past head"][case];
        assert!(reason.contains(want), "case {case}: reason '{reason}'");
    }
    // A head a whole ring and more ahead of the server's tail.
    let reg = region(1 << 16);
    let mut f = connect_good(&srv.sock, &reg, &ev);
    let c2s = Ring::new(
        Arc::new(
            Region::from_fd(reg.fd().unwrap().try_clone_to_owned().unwrap(), reg.len()).unwrap(),
        ),
        0,
        4,
    )
    .unwrap();
    c2s.head().store(40, Relaxed);
    match f.recv() {
        Some(Msg::Disconnect(d)) => assert!(d.reason.to_string_lossy().contains("out of range")),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
}

proptest! {
    /// A descriptor is located only when it lies wholly inside an existing region.
    #[test]
    fn locate_accepts_exactly_the_descriptors_inside_a_region(
        sizes in proptest::collection::vec(1usize..5, 0..4),
        region in any::<u16>(),
        offset in any::<u32>(),
        len in any::<u32>(),
    ) {
        let regions = Regions(sizes.iter().map(|s| Arc::new(Region::private(s * 4096, false).unwrap())).collect());
        let inside = (region as usize) < sizes.len()
            && (offset as u64 + len as u64) <= (sizes[region as usize] * 4096) as u64;
        prop_assert_eq!(regions.locate(region, offset, len).is_some(), inside);
    }
}

/// A client that says INIT and then nothing holds its interface only until the handshake step's
/// deadline: then it is told why and dropped, and a real client gets the interface.
#[test]
fn a_client_silent_after_init_is_timed_out_and_frees_the_interface() {
    let srv = Server::start_with("silent-init", |c| {
        c.handshake_timeout = Duration::from_millis(300)
    });
    let mut silent = Fake::connect(&srv.sock);
    silent.init(0);
    assert!(matches!(silent.recv(), Some(Msg::Ack)));
    // While it holds the interface, another client for it is turned away.
    let mut other = Fake::connect(&srv.sock);
    other.init(0);
    other.expect_disconnect("Already connected");
    // A real client, retrying, gets in once the silent one's deadline has passed.
    let mut c = MemifPort::new("c", MemifConfig::new(Role::Client, &srv.sock)).unwrap();
    let p = pool();
    let _q = (
        c.take_rx_queue(0, &p).unwrap(),
        c.take_tx_queue(0, &p).unwrap(),
    );
    assert!(
        c.wait_connected(Duration::from_secs(10)),
        "{:?}",
        c.last_reason
    );
    silent.expect_disconnect("Timeout waiting for the next handshake message");
    assert_eq!(srv.port.lock().unwrap().connects, 1);
}

/// A client that jams the interrupt line it gave us (clears O_NONBLOCK on the eventfd, which
/// our copy shares, and fills the counter): a kick of ours that had looked just before would
/// block its lcore for ever (`notify_blocking_elsewhere` on the same eventfd stands in for it). The
/// server empties the line, which lets that write through, and disconnects the client; the
/// next client is served.
#[test]
fn a_client_that_jams_its_interrupt_line_is_emptied_and_disconnected() {
    let srv = Server::start("jam");
    let ev = EventFd::new().unwrap();
    let mut f = connect_good(&srv.sock, &region(1 << 16), &ev);
    ev.jam().unwrap();
    let kick = ev.notify_blocking_elsewhere().unwrap();
    assert!(
        kick.returned_within(Duration::from_secs(5)),
        "the server empties a jammed line"
    );
    f.expect_disconnect(PEER_JAMMED);
    let next = EventFd::new().unwrap();
    let _f = connect_good(&srv.sock, &region(1 << 16), &next);
    assert_eq!(srv.port.lock().unwrap().connects, 2);
}

/// A client that reconnects again and again, each time with a descriptor whose close waits on
/// it (a lingering socket, as a FUSE file whose server does not answer), fills its user's
/// closer threads; from then on new clients of that user are refused with CLOSERS_BUSY (our
/// descriptor table does not grow with its reconnects), while a client of another user is
/// served, until it lets the closes finish, when a good client of its user is served too.
#[test]
fn a_client_whose_descriptors_never_close_is_refused_once_its_users_closers_are_full() {
    let srv = Server::start("closers");
    let me = Sender::uid(std::fs::metadata("/proc/self").unwrap().uid());
    let mut held = Vec::new();
    for _ in 0..MAX_CLOSERS {
        let (ours, theirs) = lingering_socket().unwrap();
        let mut f = Fake::connect(&srv.sock);
        // Any message carries descriptors: this one is refused, and its descriptor with it.
        f.send(&Msg::Ack.encode(), &[ours.as_fd()]);
        drop(ours); // the server's copy is now the last: its close waits
        f.expect_disconnect("Unexpected file descriptor");
        held.push(theirs);
    }
    assert_eq!(closes_waiting_from(me), MAX_CLOSERS);
    for _ in 0..3 {
        let conn = SeqpacketConn::connect(&SocketAddrSpec::memif(&srv.sock, false)).unwrap();
        Fake { conn }.expect_disconnect(CLOSERS_BUSY);
    }
    // A refused client that queued messages first, each with lingering sockets (the server
    // held still meanwhile): its connection waits to close as one descriptor, not as every
    // descriptor it queued.
    let mut lingering = Vec::new();
    let conn = {
        let _still = srv.port.lock().unwrap();
        let conn = SeqpacketConn::connect(&SocketAddrSpec::memif(&srv.sock, false)).unwrap();
        for _ in 0..3 {
            let socks: Vec<_> = (0..8).map(|_| lingering_socket().unwrap()).collect();
            let fds: Vec<_> = socks.iter().map(|(ours, _)| ours.as_fd()).collect();
            conn.send(&Msg::Ack.encode(), &fds).unwrap();
            lingering.extend(socks.into_iter().map(|(_, theirs)| theirs));
        }
        conn
    };
    Fake { conn }.expect_disconnect(CLOSERS_BUSY);
    let since = Instant::now();
    while closes_waiting_from(me) < MAX_CLOSERS + 1 && since.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        closes_waiting_from(me),
        MAX_CLOSERS + 1,
        "the connection, whole"
    );
    held.extend(lingering);
    // Another user's client is not held up by this one's closes.
    let ev = EventFd::new().unwrap();
    let reg = region(1 << 16);
    let other = on_a_thread_as_uid(4242, || connect_good(&srv.sock, &reg, &ev)).unwrap();
    assert_eq!(srv.port.lock().unwrap().connects, 1);
    drop(other);

    drop(held); // the peer lets go: every close returns
    assert!(
        closes_done_within(Duration::from_secs(5)),
        "every refused descriptor was closed"
    );
    assert!(!closers_busy(me));
    let ev = EventFd::new().unwrap();
    let _f = connect_good(&srv.sock, &region(1 << 16), &ev);
    assert_eq!(srv.port.lock().unwrap().connects, 2);
}

/// One user's clients that connect and say nothing take at most 8 of the greeting places:
/// its 9th is refused with GREETINGS_BUSY while another user's client is greeted; once its
/// silent clients go, it is greeted again.
#[test]
fn one_users_silent_clients_do_not_take_every_greeting_place() {
    let srv = Server::start("greetings");
    let silent = on_a_thread_as_uid(4242, || {
        let silent: Vec<Fake> = (0..8).map(|_| Fake::connect(&srv.sock)).collect();
        let conn = SeqpacketConn::connect(&SocketAddrSpec::memif(&srv.sock, false)).unwrap();
        Fake { conn }.expect_disconnect(GREETINGS_BUSY);
        silent
    })
    .unwrap();
    let ev = EventFd::new().unwrap();
    let reg = region(1 << 16);
    drop(connect_good(&srv.sock, &reg, &ev));
    assert_eq!(srv.port.lock().unwrap().connects, 1);
    drop(silent);
    on_a_thread_as_uid(4242, || {
        let since = Instant::now();
        // Their places are freed as the server sees them closed.
        loop {
            let conn = SeqpacketConn::connect(&SocketAddrSpec::memif(&srv.sock, false)).unwrap();
            let mut f = Fake { conn };
            match f.recv() {
                Some(Msg::Hello(_)) => break,
                other if since.elapsed() > Duration::from_secs(5) => panic!("{other:?}"),
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    })
    .unwrap();
}

/// A client greeted before its user's closes filled up sends a message with descriptors: it
/// is not read (a read takes up to 253 descriptors into our table, and what the table cannot
/// take the kernel releases inside the read, on the control path) but refused unread.
#[test]
fn a_busy_users_message_is_refused_unread() {
    use memnic_shm::unix::dispose_from;
    let srv = Server::start("unread");
    let me = Sender::uid(std::fs::metadata("/proc/self").unwrap().uid());
    let mut f = Fake::connect(&srv.sock);
    let mut held = Vec::new();
    for _ in 0..MAX_CLOSERS {
        let (ours, theirs) = lingering_socket().unwrap();
        dispose_from(ours.into(), me);
        held.push(theirs);
    }
    let evs: Vec<EventFd> = (0..16).map(|_| EventFd::new().unwrap()).collect();
    let fds: Vec<_> = evs.iter().map(|e| e.as_fd()).collect();
    let init = Msg::Init(Init {
        version: memnic_memif::msg::VERSION,
        id: 0,
        mode: InterfaceMode::Ethernet,
        secret: Secret::empty(),
        name: Name::truncated("fake"),
    });
    f.send(&init.encode(), &fds);
    f.expect_disconnect(CLOSERS_BUSY);
    drop(held);
    assert!(closes_done_within(Duration::from_secs(5)));
}

/// A region or interrupt descriptor we refuse (a socket whose close waits on its peer) is
/// disposed of as its sender's, the user the client runs as: not as nobody's, which would count
/// against every user. The server is held still (its lock) while the client sends and lets go
/// of its copy, so ours is the last and its close waits.
#[test]
fn a_refused_region_or_interrupt_descriptor_counts_against_its_sender() {
    let srv = Server::start("sender");
    let sender = Sender::uid(4242);
    let reg = region(1 << 16);
    let mut held = Vec::new();
    let refuse = |f: &mut Fake, m: Msg, reason: &str, held: &mut Vec<_>| {
        let (ours, theirs) = lingering_socket().unwrap();
        held.push(theirs);
        {
            let _still = srv.port.lock().unwrap();
            f.send(&m.encode(), &[ours.as_fd()]);
            drop(ours);
        }
        f.expect_disconnect(reason);
    };
    on_a_thread_as_uid(4242, || {
        let mut f = Fake::connect(&srv.sock);
        f.init(0);
        assert!(matches!(f.recv(), Some(Msg::Ack)));
        let r = AddRegion {
            index: 0,
            size: 1 << 16,
        };
        let why = "Region fd is not shared memory";
        refuse(&mut f, Msg::AddRegion(r), why, &mut held);
        let mut f = Fake::connect(&srv.sock);
        f.init_with_region(&reg);
        let ring = add_ring(RingDirection::C2S, 0, 0, 4);
        refuse(&mut f, ring, "Invalid interrupt fd", &mut held);
    })
    .unwrap();
    assert_eq!(closes_waiting_from(sender), 2);
    assert_eq!(closes_waiting_from(Sender::UNKNOWN), 0);
    drop(held);
    assert!(closes_done_within(Duration::from_secs(5)));
}

/// A message with more descriptors than we take (16 eventfds, then a socket whose close
/// waits on the peer): the surplus is ours to dispose of, not the kernel's to release inside
/// our `recvmsg`, where the lingering socket's last close would hold the control path. The next
/// client is greeted at once.
#[test]
fn a_descriptor_past_the_ones_we_take_is_not_closed_on_the_control_path() {
    let srv = Server::start("surplus");
    let (ours, theirs) = lingering_socket().unwrap();
    let evs: Vec<EventFd> = (0..16).map(|_| EventFd::new().unwrap()).collect();
    let mut fds: Vec<_> = evs.iter().map(|e| e.as_fd()).collect();
    fds.push(ours.as_fd());
    let mut f = Fake::connect(&srv.sock);
    f.send(&Msg::Ack.encode(), &fds);
    drop(fds);
    drop(ours); // the server's copy is now the last: its close waits
    f.expect_disconnect("Invalid message size"); // more descriptors than a message may carry
    let _next = Fake::connect(&srv.sock); // greeted
    drop(theirs);
}

/// A client's second message, still queued when its first is refused and the connection
/// dropped, carries a socket whose close waits on the client: the queue is taken off (and its
/// descriptors closed elsewhere) before the socket closes, so the control path goes on and the
/// next client is greeted at once.
#[test]
fn a_message_queued_behind_a_refused_one_is_not_closed_on_the_control_path() {
    let srv = Server::start("queued");
    let (ours, theirs) = lingering_socket().unwrap();
    let ev = EventFd::new().unwrap();
    let mut f = Fake::connect(&srv.sock);
    f.send(&Msg::Ack.encode(), &[ev.as_fd()]); // refused
    f.send(&Msg::Ack.encode(), &[ours.as_fd()]); // still queued when the connection goes
    drop(ours); // the server's copy is now the last: its close waits
    f.expect_disconnect("Unexpected file descriptor");
    let _next = Fake::connect(&srv.sock); // greeted
    drop(theirs);
}

/// Each direction has one ring per queue: a second ring with the same direction and index, or
/// an index past our queues, is refused.
#[test]
fn a_repeated_or_out_of_range_ring_is_refused() {
    let srv = Server::start("rings");
    let ev = EventFd::new().unwrap();
    let reg = region(1 << 20);
    let off = ring_bytes(4) as u32;
    for (first, second, reason) in [
        // The same direction and index twice (at CONNECT the second would replace the first).
        (Some(0), 0, "Duplicate ring"),
        // Index 1: the server has one queue pair.
        (None, 1, "Invalid ring index"),
    ] {
        let mut f = Fake::connect(&srv.sock);
        f.init_with_region(&reg);
        if let Some(i) = first {
            let mut m = add_ring(RingDirection::C2S, 0, 0, 4);
            if let Msg::AddRing(r) = &mut m {
                r.index = i;
            }
            f.send(&m.encode(), &[ev.as_fd()]);
            assert!(matches!(f.recv(), Some(Msg::Ack)));
        }
        let mut m = add_ring(RingDirection::C2S, 0, off, 4);
        if let Msg::AddRing(r) = &mut m {
            r.index = second;
        }
        f.send(&m.encode(), &[ev.as_fd()]);
        f.expect_disconnect(reason);
    }
}

fn pool() -> Mempool {
    let mut c = PoolConfig::new("c", 4096);
    c.huge = false;
    Mempool::new(&c).unwrap()
}

/// Descriptors may say any length inside their region: a frame longer than the port takes
/// (one 16-KiB descriptor, or a chain adding up past it) is walked to its end without a copy,
/// dropped and counted as an error, and the good frame behind it arrives; a burst takes at
/// most `max` frames, dropped ones included. (One 12-MiB descriptor per slot made a burst of
/// one frame copy until the pool ran dry, slot after slot.)
#[test]
fn frames_longer_than_the_port_takes_are_dropped_uncopied_and_count_toward_max() {
    let sock = format!("/tmp/memnic-hostile-long-{}.sock", std::process::id());
    let mut port = MemifPort::new("s", MemifConfig::new(Role::Server, &sock)).unwrap();
    let mut c = PoolConfig::new("long", 2048);
    c.huge = false;
    c.count = 64;
    let pool = Mempool::new(&c).unwrap();
    let mut rx = port.take_rx_queue(0, &pool).unwrap();
    let _tx = port.take_tx_queue(0, &pool).unwrap();
    let port = Arc::new(std::sync::Mutex::new(port));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let service = {
        let (p, s) = (port.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Relaxed) {
                p.lock().unwrap().service();
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let reg = region(1 << 20);
    let ev = EventFd::new().unwrap();
    let f = connect_good(&sock, &reg, &ev);
    let c2s = Ring::new(
        Arc::new(
            Region::from_fd(reg.fd().unwrap().try_clone_to_owned().unwrap(), reg.len()).unwrap(),
        ),
        0,
        4,
    )
    .unwrap();
    let desc = |slot: u16, flags: u16, length: u32, offset: u32| {
        c2s.write_desc(
            slot,
            Desc {
                flags,
                region: 0,
                length,
                offset,
            },
        )
    };
    reg.write_bytes(0x80000, &[0x5a; 100]).unwrap();
    desc(0, 0, 16 << 10, 0x10000);
    desc(1, 1, 8000, 0x20000);
    desc(2, 0, 8000, 0x30000);
    desc(3, 0, 100, 0x80000);
    c2s.head().store(4, Relaxed);

    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    // Bursts of one frame: the first takes the 16-KiB frame, the next the chain, then the
    // good one.
    let mut first = 0;
    while c2s.tail().load(Relaxed) == 0 {
        first = rx.rx_burst(&mut got, 1);
        assert!(Instant::now() < deadline, "nothing taken within 5 s");
    }
    assert_eq!(
        (first, c2s.tail().load(Relaxed)),
        (0, 1),
        "one dropped frame"
    );
    assert_eq!(rx.rx_burst(&mut got, 1), 0);
    assert_eq!(c2s.tail().load(Relaxed), 3, "the dropped chain");
    assert_eq!(rx.rx_burst(&mut got, 1), 1);
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].to_vec(),
        vec![0x5a; 100],
        "the good frame, behind two dropped ones"
    );
    let s = rx.stats();
    assert_eq!((s.packets, s.errors, s.nombuf), (1, 2, 0));
    assert!(
        s.bytes < 200,
        "nothing of the long frames counted ({} bytes)",
        s.bytes
    );
    assert_eq!(c2s.tail().load(Relaxed), 4);
    drop(got);
    stop.store(true, Relaxed);
    service.join().unwrap();
    drop(f);
    let _ = std::fs::remove_file(&sock);
}

/// A fresh client says INIT (acknowledged), then offers `region` with `fds`, and is refused
/// with `reason`.
fn refuse_region(s: &str, region: AddRegion, fds: &[std::os::fd::BorrowedFd<'_>], reason: &str) {
    let mut f = Fake::connect(s);
    f.init(0);
    assert!(matches!(f.recv(), Some(Msg::Ack)));
    f.send(&Msg::AddRegion(region).encode(), fds);
    f.expect_disconnect(reason);
}
