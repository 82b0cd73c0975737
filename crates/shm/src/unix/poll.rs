//! `poll(2)` over borrowed descriptors, with a timeout that survives interruption.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use super::os_err;
use crate::Result;

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
    use crate::unix::{EventFd, SeqpacketConn};
    use std::os::fd::AsFd;

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
}
