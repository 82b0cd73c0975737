//! Control-channel plumbing for memif: AF_UNIX `SOCK_SEQPACKET` sockets that carry file
//! descriptors (SCM_RIGHTS), eventfds, and a `poll` over several descriptors.
//!
//! * [`SocketAddrSpec`]: a filesystem path or a Linux abstract name (memif's
//!   `socket-abstract=yes`), turned into a `sockaddr_un` of exactly the length DPDK uses.
//! * [`SeqpacketListener`] / [`SeqpacketConn`]: bind, accept, connect, and message-at-a-time
//!   [`send`](SeqpacketConn::send) / [`recv`](SeqpacketConn::recv) with descriptors attached.
//! * [`EventFd`]: memif's per-ring interrupt line.
//! * [`poll`] with [`PollFd`]: wait for any of several descriptors, with a timeout.
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

use std::ffi::c_void;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Result, ShmError};

/// The most descriptors [`SeqpacketConn::recv`] accepts with one message; the kernel closes any
/// beyond this and the message is reported as truncated. memif sends at most one.
pub const MAX_RECV_FDS: usize = 8;

/// The most descriptors one message can carry on Linux (`SCM_MAX_FD`).
pub const MAX_SEND_FDS: usize = 253;

/// Bytes of `sun_path` in a `sockaddr_un` on Linux.
const SUN_PATH_LEN: usize = 108;

/// Listen backlog. DPDK uses 1; a few more let several clients (one per interface id) connect
/// to one socket at once without being refused.
const BACKLOG: libc::c_int = 16;

const FD_BYTES: usize = size_of::<libc::c_int>();

/// Control buffer for [`SeqpacketConn::recv`]: room for one SCM_RIGHTS message with
/// [`MAX_RECV_FDS`] descriptors plus one SCM_CREDENTIALS message (sent by the kernel when the
/// receiving socket has SO_PASSCRED, as DPDK's server sets).
// SAFETY: CMSG_SPACE is pure arithmetic on its argument (it touches no memory).
const RECV_CONTROL_LEN: usize = unsafe {
    libc::CMSG_SPACE((MAX_RECV_FDS * FD_BYTES) as libc::c_uint) as usize
        + libc::CMSG_SPACE(size_of::<libc::ucred>() as libc::c_uint) as usize
};

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

// ---------------------------------------------------------------------------------------------
// Addresses

/// Where a memif control socket lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SocketAddrSpec {
    /// A socket file, e.g. `/run/memif.sock` (memif's `socket-abstract=no`).
    Path(PathBuf),
    /// A Linux abstract name: `sun_path[0]` is NUL and these bytes follow, with no padding
    /// counted in the address length (memif's `socket-abstract=yes`; DPDK 22.11's default).
    Abstract(Vec<u8>),
}

impl SocketAddrSpec {
    /// The address memif devargs describe: `socket=NAME`, `socket-abstract=yes|no`.
    pub fn memif(socket: &str, is_abstract: bool) -> SocketAddrSpec {
        if is_abstract {
            SocketAddrSpec::Abstract(socket.as_bytes().to_vec())
        } else {
            SocketAddrSpec::Path(PathBuf::from(socket))
        }
    }

    /// The `sockaddr_un` and its length: `offsetof(sun_path) + strlen + 1` for a path,
    /// `offsetof(sun_path) + 1 + len` for an abstract name.
    fn to_raw(&self) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
        let bad = |reason| ShmError::BadSocketAddr {
            addr: self.to_string(),
            reason,
        };
        let mut raw = libc::sockaddr_un {
            sun_family: libc::AF_UNIX as libc::sa_family_t,
            sun_path: [0; SUN_PATH_LEN],
        };
        let base = offset_of!(libc::sockaddr_un, sun_path);
        let (start, bytes, len) = match self {
            SocketAddrSpec::Path(p) => {
                let b = p.as_os_str().as_bytes();
                if b.is_empty() {
                    return Err(bad("the path is empty"));
                }
                if b.len() >= SUN_PATH_LEN {
                    return Err(bad(
                        "the path is longer than the 107 bytes a socket path may have",
                    ));
                }
                (0, b, base + b.len() + 1)
            }
            SocketAddrSpec::Abstract(b) => {
                if b.is_empty() {
                    return Err(bad("the abstract name is empty"));
                }
                if b.len() >= SUN_PATH_LEN {
                    return Err(bad("the abstract name is longer than 107 bytes"));
                }
                (1, b.as_slice(), base + 1 + b.len())
            }
        };
        if bytes.contains(&0) {
            return Err(bad("the name contains a NUL byte"));
        }
        for (dst, &src) in raw.sun_path[start..].iter_mut().zip(bytes) {
            *dst = src as libc::c_char;
        }
        Ok((raw, len as libc::socklen_t))
    }
}

impl fmt::Display for SocketAddrSpec {
    /// A path as is; an abstract name as `@name`, the way `ss -x` shows it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SocketAddrSpec::Path(p) => write!(f, "{}", p.display()),
            SocketAddrSpec::Abstract(b) => write!(f, "@{}", String::from_utf8_lossy(b)),
        }
    }
}

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
    fd: OwnedFd,
    addr: SocketAddrSpec,
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
            fd,
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
                return Ok(SeqpacketConn { fd: owned(raw) });
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
    /// Descriptors that came with the message, already owned: dropping them closes them.
    pub fds: Vec<OwnedFd>,
    /// The kernel cut the message (MSG_TRUNC: longer than the buffer) or its descriptors
    /// (MSG_CTRUNC), or more than [`MAX_RECV_FDS`] descriptors came (the surplus is already
    /// closed).
    /// A truncated message must be rejected.
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
    fd: OwnedFd,
}

impl SeqpacketConn {
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
                return Ok(SeqpacketConn { fd });
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
            SeqpacketConn { fd: owned(raw[0]) },
            SeqpacketConn { fd: owned(raw[1]) },
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
    pub fn recv(&self, buf: &mut [u8]) -> Result<Received> {
        let mut control = [0u64; RECV_CONTROL_LEN.div_ceil(size_of::<u64>())];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain data; all-zero is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = RECV_CONTROL_LEN as _;
        let n = loop {
            // SAFETY: `iov` covers the live, writable `buf`; `control` has RECV_CONTROL_LEN
            // writable, aligned bytes; the kernel writes within those bounds and updates `msg`.
            let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if n >= 0 {
                break n as usize;
            }
            let source = io::Error::last_os_error();
            match source.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Err(ShmError::WouldBlock { op: "receive" }),
                // A reset connection is the peer going away: report it as end of file.
                Some(libc::ECONNRESET) => {
                    return Ok(Received {
                        len: 0,
                        fds: Vec::new(),
                        truncated: false,
                    })
                }
                _ => return Err(os_err("receive a message on", "a SEQPACKET socket", source)),
            }
        };
        // Take ownership of every descriptor before looking at anything else.
        let mut fds = Vec::new();
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
        let mut truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
        // The buffer's room for credentials can fit a few descriptors more than the bound when
        // no credentials come: close the surplus here, so the bound holds exactly.
        if fds.len() > MAX_RECV_FDS {
            fds.truncate(MAX_RECV_FDS);
            truncated = true;
        }
        Ok(Received {
            len: n,
            fds,
            truncated,
        })
    }

    /// Makes `send`/`recv` return [`ShmError::WouldBlock`] instead of waiting.
    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        set_nonblocking_fd(self.fd.as_fd(), on, "a SEQPACKET socket")
    }

    /// The peer's pid, uid and gid, as the kernel recorded them at connect (SO_PEERCRED).
    pub fn peer_cred(&self) -> Result<PeerCred> {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred` is a live ucred and `len` its size; the kernel writes at most `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(os_err(
                "read the peer credentials of",
                "a SEQPACKET socket",
                io::Error::last_os_error(),
            ));
        }
        Ok(PeerCred {
            pid: cred.pid,
            uid: cred.uid,
            gid: cred.gid,
        })
    }
}

impl AsFd for SeqpacketConn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<SeqpacketConn> for OwnedFd {
    fn from(c: SeqpacketConn) -> OwnedFd {
        c.fd
    }
}

// ---------------------------------------------------------------------------------------------
// eventfd

/// An eventfd: a counter a peer increments ([`notify`](Self::notify)) to wake a waiter
/// ([`wait`](Self::wait)), who then resets it ([`drain`](Self::drain)). Always nonblocking.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new eventfd with count 0 (`EFD_NONBLOCK | EFD_CLOEXEC`).
    pub fn new() -> Result<EventFd> {
        // SAFETY: eventfd() has no memory arguments; the result is checked.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(os_err("create", "an eventfd", io::Error::last_os_error()));
        }
        Ok(EventFd { fd: owned(raw) })
    }

    /// Adopts a descriptor received from a peer. It must be an eventfd
    /// ([`ShmError::NotEventFd`] otherwise: a pipe or socket could block a reader forever); if
    /// the peer created it blocking, O_NONBLOCK is set on it (this flag is shared with the peer's
    /// copy; DPDK and VPP create theirs nonblocking anyway).
    pub fn from_fd(fd: OwnedFd) -> Result<EventFd> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|source| os_err("inspect", "a received descriptor", source))?;
        if link.as_os_str().as_bytes() != b"anon_inode:[eventfd]" {
            return Err(ShmError::NotEventFd {
                kind: link.display().to_string(),
            });
        }
        if !is_nonblocking(fd.as_fd()) {
            set_nonblocking_fd(fd.as_fd(), true, "a received eventfd")?;
        }
        Ok(EventFd { fd })
    }

    /// Adds 1 to the counter, waking a waiter. A counter already at its maximum (the waiter has
    /// not drained in 2^64 - 2 notifications) stays there: the wake-up is pending anyway.
    pub fn notify(&self) -> Result<()> {
        let one: u64 = 1;
        loop {
            // SAFETY: writes the 8 bytes of the live local `one`; an eventfd takes 8-byte writes.
            let n = unsafe {
                libc::write(
                    self.fd.as_raw_fd(),
                    (&one as *const u64).cast(),
                    size_of::<u64>(),
                )
            };
            if n == size_of::<u64>() as isize {
                return Ok(());
            }
            let source = io::Error::last_os_error();
            match source.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(()),
                _ => return Err(os_err("notify", "an eventfd", source)),
            }
        }
    }

    /// Reads and resets the counter: the number of notifications since the last drain (0 if none).
    pub fn drain(&self) -> Result<u64> {
        let mut count: u64 = 0;
        loop {
            // SAFETY: reads at most 8 bytes into the live local `count`.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    (&mut count as *mut u64).cast(),
                    size_of::<u64>(),
                )
            };
            if n == size_of::<u64>() as isize {
                return Ok(count);
            }
            let source = io::Error::last_os_error();
            match source.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(0),
                _ => return Err(os_err("drain", "an eventfd", source)),
            }
        }
    }

    /// Waits until the counter is non-zero or `timeout` passes (`None`: no limit). Returns
    /// whether it was notified; the counter is left for [`drain`](Self::drain).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        let mut p = [PollFd::readable(self.fd.as_fd())];
        poll(&mut p, timeout)?;
        Ok(p[0].ready().readable)
    }

    /// A second descriptor for the same eventfd (`F_DUPFD_CLOEXEC`).
    pub fn try_clone(&self) -> Result<EventFd> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|source| os_err("duplicate", "an eventfd", source))?;
        Ok(EventFd { fd })
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<EventFd> for OwnedFd {
    fn from(e: EventFd) -> OwnedFd {
        e.fd
    }
}

impl TryFrom<OwnedFd> for EventFd {
    type Error = ShmError;
    fn try_from(fd: OwnedFd) -> Result<EventFd> {
        EventFd::from_fd(fd)
    }
}

// ---------------------------------------------------------------------------------------------
// poll

/// What [`poll`] reported for one descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ready {
    /// Data (or end of file, or a connection to accept) can be read without blocking.
    pub readable: bool,
    pub writable: bool,
    /// The peer hung up (POLLHUP or POLLRDHUP); reads drain what is left, then see end of file.
    pub hangup: bool,
    /// An error is pending on the descriptor (POLLERR).
    pub error: bool,
    /// The descriptor is not open (POLLNVAL).
    pub invalid: bool,
}

impl Ready {
    /// Whether anything at all was reported.
    pub fn any(&self) -> bool {
        self.readable || self.writable || self.hangup || self.error || self.invalid
    }
}

/// One entry of a [`poll`] set: a borrowed descriptor and the events of interest.
#[repr(transparent)]
#[derive(Debug)]
pub struct PollFd<'fd> {
    raw: libc::pollfd,
    _fd: PhantomData<BorrowedFd<'fd>>,
}

impl<'fd> PollFd<'fd> {
    fn new(fd: BorrowedFd<'fd>, events: libc::c_short) -> PollFd<'fd> {
        PollFd {
            raw: libc::pollfd {
                fd: fd.as_raw_fd(),
                events,
                revents: 0,
            },
            _fd: PhantomData,
        }
    }

    /// Wait until `fd` is readable (a message, end of file, a client to accept, a notification).
    pub fn readable(fd: BorrowedFd<'fd>) -> PollFd<'fd> {
        PollFd::new(fd, libc::POLLIN | libc::POLLRDHUP)
    }

    /// Wait until `fd` is writable.
    pub fn writable(fd: BorrowedFd<'fd>) -> PollFd<'fd> {
        PollFd::new(fd, libc::POLLOUT)
    }

    /// What the last [`poll`] reported for this descriptor.
    pub fn ready(&self) -> Ready {
        let r = self.raw.revents;
        Ready {
            readable: r & libc::POLLIN != 0,
            writable: r & libc::POLLOUT != 0,
            hangup: r & (libc::POLLHUP | libc::POLLRDHUP) != 0,
            error: r & libc::POLLERR != 0,
            invalid: r & libc::POLLNVAL != 0,
        }
    }
}

/// Milliseconds for poll(): rounded up, so a short timeout never becomes a busy loop.
fn timeout_ms(t: Duration) -> libc::c_int {
    t.as_nanos()
        .div_ceil(1_000_000)
        .min(libc::c_int::MAX as u128) as libc::c_int
}

/// Waits until at least one descriptor in `fds` is ready or `timeout` passes (`None`: no limit;
/// `Some(ZERO)`: just look). Returns how many are ready (0 on timeout); read each entry's
/// [`PollFd::ready`]. Interrupted waits resume with the time left.
pub fn poll(fds: &mut [PollFd<'_>], timeout: Option<Duration>) -> Result<usize> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        for p in fds.iter_mut() {
            p.raw.revents = 0;
        }
        let ms = match deadline {
            None => -1,
            Some(d) => timeout_ms(d.saturating_duration_since(Instant::now())),
        };
        // SAFETY: PollFd is repr(transparent) over libc::pollfd, so `fds` is a live array of
        // fds.len() pollfds; the kernel writes only their revents. The descriptors are borrowed
        // for the lifetime of the entries, so they are open (a closed one would only give POLLNVAL).
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr().cast::<libc::pollfd>(),
                fds.len() as libc::nfds_t,
                ms,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let source = io::Error::last_os_error();
        if source.raw_os_error() != Some(libc::EINTR) {
            return Err(os_err("poll", format!("{} descriptors", fds.len()), source));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Region;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn unique(tag: &str) -> String {
        // Relaxed: only uniqueness of the counter value matters, no other memory is published.
        static N: AtomicUsize = AtomicUsize::new(0);
        format!(
            "memnic-shm-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
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
    fn abstract_address_length_counts_no_padding() {
        let (raw, len) = SocketAddrSpec::Abstract(b"/run/memif.sock".to_vec())
            .to_raw()
            .unwrap();
        assert_eq!(len as usize, 2 + 1 + 15);
        assert_eq!(raw.sun_path[0], 0);
        assert_eq!(raw.sun_path[1] as u8, b'/');
        let (_, len) = SocketAddrSpec::Path("/run/memif.sock".into())
            .to_raw()
            .unwrap();
        assert_eq!(len as usize, 2 + 15 + 1);
    }

    #[test]
    fn bad_addresses_are_refused() {
        for addr in [
            SocketAddrSpec::Path(PathBuf::from("/tmp/".to_string() + &"x".repeat(120))),
            SocketAddrSpec::Path(PathBuf::new()),
            SocketAddrSpec::Abstract(Vec::new()),
            SocketAddrSpec::Abstract(vec![b'a'; 108]),
            SocketAddrSpec::Abstract(b"a\0b".to_vec()),
        ] {
            assert!(
                matches!(
                    SeqpacketListener::bind(&addr),
                    Err(ShmError::BadSocketAddr { .. })
                ),
                "{addr:?}"
            );
        }
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
    fn eventfd_notify_wait_drain() {
        let ev = EventFd::new().unwrap();
        assert_eq!(ev.drain().unwrap(), 0);
        assert!(!ev.wait(Some(Duration::from_millis(10))).unwrap());
        ev.notify().unwrap();
        ev.notify().unwrap();
        assert!(ev.wait(Some(Duration::ZERO)).unwrap());
        // Waiting does not consume.
        assert!(ev.wait(None).unwrap());
        assert_eq!(ev.drain().unwrap(), 2);
        assert_eq!(ev.drain().unwrap(), 0);
        assert!(!ev.wait(Some(Duration::ZERO)).unwrap());

        // Another thread's notify wakes a blocked wait.
        let other = ev.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            other.notify().unwrap();
        });
        assert!(ev.wait(Some(Duration::from_secs(10))).unwrap());
        t.join().unwrap();
        assert_eq!(ev.drain().unwrap(), 1);
    }

    #[test]
    fn from_fd_accepts_only_eventfds_and_makes_them_nonblocking() {
        let region = Region::memfd("not-an-eventfd", 4096, false).unwrap();
        let fd = region.fd().unwrap().try_clone_to_owned().unwrap();
        assert!(matches!(
            EventFd::from_fd(fd),
            Err(ShmError::NotEventFd { .. })
        ));
        let (a, _b) = SeqpacketConn::pair().unwrap();
        assert!(matches!(
            EventFd::try_from(OwnedFd::from(a)),
            Err(ShmError::NotEventFd { .. })
        ));

        // A blocking eventfd from a careless peer: adopted as nonblocking, so drain never hangs.
        // SAFETY: eventfd() has no memory arguments; the result is checked below.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(raw >= 0);
        let ev = EventFd::from_fd(owned(raw)).unwrap();
        assert!(is_nonblocking(ev.as_fd()));
        assert_eq!(ev.drain().unwrap(), 0);
    }

    #[test]
    fn readiness_of_eventfd_and_hangup_of_socket() {
        let (a, b) = SeqpacketConn::pair().unwrap();
        let ev = EventFd::new().unwrap();
        {
            let mut set = [PollFd::readable(b.as_fd()), PollFd::readable(ev.as_fd())];
            assert_eq!(poll(&mut set, Some(Duration::from_millis(5))).unwrap(), 0);
            assert!(!set[0].ready().any() && !set[1].ready().any());
            ev.notify().unwrap();
            assert_eq!(poll(&mut set, Some(Duration::from_secs(5))).unwrap(), 1);
            assert!(!set[0].ready().readable);
            assert!(set[1].ready().readable);
        }
        drop(a);
        let mut set = [PollFd::readable(b.as_fd())];
        assert_eq!(poll(&mut set, None).unwrap(), 1);
        assert!(set[0].ready().hangup);
        assert!(b.recv(&mut [0u8; 8]).unwrap().is_eof());
        assert_eq!(timeout_ms(Duration::from_micros(1)), 1);
        assert_eq!(timeout_ms(Duration::from_secs(u64::MAX)), libc::c_int::MAX);
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
