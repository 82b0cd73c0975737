//! TAP ports against the kernel's own network stack, each test in a network namespace of its
//! own (made on a thread, gone with it): frames the kernel sends arrive whole or as chains,
//! frames we send reach its sockets, queues spread the kernel's flows, and the interface is
//! named, addressed, brought up and kept as DPDK's `net_tap` does.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use memnic_ethdev::{Devargs, MacAddr, Mbuf, Port, RxQueue};
use memnic_shm::tap;
use memnic_shm::ShmError;
use memnic_tap::{TapConfig, TapPort, DEVARGS_KEYS, MAX_FRAME};
use memnic_test_support::netns::{in_new_netns, ip, link_counters};
use memnic_test_support::{pool, shared_pool};

/// The far end of the interface's subnet: a neighbour that does not exist, so the kernel
/// sends its frames to us without asking for its address first.
const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

fn open(devargs: &str) -> Result<TapPort, String> {
    let a = Devargs::parse(devargs, DEVARGS_KEYS).map_err(|e| e.to_string())?;
    let cfg = TapConfig::from_devargs(&a).map_err(|e| e.to_string())?;
    TapPort::open(&a.name, &cfg).map_err(|e| e.to_string())
}

/// The interface gets 10.9.0.1/24 and a static neighbour 10.9.0.2 at PEER_MAC.
fn address(iface: &str) {
    ip(&["addr", "add", "10.9.0.1/24", "dev", iface]);
    ip(&[
        "neigh",
        "add",
        "10.9.0.2",
        "lladdr",
        "02:00:00:00:00:02",
        "dev",
        iface,
    ]);
}

/// Receives until `n` frames came (at most 10 s), sleeping on the queue's interrupt between
/// empty bursts; then checks no more are waiting.
fn receive(rx: &mut dyn RxQueue, n: usize) -> Vec<Mbuf> {
    let end = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            Instant::now() < end,
            "{} of {n} frames arrived: {:?}",
            got.len(),
            rx.stats()
        );
        if rx.rx_burst(&mut got, 32) == 0 {
            rx.wait(Duration::from_millis(100));
        }
    }
    assert_eq!(got.len(), n, "more frames than sent");
    assert_eq!(rx.rx_burst(&mut got, 32), 0, "more frames than sent");
    got
}

/// The UDP payload of an Ethernet/IPv4/UDP frame (no IP options), and its source port.
fn udp_payload(frame: &[u8]) -> (u16, &[u8]) {
    assert!(frame.len() >= 42, "a {}-byte frame", frame.len());
    assert_eq!(&frame[..6], &PEER_MAC, "sent to the neighbour");
    assert_eq!(&frame[12..14], &[8, 0], "IPv4");
    assert_eq!(frame[23], 17, "UDP");
    (u16::from_be_bytes([frame[34], frame[35]]), &frame[42..])
}

/// Payload bytes no two datagrams of a test share.
fn payload(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ tag).collect()
}

#[test]
fn kernel_frames_arrive_whole_or_as_chains_of_buffers() {
    in_new_netns(|| {
        let mut port = open("tap0,iface=rx0").unwrap();
        ip(&["link", "set", "rx0", "mtu", "9100"]);
        address("rx0");
        // 1024-byte buffers: a jumbo frame takes nine.
        let pool = pool("tap-rx", 256, 1024);
        let mut rx = port.take_rx_queue(0, &pool).unwrap();
        // Nothing yet: an empty burst, and a wait that times out.
        let mut none = Vec::new();
        assert_eq!(rx.rx_burst(&mut none, 32), 0);
        assert!(rx.wait(Duration::from_millis(20)));

        let sock = UdpSocket::bind("10.9.0.1:5000").unwrap();
        let sizes = [18usize, 1000, 1024 - 42, 3000, 8976];
        for (i, &n) in sizes.iter().enumerate() {
            sock.send_to(&payload(i as u8, n), "10.9.0.2:9").unwrap();
        }
        // A frame is waiting: the wait returns at once, not after its minute.
        let t0 = Instant::now();
        assert!(rx.wait(Duration::from_secs(60)));
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());

        let got = receive(rx.as_mut(), sizes.len());
        let mut bytes = 0;
        for (i, (m, &n)) in got.iter().zip(&sizes).enumerate() {
            let frame_len = 42 + n;
            assert_eq!(m.len(), frame_len, "frame {i}");
            assert_eq!(m.nb_segs(), frame_len.div_ceil(1024), "frame {i}");
            let v = m.to_vec();
            let (_, p) = udp_payload(&v);
            assert_eq!(&p[..n], &payload(i as u8, n)[..], "frame {i}");
            bytes += frame_len as u64;
        }
        let s = rx.stats();
        assert_eq!((s.packets, s.bytes, s.drops, s.errors), (5, bytes, 0, 0));
        let k = link_counters("rx0");
        assert_eq!((k.tx_packets, k.tx_bytes), (5, bytes), "the kernel's count");
        drop(got);

        // Longer than MAX_FRAME (MTU 9100): counted as a drop; the next one still arrives.
        sock.send_to(&payload(9, MAX_FRAME - 42 + 1), "10.9.0.2:9")
            .unwrap();
        sock.send_to(&payload(10, 100), "10.9.0.2:9").unwrap();
        let got = receive(rx.as_mut(), 1);
        assert_eq!(udp_payload(&got[0].to_vec()).1, &payload(10, 100)[..]);
        assert_eq!(rx.stats().drops, 1);
        assert_eq!(rx.stats().packets, 6);
    });
}

/// Ethernet/IPv4/UDP from the neighbour (10.9.0.2:`sport`) to 10.9.0.1:4000, no UDP checksum.
fn udp_frame(dst: MacAddr, sport: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&PEER_MAC);
    f.extend_from_slice(&[8, 0]);
    let total = (20 + 8 + payload.len()) as u16;
    let mut h = [
        0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 9, 0, 2, 10, 9, 0, 1,
    ];
    h[2..4].copy_from_slice(&total.to_be_bytes());
    let mut sum: u32 = h
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend_from_slice(&h);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&4000u16.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// `bytes` as a packet of buffers from `pool`, cut at `cuts`.
fn packet(pool: &memnic_ethdev::Mempool, bytes: &[u8], cuts: &[usize]) -> Mbuf {
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(bytes.len());
    let mut head: Option<Mbuf> = None;
    for w in bounds.windows(2) {
        let mut m = pool.alloc().expect("a buffer");
        assert!(m.set_len(w[1] - w[0]));
        assert!(m.copy_in(0, &bytes[w[0]..w[1]]));
        match head.as_mut() {
            None => head = Some(m),
            Some(h) => h.chain(m).unwrap(),
        }
    }
    head.unwrap()
}

#[test]
fn frames_we_send_reach_the_kernels_sockets() {
    in_new_netns(|| {
        let mut port = open("tap0,iface=tx0").unwrap();
        address("tx0");
        let mac = port.info().mac;
        let private = pool("tap-tx", 64, 2048);
        let shared = shared_pool("tap-tx-shared", 16, 2048);
        let mut tx = port.take_tx_queue(0, &private).unwrap();
        let sock = UdpSocket::bind("10.9.0.1:4000").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();

        // One private buffer, a chain of three, a buffer in shared memory, and a chain that
        // ends in one: each arrives intact, in order.
        let frames: Vec<Vec<u8>> = (0..4)
            .map(|i| udp_frame(mac, 7000 + i, &payload(i as u8, 300 + 500 * i as usize)))
            .collect();
        let mut burst = vec![
            packet(&private, &frames[0], &[]),
            packet(&private, &frames[1], &[7, 500]),
            packet(&shared, &frames[2], &[]),
            {
                let mut m = packet(&private, &frames[3][..100], &[]);
                m.chain(packet(&shared, &frames[3][100..], &[])).unwrap();
                m
            },
        ];
        assert_eq!(tx.tx_burst(&mut burst), 4);
        assert!(burst.is_empty());
        let mut buf = [0u8; 4096];
        for (i, f) in frames.iter().enumerate() {
            let (n, from) = sock.recv_from(&mut buf).unwrap();
            assert_eq!(from.port(), 7000 + i as u16);
            assert_eq!(&buf[..n], &f[42..], "datagram {i}");
        }
        let bytes: u64 = frames.iter().map(|f| f.len() as u64).sum();
        let s = tx.stats();
        assert_eq!((s.packets, s.bytes, s.drops, s.errors), (4, bytes, 0, 0));
        let k = link_counters("tx0");
        assert_eq!((k.rx_packets, k.rx_bytes), (4, bytes), "the kernel's count");

        // A runt the kernel refuses and a frame past MAX_FRAME: errors, taken and freed.
        let long = vec![0u8; MAX_FRAME + 1];
        let mut burst = vec![
            packet(&private, &frames[0][..10], &[]),
            packet(&private, &long, &[2048, 4096, 6144, 8192]),
        ];
        assert_eq!(tx.tx_burst(&mut burst), 2);
        assert!(burst.is_empty());
        assert_eq!((tx.stats().errors, tx.stats().packets), (2, 4));

        // The interface down: frames dropped and counted, none delivered.
        ip(&["link", "set", "tx0", "down"]);
        let mut burst = vec![packet(&private, &frames[0], &[])];
        assert_eq!(tx.tx_burst(&mut burst), 1);
        assert_eq!(tx.stats().drops, 1);
        assert!(!port.link().up);

        // Deleted: the frame is an error, and the queue takes nothing more.
        ip(&["link", "del", "tx0"]);
        let mut burst = vec![
            packet(&private, &frames[0], &[]),
            packet(&private, &frames[0], &[]),
        ];
        assert_eq!(tx.tx_burst(&mut burst), 1);
        assert_eq!(tx.tx_burst(&mut burst), 0);
        assert_eq!(burst.len(), 1);
        assert_eq!(tx.stats().errors, 3);
    });
}

/// Sends one datagram from each of `flows` source ports to the neighbour.
fn send_flows(tag: u8, first_port: u16, flows: u16) {
    for p in first_port..first_port + flows {
        let s = UdpSocket::bind(("10.9.0.1", p)).unwrap();
        s.send_to(&payload(tag, 64), "10.9.0.2:9").unwrap();
    }
}

#[test]
fn the_kernel_spreads_flows_over_the_queues_taken() {
    in_new_netns(|| {
        let mut port = open("tap0,iface=mq0,queues=2").unwrap();
        address("mq0");
        assert_eq!(port.info().max_rx_queues, 2);
        let pool = pool("tap-mq", 512, 2048);
        let mut q0 = port.take_rx_queue(0, &pool).unwrap();
        // Queue 1 not taken yet: the kernel sends everything to queue 0.
        send_flows(1, 6000, 64);
        assert_eq!(receive(q0.as_mut(), 64).len(), 64);
        let mut q1 = port.take_rx_queue(1, &pool).unwrap();
        assert!(port.take_rx_queue(1, &pool).is_err());
        assert!(port.take_rx_queue(2, &pool).is_err());
        // Both taken: 64 flows land on both (each flow hashed to one queue).
        send_flows(2, 7000, 64);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let end = Instant::now() + Duration::from_secs(10);
        while a.len() + b.len() < 64 {
            assert!(Instant::now() < end, "{} + {} of 64", a.len(), b.len());
            let n = q0.rx_burst(&mut a, 32) + q1.rx_burst(&mut b, 32);
            if n == 0 {
                q0.wait(Duration::from_millis(10));
            }
        }
        assert_eq!(a.len() + b.len(), 64);
        assert!(
            !a.is_empty() && !b.is_empty(),
            "{} and {}",
            a.len(),
            b.len()
        );
        let mut ports: Vec<u16> = a
            .iter()
            .chain(&b)
            .map(|m| udp_payload(&m.to_vec()).0)
            .collect();
        ports.sort_unstable();
        assert_eq!(ports, (7000..7064).collect::<Vec<u16>>());
        let (rx, _) = port.queue_stats();
        assert_eq!(rx[0].packets + rx[1].packets, 128);
        assert_eq!(rx[1].packets, b.len() as u64);
    });
}

#[test]
fn interfaces_are_named_addressed_raised_and_kept_as_dpdk_does() {
    in_new_netns(|| {
        // No iface: the kernel's dtapN; the kernel's address; up (and running, soon).
        let a = open("tap0").unwrap();
        let b = open("tap1,mac=fixed").unwrap();
        assert_eq!((a.iface(), b.iface()), ("dtap0", "dtap1"));
        assert_eq!(a.info().driver, "net_tap");
        assert_eq!(a.info().mac.0, tap::mac("dtap0").unwrap());
        assert_eq!(&b.info().mac.0[..5], b"\x02dtap");
        assert_eq!(b.info().mac.0, tap::mac("dtap1").unwrap());
        assert!(tap::flags("dtap0").unwrap().up);
        let end = Instant::now() + Duration::from_secs(10);
        while !a.link().up {
            assert!(Instant::now() < end, "dtap0 never ran");
            std::thread::sleep(Duration::from_millis(10));
        }
        let c = open("tap2,iface=mine,mac=02:00:00:00:01:02").unwrap();
        assert_eq!(tap::mac("mine").unwrap(), [2, 0, 0, 0, 1, 2]);

        // Closed: gone, unless persistent.
        drop((a, c));
        assert!(matches!(
            tap::flags("dtap0"),
            Err(ShmError::NoSuchInterface { .. })
        ));
        let p = open("tap3,iface=kept,persist=yes").unwrap();
        drop(p);
        assert!(tap::flags("kept").is_ok());
        // A persistent interface is joined again, with its address.
        let mac = tap::mac("kept").unwrap();
        assert_eq!(open("tap3,iface=kept").unwrap().info().mac.0, mac);

        // Not a TAP: refused, in one sentence, and lo is left alone.
        let e = open("tap4,iface=lo").err().unwrap();
        assert!(
            e.starts_with("interface lo exists and is not a multi-queue TAP interface"),
            "{e}"
        );
        drop(b);
    });
}
