//! SEQPACKET sockets: listening, connecting, and one message at a time with descriptors
//! attached (SCM_RIGHTS). See the module above for how received descriptors are accounted.

use std::ffi::c_void;
use std::io;
use std::mem::{size_of, ManuallyDrop};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::{dispose_from, os_err, owned, set_nonblocking_fd, PeerFds, Sender, SocketAddrSpec};
use crate::{Result, ShmError};

/// The most descriptors [`SeqpacketConn::recv`] accepts with one message; the kernel closes any
/// beyond this and the message is reported as truncated. memif sends at most one.
pub const MAX_RECV_FDS: usize = 8;

/// The most descriptors one message can carry on Linux (`SCM_MAX_FD`).
pub const MAX_SEND_FDS: usize = 253;

/// Listen backlog. DPDK uses 1; a few more let several clients (one per interface id) connect
/// to one socket at once without being refused.
const BACKLOG: libc::c_int = 16;

const FD_BYTES: usize = size_of::<libc::c_int>();

/// The most descriptors Linux lets one SCM_RIGHTS message carry.
pub const SCM_MAX_FD: usize = 253;

/// Control buffer for [`SeqpacketConn::recv`]: room for one SCM_RIGHTS message with as many
/// descriptors as a peer can attach ([`SCM_MAX_FD`]; those past [`MAX_RECV_FDS`] are disposed
/// of: a surplus that did not fit would be released by the kernel inside our `recvmsg`, and the
/// last reference to a lingering socket would wait there) plus one SCM_CREDENTIALS message
/// (sent by the kernel when the receiving socket has SO_PASSCRED, as DPDK's server sets).
// SAFETY: CMSG_SPACE is pure arithmetic on its argument (it touches no memory).
const RECV_CONTROL_LEN: usize = unsafe {
    libc::CMSG_SPACE((SCM_MAX_FD * FD_BYTES) as libc::c_uint) as usize
        + libc::CMSG_SPACE(size_of::<libc::ucred>() as libc::c_uint) as usize
};

fn seqpacket_socket(addr: &SocketAddrSpec) -> Result<OwnedFd> {
    // SAFETY: socket() has no memory arguments; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(os_err(
            "create a socket for",
            addr.to_string(),
            io::Error::last_os_error(),
        ));
    }
    Ok(owned(raw))
}

// ---------------------------------------------------------------------------------------------
// Listener

/// A listening SEQPACKET socket (the memif server's end).
///
/// Dropping it closes the socket but leaves a socket file in place (another server may have
/// replaced it meanwhile); [`SeqpacketListener::bind_replacing_stale`] removes a leftover one.
#[derive(Debug)]
pub struct SeqpacketListener {
    /// Closed by `Drop` ([`close_listener`]).
    fd: ManuallyDrop<OwnedFd>,
    addr: SocketAddrSpec,
}

/// Connections still in the backlog may hold messages with a peer's descriptors: see
/// [`close_listener`].
impl Drop for SeqpacketListener {
    fn drop(&mut self) {
        // SAFETY: drop runs once, and nothing uses `self.fd` after it.
        let fd = unsafe { ManuallyDrop::take(&mut self.fd) };
        close_listener(fd);
    }
}

impl SeqpacketListener {
    /// Binds and listens on `addr`. A path that already exists gives [`ShmError::AddrInUse`].
    pub fn bind(addr: &SocketAddrSpec) -> Result<SeqpacketListener> {
        let (raw, len) = addr.to_raw()?;
        let fd = seqpacket_socket(addr)?;
        // SAFETY: `raw` is a live, initialised sockaddr_un and `len` does not exceed its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
                len,
            )
        };
        if rc < 0 {
            let source = io::Error::last_os_error();
            return Err(match source.raw_os_error() {
                Some(libc::EADDRINUSE) => ShmError::AddrInUse {
                    addr: addr.to_string(),
                },
                _ => os_err("bind a socket to", addr.to_string(), source),
            });
        }
        // SAFETY: listen() on a live socket; no memory arguments.
        if unsafe { libc::listen(fd.as_raw_fd(), BACKLOG) } < 0 {
            return Err(os_err(
                "listen on",
                addr.to_string(),
                io::Error::last_os_error(),
            ));
        }
        Ok(SeqpacketListener {
            fd: ManuallyDrop::new(fd),
            addr: addr.clone(),
        })
    }

    /// Like [`bind`](Self::bind), but a socket *file* nobody listens on any more (left by a
    /// server that died) is removed first. A live listener still gives [`ShmError::AddrInUse`].
    /// Liveness is probed by connecting, so a live server sees one connection that closes at once.
    pub fn bind_replacing_stale(addr: &SocketAddrSpec) -> Result<SeqpacketListener> {
        match SeqpacketListener::bind(addr) {
            Err(ShmError::AddrInUse { .. }) => {}
            other => return other,
        }
        let SocketAddrSpec::Path(path) = addr else {
            return Err(ShmError::AddrInUse {
                addr: addr.to_string(),
            });
        };
        match SeqpacketConn::connect(addr) {
            Ok(_) => Err(ShmError::AddrInUse {
                addr: addr.to_string(),
            }),
            Err(ShmError::NoListener { .. }) => {
                remove_socket_file(path)?;
                SeqpacketListener::bind(addr)
            }
            Err(e) => Err(e),
        }
    }

    /// Waits for a client and returns its connection (blocking, close-on-exec). On a nonblocking
    /// listener with no client waiting, [`ShmError::WouldBlock`].
    pub fn accept(&self) -> Result<SeqpacketConn> {
        loop {
            // SAFETY: accept4 on a live listening socket; null address pointers ask for no peer
            // address, which the kernel allows.
            let raw = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if raw >= 0 {
                return Ok(SeqpacketConn::new(owned(raw)));
            }
            let source = io::Error::last_os_error();
            match source.raw_os_error() {
                Some(libc::EINTR) | Some(libc::ECONNABORTED) => continue,
                Some(libc::EAGAIN) => return Err(ShmError::WouldBlock { op: "accept" }),
                _ => {
                    return Err(os_err(
                        "accept a connection on",
                        self.addr.to_string(),
                        source,
                    ))
                }
            }
        }
    }

    /// Makes [`accept`](Self::accept) return [`ShmError::WouldBlock`] instead of waiting.
    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        set_nonblocking_fd(self.fd.as_fd(), on, &self.addr.to_string())
    }

    /// The address it listens on.
    pub fn addr(&self) -> &SocketAddrSpec {
        &self.addr
    }
}

impl AsFd for SeqpacketListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn remove_socket_file(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|source| os_err("inspect", path.display().to_string(), source))?;
    if !meta.file_type().is_socket() {
        return Err(ShmError::BadSocketAddr {
            addr: path.display().to_string(),
            reason: "the path exists and is not a socket, so it is left alone",
        });
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(os_err(
            "remove the stale socket",
            path.display().to_string(),
            source,
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Connection

/// The credentials of the process at the other end (SO_PEERCRED), taken when it connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// One received message.
#[derive(Debug)]
pub struct Received {
    /// Bytes written to the caller's buffer. 0 means end of file (the peer closed) — or an empty
    /// message, which memif never sends; either way the session is over.
    pub len: usize,
    /// Descriptors that came with the message, already owned: those not taken out are closed
    /// with `dispose_from` when this is dropped, as the peer's ([`Sender::of`] the socket).
    pub fds: PeerFds,
    /// The kernel cut the message (MSG_TRUNC: longer than the buffer) or its descriptors
    /// (MSG_CTRUNC: our table full; the message is then left queued), or more than
    /// [`MAX_RECV_FDS`] descriptors came (the surplus is already disposed of).
    /// A truncated message must be rejected, and its connection dropped.
    pub truncated: bool,
}

impl Received {
    /// Whether the peer closed the connection (see [`Received::len`]).
    pub fn is_eof(&self) -> bool {
        self.len == 0
    }
}

/// A connected SEQPACKET socket: each `send` is one message and each `recv` returns one whole
/// message (or reports it truncated).
#[derive(Debug)]
pub struct SeqpacketConn {
    /// Closed by `Drop` ([`close_connection`]); taken out by `From<SeqpacketConn> for
    /// OwnedFd`.
    fd: ManuallyDrop<OwnedFd>,
    /// The peer's user, as the kernel recorded it at connect (see [`Sender`]).
    sender: Sender,
}

/// The messages still queued on a connection carry the peer's descriptors, and closing the
/// socket releases them on the closing thread, where the last reference to a socket the peer
/// set SO_LINGER on waits for its other end: see [`close_connection`].
impl Drop for SeqpacketConn {
    fn drop(&mut self) {
        // SAFETY: drop runs once, and nothing uses `self.fd` after it.
        let fd = unsafe { ManuallyDrop::take(&mut self.fd) };
        close_connection(fd);
    }
}

/// Closes `sock`, the last descriptor of a connected AF_UNIX socket (stream or SEQPACKET) to a
/// peer, without waiting on the peer. It is shut both ways first, so the peer sees the end at
/// once and can queue no more. A socket that still holds messages would have the kernel
/// release the descriptors they carry as it closes, on the closing thread, where a socket the
/// peer set SO_LINGER on (or a file on FUSE) waits for its other end: such a socket goes whole
/// to a closer thread as its peer's ([`dispose_from`]): one descriptor of ours, whatever it
/// holds (the descriptors in it stay in flight, which the kernel charges to the peer's user).
/// One that holds nothing is closed here.
pub fn close_connection(sock: OwnedFd) {
    let sender = Sender::of(sock.as_fd());
    // SAFETY: shutdown takes no memory.
    unsafe { libc::shutdown(sock.as_raw_fd(), libc::SHUT_RDWR) };
    if holds_messages(sock.as_fd(), sender) {
        dispose_from(sock, sender);
    }
}

/// Closes `listener`, the last descriptor of a listening AF_UNIX socket, without waiting on a
/// peer: connections still in its backlog may hold messages whose descriptors the kernel would
/// release on the closing thread. It is shut first (a connect from then on is refused), then
/// every connection left in its backlog is accepted and closed as [`close_connection`] does.
/// One whose backlog cannot be taken (no room in our table) goes whole to a closer thread.
pub fn close_listener(listener: OwnedFd) {
    // SAFETY: shutdown takes no memory.
    unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
    if set_nonblocking_fd(listener.as_fd(), true, "a listener").is_err() {
        // Its backlog cannot be taken here: closed elsewhere, whole.
        dispose_from(listener, Sender::UNKNOWN);
        return;
    }
    loop {
        // SAFETY: accept4 on a live socket; null address pointers ask for no peer address.
        let raw = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if raw >= 0 {
            close_connection(owned(raw));
            continue;
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) | Some(libc::ECONNABORTED) => continue,
            Some(libc::EAGAIN) => return, // the backlog is empty: closed here
            // No room to take the backlog (EMFILE and the like): closed elsewhere, whole.
            _ => {
                dispose_from(listener, Sender::UNKNOWN);
                return;
            }
        }
    }
}

/// Sends one out-of-band byte (MSG_OOB) on stream socket `fd` with `fds` attached, as a hostile
/// peer can: a peek never sees it unless the receiver set SO_OOBINLINE
/// ([`set_oob_inline`]). For tests.
#[doc(hidden)]
pub fn send_out_of_band(fd: BorrowedFd<'_>, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let byte = [b'!'];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
    let room = unsafe { libc::CMSG_SPACE((fds.len() * FD_BYTES) as libc::c_uint) } as usize;
    let mut control = vec![0u64; room.div_ceil(size_of::<u64>())];
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = room as _;
    // SAFETY: the control buffer is live, aligned and `room` bytes long, enough for one
    // SCM_RIGHTS header and `fds.len()` descriptors (CMSG_SPACE above); CMSG_FIRSTHDR returns
    // its start, and the writes stay inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN((fds.len() * FD_BYTES) as libc::c_uint) as _;
        let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
        for (i, f) in fds.iter().enumerate() {
            data.add(i).write_unaligned(f.as_raw_fd());
        }
    }
    // SAFETY: `msg` points at the live `iov` (over the live `byte`) and `control`.
    let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_OOB | libc::MSG_NOSIGNAL) };
    match n {
        1 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Keeps out-of-band bytes of stream socket `fd` in line (SO_OOBINLINE): a peer's MSG_OOB byte,
/// and the descriptors attached to it, are then where peeks and reads see them, not in a place
/// of their own that a peek skips and a plain read drops (releasing its descriptors on the
/// reading thread).
pub fn set_oob_inline(fd: BorrowedFd<'_>) -> Result<()> {
    super::set_socket_option(fd, libc::SO_OOBINLINE, 1i32)
        .map_err(|e| os_err("keep out-of-band data in line on", "a socket", e))
}

/// Whether connected socket `fd`, shut for reading, still holds a message or bytes: anything
/// queued (FIONREAD), or, for the zero-length messages a SEQPACKET socket can queue, a look
/// (MSG_PEEK, with room for a timestamp only: descriptors are not installed) that brings a
/// timestamp (SO_TIMESTAMP on: every message read brings one, the end of the stream none) or
/// reports descriptors cut off (copies the look installed after all are `sender`'s to dispose
/// of). An error counts as holding something.
fn holds_messages(fd: BorrowedFd<'_>, sender: Sender) -> bool {
    if queued_bytes(fd).is_ok_and(|n| n > 0) {
        return true;
    }
    if super::set_socket_option(fd, libc::SO_TIMESTAMP, 1i32).is_err() {
        return true;
    }
    let mut control = [0u64; STAMP_CONTROL_LEN.div_ceil(size_of::<u64>())];
    let mut buf = [0u8; 1];
    let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT;
    loop {
        return match recv_with_fds(fd, &mut buf, flags, &mut control) {
            Ok((n, fds, got, stamped)) => {
                let carried = !fds.is_empty() || got & libc::MSG_CTRUNC != 0;
                fds.into_iter().for_each(|f| dispose_from(f, sender));
                n > 0 || stamped || carried
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(_) => true,
        };
    }
}

/// Control buffer for [`holds_messages`]: a timestamp, no room for descriptors.
// SAFETY: CMSG_SPACE is pure arithmetic on its argument (it touches no memory).
const STAMP_CONTROL_LEN: usize =
    unsafe { libc::CMSG_SPACE(size_of::<libc::timeval>() as libc::c_uint) as usize };

impl SeqpacketConn {
    fn new(fd: OwnedFd) -> SeqpacketConn {
        SeqpacketConn {
            sender: Sender::of(fd.as_fd()),
            fd: ManuallyDrop::new(fd),
        }
    }

    /// Who the peer is, for the closes of the descriptors it sends ([`Sender::of`], read once
    /// when the connection was made).
    pub fn sender(&self) -> Sender {
        self.sender
    }

    /// Connects to a listener at `addr` (blocking). No listener there gives
    /// [`ShmError::NoListener`], so a client can retry until the server appears.
    pub fn connect(addr: &SocketAddrSpec) -> Result<SeqpacketConn> {
        let (raw, len) = addr.to_raw()?;
        let fd = seqpacket_socket(addr)?;
        loop {
            // SAFETY: `raw` is a live, initialised sockaddr_un and `len` does not exceed its size.
            let rc = unsafe {
                libc::connect(
                    fd.as_raw_fd(),
                    (&raw as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
                    len,
                )
            };
            if rc == 0 {
                return Ok(SeqpacketConn::new(fd));
            }
            let source = io::Error::last_os_error();
            return Err(match source.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOENT) | Some(libc::ECONNREFUSED) => ShmError::NoListener {
                    addr: addr.to_string(),
                },
                _ => os_err("connect to", addr.to_string(), source),
            });
        }
    }

    /// Two connected sockets (`socketpair`), for tests and in-process peers.
    pub fn pair() -> Result<(SeqpacketConn, SeqpacketConn)> {
        let mut raw = [-1 as libc::c_int; 2];
        // SAFETY: `raw` is a live array of two c_ints, which socketpair fills on success.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                raw.as_mut_ptr(),
            )
        };
        if rc < 0 {
            return Err(os_err(
                "create",
                "a socket pair",
                io::Error::last_os_error(),
            ));
        }
        Ok((
            SeqpacketConn::new(owned(raw[0])),
            SeqpacketConn::new(owned(raw[1])),
        ))
    }

    /// Sends `bytes` as one message, with `fds` attached as SCM_RIGHTS (the peer gets its own
    /// copies; ours stay open). A closed peer gives [`ShmError::PeerClosed`] (no SIGPIPE); a
    /// full socket in nonblocking mode gives [`ShmError::WouldBlock`].
    pub fn send(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        if fds.len() > MAX_SEND_FDS {
            return Err(ShmError::TooManyFds {
                count: fds.len(),
                max: MAX_SEND_FDS,
            });
        }
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut c_void,
            iov_len: bytes.len(),
        };
        // SAFETY: msghdr is plain data (pointers and integers); all-zero is a valid value
        // (no name, no iovecs, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let payload = (fds.len() * FD_BYTES) as libc::c_uint;
        // SAFETY: CMSG_SPACE is pure arithmetic.
        let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
        // u64 words keep the buffer aligned for cmsghdr (whose alignment is that of size_t). It
        // must live until sendmsg returns, hence declared out here even when unused.
        let mut control: Vec<u64> = if fds.is_empty() {
            Vec::new()
        } else {
            vec![0; space.div_ceil(size_of::<u64>())]
        };
        if !fds.is_empty() {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points at `space` zeroed, aligned bytes, at least one cmsghdr,
            // so CMSG_FIRSTHDR returns a non-null pointer into `control`.
            let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
            debug_assert!(!cmsg.is_null());
            // SAFETY: `cmsg` points at a cmsghdr inside `control`, followed by CMSG_LEN(payload)
            // - header bytes of room (CMSG_SPACE reserved them); each descriptor is written
            // unaligned within that room.
            unsafe {
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                for (i, fd) in fds.iter().enumerate() {
                    data.add(i).write_unaligned(fd.as_raw_fd());
                }
            }
        }
        loop {
            // SAFETY: `msg` points at `iov` (covering the live `bytes`) and at `control`, all of
            // which outlive the call; sendmsg only reads them.
            let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                if n as usize != bytes.len() {
                    return Err(os_err(
                        "send a whole message on",
                        "a SEQPACKET socket",
                        io::Error::new(io::ErrorKind::WriteZero, "short send"),
                    ));
                }
                return Ok(());
            }
            let source = io::Error::last_os_error();
            return Err(match source.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => ShmError::WouldBlock { op: "send" },
                Some(libc::EPIPE) | Some(libc::ECONNRESET) | Some(libc::ENOTCONN) => {
                    ShmError::PeerClosed { op: "send" }
                }
                _ => os_err("send a message on", "a SEQPACKET socket", source),
            });
        }
    }

    /// Receives one message into `buf`, with up to [`MAX_RECV_FDS`] descriptors. Descriptors
    /// are owned by the result from the start (close-on-exec), whatever the caller then decides;
    /// other control messages (credentials) are skipped. On a nonblocking socket with nothing
    /// queued, [`ShmError::WouldBlock`].
    ///
    /// The message is looked at first (MSG_PEEK), which installs copies of its descriptors:
    /// those our table cannot take the kernel releases while the queued message still holds
    /// them, so never the last reference. Then it is taken with no room for descriptors, and
    /// the kernel releases the originals inside that read while ours are held. A look that
    /// could not install them all (our table full: MSG_CTRUNC) leaves the message queued and
    /// reports it truncated (the caller drops the connection, which closes it whole:
    /// [`close_connection`]).
    pub fn recv(&self, buf: &mut [u8]) -> Result<Received> {
        let mut control = [0u64; RECV_CONTROL_LEN.div_ceil(size_of::<u64>())];
        let mut reset_seen = false;
        let look = libc::MSG_PEEK | libc::MSG_CMSG_CLOEXEC;
        let (n, mut fds, flags) = loop {
            match recv_with_fds(self.fd.as_fd(), buf, look, &mut control) {
                Ok((n, fds, flags, _)) => break (n, fds, flags),
                Err(source) => match source.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => return Err(ShmError::WouldBlock { op: "receive" }),
                    // The peer closed while our messages were still unread in its queue.
                    // Linux reports that reset once, before the messages the peer sent us last
                    // (a DISCONNECT and its reason): read on once, then it is the end of file.
                    Some(libc::ECONNRESET) if !reset_seen => {
                        reset_seen = true;
                        continue;
                    }
                    Some(libc::ECONNRESET) => {
                        return Ok(Received {
                            len: 0,
                            fds: PeerFds::default(),
                            truncated: false,
                        })
                    }
                    _ => return Err(os_err("receive a message on", "a SEQPACKET socket", source)),
                },
            }
        };
        let sender = self.sender;
        let cut = flags & libc::MSG_CTRUNC != 0;
        if !cut {
            if let Err(e) = take_peeked(self.fd.as_fd(), sender) {
                fds.into_iter().for_each(|f| dispose_from(f, sender));
                return Err(os_err("receive a message on", "a SEQPACKET socket", e));
            }
        }
        let mut truncated = cut || flags & libc::MSG_TRUNC != 0;
        // Past the bound (the buffer takes every descriptor a message can carry): disposed of
        // here, so the bound holds exactly.
        if fds.len() > MAX_RECV_FDS {
            fds.split_off(MAX_RECV_FDS)
                .into_iter()
                .for_each(|f| dispose_from(f, sender));
            truncated = true;
        }
        Ok(Received {
            len: n,
            fds: PeerFds::new(fds, sender),
            truncated,
        })
    }

    /// Makes `send`/`recv` return [`ShmError::WouldBlock`] instead of waiting.
    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        set_nonblocking_fd(self.fd.as_fd(), on, "a SEQPACKET socket")
    }

    /// The peer's pid, uid and gid, as the kernel recorded them at connect (SO_PEERCRED).
    pub fn peer_cred(&self) -> Result<PeerCred> {
        peer_cred(self.fd.as_fd())
    }
}

/// The pid, uid and gid of the peer of a connected AF_UNIX socket of any type, as the kernel
/// recorded them at connect (SO_PEERCRED).
pub fn peer_cred(fd: BorrowedFd<'_>) -> Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a live ucred and `len` its size; the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(os_err(
            "read the peer credentials of",
            "a socket",
            io::Error::last_os_error(),
        ));
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// One `recvmsg` on `fd` into `buf` with `flags`, taking every descriptor it carries (owned
/// from the start, whatever the caller then decides; other control messages are skipped):
/// the bytes received, the descriptors and the message flags.
/// Takes the message [`SeqpacketConn::recv`] looked at (the end of the stream takes nothing)
/// with no room for descriptors: a byte of room is enough, the rest of a SEQPACKET message goes
/// with it, and its descriptors are released while the look's copies hold them.
///
/// A peer that closes with our messages unread in its queue leaves a reset on our socket, which
/// the next receive reports before the messages still queued; when that close falls between the
/// look and this take, the take reports it and takes the message on its next try (without the
/// retry the message the look found, the peer's last, was lost: a DISCONNECT's reason, seen
/// under load by memif's fd-flood test).
fn take_peeked(fd: BorrowedFd<'_>, sender: Sender) -> io::Result<()> {
    let mut rest = [0u8; 1];
    let take = libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
    let mut reset_seen = false;
    loop {
        match recv_with_fds(fd, &mut rest, take, &mut []) {
            Ok((_, more, _, _)) => {
                // No room was given: nothing can have been installed.
                more.into_iter().for_each(|f| dispose_from(f, sender));
                return Ok(());
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) && !reset_seen => {
                reset_seen = true;
            }
            Err(e) => return Err(e),
        }
    }
}

fn recv_with_fds(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
    control: &mut [u64],
) -> io::Result<(usize, Vec<OwnedFd>, libc::c_int, bool)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(control) as _;
    // SAFETY: `iov` covers the live, writable `buf`; `control` is live, writable and aligned
    // for its whole length; the kernel writes within those bounds and updates `msg`.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    let mut stamped = false;
    // SAFETY: `msg` was filled by a successful recvmsg: msg_control/msg_controllen describe
    // the control data the kernel wrote into `control`, so CMSG_FIRSTHDR/NXTHDR stay inside it.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: `cmsg` is non-null and was returned by CMSG_FIRSTHDR/NXTHDR for this
        // kernel-written buffer, so it points at a complete cmsghdr inside `control`.
        let (level, kind, len) = unsafe {
            (
                (*cmsg).cmsg_level,
                (*cmsg).cmsg_type,
                (*cmsg).cmsg_len as usize,
            )
        };
        stamped |= level == libc::SOL_SOCKET && kind == libc::SCM_TIMESTAMP;
        if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN is pure arithmetic.
            let header = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = len.saturating_sub(header) / FD_BYTES;
            // SAFETY: CMSG_DATA of a kernel-written SCM_RIGHTS cmsghdr points at `count`
            // c_ints (cmsg_len = CMSG_LEN(count * 4)) inside `control`; read unaligned.
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<libc::c_int>();
            for i in 0..count {
                // SAFETY: i < count, so the read stays inside this cmsg's data (see above).
                let raw = unsafe { data.add(i).read_unaligned() };
                if raw >= 0 {
                    fds.push(owned(raw));
                }
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR; NXTHDR returns null past msg_controllen.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok((n as usize, fds, msg.msg_flags, stamped))
}

/// What [`peek_with_fds`] saw: how many bytes, the copies of the descriptors attached to them
/// (owned here), and whether the kernel cut descriptors off (MSG_CTRUNC: more than the room
/// asked for, or our descriptor table full), so that `fds` is not all there is.
#[derive(Debug)]
pub struct Peeked {
    pub len: usize,
    pub fds: Vec<OwnedFd>,
    pub cut: bool,
}

/// Up to `len` bytes at the head of stream socket `fd`'s queue and the descriptors attached to
/// them, up to `max`, without taking them (MSG_PEEK, never waiting: the kernel installs copies;
/// those it cannot are released, never the last reference, since the queue keeps its own). A
/// stream read ends after the first stretch of bytes that carries descriptors, so fewer than
/// `len` bytes while [`queued_bytes`] holds `len` or more means descriptors came with bytes
/// past that stretch. Nothing queued: nothing seen.
pub fn peek_with_fds(fd: BorrowedFd<'_>, len: usize, max: usize) -> Result<Peeked> {
    // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
    let room = unsafe { libc::CMSG_SPACE((max * FD_BYTES) as libc::c_uint) } as usize;
    let mut control = vec![0u64; room.div_ceil(size_of::<u64>())];
    let mut buf = vec![0u8; len.max(1)];
    let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
    loop {
        return match recv_with_fds(fd, &mut buf, flags, &mut control) {
            Ok((len, fds, got, _)) => Ok(Peeked {
                len,
                fds,
                cut: got & libc::MSG_CTRUNC != 0,
            }),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(Peeked {
                len: 0,
                fds: Vec::new(),
                cut: false,
            }),
            Err(e) => Err(os_err("peek at", "a socket", e)),
        };
    }
}

/// How many bytes wait in stream socket `fd`'s receive queue (FIONREAD).
pub fn queued_bytes(fd: BorrowedFd<'_>) -> Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, to the live local `n`.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n as *mut libc::c_int) };
    if rc < 0 {
        return Err(os_err(
            "count the bytes queued on",
            "a socket",
            io::Error::last_os_error(),
        ));
    }
    Ok(n.max(0) as usize)
}

impl AsFd for SeqpacketConn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<SeqpacketConn> for OwnedFd {
    fn from(c: SeqpacketConn) -> OwnedFd {
        let mut c = ManuallyDrop::new(c);
        // SAFETY: `c` is never dropped (ManuallyDrop), so its descriptor is taken once.
        unsafe { ManuallyDrop::take(&mut c.fd) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unix::returns_at_once;
    use crate::unix::{poll, unique, EventFd, PollFd};
    use crate::Region;
    use std::time::Duration;

    /// Dropping our end of a connection whose queue holds a socket the peer set SO_LINGER on
    /// (behind zero-length messages, which read like the end of the stream) returns at once:
    /// the connection goes whole to a closer thread, as its peer's (one descriptor waiting,
    /// not the queue's), and the peer sees the end at once. One that holds nothing is closed
    /// on the spot.
    #[test]
    fn a_dropped_connection_that_holds_messages_is_closed_elsewhere_whole() {
        let _serial = crate::unix::dispose::one_at_a_time();
        let me = crate::unix::Sender::uid(std::fs::metadata("/proc/self").map_or(0, |m| {
            use std::os::unix::fs::MetadataExt;
            m.uid()
        }));
        let (a, b) = SeqpacketConn::pair().unwrap();
        let (ours, theirs) = crate::unix::lingering_socket().unwrap();
        let ev = EventFd::new().unwrap();
        a.send(&[], &[]).unwrap();
        a.send(&[], &[ev.as_fd()]).unwrap();
        a.send(&[], &[]).unwrap();
        for _ in 0..3 {
            a.send(&[], &[ours.as_fd(), ev.as_fd()]).unwrap();
        }
        drop(ours); // the copies in `b`'s queue are the last
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(b);
            tx.send(()).unwrap();
        });
        let returned = rx.recv_timeout(Duration::from_secs(5)).is_ok();
        let waiting = crate::unix::closes_waiting_from(me);
        let mut buf = [0u8; 8];
        let end = a.recv(&mut buf).map(|r| r.is_eof());
        drop(theirs);
        assert!(returned, "the drop returned at once");
        assert_eq!(waiting, 1, "the connection waits to close, whole");
        assert!(matches!(end, Ok(true)), "the peer sees the end: {end:?}");
        assert!(matches!(
            a.send(b"x", &[]),
            Err(ShmError::PeerClosed { .. })
        ));
        assert!(crate::unix::closes_done_within(Duration::from_secs(5)));

        let (a, b) = SeqpacketConn::pair().unwrap();
        drop(b);
        assert_eq!(
            crate::unix::closer_threads(),
            0,
            "nothing queued: closed here"
        );
        assert!(matches!(a.recv(&mut buf).map(|r| r.is_eof()), Ok(true)));
    }

    /// Dropping a listener whose backlog holds a connection with a socket the peer set
    /// SO_LINGER on returns at once: the listener is shut (a later connect is refused) and
    /// the connection left in the backlog goes whole to a closer thread.
    #[test]
    fn a_dropped_listener_closes_its_backlog_elsewhere() {
        let _serial = crate::unix::dispose::one_at_a_time();
        let addr = temp_path("backlog");
        let l = SeqpacketListener::bind(&addr).unwrap();
        let c = SeqpacketConn::connect(&addr).unwrap();
        let (ours, theirs) = crate::unix::lingering_socket().unwrap();
        c.send(b"x", &[ours.as_fd()]).unwrap();
        drop(ours); // the copy in the backlog's queue is the last
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(l);
            tx.send(()).unwrap();
        });
        let returned = rx.recv_timeout(Duration::from_secs(5)).is_ok();
        let waiting = crate::unix::closes_waiting();
        drop(theirs);
        assert!(returned, "the drop returned at once");
        assert_eq!(waiting, 1, "the connection waits to close, whole");
        let mut buf = [0u8; 8];
        assert!(matches!(c.recv(&mut buf).map(|r| r.is_eof()), Ok(true)));
        if let SocketAddrSpec::Path(p) = &addr {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Every free slot of our descriptor table taken (files of /dev/null), until dropped.
    fn plug_the_table() -> Vec<std::fs::File> {
        std::iter::from_fn(|| std::fs::File::open("/dev/null").ok()).collect()
    }

    /// Whether the caller is the child [`alone`] started: the test's body runs there.
    const ENV_ALONE: &str = "MEMNIC_SHM_TEST_ALONE";

    /// Runs test `name` of this binary in a process of its own and asserts that it passed
    /// there; true in that child, where the caller goes on to run the test's body. For a test
    /// that takes the whole descriptor table, which would fail every test running beside it
    /// (a plain `cargo test` runs a crate's tests as threads of one process).
    fn alone(name: &str) -> bool {
        if std::env::var_os(ENV_ALONE).is_some() {
            return true;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1"])
            .env(ENV_ALONE, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("test result: ok. 1 passed"),
            "{name}, alone: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        false
    }

    /// Our table full when a message with a socket the peer set SO_LINGER on is received: the
    /// look installs no copy, the message is reported truncated and left queued (the kernel
    /// released nothing on this thread), and dropping the connection closes it whole
    /// elsewhere. A listener whose backlog holds such a message, dropped with our table full,
    /// goes whole to a closer too.
    #[test]
    fn at_a_full_table_nothing_a_peer_sent_is_released_here() {
        if !alone("unix::socket::tests::at_a_full_table_nothing_a_peer_sent_is_released_here") {
            return;
        }
        let (a, b) = SeqpacketConn::pair().unwrap();
        let (ours, theirs) = crate::unix::lingering_socket().unwrap();
        a.send(b"x", &[ours.as_fd()]).unwrap();
        drop(ours); // the copy in `b`'s queue is the last
        let addr = temp_path("full-table");
        let l = SeqpacketListener::bind(&addr).unwrap();
        let c = SeqpacketConn::connect(&addr).unwrap();
        let (ours2, theirs2) = crate::unix::lingering_socket().unwrap();
        c.send(b"y", &[ours2.as_fd()]).unwrap();
        drop(ours2);

        let plug = plug_the_table();
        let (tx, rx) = std::sync::mpsc::channel();
        let received = returns_at_once(move || {
            let mut buf = [0u8; 8];
            let r = b.recv(&mut buf).map(|r| (r.truncated, r.fds.len()));
            tx.send((r, b)).unwrap();
        });
        let dropped = returns_at_once(move || drop(l));
        drop(plug);
        let (got, b) = rx.recv().unwrap();
        let dropped_conn = returns_at_once(move || drop(b));
        let waiting = crate::unix::closes_waiting();
        drop((theirs, theirs2));
        assert!(received, "the receive returned at once");
        assert!(matches!(got, Ok((true, 0))), "{got:?}");
        assert!(dropped, "the listener's drop returned at once");
        assert!(dropped_conn, "the connection's drop returned at once");
        assert_eq!(
            waiting, 2,
            "the listener and the connection wait to close, whole"
        );
        drop((a, c));
        if let SocketAddrSpec::Path(p) = &addr {
            let _ = std::fs::remove_file(p);
        }
    }

    fn temp_path(tag: &str) -> SocketAddrSpec {
        SocketAddrSpec::Path(std::env::temp_dir().join(format!("{}.sock", unique(tag))))
    }

    #[test]
    fn round_trip_with_zero_one_and_two_fds() {
        let (a, b) = SeqpacketConn::pair().unwrap();
        let mut buf = [0u8; 128];

        // No descriptor.
        a.send(b"hello", &[]).unwrap();
        let r = b.recv(&mut buf).unwrap();
        assert_eq!((r.len, r.fds.len(), r.truncated), (5, 0, false));
        assert_eq!(&buf[..5], b"hello");

        // One: a memfd whose content the receiver sees through its own mapping.
        let region = Region::memfd("unix-test", 4096, false).unwrap();
        region.write_bytes(100, b"shared!").unwrap();
        a.send(b"region", &[region.fd().unwrap()]).unwrap();
        let mut r = b.recv(&mut buf).unwrap();
        assert_eq!((r.len, r.fds.len(), r.truncated), (6, 1, false));
        let mapped = Region::from_fd(r.fds.pop().unwrap(), 4096).unwrap();
        let mut out = [0u8; 7];
        mapped.read_bytes(100, &mut out).unwrap();
        assert_eq!(&out, b"shared!");
        mapped.write_bytes(200, b"back").unwrap();
        let mut out = [0u8; 4];
        region.read_bytes(200, &mut out).unwrap();
        assert_eq!(&out, b"back");

        // Two: the memfd and an eventfd, in order; a notify through the received eventfd wakes
        // the sender's.
        let ev = EventFd::new().unwrap();
        b.send(b"two", &[region.fd().unwrap(), ev.as_fd()]).unwrap();
        let mut r = a.recv(&mut buf).unwrap();
        assert_eq!((r.len, r.fds.len(), r.truncated), (3, 2, false));
        let ev2 = EventFd::from_fd(r.fds.pop().unwrap()).unwrap();
        let mem2 = Region::from_fd(r.fds.pop().unwrap(), 4096).unwrap();
        let mut out = [0u8; 7];
        mem2.read_bytes(100, &mut out).unwrap();
        assert_eq!(&out, b"shared!");
        ev2.notify().unwrap();
        assert!(ev.wait(Some(Duration::from_secs(5))).unwrap());
        assert_eq!(ev.drain().unwrap(), 1);
    }

    /// A peer that closes with our messages unread makes Linux report ECONNRESET once, ahead of
    /// what it sent us last: that last message (a DISCONNECT, say) is still received, then the
    /// end of file.
    #[test]
    fn the_last_message_of_a_peer_that_closed_with_ours_unread_is_received() {
        let (a, b) = SeqpacketConn::pair().unwrap();
        a.send(b"unread by b", &[]).unwrap();
        b.send(b"goodbye", &[]).unwrap();
        drop(b);
        let mut buf = [0u8; 64];
        let got = a.recv(&mut buf).unwrap();
        assert_eq!(&buf[..got.len], b"goodbye");
        assert!(a.recv(&mut buf).unwrap().is_eof());
    }

    /// The same when the peer closes between our look at its last message and our take of
    /// it: the take meets the reset and takes the message on its next try.
    #[test]
    fn a_reset_between_the_look_and_the_take_loses_no_message() {
        let (a, b) = SeqpacketConn::pair().unwrap();
        a.send(b"unread by b", &[]).unwrap();
        b.send(b"goodbye", &[]).unwrap();
        b.send(b"after", &[]).unwrap();
        let mut buf = [0u8; 64];
        let look = libc::MSG_PEEK | libc::MSG_CMSG_CLOEXEC;
        let (n, _, _, _) = recv_with_fds(a.as_fd(), &mut buf, look, &mut []).unwrap();
        assert_eq!(&buf[..n], b"goodbye");
        // b's close (on a closer thread: its queue holds our message) leaves the reset on `a`.
        drop(b);
        assert!(crate::unix::closes_done_within(Duration::from_secs(10)));
        take_peeked(a.as_fd(), a.sender()).unwrap();
        let got = a.recv(&mut buf).unwrap();
        assert_eq!(
            &buf[..got.len],
            b"after",
            "the look's message was taken, once"
        );
        assert!(a.recv(&mut buf).unwrap().is_eof());
    }

    #[test]
    fn received_fds_are_close_on_exec() {
        let (a, b) = SeqpacketConn::pair().unwrap();
        let ev = EventFd::new().unwrap();
        a.send(b"x", &[ev.as_fd()]).unwrap();
        let r = b.recv(&mut [0u8; 8]).unwrap();
        for fd in r
            .fds
            .iter()
            .map(|f| f.as_fd())
            .chain([a.as_fd(), ev.as_fd()])
        {
            // SAFETY: fcntl(F_GETFD) on a live borrowed descriptor; no memory arguments.
            let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
            assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        }
    }

    #[test]
    fn path_socket_listen_connect_accept() {
        let addr = temp_path("path");
        let listener = SeqpacketListener::bind(&addr).unwrap();
        let client = SeqpacketConn::connect(&addr).unwrap();
        let server = listener.accept().unwrap();
        client.send(&[7u8; 128], &[]).unwrap();
        let mut buf = [0u8; 256];
        let r = server.recv(&mut buf).unwrap();
        assert_eq!((r.len, r.truncated), (128, false));
        assert_eq!(server.peer_cred().unwrap().pid, std::process::id() as i32);
        assert_eq!(client.peer_cred().unwrap().pid, std::process::id() as i32);
        // Peer closes: end of file.
        drop(client);
        assert!(server.recv(&mut buf).unwrap().is_eof());
        // Sending to a closed peer is an error, not a SIGPIPE.
        let client2 = SeqpacketConn::connect(&addr).unwrap();
        drop(listener.accept().unwrap());
        assert!(matches!(
            client2.send(b"x", &[]),
            Err(ShmError::PeerClosed { .. })
        ));
        drop(listener);
        if let SocketAddrSpec::Path(p) = &addr {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn abstract_socket_listen_connect_accept() {
        let addr = SocketAddrSpec::memif(&format!("/run/{}.sock", unique("abs")), true);
        assert!(addr.to_string().starts_with("@/run/"));
        let listener = SeqpacketListener::bind(&addr).unwrap();
        // The same name is taken while the listener lives, and no file was created.
        assert!(matches!(
            SeqpacketListener::bind(&addr),
            Err(ShmError::AddrInUse { .. })
        ));
        let client = SeqpacketConn::connect(&addr).unwrap();
        let server = listener.accept().unwrap();
        server.send(b"from server", &[]).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(client.recv(&mut buf).unwrap().len, 11);
        drop((client, server, listener));
        // Abstract names vanish with their socket.
        assert!(matches!(
            SeqpacketConn::connect(&addr),
            Err(ShmError::NoListener { .. })
        ));
        SeqpacketListener::bind(&addr).unwrap();
    }

    #[test]
    fn connect_without_listener_and_stale_socket_file() {
        let addr = temp_path("stale");
        assert!(matches!(
            SeqpacketConn::connect(&addr),
            Err(ShmError::NoListener { .. })
        ));
        let listener = SeqpacketListener::bind(&addr).unwrap();
        // Live listener: not replaced.
        assert!(matches!(
            SeqpacketListener::bind_replacing_stale(&addr),
            Err(ShmError::AddrInUse { .. })
        ));
        drop(listener.accept()); // the liveness probe's connection
        drop(listener);
        // The file stays behind, as after a crash.
        assert!(matches!(
            SeqpacketListener::bind(&addr),
            Err(ShmError::AddrInUse { .. })
        ));
        assert!(matches!(
            SeqpacketConn::connect(&addr),
            Err(ShmError::NoListener { .. })
        ));
        let listener = SeqpacketListener::bind_replacing_stale(&addr).unwrap();
        let _c = SeqpacketConn::connect(&addr).unwrap();
        let _s = listener.accept().unwrap();
        if let SocketAddrSpec::Path(p) = &addr {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn a_non_socket_file_is_never_removed() {
        let path = std::env::temp_dir().join(unique("plain"));
        std::fs::write(&path, b"data").unwrap();
        let addr = SocketAddrSpec::Path(path.clone());
        assert!(SeqpacketListener::bind_replacing_stale(&addr).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"data");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn long_message_is_reported_truncated() {
        let (a, b) = SeqpacketConn::pair().unwrap();
        let msg: Vec<u8> = (0..200u8).collect();
        a.send(&msg, &[]).unwrap();
        a.send(b"next", &[]).unwrap();
        let mut buf = [0u8; 128];
        let r = b.recv(&mut buf).unwrap();
        assert!(r.truncated);
        assert_eq!(r.len, 128);
        assert_eq!(&buf[..], &msg[..128]);
        // The rest of the long message is gone; the next message arrives whole.
        let r = b.recv(&mut buf).unwrap();
        assert_eq!((r.len, r.truncated), (4, false));
        assert_eq!(&buf[..4], b"next");
    }

    #[test]
    fn nonblocking_recv_and_accept_would_block() {
        let (a, b) = SeqpacketConn::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        assert!(matches!(
            b.recv(&mut [0u8; 8]),
            Err(ShmError::WouldBlock { .. })
        ));
        a.send(b"1", &[]).unwrap();
        assert_eq!(b.recv(&mut [0u8; 8]).unwrap().len, 1);

        let addr = temp_path("nb");
        let l = SeqpacketListener::bind(&addr).unwrap();
        l.set_nonblocking(true).unwrap();
        assert!(matches!(l.accept(), Err(ShmError::WouldBlock { .. })));
        let _c = SeqpacketConn::connect(&addr).unwrap();
        let mut p = [PollFd::readable(l.as_fd())];
        assert_eq!(poll(&mut p, Some(Duration::from_secs(5))).unwrap(), 1);
        l.accept().unwrap();
        if let SocketAddrSpec::Path(p) = &addr {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn send_refuses_more_fds_than_linux_allows() {
        let (a, _b) = SeqpacketConn::pair().unwrap();
        let ev = EventFd::new().unwrap();
        let many = vec![ev.as_fd(); MAX_SEND_FDS + 1];
        assert!(matches!(
            a.send(b"x", &many),
            Err(ShmError::TooManyFds { .. })
        ));
    }
}
