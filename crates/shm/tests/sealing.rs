//! Seals: what we create cannot be shrunk, and what we receive reports whether it can.

mod common;

use std::io::Write;
use std::os::fd::AsFd;

use common::{dup, peer_memfd, seals, truncate};
use memnic_shm::Region;

#[test]
fn own_memfd_cannot_be_shrunk_by_anyone_holding_its_fd() {
    let r = Region::memfd("sealed", 1 << 16, false).unwrap();
    let fd = r.fd().unwrap();
    assert_ne!(
        seals(fd).unwrap() & libc::F_SEAL_SHRINK,
        0,
        "F_SEAL_SHRINK is set"
    );
    // What a peer would do with the fd we pass it:
    let peer = dup(fd);
    let err = truncate(peer.as_fd(), 4096).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    let err = truncate(peer.as_fd(), 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    // Nor can it add seals of its own (F_SEAL_SEAL closes the set).
    assert_ne!(
        seals(fd).unwrap() & libc::F_SEAL_SEAL,
        0,
        "F_SEAL_SEAL is set"
    );
    // SAFETY: fcntl(F_ADD_SEALS) on a live descriptor; no memory arguments.
    let rc = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&peer),
            libc::F_ADD_SEALS,
            libc::F_SEAL_FUTURE_WRITE,
        )
    };
    assert_eq!(rc, -1, "a peer cannot add F_SEAL_FUTURE_WRITE");
    // Growing stays possible, and a mapping of the new size works.
    truncate(peer.as_fd(), 1 << 17).unwrap();
    let bigger = Region::from_fd(dup(peer.as_fd()), 1 << 17).unwrap();
    assert!(bigger.is_shrink_sealed());
    assert_eq!(std::fs::File::from(peer).metadata().unwrap().len(), 1 << 17);
    assert!(r.is_shrink_sealed());
    assert!(
        !r.is_peer_controlled(),
        "sealed memory needs no SIGBUS protection"
    );
    assert!(!r.peer_faulted());
}

#[test]
fn own_hugepage_memfd_is_sealed_or_protected() {
    // With hugepages reserved this is a hugetlb memfd (sealable since Linux 4.16); without, it
    // falls back to normal pages. Either way a peer holding the fd cannot crash us.
    let r = Region::memfd("huge-sealed", 1 << 20, true).unwrap();
    let err = truncate(r.fd().unwrap(), 0).err();
    if r.is_shrink_sealed() {
        assert_eq!(err.map(|e| e.raw_os_error()), Some(Some(libc::EPERM)));
        assert!(!r.is_peer_controlled());
    } else {
        assert!(r.is_huge(), "only hugetlb memfds may come unsealed");
        assert!(
            r.is_peer_controlled(),
            "an unsealed memfd is protected instead"
        );
    }
}

#[test]
fn received_fds_report_their_seals() {
    // Our own sealed memfd, received back.
    let own = Region::memfd("own", 8192, false).unwrap();
    let back = Region::from_fd(dup(own.fd().unwrap()), 8192).unwrap();
    assert!(back.is_shrink_sealed());
    assert!(!back.is_peer_controlled());

    // A peer's memfd that cannot be sealed at all (DPDK's unsealed EAL memory).
    let r = Region::from_fd(peer_memfd(8192, false), 8192).unwrap();
    assert!(!r.is_shrink_sealed());
    assert!(r.is_peer_controlled());

    // A sealable memfd the peer did not seal, and one it sealed against shrinking.
    let open = peer_memfd(8192, true);
    let r = Region::from_fd(dup(open.as_fd()), 8192).unwrap();
    assert!(!r.is_shrink_sealed());
    assert!(r.is_peer_controlled());
    // SAFETY: fcntl(F_ADD_SEALS) on a live descriptor; no memory arguments.
    let rc = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&open),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )
    };
    assert_eq!(rc, 0);
    let r = Region::from_fd(open, 8192).unwrap();
    assert!(r.is_shrink_sealed());
    assert!(!r.is_peer_controlled());

    // A file that cannot carry seals (F_GET_SEALS gives EINVAL): no seals, not an error.
    let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("memnic-shm-seals-{}", std::process::id()));
    let mut f = std::fs::File::create_new(&path).unwrap();
    f.write_all(&[7u8; 8192]).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    if let Err(e) = seals(f.as_fd()) {
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    }
    let r = Region::from_fd(f.into(), 8192).unwrap();
    assert!(!r.is_shrink_sealed());
    assert!(r.is_peer_controlled());
    let mut b = [0u8; 4];
    r.read_bytes(8188, &mut b).unwrap();
    assert_eq!(b, [7; 4]);
}
