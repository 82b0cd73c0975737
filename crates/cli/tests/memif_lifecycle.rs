//! Kill the memif peer (SIGKILL) during traffic, ten times in a row, in either role: the survivor
//! (in this process) reports link down, keeps no buffer and no fd of the dead connection, and
//! traffic resumes when a new peer comes.

mod common;

use std::time::{Duration, Instant};

use memnic_ethdev::{Port, RxQueue, TxQueue};
use memnic_memif::{MemifConfig, MemifPort, Role};
use memnic_pktbuf::{Mbuf, Mempool, PoolCache, PoolConfig};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

struct Survivor {
    port: MemifPort,
    rx: Box<dyn RxQueue>,
    tx: Box<dyn TxQueue>,
    pool: Mempool,
    cache: PoolCache,
    pkts: Vec<Mbuf>,
    received: u64,
}

impl Survivor {
    fn new(role: Role, sock: &str) -> Survivor {
        let mut port = MemifPort::new("survivor", MemifConfig::new(role, sock)).unwrap();
        let mut c = PoolConfig::new("survivor", 8192);
        c.huge = false;
        c.cache_size = 8;
        let pool = Mempool::new(&c).unwrap();
        let rx = port.take_rx_queue(0, &pool).unwrap();
        let tx = port.take_tx_queue(0, &pool).unwrap();
        let cache = pool.cache();
        Survivor {
            port,
            rx,
            tx,
            pool,
            cache,
            pkts: Vec::new(),
            received: 0,
        }
    }

    /// Services the port and polls rx (and sends one burst, to keep the peer's rx busy too).
    fn step(&mut self) {
        self.port.service();
        self.received += self.rx.rx_burst(&mut self.pkts, 32) as u64;
        self.cache.free_all(&mut self.pkts);
        self.cache.alloc_up_to(&mut self.pkts, 8);
        for m in self.pkts.iter_mut() {
            m.set_len(64);
        }
        self.tx.tx_burst(&mut self.pkts);
        self.cache.free_all(&mut self.pkts);
    }

    fn run_until(&mut self, what: &str, limit: Duration, mut done: impl FnMut(&Survivor) -> bool) {
        let end = Instant::now() + limit;
        while !done(self) {
            assert!(
                Instant::now() < end,
                "{what} within {limit:?} (last reason {:?})",
                self.port.last_reason
            );
            self.step();
        }
    }
}

fn kill_ten_times(survivor_role: Role) {
    let sock = format!(
        "/tmp/memnic-kill-{:?}-{}.sock",
        survivor_role,
        std::process::id()
    );
    let _ = std::fs::remove_file(&sock);
    let mut s = Survivor::new(survivor_role, &sock);
    let peer_role = if survivor_role == Role::Server {
        "client"
    } else {
        "server"
    };
    let dev = format!("memif0,role={peer_role},socket={sock}");
    // The pool's own buffers, less what the caches may hold parked: a leak of even one ring's
    // worth (1024) would fall below this.
    let floor = s.pool.count() - 64;
    let mut fds_when_down = None;
    for round in 0..10 {
        let peer = common::testpmd(1, &dev, "txonly", &["--duration", "30"]);
        let before = s.received;
        s.run_until(
            &format!("round {round}: link up and traffic"),
            Duration::from_secs(20),
            |s| s.port.link().up && s.received > before + 10_000,
        );
        drop(peer); // SIGKILL
        s.run_until(
            &format!("round {round}: link down"),
            Duration::from_secs(10),
            |s| !s.port.link().up,
        );
        // Let the queues drop the dead connection's mappings.
        for _ in 0..100 {
            s.step();
        }
        s.cache.flush();
        let free = s.pool.shared_free();
        assert!(
            free >= floor,
            "round {round}: {free} of {} buffers back (floor {floor})",
            s.pool.count()
        );
        let fds = open_fds();
        match fds_when_down {
            None => fds_when_down = Some(fds),
            Some(f) => assert_eq!(fds, f, "round {round}: descriptors leaked"),
        }
    }
    assert!(s.port.disconnects >= 10 && s.port.connects >= 10);
    drop(s);
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn poll_server_survives_ten_killed_clients() {
    kill_ten_times(Role::Server);
}

#[test]
fn poll_client_survives_ten_killed_servers_and_reconnects() {
    kill_ten_times(Role::Client);
}
