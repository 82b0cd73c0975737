//! What the hostile-peer tests share: our server on a background thread, and a fake client
//! that speaks raw messages.

#![allow(dead_code)] // each test file uses its own part

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use memnic_ethdev::Port;
use memnic_memif::msg::{
    AddRegion, AddRing, Init, InterfaceMode, Msg, Name, RingDirection, Secret, VERSION,
};
use memnic_memif::ring::{ring_bytes, Ring};
use memnic_memif::{MemifConfig, MemifPort, Role};
use memnic_pktbuf::{Mempool, PoolConfig};
use memnic_shm::unix::{poll, EventFd, PollFd, SeqpacketConn, SocketAddrSpec};
use memnic_shm::Region;

/// Our server, serviced and polled by a background thread until dropped.
pub struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub port: Arc<Mutex<MemifPort>>,
    pub sock: String,
}

impl Server {
    /// Our server with the default configuration.
    pub fn start(tag: &str) -> Server {
        Server::start_with(tag, |_| {})
    }

    /// Our server, its configuration adjusted by `tweak`.
    pub fn start_with(tag: &str, tweak: impl FnOnce(&mut MemifConfig)) -> Server {
        let sock = format!("/tmp/memnic-hostile-{tag}-{}.sock", std::process::id());
        let mut cfg = MemifConfig::new(Role::Server, &sock);
        tweak(&mut cfg);
        let mut port = MemifPort::new("s", cfg).unwrap();
        let mut c = PoolConfig::new("h", 2048);
        c.huge = false;
        let pool = Mempool::new(&c).unwrap();
        let mut rx = port.take_rx_queue(0, &pool).unwrap();
        let _tx = port.take_tx_queue(0, &pool).unwrap();
        let port = Arc::new(Mutex::new(port));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (port.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut cache = pool.cache();
            let mut pkts = Vec::new();
            while !s.load(Relaxed) {
                p.lock().unwrap().service();
                rx.rx_burst(&mut pkts, 32);
                cache.free_all(&mut pkts);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        Server {
            stop,
            thread: Some(thread),
            port,
            sock,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.sock);
    }
}

/// A client that speaks raw bytes.
pub struct Fake {
    pub conn: SeqpacketConn,
}

impl Fake {
    pub fn connect(sock: &str) -> Fake {
        let conn = SeqpacketConn::connect(&SocketAddrSpec::memif(sock, false)).unwrap();
        let mut f = Fake { conn };
        assert!(
            matches!(f.recv(), Some(Msg::Hello(_))),
            "the server greets first"
        );
        f
    }

    pub fn recv(&mut self) -> Option<Msg> {
        let mut pfd = [PollFd::readable(self.conn.as_fd())];
        if poll(&mut pfd, Some(Duration::from_secs(5))).unwrap() == 0 {
            return None;
        }
        let mut buf = [0u8; 256];
        let got = self.conn.recv(&mut buf).ok()?;
        if got.is_eof() {
            return None;
        }
        Msg::decode(&buf[..got.len]).ok()
    }

    pub fn send(&mut self, bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) {
        self.conn.send(bytes, fds).unwrap();
    }

    /// CONNECT, the handshake's last message.
    pub fn send_connect(&mut self) {
        let m = Msg::Connect {
            if_name: Name::truncated("fake"),
        };
        self.send(&m.encode(), &[]);
    }

    /// Expects DISCONNECT whose reason is exactly `reason`, then the end of the connection.
    pub fn expect_disconnect(&mut self, reason: &str) {
        assert!(!reason.is_empty(), "name the reason the server must give");
        match self.recv() {
            Some(Msg::Disconnect(d)) => {
                let r = d.reason.to_string_lossy().to_string();
                assert_eq!(r, reason, "the DISCONNECT's reason");
            }
            other => panic!("expected DISCONNECT '{reason}', got {other:?}"),
        }
        assert!(self.recv().is_none(), "the server closes after DISCONNECT");
    }

    /// INIT for interface 0 and region 0 (all of `reg`), each acknowledged.
    pub fn init_with_region(&mut self, reg: &Region) {
        self.init(0);
        assert!(matches!(self.recv(), Some(Msg::Ack)));
        self.send(
            &Msg::AddRegion(AddRegion {
                index: 0,
                size: reg.len() as u64,
            })
            .encode(),
            &[reg.fd().unwrap()],
        );
        assert!(matches!(self.recv(), Some(Msg::Ack)));
    }

    pub fn init(&mut self, id: u32) {
        let m = Msg::Init(Init {
            version: VERSION,
            id,
            mode: InterfaceMode::Ethernet,
            secret: Secret::empty(),
            name: Name::truncated("fake"),
        });
        self.send(&m.encode(), &[]);
    }
}

pub fn region(len: usize) -> Region {
    Region::memfd("fake", len, false).unwrap()
}

pub fn add_ring(dir: RingDirection, region: u16, offset: u32, log2: u8) -> Msg {
    Msg::AddRing(AddRing {
        direction: dir,
        index: 0,
        region,
        offset,
        log2_ring_size: log2,
    })
}

/// Handshakes properly with a C2S and an S2C ring at the start of `reg`; returns the connection.
pub fn connect_good(sock: &str, reg: &Region, ev: &EventFd) -> Fake {
    let mut f = Fake::connect(sock);
    f.init_with_region(reg);
    let rb = ring_bytes(4);
    for (i, dir) in [RingDirection::C2S, RingDirection::S2C]
        .into_iter()
        .enumerate()
    {
        let off = i * rb;
        let r = Ring::new(
            Arc::new(
                Region::from_fd(reg.fd().unwrap().try_clone_to_owned().unwrap(), reg.len())
                    .unwrap(),
            ),
            off,
            4,
        )
        .unwrap();
        r.init();
        f.send(&add_ring(dir, 0, off as u32, 4).encode(), &[ev.as_fd()]);
        assert!(matches!(f.recv(), Some(Msg::Ack)), "ring {i}");
    }
    f.send_connect();
    assert!(matches!(f.recv(), Some(Msg::Connected { .. })), "connected");
    f
}
