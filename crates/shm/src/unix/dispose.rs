//! Closing descriptors a peer sent that we do not keep.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::Region;

/// Closes `fd`, a descriptor a peer sent us, without waiting on the peer. Closing a file of a
/// filesystem a process serves (FUSE) asks that process (FUSE_FLUSH) and waits for its answer,
/// and closing the last reference to a socket the peer set SO_LINGER on waits for the other end
/// to take the data: a hostile peer never lets either finish, and a refused descriptor is
/// closed on the thread that refused it. What closes without asking anyone is closed here and
/// now (shared memory, eventfds and other anonymous files, pipes, files on a mount our table
/// names that is not FUSE: [`closes_without_a_server`]); anything else on a thread of its own,
/// at most [`MAX_CLOSERS`] at once, past which it is left open rather than closed here.
pub fn dispose(fd: OwnedFd) {
    if closes_without_a_server(fd.as_fd(), None) {
        drop(fd);
        return;
    }
    // Relaxed: a count of threads alive; nothing is published with it.
    if CLOSERS.fetch_add(1, Relaxed) >= MAX_CLOSERS {
        CLOSERS.fetch_sub(1, Relaxed);
        std::mem::forget(fd);
        return;
    }
    // Handed over through a slot: a thread that cannot start must not close it here either.
    let slot = Arc::new(Mutex::new(Some(fd)));
    let theirs = slot.clone();
    let started = std::thread::Builder::new()
        .name("memnic-closer".into())
        .spawn(move || {
            drop(theirs.lock().unwrap_or_else(|p| p.into_inner()).take());
            CLOSERS.fetch_sub(1, Relaxed);
        });
    if started.is_err() {
        CLOSERS.fetch_sub(1, Relaxed);
        std::mem::forget(slot.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// How many descriptors [`dispose`] closes on threads of their own at once (each may wait on
/// a peer for ever); more are left open.
pub const MAX_CLOSERS: usize = 64;

static CLOSERS: AtomicUsize = AtomicUsize::new(0);

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    /// A TCP socket whose last close waits (SO_LINGER 60 s, data its peer never reads), as
    /// a peer can hand us one, and its other end (dropping that ends the wait).
    fn lingering_socket() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut ours = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (theirs, _) = l.accept().unwrap();
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 60,
        };
        // SAFETY: setsockopt with a live, correctly sized linger struct.
        let rc = unsafe {
            libc::setsockopt(
                ours.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        ours.set_nonblocking(true).unwrap();
        let chunk = [0u8; 65536];
        while ours.write(&chunk).is_ok() {}
        (ours, theirs)
    }

    /// Runs `close` on another thread: whether it returned within 5 s.
    fn returns_at_once(close: impl FnOnce() + Send + 'static) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            close();
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(5)).is_ok()
    }

    /// A socket whose close would linger goes to a thread of its own, by `dispose` and by a
    /// dropped `PeerFds`, and the caller returns at once; a pipe and an eventfd close here.
    #[test]
    fn a_socket_whose_close_would_linger_is_closed_elsewhere() {
        let (ours, theirs) = lingering_socket();
        assert!(!closes_without_a_server(ours.as_fd(), None));
        let disposed = returns_at_once(move || dispose(OwnedFd::from(ours)));
        drop(theirs);
        assert!(disposed, "dispose returned at once");
        let (ours, theirs) = lingering_socket();
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
