//! eventfd: memif's per-ring interrupt line.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use super::{is_nonblocking, os_err, owned, poll, set_nonblocking_fd, PollFd};
use crate::{Result, ShmError};

/// How long [`EventFd::unjam`] keeps reading a jammed counter at most, and how long it reads
/// only zeros before it stops early.
pub const UNJAM_SPIN: Duration = Duration::from_millis(5);
pub const UNJAM_QUIET: Duration = Duration::from_micros(50);

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

    /// Adopts a descriptor received from a peer. It must be an eventfd ([`Self::is_eventfd`];
    /// [`ShmError::NotEventFd`] otherwise, and the descriptor is disposed of as an unknown
    /// sender's: a pipe or socket could block a reader forever); if the peer created it
    /// blocking, O_NONBLOCK is set on it (this flag is shared with the peer's copy; DPDK and
    /// VPP create theirs nonblocking anyway).
    pub fn from_fd(fd: OwnedFd) -> Result<EventFd> {
        if !Self::is_eventfd(fd.as_fd()) {
            let kind = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .map_or_else(|e| format!("unknown ({e})"), |l| l.display().to_string());
            // Closed elsewhere: a file on FUSE would make this close wait for its server.
            super::dispose(fd);
            return Err(ShmError::NotEventFd { kind });
        }
        if !is_nonblocking(fd.as_fd()) {
            set_nonblocking_fd(fd.as_fd(), true, "a received eventfd")?;
        }
        Ok(EventFd { fd })
    }

    /// Whether `fd` is an eventfd (what `/proc/self/fd` names it). A caller that disposes of a
    /// refused descriptor as its sender's looks before it hands one to [`Self::from_fd`].
    pub fn is_eventfd(fd: BorrowedFd<'_>) -> bool {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .is_ok_and(|l| l.as_os_str().as_bytes() == b"anon_inode:[eventfd]")
    }

    /// Adds 1 to the counter, waking a waiter. A counter already at its maximum (the waiter has
    /// not drained in 2^64 - 2 notifications) stays there: the wake-up is pending anyway.
    ///
    /// A received eventfd's O_NONBLOCK is shared with the peer, which can clear it and then
    /// fill the counter, and an eventfd write has no nonblocking flag of its own (`pwritev2`'s
    /// RWF_NOWAIT is refused), so this looks first (`poll`, no wait) and writes only while the
    /// counter has room: a peer must then fill it in the moment between the look and the
    /// write to block us, and the write stays blocked until someone reads the counter: the
    /// control path of a port looks for full lines and [`unjam`](Self::unjam)s them.
    pub fn notify(&self) -> Result<()> {
        if self.is_full()? {
            return Ok(());
        }
        #[cfg(feature = "fault-injection")]
        fault::between_look_and_write(self);
        match self.write(1) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(()),
            r => r.map_err(|source| os_err("notify", "an eventfd", source)),
        }
    }

    /// Reads and resets the counter: the number of notifications since the last drain (0 if
    /// none). Never blocks, even on a descriptor whose peer cleared O_NONBLOCK (see
    /// [`notify`](Self::notify)): the read asks for RWF_NOWAIT (`preadv2`); a kernel that
    /// refuses it for eventfds (before 5.12) gets a look (`poll`, no wait) before a plain read.
    pub fn drain(&self) -> Result<u64> {
        let mut count: u64 = 0;
        let mut nowait = true;
        loop {
            let iov = libc::iovec {
                iov_base: (&mut count as *mut u64).cast(),
                iov_len: size_of::<u64>(),
            };
            let n = if nowait {
                // SAFETY: one iovec over the live local `count` (8 bytes); offset -1 reads at
                // the descriptor's position, as read() does.
                unsafe { libc::preadv2(self.fd.as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) }
            } else {
                let mut p = [PollFd::readable(self.fd.as_fd())];
                poll(&mut p, Some(Duration::ZERO))?;
                if !p[0].ready().readable {
                    return Ok(0);
                }
                // SAFETY: reads at most 8 bytes into the live local `count`.
                unsafe { libc::read(self.fd.as_raw_fd(), iov.iov_base, size_of::<u64>()) }
            };
            if n == size_of::<u64>() as isize {
                return Ok(count);
            }
            let source = io::Error::last_os_error();
            match source.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(0),
                Some(libc::EOPNOTSUPP | libc::EINVAL) if nowait => nowait = false,
                _ => return Err(os_err("drain", "an eventfd", source)),
            }
        }
    }

    /// Whether the counter is full, so that a write of 1 would block (or fail, nonblocking).
    /// An honest peer never lets 2^64 - 2 notifications pile up; a full counter is a peer
    /// jamming the line.
    pub fn is_full(&self) -> Result<bool> {
        let mut p = [PollFd::writable(self.fd.as_fd())];
        poll(&mut p, Some(Duration::ZERO))?;
        Ok(!p[0].ready().writable)
    }

    /// Empties a full counter (see [`is_full`](Self::is_full)); returns whether it found one.
    /// This is how a thread stuck in [`notify`](Self::notify) gets out: a peer that cleared
    /// O_NONBLOCK and filled the counter between `notify`'s look and its write leaves that
    /// write blocked until someone reads the counter, and the kernel then lets it add its 1.
    /// A peer that refills the counter the moment it is read would win the woken write's
    /// race every time against a single read, so the counter is read over and over, for
    /// [`UNJAM_SPIN`] or until it stays empty for [`UNJAM_QUIET`] (no one refills): against a
    /// refiller it is then empty about half of the time, when the woken write gets through
    /// (whoever unjams looks again later). A counter with room is left alone, so an honest
    /// peer's pending wake-up is never taken.
    pub fn unjam(&self) -> Result<bool> {
        if !self.is_full()? {
            return Ok(false);
        }
        let start = std::time::Instant::now();
        let mut quiet_since = start;
        loop {
            let now = std::time::Instant::now();
            if self.drain()? != 0 {
                quiet_since = now;
            } else if now - quiet_since >= UNJAM_QUIET {
                // Nothing written for a while: no one refills, and a woken write got in
                // (or there was none).
                break;
            }
            if now - start >= UNJAM_SPIN {
                break;
            }
        }
        Ok(true)
    }

    /// Waits until the counter is non-zero or `timeout` passes (`None`: no limit). Returns
    /// whether it was notified; the counter is left for [`drain`](Self::drain).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        let mut p = [PollFd::readable(self.fd.as_fd())];
        poll(&mut p, timeout)?;
        Ok(p[0].ready().readable)
    }

    /// What a hostile peer does to its copy of the descriptor, for tests: clears O_NONBLOCK
    /// on the open file description (shared with every copy, ours included) and fills the
    /// counter to the top. A [`notify`](Self::notify) then writes nothing; one that had
    /// looked just before would block until the counter is read ([`unjam`](Self::unjam)).
    pub fn jam(&self) -> Result<()> {
        set_nonblocking_fd(self.fd.as_fd(), false, "an eventfd")?;
        self.drain()?;
        self.write(u64::MAX - 1)
            .map_err(|source| os_err("fill", "an eventfd", source))
    }

    /// Fault injection, for tests (feature `fault-injection`): the next
    /// [`notify`](Self::notify) of this eventfd's counter in this process, through any
    /// descriptor of it (a peer's copy received over a socket included), runs `f` after its
    /// look and before its write: the moment in which a hostile peer [`jam`](Self::jam)ming
    /// the counter leaves that write blocked, which no timing can hit on purpose.
    #[cfg(feature = "fault-injection")]
    pub fn before_next_notify_write(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let id = fault::eventfd_id(self.fd.as_fd()).ok_or_else(|| {
            os_err(
                "read the id of",
                "an eventfd",
                io::Error::other("no eventfd-id in /proc/self/fdinfo"),
            )
        })?;
        fault::arm(id, Box::new(f));
        Ok(())
    }

    /// A plain write of 1 on a thread of its own, which blocks while the counter is full and
    /// O_NONBLOCK is clear: the write of a [`notify`](Self::notify) whose look came just
    /// before a peer [`jam`](Self::jam)med the counter, on the lcore it would hold. For tests.
    pub fn notify_blocking_elsewhere(&self) -> Result<BlockedNotify> {
        let ours = self.try_clone()?;
        let (tx, done) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let _ = ours.write(1);
            let _ = tx.send(());
        });
        Ok(BlockedNotify {
            done,
            thread: Some(thread),
        })
    }

    /// Adds `v` to the counter (a write; it waits for room unless O_NONBLOCK is set).
    fn write(&self, v: u64) -> io::Result<()> {
        loop {
            // SAFETY: writes the 8 bytes of the live local `v`; an eventfd takes 8-byte writes.
            let n = unsafe {
                libc::write(
                    self.fd.as_raw_fd(),
                    (&v as *const u64).cast(),
                    size_of::<u64>(),
                )
            };
            if n == size_of::<u64>() as isize {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
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

/// What [`EventFd::before_next_notify_write`] arms: actions keyed by the eventfd's id (one
/// counter, whichever descriptor of it is used), each run once.
#[cfg(feature = "fault-injection")]
mod fault {
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Mutex;

    type Action = Box<dyn FnOnce() + Send>;

    /// Whether anything is armed: a notify with nothing armed reads no fdinfo. SeqCst: test
    /// plumbing, off any hot path that matters.
    static ARMED: AtomicBool = AtomicBool::new(false);
    static PENDING: Mutex<Vec<(u64, Action)>> = Mutex::new(Vec::new());

    /// The counter's id (`eventfd-id` in `/proc/self/fdinfo`), the same through every
    /// descriptor of one eventfd.
    pub(super) fn eventfd_id(fd: BorrowedFd<'_>) -> Option<u64> {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("eventfd-id:"))
            .and_then(|v| v.trim().parse().ok())
    }

    pub(super) fn arm(id: u64, f: Action) {
        let mut p = PENDING.lock().unwrap_or_else(|p| p.into_inner());
        p.push((id, f));
        ARMED.store(true, SeqCst);
    }

    /// Runs (outside the lock) the action armed for `ev`'s counter, if any.
    pub(super) fn between_look_and_write(ev: &super::EventFd) {
        if !ARMED.load(SeqCst) {
            return;
        }
        let Some(id) = eventfd_id(ev.fd.as_fd()) else {
            return;
        };
        let action = {
            let mut p = PENDING.lock().unwrap_or_else(|p| p.into_inner());
            let i = p.iter().position(|(armed, _)| *armed == id);
            let action = i.map(|i| p.swap_remove(i).1);
            ARMED.store(!p.is_empty(), SeqCst);
            action
        };
        if let Some(f) = action {
            f();
        }
    }
}

/// A write started by [`EventFd::notify_blocking_elsewhere`].
pub struct BlockedNotify {
    done: std::sync::mpsc::Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BlockedNotify {
    /// Whether the write has returned, waiting for it up to `t`.
    pub fn returned_within(&self, t: Duration) -> bool {
        self.done.recv_timeout(t).is_ok()
    }
}

impl Drop for BlockedNotify {
    fn drop(&mut self) {
        // A write still blocked (a failing test) is left to its thread.
        if let Some(t) = self.thread.take().filter(|t| t.is_finished()) {
            let _ = t.join();
        }
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

    /// A peer that clears O_NONBLOCK on the description we share and fills the counter
    /// (`jam`): an empty counter's drain and a full counter's notify return at once (each
    /// would block on a plain read or write), and the counter is as the peer left it, or
    /// drained.
    #[test]
    fn a_peer_that_makes_the_eventfd_blocking_cannot_block_notify_or_drain() {
        let ev = EventFd::new().unwrap();
        let peer = ev.try_clone().unwrap();
        set_nonblocking_fd(peer.as_fd(), false, "the test's eventfd").unwrap();
        assert!(!is_nonblocking(ev.as_fd()), "the flag is shared");
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            tx.send(ev.drain().unwrap()).unwrap();
            peer.jam().unwrap();
            assert!(ev.is_full().unwrap());
            ev.notify().unwrap();
            tx.send(ev.drain().unwrap()).unwrap();
            tx.send(ev.drain().unwrap()).unwrap();
        });
        let within = |what| {
            rx.recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("{what} blocked"))
        };
        assert_eq!(within("a drain of an empty counter"), 0);
        assert_eq!(within("a notify of a full counter"), u64::MAX - 1);
        assert_eq!(within("a drain after it"), 0);
        t.join().unwrap();
    }

    /// The race `notify` cannot close: a write already blocked on a full counter
    /// (`notify_blocking_elsewhere` stands in for a `notify` whose look came just before the
    /// peer filled it). `unjam` releases it; a counter with room (an honest peer's pending
    /// wake-ups) is left as it is.
    #[test]
    fn unjam_releases_a_write_blocked_on_a_full_counter_and_leaves_room_alone() {
        let ev = EventFd::new().unwrap();
        ev.notify().unwrap();
        ev.notify().unwrap();
        assert!(!ev.is_full().unwrap());
        assert!(!ev.unjam().unwrap());
        assert_eq!(ev.drain().unwrap(), 2, "an honest counter is not taken");

        ev.try_clone().unwrap().jam().unwrap();
        assert!(ev.is_full().unwrap());
        let write = ev.notify_blocking_elsewhere().unwrap();
        assert!(
            !write.returned_within(Duration::from_millis(200)),
            "the write is blocked on the full counter"
        );
        let started = std::time::Instant::now();
        while !write.returned_within(Duration::ZERO) {
            ev.unjam().unwrap();
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "unjam did not release the blocked write"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!ev.is_full().unwrap());
        // The released write's 1, unless the unjam read it.
        assert!(ev.drain().unwrap() <= 1);
    }

    /// A peer that, once our write sleeps on its full counter, sets O_NONBLOCK again (the
    /// sleeping write never looks at it) and refills the counter the moment it is read: a
    /// single read per unjam lost that race for good in 2 runs of 5 (a review's program);
    /// `unjam`'s reads over `UNJAM_SPIN` get the write through, looked at as often as a
    /// port's control path does (every 50 ms).
    #[test]
    fn unjam_wins_against_a_peer_that_refills_at_once() {
        let ev = EventFd::new().unwrap();
        let peer = ev.try_clone().unwrap();
        peer.jam().unwrap();
        let write = ev.notify_blocking_elsewhere().unwrap();
        assert!(
            !write.returned_within(Duration::from_millis(100)),
            "blocked"
        );
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt = stop.clone();
        let (spinning, refiller_up) = std::sync::mpsc::channel();
        let refiller = std::thread::spawn(move || {
            set_nonblocking_fd(peer.as_fd(), true, "the test's eventfd").unwrap();
            spinning.send(()).unwrap();
            let mut refills = 0u64;
            while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                refills += u64::from(peer.write(u64::MAX - 1).is_ok());
            }
            refills
        });
        refiller_up.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let started = std::time::Instant::now();
        let mut looks = 0;
        let released = loop {
            if write.returned_within(Duration::ZERO) {
                break true;
            }
            if started.elapsed() > Duration::from_secs(20) {
                break false;
            }
            looks += 1;
            ev.unjam().unwrap();
            std::thread::sleep(Duration::from_millis(50));
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let refills = refiller.join().unwrap();
        if !released {
            // Let the blocked thread go before failing (the refiller has stopped).
            ev.drain().unwrap();
            write.returned_within(Duration::from_secs(5));
        }
        // (The write may get in at the first unjam, before a refill ever wins: `refills` can
        // be 0 in a run that passes.)
        assert!(
            released,
            "still blocked after {looks} unjams ({refills} refills)"
        );
    }
}
