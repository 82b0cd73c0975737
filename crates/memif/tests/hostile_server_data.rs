//! A fake memif server against our client: it speaks the real control protocol over the socket
//! (HELLO, ACKs, CONNECTED), maps the client's region 0 (and, in zero copy, its pool) and then
//! writes the rings itself, driving every client-side check of the data path through the public
//! burst API. Each mistake must be answered with DISCONNECT and its exact reason, the error
//! counted in the queue's stats; the client never panics, never reads outside its buffers, and
//! connects again to the (now well-behaved) server, which checks real traffic both ways.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memnic_ethdev::{Port, QueueStats};
use memnic_memif::msg::{Hello, Msg, Name, RingDirection, VERSION};
use memnic_memif::ring::{Desc, Ring, DESC_FLAG_NEXT};
use memnic_memif::{MemifConfig, MemifPort, Role};
use memnic_pktbuf::{Mbuf, Mempool, PoolCache, PoolConfig};
use memnic_shm::unix::{poll, PeerFds, PollFd, SeqpacketConn, SeqpacketListener, SocketAddrSpec};
use memnic_shm::Region;

const LOG2: u8 = 4;
const SIZE: u16 = 1 << LOG2;
const BSIZE: u32 = 2048;

/// Test frame `seq` of `len` bytes, in the one payload format (memnic-test-support's).
fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    memnic_test_support::fill(&mut f, seq, 0x5a);
    f
}

// ---- our client, polled by a thread ----------------------------------------------------------

/// Our client port, serviced and polled by a background thread; frames it receives are kept,
/// frames to send are asked for through a channel (the reply is how many were sent).
struct Client {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    port: Arc<Mutex<MemifPort>>,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
    tx: mpsc::Sender<Vec<usize>>,
    sent: mpsc::Receiver<usize>,
    seq: u64,
}

impl Client {
    fn start(sock: &str, zero_copy: bool) -> Client {
        let mut cfg = MemifConfig::new(Role::Client, sock);
        cfg.log2_ring_size = LOG2;
        cfg.bsize = BSIZE;
        cfg.zero_copy = zero_copy;
        let mut port = MemifPort::new("c", cfg).unwrap();
        let mut c = PoolConfig::new("hostile-server", 1024);
        c.huge = false;
        c.shared = zero_copy; // zero copy sends its pool to the server as region 1
        let pool = Mempool::new(&c).unwrap();
        let mut rx = port.take_rx_queue(0, &pool).unwrap();
        let mut txq = port.take_tx_queue(0, &pool).unwrap();
        let port = Arc::new(Mutex::new(port));
        let stop = Arc::new(AtomicBool::new(false));
        let got = Arc::new(Mutex::new(Vec::new()));
        let (tx, cmds) = mpsc::channel::<Vec<usize>>();
        let (done, sent) = mpsc::channel();
        let (p, s, g) = (port.clone(), stop.clone(), got.clone());
        let thread = std::thread::spawn(move || {
            let mut cache = pool.cache();
            let mut pkts = Vec::new();
            let mut seq = 0u64;
            while !s.load(Relaxed) {
                p.lock().unwrap().service();
                rx.rx_burst(&mut pkts, 32);
                for m in pkts.drain(..) {
                    g.lock().unwrap().push(m.to_vec());
                    cache.free(m);
                }
                if let Ok(lens) = cmds.try_recv() {
                    let mut frames: Vec<Mbuf> = lens
                        .iter()
                        .map(|&len| {
                            seq += 1;
                            frame(&mut cache, &payload(seq, len))
                        })
                        .collect();
                    let n = txq.tx_burst(&mut frames);
                    cache.free_all(&mut frames);
                    done.send(n).unwrap();
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        Client {
            stop,
            thread: Some(thread),
            port,
            got,
            tx,
            sent,
            seq: 0,
        }
    }

    /// Sends frames of these lengths (payloads numbered from where the last call stopped);
    /// returns how many the queue took and their payloads.
    fn send(&mut self, lens: &[usize]) -> (usize, Vec<Vec<u8>>) {
        self.tx.send(lens.to_vec()).unwrap();
        let n = self.sent.recv_timeout(Duration::from_secs(5)).unwrap();
        let payloads = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| payload(self.seq + 1 + i as u64, len))
            .collect();
        self.seq += lens.len() as u64;
        (n, payloads)
    }

    /// Waits until `n` frames have been received; returns them.
    fn received(&self, n: usize) -> Vec<Vec<u8>> {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let got = self.got.lock().unwrap();
            if got.len() >= n || Instant::now() > end {
                return got.clone();
            }
            drop(got);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn stats(&self) -> (QueueStats, QueueStats) {
        let (rx, tx) = self.port.lock().unwrap().queue_stats();
        (rx[0], tx[0])
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                // The polling thread panicked inside a burst: its queue never left the gate,
                // and closing the port would wait for it forever. Leak the port instead, so
                // the test reports the panic rather than hanging.
                std::mem::forget(self.port.clone());
            }
        }
    }
}

fn frame(cache: &mut PoolCache, bytes: &[u8]) -> Mbuf {
    let cap = cache.pool().data_room() as usize;
    let mut m: Option<Mbuf> = None;
    for chunk in bytes.chunks(cap) {
        let mut seg = cache.alloc().expect("buffer");
        assert!(seg.set_len(chunk.len()));
        assert!(seg.copy_in(0, chunk)); // the pool may be one the peer sees: no slices into it
        match &mut m {
            None => m = Some(seg),
            Some(h) => h.chain(seg).unwrap(),
        }
    }
    m.expect("a frame has bytes")
}

// ---- the fake server ---------------------------------------------------------------------------

struct FakeServer {
    listener: SeqpacketListener,
    sock: String,
}

/// One connection of the fake server, after the handshake: the client's regions and its rings.
struct Session {
    conn: SeqpacketConn,
    regions: Vec<Arc<Region>>,
    /// C2S (the client transmits) and S2C (the client receives).
    c2s: Ring,
    s2c: Ring,
    /// Where the server has read C2S up to, and where it has filled S2C up to.
    c2s_seen: u16,
    s2c_tail: u16,
}

impl FakeServer {
    fn bind(tag: &str) -> FakeServer {
        let sock = format!("/tmp/memnic-hostile-srv-{tag}-{}.sock", std::process::id());
        let _ = std::fs::remove_file(&sock);
        let listener = SeqpacketListener::bind(&SocketAddrSpec::memif(&sock, false)).unwrap();
        listener.set_nonblocking(true).unwrap();
        FakeServer { listener, sock }
    }

    /// Accepts the client's next connection and runs the server's side of the handshake.
    #[track_caller]
    fn accept(&self) -> Session {
        self.accept_or(String::new)
    }

    /// As `accept`; `why` says what the client last reported if it never comes.
    #[track_caller]
    fn accept_or(&self, why: impl Fn() -> String) -> Session {
        let mut pfd = [PollFd::readable(self.listener.as_fd())];
        let ready = poll(&mut pfd, Some(Duration::from_secs(10))).unwrap();
        assert_eq!(ready, 1, "the client connects (again): {}", why());
        let conn = self.listener.accept().unwrap();
        let send = |m: Msg| conn.send(&m.encode(), &[]).unwrap();
        send(Msg::Hello(Hello::new(Name::truncated("fake server"))));
        let mut regions = Vec::new();
        let mut rings = Vec::new();
        loop {
            let (m, mut fds) = recv(&conn).expect("the client goes on with the handshake");
            match m {
                Msg::Init(i) => {
                    assert_eq!((i.version, i.id), (VERSION, 0));
                    send(Msg::Ack);
                }
                Msg::AddRegion(r) => {
                    assert_eq!(r.index as usize, regions.len());
                    let fd: OwnedFd = fds.pop().expect("a region fd");
                    regions.push(Arc::new(Region::from_fd(fd, r.size as usize).unwrap()));
                    send(Msg::Ack);
                }
                Msg::AddRing(r) => {
                    assert_eq!(fds.len(), 1, "an interrupt fd");
                    rings.push(r);
                    send(Msg::Ack);
                }
                Msg::Connect { .. } => break,
                other => panic!("unexpected {other:?} in the handshake"),
            }
        }
        let ring = |dir: RingDirection| {
            let r = rings
                .iter()
                .find(|r| r.direction == dir && r.index == 0)
                .expect("ring 0");
            assert_eq!(r.log2_ring_size, LOG2);
            let ring = Ring::checked(
                regions[r.region as usize].clone(),
                r.offset as usize,
                r.log2_ring_size,
            )
            .unwrap();
            // As a server does at CONNECT: both counters start at 0.
            ring.head().store(0, Relaxed);
            ring.tail().store(0, Relaxed);
            ring
        };
        let (c2s, s2c) = (ring(RingDirection::C2S), ring(RingDirection::S2C));
        send(Msg::Connected {
            if_name: Name::truncated("fake"),
        });
        let s = Session {
            conn,
            regions,
            c2s,
            s2c,
            c2s_seen: 0,
            s2c_tail: 0,
        };
        // The client posts its whole S2C ring once connected.
        let end = Instant::now() + Duration::from_secs(5);
        while s.s2c.head().load(Relaxed) != SIZE {
            assert!(Instant::now() < end, "the client posts its S2C ring");
            std::thread::sleep(Duration::from_millis(1));
        }
        s
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sock);
    }
}

/// One message (and its fds) within 5 s; None when the connection ends or nothing comes.
fn recv(conn: &SeqpacketConn) -> Option<(Msg, PeerFds)> {
    recv_within(conn, Duration::from_secs(5))
}

fn recv_within(conn: &SeqpacketConn, t: Duration) -> Option<(Msg, PeerFds)> {
    let mut pfd = [PollFd::readable(conn.as_fd())];
    if poll(&mut pfd, Some(t)).unwrap() == 0 {
        return None;
    }
    let mut buf = [0u8; 256];
    let got = conn.recv(&mut buf).ok()?;
    if got.is_eof() {
        return None;
    }
    Some((Msg::decode(&buf[..got.len]).unwrap(), got.fds))
}

impl Session {
    /// The client's DISCONNECT: its reason, exactly; then the connection ends.
    fn expect_disconnect(&self, reason: &str) {
        match recv(&self.conn) {
            Some((Msg::Disconnect(d), _)) => {
                assert_eq!(d.reason.to_string_lossy(), reason, "the DISCONNECT reason")
            }
            other => panic!("expected DISCONNECT '{reason}', got {other:?}"),
        }
        assert!(
            recv(&self.conn).is_none(),
            "the client closes after DISCONNECT"
        );
    }

    /// Nothing comes from the client for a while (no DISCONNECT).
    fn expect_quiet(&self) {
        let m = recv_within(&self.conn, Duration::from_millis(300));
        assert!(m.is_none(), "the client stays connected, got {m:?}");
    }

    /// The bytes descriptor `d` points at (region 0 in copy mode, the pool in zero copy).
    fn bytes_at(&self, d: Desc) -> &Region {
        &self.regions[d.region as usize]
    }

    /// An honest server sending frames: each into the slots the client posted, as a chain when
    /// longer than the posted capacity; tail published after the descriptors.
    fn send(&mut self, frames: &[Vec<u8>]) {
        let mut t = self.s2c_tail;
        for f in frames {
            let mut done = 0;
            loop {
                let mut d = self.s2c.read_desc(t);
                let k = (f.len() - done).min(d.length as usize);
                self.bytes_at(d)
                    .write_bytes(d.offset as usize, &f[done..done + k])
                    .unwrap();
                done += k;
                d.length = k as u32;
                d.flags = if done < f.len() { DESC_FLAG_NEXT } else { 0 };
                self.s2c.write_desc(t, d);
                t = t.wrapping_add(1);
                if done == f.len() {
                    break;
                }
            }
        }
        self.s2c_tail = t;
        self.s2c.tail().store(t, Release);
    }

    /// An honest server taking the client's frames from C2S; tail published after.
    fn take(&mut self) -> Vec<Vec<u8>> {
        let head = self.c2s.head().load(Acquire);
        let mut frames = Vec::new();
        let mut cur = Vec::new();
        while self.c2s_seen != head {
            let d = self.c2s.read_desc(self.c2s_seen);
            let mut b = vec![0; d.length as usize];
            self.bytes_at(d)
                .read_bytes(d.offset as usize, &mut b)
                .unwrap();
            cur.extend_from_slice(&b);
            if d.flags & DESC_FLAG_NEXT == 0 {
                frames.push(std::mem::take(&mut cur));
            }
            self.c2s_seen = self.c2s_seen.wrapping_add(1);
        }
        self.c2s.tail().store(head, Release);
        frames
    }

    /// Waits until the client's C2S head is at `head`.
    fn wait_c2s_head(&self, head: u16) {
        let end = Instant::now() + Duration::from_secs(5);
        while self.c2s.head().load(Relaxed) != head {
            assert!(Instant::now() < end, "C2S head reaches {head}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Publishes a two-slot chain on a fresh session whose second slot is one byte over the
/// buffer the client posted in it.
fn bend_second_of_chain(s: &Session) {
    let mut d = s.s2c.read_desc(0);
    d.length = 64;
    d.flags = DESC_FLAG_NEXT;
    s.s2c.write_desc(0, d);
    let mut d = s.s2c.read_desc(1);
    d.length += 1;
    d.flags = 0;
    s.s2c.write_desc(1, d);
    s.s2c.tail().store(2, Release);
}

/// Good traffic both ways on a fresh session: the fake server is right about the protocol, so
/// what the mistakes below provoke is the client's doing. Returns the number of frames received.
fn good_traffic(c: &mut Client, s: &mut Session, received_so_far: usize) -> usize {
    let frames: Vec<Vec<u8>> = [60usize, 1518, 2048, 2049, 9000]
        .iter()
        .enumerate()
        .map(|(i, &l)| payload(1000 + i as u64, l))
        .collect();
    s.send(&frames);
    let got = c.received(received_so_far + frames.len());
    assert_eq!(
        got[received_so_far..],
        frames[..],
        "frames from the server arrive intact"
    );
    let (n, sent) = c.send(&[64, 1500, 3000]);
    assert_eq!(n, 3);
    s.wait_c2s_head(s.c2s_seen.wrapping_add(1 + 1 + 2));
    assert_eq!(s.take(), sent, "frames to the server arrive intact");
    received_so_far + frames.len()
}

/// Every client-side check, in copy mode, each on its own connection.
#[test]
fn poll_a_hostile_server_is_disconnected_with_the_reason_and_the_client_reconnects() {
    let srv = FakeServer::bind("copy");
    let mut c = Client::start(&srv.sock, false);
    let mut rx_errors = 0;
    let mut tx_errors = 0;

    let mut s = srv.accept();
    let mut received = good_traffic(&mut c, &mut s, 0);

    // The server's tail passes the client's head (read from the ring, as a server does).
    let head = s.s2c.head().load(Acquire);
    s.s2c.tail().store(head.wrapping_add(1), Release);
    s.expect_disconnect("Ring tail passed head");
    rx_errors += 1;
    assert_eq!(c.stats().0.errors, rx_errors, "rx counted it");

    // A length over the buffer the client posted.
    let s = srv.accept();
    let mut d = s.s2c.read_desc(0);
    d.length = BSIZE + 1;
    s.s2c.write_desc(0, d);
    s.s2c.tail().store(1, Release);
    s.expect_disconnect("Descriptor longer than its buffer");
    rx_errors += 1;
    assert_eq!(c.stats().0.errors, rx_errors);

    // The same inside a chain: the second slot of a frame is over its buffer.
    let s = srv.accept();
    bend_second_of_chain(&s);
    s.expect_disconnect("Descriptor longer than its buffer");
    rx_errors += 1;
    assert_eq!(c.stats().0.errors, rx_errors);

    // A chain running past tail: the last published slot says NEXT.
    let s = srv.accept();
    for slot in 0..2 {
        let mut d = s.s2c.read_desc(slot);
        d.length = 64;
        d.flags = DESC_FLAG_NEXT;
        s.s2c.write_desc(slot, d);
    }
    s.s2c.tail().store(2, Release);
    s.expect_disconnect("Chained buffer runs past tail");
    rx_errors += 1;
    assert_eq!(c.stats().0.errors, rx_errors);

    // A tail moved backwards on S2C (behind the client's last tail) is as far out of range.
    let mut s = srv.accept();
    s.send(&[payload(1, 100)]);
    let got = c.received(received + 1);
    assert_eq!(got[received], payload(1, 100));
    received += 1;
    s.s2c.tail().store(0, Release);
    s.expect_disconnect("Ring tail passed head");
    rx_errors += 1;
    assert_eq!(c.stats().0.errors, rx_errors);

    // C2S: the server's tail out of range (past the client's head). A copy-mode client reads
    // the tail once the room it knew of runs out: here at the 15th frame of the next burst,
    // and that burst sends nothing (its frames stay behind the published head).
    let s = srv.accept();
    let (n, _) = c.send(&[60, 60]);
    assert_eq!(n, 2);
    s.wait_c2s_head(2);
    s.c2s.tail().store(5, Release);
    let (n, _) = c.send(&[60; SIZE as usize - 1]);
    assert_eq!(n, 0, "nothing sent on a ring that broke the protocol");
    assert_eq!(
        s.c2s.head().load(Acquire),
        2,
        "head never published past the bad tail"
    );
    s.expect_disconnect("Ring tail out of range");
    tx_errors += 1;
    assert_eq!(c.stats().1.errors, tx_errors, "tx counted it");

    // No room: a server that takes nothing fills the ring; the rest comes back to the caller,
    // frame by frame (a chain only when all its slots are free), and nothing is an error.
    let mut s = srv.accept();
    let (n, _) = c.send(&[60; 20]);
    assert_eq!(
        n, SIZE as usize,
        "one ring's worth sent, the rest handed back"
    );
    s.wait_c2s_head(SIZE);
    let (n, _) = c.send(&[60; 3]);
    assert_eq!(n, 0, "a full ring takes nothing");
    s.c2s.tail().store(1, Release); // one slot free
    s.c2s_seen = 1;
    let (n, _) = c.send(&[3000, 60]);
    assert_eq!(
        n, 0,
        "a two-slot chain does not fit one free slot, and order is kept"
    );
    let (n, _) = c.send(&[60]);
    assert_eq!(n, 1);
    s.expect_quiet();
    assert_eq!(c.stats().1.errors, tx_errors, "no room is not an error");
    let frames = s.take();
    assert_eq!(
        frames.len(),
        SIZE as usize,
        "15 left plus the one sent into the freed slot"
    );

    // The descriptor's region and offset are ignored by the client: it reads its own layout,
    // never where a server points it.
    let mut d = s.s2c.read_desc(0);
    let good = d;
    let want = payload(77, 80);
    s.regions[0]
        .write_bytes(good.offset as usize, &want)
        .unwrap();
    d.region = 9;
    d.offset = 0xffff_ff00;
    d.length = want.len() as u32;
    d.flags = 0;
    s.s2c.write_desc(0, d);
    s.s2c.tail().store(1, Release);
    let got = c.received(received + 1);
    assert_eq!(
        got[received], want,
        "the frame comes from the client's own buffer"
    );
    received += 1;
    s.expect_quiet();

    // After all that, a well-behaved server is served normally.
    drop(s);
    let mut s = srv.accept();
    good_traffic(&mut c, &mut s, received);
    assert_eq!(c.stats().0.errors, rx_errors);
    assert_eq!(c.stats().1.errors, tx_errors);
    let p = c.port.lock().unwrap();
    assert_eq!(p.connects, 8, "one connection per case");
}

/// The same checks in zero copy: the server writes straight into the client's pool buffers
/// (region 1), and the client's own frames are read from there.
#[test]
fn poll_a_hostile_server_in_zero_copy_is_disconnected_with_the_reason() {
    let srv = FakeServer::bind("zc");
    let mut c = Client::start(&srv.sock, true);
    let mut rx_errors = 0;

    let mut s = srv.accept_or(|| format!("{:?}", c.port.lock().unwrap().last_reason));
    assert_eq!(s.regions.len(), 2, "region 0 and the pool");
    assert_eq!(s.s2c.read_desc(0).region, 1, "S2C slots are pool buffers");
    let mut received = good_traffic(&mut c, &mut s, 0);

    // A length over the pool buffer parked in the slot (on the live session, after traffic).
    let t = s.s2c_tail;
    let mut d = s.s2c.read_desc(t);
    d.length += 1;
    s.s2c.write_desc(t, d);
    s.s2c.tail().store(t.wrapping_add(1), Release);
    s.expect_disconnect("Descriptor longer than its buffer");
    rx_errors += 1;
    assert_eq!(c.stats().0.errors, rx_errors);

    // The same inside a chain.
    let s = srv.accept();
    bend_second_of_chain(&s);
    s.expect_disconnect("Descriptor longer than its buffer");
    rx_errors += 1;
    assert_eq!(c.stats().0.errors, rx_errors);

    // A chain running past tail.
    let s = srv.accept();
    let mut d = s.s2c.read_desc(0);
    d.length = 64;
    d.flags = DESC_FLAG_NEXT;
    s.s2c.write_desc(0, d);
    s.s2c.tail().store(1, Release);
    s.expect_disconnect("Chained buffer runs past tail");
    rx_errors += 1;

    // Tail passing head.
    let s = srv.accept();
    s.s2c.tail().store(SIZE + 3, Release);
    s.expect_disconnect("Ring tail passed head");
    rx_errors += 1;

    // The descriptor's offset is ignored: the frame is the buffer the client parked.
    let mut s = srv.accept();
    let good = s.s2c.read_desc(0);
    let want = payload(5, 200);
    s.regions[1]
        .write_bytes(good.offset as usize, &want)
        .unwrap();
    s.s2c.write_desc(
        0,
        Desc {
            flags: 0,
            region: 0,
            length: want.len() as u32,
            offset: 0,
        },
    );
    s.s2c.tail().store(1, Release);
    s.s2c_tail = 1;
    let got = c.received(received + 1);
    assert_eq!(got[received], want);
    received += 1;

    // No room in zero copy: the ring fills, the rest comes back.
    let (n, _) = c.send(&[60; 20]);
    assert_eq!(n, SIZE as usize);
    let (n, _) = c.send(&[60]);
    assert_eq!(n, 0);
    s.wait_c2s_head(SIZE);
    assert_eq!(s.take().len(), SIZE as usize);
    s.expect_quiet();
    assert_eq!(c.stats().0.errors, rx_errors);
    assert_eq!(c.stats().1.errors, 0);

    // And a good server afterwards.
    drop(s);
    let mut s = srv.accept();
    good_traffic(&mut c, &mut s, received);
}
