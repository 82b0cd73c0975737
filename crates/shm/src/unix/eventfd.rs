//! eventfd: memif's per-ring interrupt line.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use super::{is_nonblocking, os_err, owned, poll, set_nonblocking_fd, PollFd};
use crate::{Result, ShmError};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unix::SeqpacketConn;
    use crate::Region;

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
}
