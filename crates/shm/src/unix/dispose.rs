//! Closing descriptors a peer sent that we do not keep.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex};

use crate::Region;

/// Closes `fd`, a descriptor a peer sent us, without waiting on the peer. Closing a file of a
/// filesystem a process serves (FUSE) asks that process (FUSE_FLUSH) and waits for its answer,
/// and closing the last reference to a socket the peer set SO_LINGER on waits for the other end
/// to take the data: a hostile peer never lets either finish, and a refused descriptor is
/// closed on the thread that refused it. What closes without asking anyone is closed here and
/// now (shared memory, eventfds and other anonymous files, pipes, files on a mount our table
/// names that is not FUSE: [`closes_without_a_server`]); anything else on a closer thread, at
/// most [`MAX_CLOSERS`] at once. Past that it waits in a queue that the closer threads take
/// from as their closes return, so nothing is left open for good; while any waits there
/// ([`closes_waiting`] at [`MAX_CLOSERS`] or more) our listeners take no new peers, which is
/// what bounds the queue: each peer can hand us a few descriptors before it is dropped.
pub fn dispose(fd: OwnedFd) {
    if closes_without_a_server(fd.as_fd(), None) {
        drop(fd);
        return;
    }
    let mut w = lock_waiting();
    if w.closers >= MAX_CLOSERS {
        w.queued.push(fd);
        return;
    }
    w.closers += 1;
    drop(w);
    start_closer(fd);
}

/// Starts a closer thread on `fd` (counted in `closers` by the caller). One that cannot start
/// leaves `fd` queued: the next `dispose`, or a look at [`closes_waiting`] while no closer
/// runs, starts another for the queue.
fn start_closer(fd: OwnedFd) {
    // Handed over through a slot: a thread that cannot start must not close it here either.
    let slot = Arc::new(Mutex::new(Some(fd)));
    let theirs = slot.clone();
    let started = std::thread::Builder::new()
        .name("memnic-closer".into())
        .spawn(move || {
            let first = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
            close_all_from(first);
        });
    if started.is_err() {
        let mut w = lock_waiting();
        w.closers -= 1;
        w.queued
            .extend(slot.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// A closer thread's work: closes `first`, then whatever waits in the queue, until it is
/// empty.
fn close_all_from(first: Option<OwnedFd>) {
    let mut next = first;
    loop {
        drop(next.take());
        let mut w = lock_waiting();
        match w.queued.pop() {
            Some(fd) => next = Some(fd),
            None => {
                w.closers -= 1;
                return;
            }
        }
    }
}

/// How many descriptors [`dispose`] closes on threads of their own at once (each may wait on
/// a peer for ever); more wait in a queue.
pub const MAX_CLOSERS: usize = 64;

/// How many descriptors peers sent us are not closed yet: closing on a closer thread (their
/// server has not answered) or queued for one. Ports take no new peer while this is
/// [`MAX_CLOSERS`] or more ([`closers_busy`]).
pub fn closes_waiting() -> usize {
    let mut w = lock_waiting();
    let waiting = w.closers + w.queued.len();
    // Queued with no closer to take them (none could start): try again.
    if w.closers == 0 {
        if let Some(fd) = w.queued.pop() {
            w.closers += 1;
            drop(w);
            start_closer(fd);
        }
    }
    waiting
}

/// Whether every closer thread is taken ([`closes_waiting`] at [`MAX_CLOSERS`] or more): the
/// point at which memif and vhost ports stop taking new peers (and our memif client stops
/// connecting), until closes return.
pub fn closers_busy() -> bool {
    closes_waiting() >= MAX_CLOSERS
}

/// Closer threads running and descriptors queued for them.
struct Waiting {
    closers: usize,
    queued: Vec<OwnedFd>,
}

static WAITING: Mutex<Waiting> = Mutex::new(Waiting {
    closers: 0,
    queued: Vec::new(),
});

fn lock_waiting() -> std::sync::MutexGuard<'static, Waiting> {
    WAITING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Descriptors a peer sent: those not taken out are closed with [`dispose`] when this is
/// dropped, on whatever path a message is refused.
#[derive(Debug, Default)]
pub struct PeerFds(Vec<OwnedFd>);

impl PeerFds {
    pub fn new(fds: Vec<OwnedFd>) -> PeerFds {
        PeerFds(fds)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn iter(&self) -> std::slice::Iter<'_, OwnedFd> {
        self.0.iter()
    }
    /// Takes the last descriptor out (the caller keeps it, or disposes of it).
    pub fn pop(&mut self) -> Option<OwnedFd> {
        self.0.pop()
    }
}

impl Drop for PeerFds {
    fn drop(&mut self) {
        self.0.drain(..).for_each(dispose);
    }
}

/// Whether closing `fd`, a descriptor a peer sent, asks no process anything: it closes at
/// once (see [`dispose`]), or it is a file on a mount a table names and that is not FUSE
/// ([`Region::check_peer_file`], `peer_pid` as there).
pub fn closes_without_a_server(fd: BorrowedFd<'_>, peer_pid: Option<i32>) -> bool {
    closes_at_once(fd) || Region::check_peer_file(fd, peer_pid).is_ok()
}

/// Whether closing `fd` asks no process anything: shared memory (no flush), or what
/// `/proc/self/fd` names as an anonymous file or a pipe (asked of the kernel's own record of
/// the descriptor, not of its filesystem; a file's name there is its path, which starts with
/// '/'). Not a socket: the last close of one with SO_LINGER waits for its peer.
fn closes_at_once(fd: BorrowedFd<'_>) -> bool {
    if Region::is_shared_memory_fd(fd) {
        return true;
    }
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).is_ok_and(|l| {
        let name = l.as_os_str().as_bytes();
        [&b"anon_inode:"[..], b"pipe:["]
            .iter()
            .any(|p| name.starts_with(p))
    })
}

/// A TCP socket whose last close waits on its peer, as a hostile peer can hand us one (SO_LINGER
/// 60 s, a few KiB sent that the other end has not read), and that other end: dropping it, or
/// reading to the end, lets the close finish. For tests (a stand-in for a FUSE file whose server
/// does not answer).
pub fn lingering_socket() -> std::io::Result<(std::net::TcpStream, std::net::TcpStream)> {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    // Small buffers (the accepted end inherits the listener's): a few KiB wait unread.
    super::set_socket_option(l.as_fd(), libc::SO_RCVBUF, 4096i32)?;
    let mut ours = std::net::TcpStream::connect(l.local_addr()?)?;
    let (theirs, _) = l.accept()?;
    super::set_socket_option(ours.as_fd(), libc::SO_SNDBUF, 4096i32)?;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 60,
    };
    super::set_socket_option(ours.as_fd(), libc::SO_LINGER, linger)?;
    ours.set_nonblocking(true)?;
    let chunk = [0u8; 65536];
    while ours.write(&chunk).is_ok() {}
    ours.set_nonblocking(false)?;
    Ok((ours, theirs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Runs `close` on another thread: whether it returned within 5 s.
    fn returns_at_once(close: impl FnOnce() + Send + 'static) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            close();
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(5)).is_ok()
    }

    /// More lingering closes than closer threads: the surplus waits in the queue, the ports'
    /// gate closes (`closers_busy`), and once the peers let the closes finish (their ends read
    /// everything) every one of them is closed, the queued ones too, and the gate opens.
    #[test]
    fn closes_past_the_closer_threads_wait_their_turn_and_all_finish() {
        let surplus = 8;
        let mut theirs = Vec::new();
        for _ in 0..MAX_CLOSERS + surplus {
            let (ours, their) = lingering_socket().unwrap();
            assert!(returns_at_once(move || dispose(OwnedFd::from(ours))));
            theirs.push(their);
        }
        assert_eq!(closes_waiting(), MAX_CLOSERS + surplus);
        assert!(closers_busy());
        // Each of our ends is closed once its peer has read what it sent: then the peer reads
        // the end of the stream.
        let readers: Vec<_> = theirs
            .into_iter()
            .map(|mut t| {
                std::thread::spawn(move || {
                    t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let mut buf = [0u8; 65536];
                    loop {
                        match std::io::Read::read(&mut t, &mut buf) {
                            Ok(0) => return true,
                            Ok(_) => continue,
                            Err(_) => return false,
                        }
                    }
                })
            })
            .collect();
        let ended = readers
            .into_iter()
            .filter_map(|r| r.join().ok())
            .filter(|&e| e)
            .count();
        assert_eq!(
            ended,
            MAX_CLOSERS + surplus,
            "every disposed socket was closed"
        );
        let since = std::time::Instant::now();
        while closes_waiting() > 0 && since.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(closes_waiting(), 0);
        assert!(!closers_busy());
    }

    /// A socket whose close would linger goes to a thread of its own, by `dispose` and by a
    /// dropped `PeerFds`, and the caller returns at once; a pipe and an eventfd close here.
    #[test]
    fn a_socket_whose_close_would_linger_is_closed_elsewhere() {
        let (ours, theirs) = lingering_socket().unwrap();
        assert!(!closes_without_a_server(ours.as_fd(), None));
        let disposed = returns_at_once(move || dispose(OwnedFd::from(ours)));
        drop(theirs);
        assert!(disposed, "dispose returned at once");
        let (ours, theirs) = lingering_socket().unwrap();
        let dropped = returns_at_once(move || drop(PeerFds::new(vec![OwnedFd::from(ours)])));
        drop(theirs);
        assert!(dropped, "a dropped PeerFds returned at once");

        let (r, w) = std::io::pipe().unwrap();
        assert!(closes_without_a_server(r.as_fd(), None));
        assert!(closes_without_a_server(w.as_fd(), None));
        let ev = crate::unix::EventFd::new().unwrap();
        assert!(closes_without_a_server(ev.as_fd(), None));
    }
}
