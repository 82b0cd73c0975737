//! Several server interfaces on one socket, told apart by the id in the client's INIT, and the
//! optional secret (`specs/memif.md` §3).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use memnic_ethdev::{Port, RxQueue, TxQueue};
use memnic_memif::{MemifConfig, MemifPort, Role};
use memnic_pktbuf::{Mbuf, Mempool, PoolCache};

fn pool() -> Mempool {
    memnic_test_support::pool("t", 8192, 2048)
}

fn server(sock: &str, id: u32, secret: Option<&str>) -> MemifPort {
    let mut c = MemifConfig::new(Role::Server, sock);
    c.id = id;
    c.secret = secret.map(str::to_string);
    MemifPort::new(&format!("s{id}"), c).unwrap()
}

fn client(sock: &str, id: u32, secret: Option<&str>) -> MemifPort {
    let mut c = MemifConfig::new(Role::Client, sock);
    c.id = id;
    c.secret = secret.map(str::to_string);
    MemifPort::new(&format!("c{id}"), c).unwrap()
}

/// Takes queue pair 0 of a port (kept alive by the caller, unused).
fn queues(port: &mut MemifPort, p: &Mempool) -> (Box<dyn RxQueue>, Box<dyn TxQueue>) {
    (
        port.take_rx_queue(0, p).unwrap(),
        port.take_tx_queue(0, p).unwrap(),
    )
}

/// Runs the servers' control paths on a thread until the returned flag is set.
fn serve(mut servers: Vec<MemifPort>) -> (Arc<AtomicBool>, JoinHandle<Vec<MemifPort>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let h = std::thread::spawn(move || {
        while !s.load(Relaxed) {
            for p in &mut servers {
                p.service();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        servers
    });
    (stop, h)
}

/// A frame that says which interface sent it: its flow is the tag.
fn frame(cache: &mut PoolCache, tag: u8, seq: u8) -> Mbuf {
    let mut m = cache.alloc().unwrap();
    memnic_test_support::write_frame(&mut m, seq as u64, tag as u64, 64);
    m
}

fn send(tx: &mut dyn TxQueue, cache: &mut PoolCache, tag: u8, n: u8) {
    let mut v: Vec<Mbuf> = (0..n).map(|s| frame(cache, tag, s)).collect();
    assert_eq!(tx.tx_burst(&mut v), n as usize);
}

/// Receives `n` frames (bounded) and returns their tags.
fn recv_tags(rx: &mut dyn RxQueue, cache: &mut PoolCache, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    for _ in 0..10_000 {
        rx.rx_burst(&mut got, 32);
        if got.len() >= n {
            break;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    got.drain(..)
        .map(|m| {
            let f = m.to_vec();
            let t = memnic_test_support::flow_of(&f).expect("a whole frame") as u8;
            cache.free(m);
            t
        })
        .collect()
}

#[test]
fn two_interfaces_share_one_socket_and_clients_reach_theirs_by_id() {
    let sock = format!("/tmp/memif-shared-{}.sock", std::process::id());
    let p = pool();
    let mut cache = p.cache();
    let mut s0 = server(&sock, 0, None);
    let mut s1 = server(&sock, 1, None);
    let dup = MemifPort::new(
        "dup",
        MemifConfig {
            id: 1,
            ..MemifConfig::new(Role::Server, &sock)
        },
    );
    let e = dup.err().expect("a second interface with id 1 is refused");
    assert!(e.to_string().contains("id 1 is already served"), "{e}");

    let mut s0rx = s0.take_rx_queue(0, &p).unwrap();
    let _s0tx = s0.take_tx_queue(0, &p).unwrap();
    let mut s1rx = s1.take_rx_queue(0, &p).unwrap();
    let mut s1tx = s1.take_tx_queue(0, &p).unwrap();
    let (stop, h) = serve(vec![s0, s1]);

    let mut c0 = client(&sock, 0, None);
    let mut c1 = client(&sock, 1, None);
    let _c0rx = c0.take_rx_queue(0, &p).unwrap();
    let mut c0tx = c0.take_tx_queue(0, &p).unwrap();
    let mut c1rx = c1.take_rx_queue(0, &p).unwrap();
    let mut c1tx = c1.take_tx_queue(0, &p).unwrap();
    assert!(
        c0.wait_connected(Duration::from_secs(10)),
        "{:?}",
        c0.last_reason
    );
    assert!(
        c1.wait_connected(Duration::from_secs(10)),
        "{:?}",
        c1.last_reason
    );

    // An id nobody serves, and an id whose interface is taken.
    let mut c2 = client(&sock, 2, None);
    assert!(!c2.wait_connected(Duration::from_millis(500)));
    let r = c2.last_reason.clone().unwrap_or_default();
    assert!(r.contains("ID not found"), "{r}");
    let mut again = client(&sock, 1, None);
    assert!(!again.wait_connected(Duration::from_millis(500)));
    let r = again.last_reason.clone().unwrap_or_default();
    assert!(r.contains("Already connected"), "{r}");

    // Each client's frames reach its own server only; and back from server 1 to client 1.
    send(c0tx.as_mut(), &mut cache, 0xA0, 10);
    send(c1tx.as_mut(), &mut cache, 0xA1, 20);
    assert_eq!(recv_tags(s0rx.as_mut(), &mut cache, 10), vec![0xA0; 10]);
    assert_eq!(recv_tags(s1rx.as_mut(), &mut cache, 20), vec![0xA1; 20]);
    send(s1tx.as_mut(), &mut cache, 0xB1, 5);
    assert_eq!(recv_tags(c1rx.as_mut(), &mut cache, 5), vec![0xB1; 5]);

    stop.store(true, Relaxed);
    let mut servers = h.join().unwrap();
    assert!(servers.iter().all(|s| s.is_connected() && s.connects == 1));

    // Interface 0 goes away: its client is told, interface 1 keeps its client, and id 0 can be
    // served again on the same socket.
    let s1 = servers.pop().unwrap();
    drop(servers);
    for _ in 0..1000 {
        c0.service();
        c1.service();
        if !c0.is_connected() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!c0.is_connected());
    assert!(c1.is_connected(), "{:?}", c1.last_reason);
    let s0 = server(&sock, 0, None);
    let (stop, h) = serve(vec![s0, s1]);
    assert!(
        c0.wait_connected(Duration::from_secs(10)),
        "{:?}",
        c0.last_reason
    );
    stop.store(true, Relaxed);
    let servers = h.join().unwrap();
    assert!(servers.iter().all(|s| s.is_connected()));
    drop((servers, c0, c1));
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn a_server_with_a_secret_admits_only_clients_that_know_it() {
    let sock = format!("/tmp/memif-secret-{}.sock", std::process::id());
    let p = pool();
    let mut s = server(&sock, 0, Some("s3cret"));
    let _q = queues(&mut s, &p);
    let (stop, h) = serve(vec![s]);
    for (secret, why) in [
        (None, "Secret required"),
        (Some("guess"), "Incorrect secret"),
    ] {
        let mut c = client(&sock, 0, secret);
        let _q = queues(&mut c, &p);
        assert!(!c.wait_connected(Duration::from_millis(500)));
        let r = c.last_reason.clone().unwrap_or_default();
        assert!(r.contains(why), "secret {secret:?}: {r}");
    }
    let mut c = client(&sock, 0, Some("s3cret"));
    let _q = queues(&mut c, &p);
    assert!(
        c.wait_connected(Duration::from_secs(10)),
        "{:?}",
        c.last_reason
    );
    stop.store(true, Relaxed);
    let servers = h.join().unwrap();
    assert_eq!(servers[0].connects, 1);
    drop((servers, c));
    let _ = std::fs::remove_file(&sock);
}

/// Clients that connect and never say INIT (a flood) are timed out and dropped; a real client
/// still gets in.
#[test]
fn silent_clients_do_not_lock_out_a_real_one() {
    let sock = format!("/tmp/memif-flood-{}.sock", std::process::id());
    let p = pool();
    let mut s = server(&sock, 0, None);
    let _q = queues(&mut s, &p);
    let (stop, h) = serve(vec![s]);
    let addr = memnic_shm::unix::SocketAddrSpec::memif(&sock, false);
    let silent: Vec<_> = (0..100)
        .filter_map(|_| memnic_shm::unix::SeqpacketConn::connect(&addr).ok())
        .collect();
    assert!(
        silent.len() >= 64,
        "only {} connects went through",
        silent.len()
    );
    let mut c = client(&sock, 0, None);
    let _cq = queues(&mut c, &p);
    assert!(
        c.wait_connected(Duration::from_secs(20)),
        "{:?}",
        c.last_reason
    );
    stop.store(true, Relaxed);
    let servers = h.join().unwrap();
    assert_eq!(servers[0].connects, 1);
    drop((servers, c, silent));
    let _ = std::fs::remove_file(&sock);
}
