//! Linux TAP interfaces: the system-call side of the `net_tap` driver.
//!
//! * [`Tap`]: one queue of a multi-queue TAP interface, a nonblocking descriptor of
//!   `/dev/net/tun` attached with `TUNSETIFF` (`IFF_TAP | IFF_NO_PI | IFF_MULTI_QUEUE`). Every
//!   queue of an interface is a `Tap` of its own, opened with the same name. Frames are read and
//!   written whole, one per call; "nothing to read now" is [`io::ErrorKind::WouldBlock`].
//! * [`mac`], [`set_mac`], [`flags`], [`set_up`]: the interface's Ethernet address and
//!   up/running state, by name, through `SIOCGIF*` / `SIOCSIF*` on a socket of this thread's
//!   network namespace (an interface moved to another namespace is not found here).
//!
//! What the kernel does at the edges (Linux 6.x): a read into a buffer shorter than the frame
//! returns the buffer's length and drops the rest, so a reader offers more room than the longest
//! frame it accepts and treats a full buffer as too long; a write to an interface that is down
//! fails with `EIO`, a frame shorter than an Ethernet header with `EINVAL`.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use crate::unix::{poll, PollFd};
use crate::{Result, ShmError};

/// Longest interface name, without its terminating NUL (`IFNAMSIZ - 1`).
pub const MAX_NAME_LEN: usize = libc::IFNAMSIZ - 1;

/// The link flags of an interface that matter to a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfFlags {
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// Up with its carrier on, as the kernel sees it (`IFF_RUNNING`).
    pub running: bool,
}

/// One queue of a TAP interface.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Attaches a new queue to TAP interface `name`, creating the interface if this network
    /// namespace has none by that name. A name with `%d` (`dtap%d`) lets the kernel pick the
    /// first free number; [`Tap::name`] says which. The descriptor is nonblocking and
    /// close-on-exec; the interface goes away with its last queue unless it is persistent.
    pub fn open(name: &str) -> Result<Tap> {
        let mut req = ifreq(name)?;
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_MULTI_QUEUE) as _;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/net/tun")
            .map_err(|source| ShmError::TunDevice { source })?;
        ioctl_ifreq(file.as_fd(), libc::TUNSETIFF, &mut req).map_err(|e| {
            let name = name.to_string();
            match e.raw_os_error() {
                Some(libc::EINVAL) => ShmError::NotMultiQueueTap { name },
                Some(libc::EBUSY) => ShmError::InterfaceBusy { name },
                Some(libc::EPERM) => ShmError::InterfaceNotPermitted { name },
                _ => os_err("create or attach to TAP interface", name, e),
            }
        })?;
        // The kernel wrote back the name it chose (or ours); it never exceeds IFNAMSIZ.
        Ok(Tap {
            name: name_of(&req),
            file,
        })
    }

    /// The interface's name (the kernel's choice when the name given had `%d`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads one frame into `buf`: its length, or `WouldBlock` when none is queued. A frame
    /// longer than `buf` is cut to `buf.len()` (see the module docs).
    #[inline]
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Reads one frame across `bufs`, in order (`readv`); as [`Tap::read`].
    #[inline]
    pub fn read_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        (&self.file).read_vectored(bufs)
    }

    /// Writes one whole frame: its length, `WouldBlock` when the kernel has no room now, `EIO`
    /// while the interface is down, `EINVAL` for a frame shorter than an Ethernet header.
    #[inline]
    pub fn write(&self, frame: &[u8]) -> io::Result<usize> {
        (&self.file).write(frame)
    }

    /// Waits until a frame can be read or `timeout` passes (`None`: no limit); whether one can.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> Result<bool> {
        let mut p = [PollFd::readable(self.file.as_fd())];
        poll(&mut p, timeout)?;
        Ok(p[0].ready().readable)
    }

    /// Whether this queue still has its interface (`TUNGETIFF` succeeds): false once the
    /// interface has been deleted.
    pub fn is_alive(&self) -> bool {
        match ifreq(&self.name) {
            Ok(mut req) => ioctl_ifreq(self.file.as_fd(), libc::TUNGETIFF, &mut req).is_ok(),
            Err(_) => false,
        }
    }

    /// Makes the interface outlive its queues (`TUNSETPERSIST`), or not.
    pub fn set_persist(&self, on: bool) -> Result<()> {
        // SAFETY: TUNSETPERSIST takes its argument by value (no memory is passed) on a live
        // descriptor borrowed for the call.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETPERSIST,
                libc::c_ulong::from(on),
            )
        };
        if rc < 0 {
            return Err(os_err(
                "set persistence of TAP interface",
                &self.name,
                io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Takes this queue out of the interface's set (`TUNSETQUEUE` with `IFF_DETACH_QUEUE`): the
    /// kernel sends it no frames until [`Tap::attach`]. A detached queue still keeps the
    /// interface alive (and can still write).
    pub fn detach(&self) -> Result<()> {
        self.set_queue(libc::IFF_DETACH_QUEUE, "detach a queue of")
    }

    /// Puts a detached queue back into the interface's set; works wherever the interface is
    /// now (the queue knows its interface, not its name).
    pub fn attach(&self) -> Result<()> {
        self.set_queue(libc::IFF_ATTACH_QUEUE, "attach a queue to")
    }

    fn set_queue(&self, flag: libc::c_int, op: &'static str) -> Result<()> {
        let mut req = ifreq(&self.name)?;
        req.ifr_ifru.ifru_flags = flag as _;
        ioctl_ifreq(self.file.as_fd(), libc::TUNSETQUEUE, &mut req)
            .map_err(|e| os_err(op, &self.name, e))
    }
}

/// What a failed [`Tap::read`] or [`Tap::write`] means for the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Nothing to read, or no room to write, now (`EAGAIN`).
    WouldBlock,
    /// The interface is down (`EIO` on a write).
    Down,
    /// The queue has no interface any more: it was deleted (`EBADFD`).
    Gone,
    /// Anything else, such as a frame the kernel refuses (`EINVAL`).
    Other,
}

impl Failure {
    pub fn of(e: &io::Error) -> Failure {
        match e.raw_os_error() {
            Some(libc::EAGAIN) => Failure::WouldBlock,
            Some(libc::EIO) => Failure::Down,
            Some(libc::EBADFD) => Failure::Gone,
            _ => Failure::Other,
        }
    }
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// The Ethernet address of interface `name`.
pub fn mac(name: &str) -> Result<[u8; 6]> {
    let mut req = ifreq(name)?;
    control(name, libc::SIOCGIFHWADDR, &mut req, "read the address of")?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member; a sockaddr is plain integers, so any
    // bytes the kernel left there are a valid value.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    if hw.sa_family != libc::ARPHRD_ETHER {
        return Err(ShmError::NotEthernet {
            name: name.to_string(),
            family: hw.sa_family,
        });
    }
    let mut m = [0u8; 6];
    for (d, s) in m.iter_mut().zip(hw.sa_data) {
        *d = s as u8;
    }
    Ok(m)
}

/// Sets the Ethernet address of interface `name`.
pub fn set_mac(name: &str, mac: [u8; 6]) -> Result<()> {
    let mut req = ifreq(name)?;
    let mut hw = libc::sockaddr {
        sa_family: libc::ARPHRD_ETHER,
        sa_data: [0; 14],
    };
    for (d, s) in hw.sa_data.iter_mut().zip(mac) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_hwaddr = hw;
    control(name, libc::SIOCSIFHWADDR, &mut req, "set the address of")
}

/// Whether interface `name` is up and running.
pub fn flags(name: &str) -> Result<IfFlags> {
    let mut req = ifreq(name)?;
    control(name, libc::SIOCGIFFLAGS, &mut req, "read the flags of")?;
    // SAFETY: SIOCGIFFLAGS filled the flags member, a plain integer.
    let f = libc::c_int::from(unsafe { req.ifr_ifru.ifru_flags }) & 0xffff;
    Ok(IfFlags {
        up: f & libc::IFF_UP != 0,
        running: f & libc::IFF_RUNNING != 0,
    })
}

/// Brings interface `name` up (`IFF_UP`), keeping its other flags.
pub fn set_up(name: &str) -> Result<()> {
    let mut req = ifreq(name)?;
    control(name, libc::SIOCGIFFLAGS, &mut req, "read the flags of")?;
    // SAFETY: SIOCGIFFLAGS filled the flags member, a plain integer.
    let f = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = f | libc::IFF_UP as libc::c_short;
    control(name, libc::SIOCSIFFLAGS, &mut req, "bring up")
}

/// An interface request on a socket of this thread's network namespace; no such interface is
/// [`ShmError::NoSuchInterface`].
fn control(
    name: &str,
    request: libc::c_ulong,
    req: &mut libc::ifreq,
    op: &'static str,
) -> Result<()> {
    // Any socket reaches the interface ioctls; an AF_UNIX one needs no network protocol.
    let sock = UnixDatagram::unbound().map_err(|e| os_err("create a socket to", name, e))?;
    ioctl_ifreq(sock.as_fd(), request, req).map_err(|e| match e.raw_os_error() {
        Some(libc::ENODEV) => ShmError::NoSuchInterface {
            name: name.to_string(),
        },
        _ => os_err(op, name, e),
    })
}

/// A zeroed request naming interface `name` (1 to [`MAX_NAME_LEN`] bytes, no NUL).
fn ifreq(name: &str) -> Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_NAME_LEN || bytes.contains(&0) {
        return Err(ShmError::BadInterfaceName {
            name: name.to_string(),
        });
    }
    // SAFETY: ifreq is plain data (byte arrays, integers, and a raw pointer in a union), for
    // which all-zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

/// The name in a request the kernel filled (NUL-terminated within IFNAMSIZ).
fn name_of(req: &libc::ifreq) -> String {
    let bytes: Vec<u8> = req
        .ifr_name
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn ioctl_ifreq(
    fd: BorrowedFd<'_>,
    request: libc::c_ulong,
    req: &mut libc::ifreq,
) -> io::Result<()> {
    // SAFETY: `req` is a live ifreq borrowed exclusively for the call, and every request passed
    // here (TUNSETIFF, TUNSETQUEUE, SIOCGIF*, SIOCSIF*) reads and writes at most one ifreq at
    // that address; the descriptor is borrowed, so it stays open during the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, req as *mut libc::ifreq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn os_err(op: &'static str, name: impl Into<String>, source: io::Error) -> ShmError {
    ShmError::Io {
        op,
        what: format!("interface {}", name.into()),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns;
    use std::net::UdpSocket;
    use std::process::Command;

    /// Runs `f` on a thread in a network namespace of its own (gone when the thread ends),
    /// with IPv6 off: the kernel then queues nothing on an interface unasked.
    fn in_new_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                netns::unshare().expect("a new network namespace (needs root)");
                netns::disable_ipv6().unwrap();
                f()
            })
            .join()
            .expect("the namespace thread panicked")
        })
    }

    /// `ip ARGS` in the calling thread's network namespace (a child inherits it).
    fn ip(args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("run ip");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn wait_running(name: &str) {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while !flags(name).unwrap().running {
            assert!(std::time::Instant::now() < end, "{name} never ran");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn queues_share_one_interface_named_by_the_kernel() {
        in_new_netns(|| {
            let a = Tap::open("mq%d").unwrap();
            assert_eq!(a.name(), "mq0");
            let b = Tap::open("mq0").unwrap();
            assert_eq!(b.name(), "mq0");
            assert_eq!(Tap::open("mq%d").unwrap().name(), "mq1");
            assert_eq!(
                flags("mq0").unwrap(),
                IfFlags {
                    up: false,
                    running: false
                }
            );
            set_up("mq0").unwrap();
            assert!(flags("mq0").unwrap().up);
            wait_running("mq0");
            // Nothing queued: a distinct WouldBlock, and poll times out.
            let mut buf = [0u8; 64];
            assert_eq!(
                a.read(&mut buf).unwrap_err().kind(),
                io::ErrorKind::WouldBlock
            );
            assert!(!a.wait_readable(Some(Duration::from_millis(10))).unwrap());
            assert_eq!(
                Failure::of(&a.read(&mut buf).unwrap_err()),
                Failure::WouldBlock
            );
            // A detached queue keeps the interface; attaching twice is refused.
            b.detach().unwrap();
            assert!(b.detach().is_err());
            b.attach().unwrap();
            assert!(b.attach().is_err());
            // The last queue closed: the interface is gone.
            drop((a, b));
            assert!(matches!(
                flags("mq0"),
                Err(ShmError::NoSuchInterface { .. })
            ));
        });
    }

    #[test]
    fn mac_reads_back_what_was_set() {
        in_new_netns(|| {
            let t = Tap::open("m%d").unwrap();
            let first = mac(t.name()).unwrap();
            assert_eq!(first[0] & 1, 0, "a unicast address: {first:02x?}");
            let want = [0x02, 0x64, 0x74, 0x61, 0x70, 0x30];
            set_mac(t.name(), want).unwrap();
            assert_eq!(mac(t.name()).unwrap(), want);
        });
    }

    #[test]
    fn bad_names_and_foreign_interfaces_are_refused() {
        for bad in ["", "sixteen-chars-xx", "a\0b"] {
            assert!(
                matches!(Tap::open(bad), Err(ShmError::BadInterfaceName { .. })),
                "{bad:?}"
            );
        }
        in_new_netns(|| {
            // lo exists and is no TAP: the kernel refuses to attach, and lo is untouched.
            assert!(matches!(
                Tap::open("lo"),
                Err(ShmError::NotMultiQueueTap { .. })
            ));
            assert!(matches!(
                flags("nope0"),
                Err(ShmError::NoSuchInterface { .. })
            ));
        });
    }

    #[test]
    fn frames_cross_between_the_queue_and_the_kernel() {
        in_new_netns(|| {
            let t = Tap::open("io%d").unwrap();
            let name = t.name().to_string();
            set_up(&name).unwrap();
            wait_running(&name);
            ip(&["addr", "add", "10.9.0.1/24", "dev", &name]);
            ip(&[
                "neigh",
                "add",
                "10.9.0.2",
                "lladdr",
                "02:00:00:00:00:02",
                "dev",
                &name,
            ]);
            // The kernel sends a UDP datagram out of the interface: we read it whole, or cut
            // to a short buffer (the rest is gone).
            let udp = UdpSocket::bind("10.9.0.1:0").unwrap();
            let ipv4_udp = |f: &[u8]| f.len() >= 42 && f[12..14] == [8, 0] && f[23] == 17;
            let read_udp = |buf: &mut [u8]| loop {
                assert!(t.wait_readable(Some(Duration::from_secs(10))).unwrap());
                let n = t.read(buf).unwrap();
                if ipv4_udp(&buf[..n]) {
                    return n;
                }
            };
            udp.send_to(&[7u8; 100], "10.9.0.2:9").unwrap();
            let mut buf = [0u8; 2048];
            let n = read_udp(&mut buf);
            assert_eq!(n, 14 + 20 + 8 + 100);
            assert_eq!(&buf[..6], &[2, 0, 0, 0, 0, 2]);
            assert_eq!(&buf[42..n], &[7u8; 100]);
            udp.send_to(&[7u8; 100], "10.9.0.2:9").unwrap();
            let mut short = [0u8; 60];
            assert_eq!(read_udp(&mut short), 60);

            // A frame we write is the kernel's: a UDP datagram to its own address arrives.
            let rx = UdpSocket::bind("10.9.0.1:4000").unwrap();
            let frame = udp_frame(mac(&name).unwrap(), b"hello");
            assert_eq!(t.write(&frame).unwrap(), frame.len());
            rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = [0u8; 16];
            assert_eq!(rx.recv(&mut got).unwrap(), 5);
            assert_eq!(&got[..5], b"hello");
            // A runt is refused; nothing passes an interface that is down.
            assert_eq!(
                Failure::of(&t.write(&frame[..10]).unwrap_err()),
                Failure::Other
            );
            ip(&["link", "set", &name, "down"]);
            assert_eq!(Failure::of(&t.write(&frame).unwrap_err()), Failure::Down);
            // Deleted under us: the queue says so, and reads and writes fail as Gone.
            assert!(t.is_alive());
            ip(&["link", "del", &name]);
            assert!(!t.is_alive());
            assert_eq!(Failure::of(&t.read(&mut buf).unwrap_err()), Failure::Gone);
            assert_eq!(Failure::of(&t.write(&frame).unwrap_err()), Failure::Gone);
        });
    }

    /// Ethernet/IPv4/UDP from 10.9.0.2:4001 to 10.9.0.1:4000 (no UDP checksum).
    fn udp_frame(dst: [u8; 6], payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&dst);
        f.extend_from_slice(&[2, 0, 0, 0, 0, 2, 8, 0]);
        let total = (20 + 8 + payload.len()) as u16;
        let mut ip = [
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 9, 0, 2, 10, 9, 0, 1,
        ];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        let sum = ip
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum::<u32>();
        let sum = (sum & 0xffff) + (sum >> 16);
        ip[10..12].copy_from_slice(&(!((sum & 0xffff) + (sum >> 16)) as u16).to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&4001u16.to_be_bytes());
        f.extend_from_slice(&4000u16.to_be_bytes());
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }
}
