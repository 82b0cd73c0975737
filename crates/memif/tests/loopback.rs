//! A memif server and client in one process (threads), over a real socket and memfd.

use std::time::Duration;

use memnic_ethdev::Port;
use memnic_memif::{MemifConfig, MemifPort, Role};
use memnic_pktbuf::{Mempool, PoolConfig};

fn pool() -> Mempool {
    let mut c = PoolConfig::new("t", 4096);
    c.huge = false;
    Mempool::new(&c).unwrap()
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
    assert!(client.is_connected(), "client: {:?}", client.last_reason);
    let _ = std::fs::remove_file(&sock);
}
