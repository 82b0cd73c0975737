//! Descriptor accounting for `SeqpacketConn::recv` against a peer that attaches too many
//! descriptors. One test in its own binary: it counts the entries of /proc/self/fd, which other
//! tests running in parallel threads would disturb.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use memnic_shm::unix::{EventFd, SeqpacketConn, MAX_RECV_FDS};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn set_passcred(fd: BorrowedFd<'_>) {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads the live local `on`, whose size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
}

#[test]
fn surplus_and_rejected_descriptors_never_leak() {
    let (a, b) = SeqpacketConn::pair().unwrap();
    let evs: Vec<EventFd> = (0..20).map(|_| EventFd::new().unwrap()).collect();
    let all: Vec<BorrowedFd<'_>> = evs.iter().map(|e| e.as_fd()).collect();
    let before = open_fds();
    let mut buf = [0u8; 128];

    for _round in 0..50 {
        // More descriptors than recv accepts: the first MAX_RECV_FDS arrive owned, recv
        // disposes of the rest, and the message is flagged.
        a.send(&[1u8; 128], &all[..10]).unwrap();
        let r = b.recv(&mut buf).unwrap();
        assert_eq!(r.len, 128);
        assert!(r.truncated, "10 descriptors must be reported as cut");
        assert_eq!(r.fds.len(), MAX_RECV_FDS);
        assert_eq!(open_fds(), before + MAX_RECV_FDS);
        drop(r); // the caller rejects the message
        assert_eq!(open_fds(), before);

        // More again: recv's control buffer takes every descriptor a message can carry, and
        // disposes of the surplus over the bound.
        a.send(&[1u8; 128], &all).unwrap();
        let r = b.recv(&mut buf).unwrap();
        assert!(r.truncated);
        assert_eq!(r.fds.len(), MAX_RECV_FDS);
        drop(r);
        assert_eq!(open_fds(), before);

        // Exactly the maximum is fine.
        a.send(&[2u8; 128], &all[..MAX_RECV_FDS]).unwrap();
        let r = b.recv(&mut buf).unwrap();
        assert!(!r.truncated);
        assert_eq!(r.fds.len(), MAX_RECV_FDS);
        drop(r);

        // A message too long for the buffer, with a descriptor: flagged, descriptor still owned.
        a.send(&[3u8; 200], &all[..1]).unwrap();
        let r = b.recv(&mut buf).unwrap();
        assert!(r.truncated);
        assert_eq!(r.fds.len(), 1);
        drop(r);

        // A descriptor the protocol did not expect (memif: on HELLO): owned, dropped, closed.
        a.send(&[4u8; 128], &all[..1]).unwrap();
        let r = b.recv(&mut buf).unwrap();
        assert_eq!(r.fds.len(), 1);
        drop(r);
        assert_eq!(open_fds(), before);
    }

    // With SO_PASSCRED (as DPDK's server sets) the kernel adds a credentials message; it is
    // skipped and the descriptors still all arrive.
    set_passcred(b.as_fd());
    a.send(&[5u8; 128], &all[..MAX_RECV_FDS]).unwrap();
    let r = b.recv(&mut buf).unwrap();
    assert!(!r.truncated);
    assert_eq!(r.fds.len(), MAX_RECV_FDS);
    drop(r);
    a.send(&[6u8; 128], &all).unwrap();
    let r = b.recv(&mut buf).unwrap();
    assert!(r.truncated);
    assert!(r.fds.len() <= MAX_RECV_FDS);
    drop(r);
    assert_eq!(open_fds(), before);

    // Queued messages with descriptors that are never read are released with the sockets (the
    // one that still held a message on a closer thread, so a moment later).
    a.send(&[7u8; 128], &all[..3]).unwrap();
    drop((a, b));
    let since = std::time::Instant::now();
    while open_fds() != before - 2 && since.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(open_fds(), before - 2);
}
