//! Control-channel plumbing for memif: AF_UNIX `SOCK_SEQPACKET` sockets that carry file
//! descriptors (SCM_RIGHTS), eventfds, and a `poll` over several descriptors.
//!
//! * [`SocketAddrSpec`]: a filesystem path or a Linux abstract name (memif's
//!   `socket-abstract=yes`), turned into a `sockaddr_un` of exactly the length DPDK uses.
//! * [`SeqpacketListener`] / [`SeqpacketConn`]: bind, accept, connect, and message-at-a-time
//!   [`send`](SeqpacketConn::send) / [`recv`](SeqpacketConn::recv) with descriptors attached.
//! * [`EventFd`]: memif's per-ring interrupt line.
//! * [`poll`] with [`PollFd`]: wait for any of several descriptors, with a timeout.
//! * [`dispose`]: close a descriptor a peer sent without waiting on the peer (FUSE).
//!
//! Every descriptor is created close-on-exec (`SOCK_CLOEXEC`, `MSG_CMSG_CLOEXEC`, `EFD_CLOEXEC`)
//! and is owned by an [`OwnedFd`], so it is closed on drop.
//!
//! Descriptor safety on receive: the peer decides how many descriptors it attaches, not us.
//! [`SeqpacketConn::recv`] offers the kernel a bounded control buffer; the kernel installs what
//! fits, closes the rest itself and reports `MSG_CTRUNC`. Each installed descriptor is wrapped in
//! an `OwnedFd` before anything else looks at the message, those over [`MAX_RECV_FDS`] are closed
//! and the message is flagged as truncated, so a message the caller
//! rejects (wrong size, unexpected or surplus descriptors) leaks nothing: dropping the
//! [`Received`] closes them.

mod addr;
mod dispose;
mod eventfd;
mod poll;
mod socket;

pub use addr::SocketAddrSpec;
pub use dispose::{
    closer_threads, closers_busy, closes_done_within, closes_waiting, closes_waiting_from,
    closes_without_a_server, dispose, dispose_from, lingering_socket, max_waiting,
    on_a_thread_as_uid, PeerFds, Sender, MAX_CLOSERS, MAX_CLOSERS_IN_ALL,
};
pub use eventfd::{BlockedNotify, EventFd};
pub use poll::{poll, PollFd, Ready};
pub use socket::{
    close_connection, close_listener, peek_with_fds, peer_cred, queued_bytes, send_out_of_band,
    set_oob_inline, Peeked, PeerCred, Received, SeqpacketConn, SeqpacketListener, MAX_RECV_FDS,
    MAX_SEND_FDS, SCM_MAX_FD,
};

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::{Result, ShmError};

/// Copies up to `buf.len()` bytes queued on socket `fd` into `buf` without taking them off the
/// queue (`MSG_PEEK`, never waiting): how many were there, 0 at end of file, or
/// [`ShmError::WouldBlock`] when nothing is queued. A stream reader uses it to look at the next
/// message's header before it decides who reads the message.
pub fn peek(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize> {
    loop {
        // SAFETY: `buf` is live and writable for `buf.len()` bytes; recv writes at most that.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let source = io::Error::last_os_error();
        match source.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Err(ShmError::WouldBlock { op: "peek" }),
            _ => return Err(os_err("peek at", "a socket", source)),
        }
    }
}

fn os_err(op: &'static str, what: impl Into<String>, source: io::Error) -> ShmError {
    ShmError::Io {
        op,
        what: what.into(),
        source,
    }
}

/// Takes ownership of a descriptor the kernel just returned (checked for `-1` by the caller).
fn owned(raw: RawFd) -> OwnedFd {
    debug_assert!(raw >= 0);
    // SAFETY: every caller passes a descriptor freshly created for this process by a successful
    // system call (socket, accept4, eventfd, socketpair, or installed by recvmsg); nothing else
    // owns it, so exactly one OwnedFd will close it.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

fn set_nonblocking_fd(fd: BorrowedFd<'_>, on: bool, what: &str) -> Result<()> {
    // SAFETY: fcntl(F_GETFL) on a live descriptor borrowed for the call; no memory arguments.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(os_err(
            "read the flags of",
            what,
            io::Error::last_os_error(),
        ));
    }
    let new = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    if new == flags {
        return Ok(());
    }
    // SAFETY: fcntl(F_SETFL) on a live descriptor borrowed for the call; no memory arguments.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, new) } < 0 {
        return Err(os_err(
            "set O_NONBLOCK on",
            what,
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn is_nonblocking(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: fcntl(F_GETFL) on a live descriptor borrowed for the call; no memory arguments.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

/// A name no other test of this process (or a concurrent test process) uses.
#[cfg(test)]
fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Relaxed: only uniqueness of the counter value matters, no other memory is published.
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "memnic-shm-test-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `f` on another thread: whether it returned within 5 s (a close, a drop or a receive
/// that must not block on what a peer does).
#[cfg(test)]
fn returns_at_once(f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok()
}

/// Sets socket option `opt` (level SOL_SOCKET) of `fd` to `v`.
pub(crate) fn set_socket_option<T>(
    fd: BorrowedFd<'_>,
    opt: libc::c_int,
    v: T,
) -> std::io::Result<()> {
    // SAFETY: setsockopt reads size_of::<T>() bytes of a live `T`.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod peek_tests {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::peek;
    use crate::ShmError;

    #[test]
    fn peek_shows_queued_bytes_and_leaves_them_for_the_reader() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 8];
        assert!(matches!(
            peek(b.as_fd(), &mut buf),
            Err(ShmError::WouldBlock { .. })
        ));
        a.write_all(b"abcdef").unwrap();
        assert_eq!(peek(b.as_fd(), &mut buf).unwrap(), 6);
        assert_eq!(&buf[..6], b"abcdef");
        let mut got = [0u8; 6];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"abcdef");
        drop(a);
        assert_eq!(peek(b.as_fd(), &mut buf).unwrap(), 0);
    }
}
