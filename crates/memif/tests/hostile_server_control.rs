//! Fake memif servers against our client: one that accepts and never greets, one whose backlog
//! is full so `connect` itself would block, one that goes silent after HELLO, and one that says
//! CONNECTED before we sent CONNECT. `Port::service` runs on the control thread every port
//! shares, so it must never wait on the peer; each handshake step has a deadline; and a reply
//! the protocol does not allow yet is refused with DISCONNECT and a reason.
//!
//! The tests run one at a time: one counts this process's threads.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memnic_ethdev::{Port, RxQueue, TxQueue};
use memnic_memif::msg::{Hello, Msg, Name};
use memnic_memif::{MemifConfig, MemifPort, Role};
use memnic_pktbuf::{Mempool, PoolConfig};
use memnic_shm::unix::{
    closes_waiting_from, dispose_from, lingering_socket, poll, PollFd, Sender, SeqpacketConn,
    SeqpacketListener, SocketAddrSpec, MAX_CLOSERS,
};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

static SERIAL: Mutex<()> = Mutex::new(());

/// A `service` call that waited on the peer would take the peer's time (seconds); one that does
/// not takes microseconds. The bound sits far from both, so a loaded machine does not trip it.
const LONGEST_CALL: Duration = Duration::from_millis(100);

fn sock(tag: &str) -> String {
    let s = format!(
        "/tmp/memif-hostile-server-{tag}-{}.sock",
        std::process::id()
    );
    let _ = std::fs::remove_file(&s);
    s
}

/// Our client, with one queue pair, and `timeout` for each handshake step.
struct Client {
    port: MemifPort,
    _q: (Box<dyn RxQueue>, Box<dyn TxQueue>),
}

impl Client {
    fn new(sock: &str, timeout: Duration) -> Client {
        let mut c = MemifConfig::new(Role::Client, sock);
        c.handshake_timeout = timeout;
        let mut port = MemifPort::new("c", c).unwrap();
        let mut pc = PoolConfig::new("c", 2048);
        pc.huge = false;
        let pool = Mempool::new(&pc).unwrap();
        let _q = (
            port.take_rx_queue(0, &pool).unwrap(),
            port.take_tx_queue(0, &pool).unwrap(),
        );
        Client { port, _q }
    }

    /// Calls `service` for `dur` or until `done` holds; returns the longest call and whether
    /// the port was ever connected.
    fn service_for(&mut self, dur: Duration, mut done: impl FnMut() -> bool) -> (Duration, bool) {
        let end = Instant::now() + dur;
        let (mut longest, mut connected) = (Duration::ZERO, false);
        while Instant::now() < end && !done() {
            let t = Instant::now();
            self.port.service();
            longest = longest.max(t.elapsed());
            connected |= self.port.is_connected();
            std::thread::sleep(Duration::from_millis(1));
        }
        (longest, connected)
    }
}

/// One accepted connection of a fake server.
struct Peer(SeqpacketConn);

impl Peer {
    fn recv(&self, timeout: Duration) -> Option<Msg> {
        let mut pfd = [PollFd::readable(self.0.as_fd())];
        if poll(&mut pfd, Some(timeout)).unwrap() == 0 {
            return None;
        }
        let mut buf = [0u8; 256];
        let got = self.0.recv(&mut buf).ok()?;
        if got.is_eof() {
            return None;
        }
        Msg::decode(&buf[..got.len]).ok()
    }

    fn send(&self, m: &Msg) {
        self.0.send(&m.encode(), &[]).unwrap();
    }

    fn hello(&self) {
        self.send(&Msg::Hello(Hello::new(Name::truncated("fake"))));
    }

    /// The reason of the DISCONNECT that comes next (within 5 s), or what came instead.
    fn disconnect_reason(&self) -> Result<String, Option<Msg>> {
        match self.recv(Duration::from_secs(5)) {
            Some(Msg::Disconnect(d)) => Ok(d.reason.to_string_lossy().to_string()),
            other => Err(other),
        }
    }
}

/// A fake server on `sock` that accepts one client and runs `script` on it, on its own thread.
fn fake_server<R: Send + 'static>(
    sock: &str,
    script: impl FnOnce(&Peer) -> R + Send + 'static,
) -> JoinHandle<R> {
    let l = SeqpacketListener::bind(&SocketAddrSpec::memif(sock, false)).unwrap();
    std::thread::spawn(move || {
        let peer = Peer(l.accept().unwrap());
        script(&peer)
    })
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn service_returns_at_once_while_the_server_sends_no_hello() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s = sock("no-hello");
    // Accepts, says nothing, and reports what our client said before giving up.
    let fake = fake_server(&s, |p| p.disconnect_reason());
    let mut c = Client::new(&s, Duration::from_millis(300));
    let (longest, connected) = c.service_for(Duration::from_secs(3), || fake.is_finished());
    assert!(!connected);
    assert!(
        longest < LONGEST_CALL,
        "a service call took {longest:?} while waiting for HELLO"
    );
    assert_eq!(
        fake.join().unwrap().as_deref(),
        Ok("Timeout waiting for HELLO")
    );
    assert_eq!(
        c.port.last_reason.as_deref(),
        Some("Timeout waiting for HELLO")
    );
    let _ = std::fs::remove_file(&s);
}

/// A listener that never accepts and whose backlog is full: `connect` blocks until it goes
/// away. Our control thread must not, and a connect that outlives its deadline must not be
/// followed by another (one blocked thread at most).
#[test]
fn service_returns_at_once_while_the_servers_backlog_is_full() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s = sock("backlog");
    let addr = SocketAddrSpec::memif(&s, false);
    let listener = SeqpacketListener::bind(&addr).unwrap();
    let queued = Arc::new(Mutex::new(Vec::new()));
    let filler = {
        let (addr, queued) = (addr.clone(), queued.clone());
        std::thread::spawn(move || {
            // Blocks once the backlog is full, and fails once the listener is gone.
            while let Ok(c) = SeqpacketConn::connect(&addr) {
                queued.lock().unwrap().push(c);
            }
        })
    };
    // Full when no connect has gone through for a while.
    let (mut n, mut since) = (0, Instant::now());
    while since.elapsed() < Duration::from_millis(300) {
        let now = queued.lock().unwrap().len();
        if now != n {
            (n, since) = (now, Instant::now());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(n >= 1, "the backlog took no connection");
    eprintln!("backlog full after {n} connects");

    // Our client runs on a worker, so that a call that blocks fails the test instead of
    // hanging it.
    let (tx, rx) = mpsc::channel();
    let sock_path = s.clone();
    std::thread::spawn(move || {
        let mut c = Client::new(&sock_path, Duration::from_millis(200));
        let before = threads();
        let (longest, connected) = c.service_for(Duration::from_millis(1500), || false);
        let extra_threads = threads().saturating_sub(before);
        let _ = tx.send((
            longest,
            connected,
            extra_threads,
            c.port.last_reason.clone(),
        ));
        c
    });
    let result = rx.recv_timeout(Duration::from_secs(10));
    drop(listener); // wakes the blocked connects
    let (longest, connected, extra_threads, reason) =
        result.expect("Port::service blocked while the server's backlog was full");
    filler.join().unwrap();
    assert!(!connected);
    assert!(
        longest < LONGEST_CALL,
        "a service call took {longest:?} while connect could not complete"
    );
    assert!(
        extra_threads <= 1,
        "{extra_threads} threads more: connects pile up"
    );
    let reason = reason.unwrap_or_default();
    eprintln!("longest call {longest:?}, {extra_threads} extra threads, last reason: {reason}");
    assert!(
        reason.contains("timed out") || reason.contains("still blocked"),
        "{reason}"
    );
    let _ = std::fs::remove_file(&s);
}

#[test]
fn a_server_silent_after_hello_is_timed_out() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s = sock("no-ack");
    let fake = fake_server(&s, |p| {
        p.hello();
        assert!(matches!(p.recv(Duration::from_secs(5)), Some(Msg::Init(_))));
        p.disconnect_reason() // and never ACK
    });
    let mut c = Client::new(&s, Duration::from_millis(300));
    let (longest, connected) = c.service_for(Duration::from_secs(5), || fake.is_finished());
    assert!(!connected);
    assert!(longest < LONGEST_CALL, "a service call took {longest:?}");
    assert_eq!(
        fake.join().unwrap().as_deref(),
        Ok("Timeout waiting for ACK")
    );
    assert_eq!(
        c.port.last_reason.as_deref(),
        Some("Timeout waiting for ACK")
    );
    let _ = std::fs::remove_file(&s);
}

/// CONNECTED answers CONNECT; one that comes earlier (here, right after INIT) is a protocol
/// error, not a link up.
#[test]
fn connected_before_we_sent_connect_is_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s = sock("early");
    let fake = fake_server(&s, |p| {
        p.hello();
        assert!(matches!(p.recv(Duration::from_secs(5)), Some(Msg::Init(_))));
        p.send(&Msg::Connected {
            if_name: Name::truncated("fake"),
        });
        p.disconnect_reason()
    });
    let mut c = Client::new(&s, Duration::from_secs(5));
    let (_, connected) = c.service_for(Duration::from_secs(5), || fake.is_finished());
    assert!(!connected, "the client took an early CONNECTED");
    assert_eq!(fake.join().unwrap().as_deref(), Ok("Unexpected CONNECTED"));
    assert_eq!(c.port.last_reason.as_deref(), Some("Unexpected CONNECTED"));
    let _ = std::fs::remove_file(&s);
}

/// Fills a sender's closer threads with closes that wait (lingering sockets); dropping what
/// this returns lets them finish.
fn fill_closers(sender: Sender) -> Vec<std::net::TcpStream> {
    let mut held = Vec::new();
    for _ in 0..MAX_CLOSERS {
        let (ours, theirs) = lingering_socket().unwrap();
        dispose_from(ours.into(), sender);
        held.push(theirs);
    }
    assert_eq!(closes_waiting_from(sender), MAX_CLOSERS);
    held
}

/// While every closer thread of the server's user waits on a descriptor it sent (a server that
/// hands us a file whose close never returns, each time we connect), our client closes the
/// connection it made before reading a word, says why, and does not connect again: what that
/// connection held (a HELLO with another lingering socket) waits to close as one descriptor,
/// and the count stays there however long the client runs. Once those closes return it
/// connects. A server of another user is not held up by those closes.
#[test]
fn no_connection_kept_while_every_closer_of_the_servers_user_waits() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let me = Sender::uid(std::fs::metadata("/proc/self").unwrap().uid());
    let held = fill_closers(me);
    let s = sock("closers");
    let l = SeqpacketListener::bind(&SocketAddrSpec::memif(&s, false)).unwrap();
    let (tx, accepted) = mpsc::channel();
    let fake = std::thread::spawn(move || {
        // The first connection is greeted with a HELLO that carries a lingering socket, and
        // closed before its greeting is read (no INIT comes); then, once the closes returned,
        // one greeted properly goes on to INIT.
        let hello = Msg::Hello(Hello::new(Name::truncated("fake")));
        let p = Peer(l.accept().unwrap());
        let (ours, theirs) = lingering_socket().unwrap();
        // Our copy is let go only once the message holds one (the client may have closed
        // first, when the send fails): dropped after `theirs`, it closes at once.
        let ours = match p.0.send(&hello.encode(), &[ours.as_fd()]) {
            Ok(()) => None,
            Err(_) => Some(ours),
        };
        tx.send((theirs, ours)).unwrap();
        assert!(p.recv(Duration::from_secs(5)).is_none(), "no INIT");
        let p = Peer(l.accept().unwrap());
        p.send(&hello);
        p.recv(Duration::from_secs(5))
    });
    let mut c = Client::new(&s, Duration::from_secs(5));
    let mut first = Vec::new();
    // Generous: a loaded machine can take seconds to run the connect thread.
    c.service_for(Duration::from_secs(30), || {
        first.extend(accepted.try_iter());
        !first.is_empty()
    });
    // Time for many retries (one every 50 ms) if the client made them.
    c.service_for(Duration::from_millis(500), || false);
    first.extend(accepted.try_iter());
    assert_eq!(
        first.len(),
        1,
        "connections made while the server's user is busy ({:?})",
        c.port.last_reason
    );
    let why = c.port.last_reason.clone().unwrap_or_default();
    assert!(why.contains("have not closed yet"), "{why}");
    assert!(!c.port.is_connected());
    let sent = first.iter().all(|(_, ours)| ours.is_none());
    assert_eq!(
        closes_waiting_from(me),
        MAX_CLOSERS + usize::from(sent),
        "the refused connection waits to close, whole, if it holds the HELLO"
    );
    drop(held);
    drop(first);
    c.service_for(Duration::from_secs(5), || fake.is_finished());
    let last = fake.join().unwrap();
    assert!(matches!(last, Some(Msg::Init(_))), "{last:?}");
    let _ = std::fs::remove_file(&s);

    // Another user's closes: our client connects.
    let held = fill_closers(Sender::uid(4242));
    let s = sock("closers-other");
    let fake = fake_server(&s, |p| {
        p.hello();
        p.recv(Duration::from_secs(5))
    });
    let mut c = Client::new(&s, Duration::from_secs(5));
    c.service_for(Duration::from_secs(5), || fake.is_finished());
    assert!(matches!(fake.join().unwrap(), Some(Msg::Init(_))));
    drop(held);
    let _ = std::fs::remove_file(&s);
}
