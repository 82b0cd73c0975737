//! Closing descriptors a peer sent that we do not keep.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

use crate::Region;

/// Closes `fd`, a descriptor a peer sent us, without waiting on the peer. Closing a file of a
/// filesystem a process serves (FUSE) asks that process (FUSE_FLUSH) and waits for its answer,
/// which a hostile peer never gives, and a refused descriptor is closed on the thread that
/// refused it. What closes without asking a process is closed here and now (shared memory,
/// eventfds and other anonymous files, sockets, pipes, files on a mount our table names that
/// is not FUSE: [`closes_without_a_server`]); anything else goes to a thread that does nothing
/// but close such descriptors, one after another (one a peer stalls holds up those after it,
/// never the caller, and no descriptor of an honest peer waits behind it). Should that thread
/// not start, the descriptor is left open rather than closed here.
pub fn dispose(fd: OwnedFd) {
    if closes_without_a_server(fd.as_fd(), None) {
        drop(fd);
        return;
    }
    static CLOSER: OnceLock<Option<Mutex<Sender<OwnedFd>>>> = OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (tx, rx) = channel::<OwnedFd>();
        std::thread::Builder::new()
            .name("memnic-closer".into())
            .spawn(move || rx.into_iter().for_each(drop))
            .ok()
            .map(|_| Mutex::new(tx))
    });
    match closer {
        Some(tx) => {
            if let Err(e) = tx.lock().unwrap_or_else(|p| p.into_inner()).send(fd) {
                // The closer is gone: leave the descriptor open rather than block here.
                std::mem::forget(e.0);
            }
        }
        None => std::mem::forget(fd),
    }
}

/// Whether closing `fd`, a descriptor a peer sent, asks no process anything: it closes at
/// once (see [`dispose`]), or it is a file on a mount a table names and that is not FUSE
/// ([`Region::check_peer_file`], `peer_pid` as there).
pub fn closes_without_a_server(fd: BorrowedFd<'_>, peer_pid: Option<i32>) -> bool {
    closes_at_once(fd) || Region::check_peer_file(fd, peer_pid).is_ok()
}

/// Whether closing `fd` asks no process anything: shared memory (no flush), or what
/// `/proc/self/fd` names as an anonymous file, a socket or a pipe (asked of the kernel's own
/// record of the descriptor, not of its filesystem).
fn closes_at_once(fd: BorrowedFd<'_>) -> bool {
    if Region::is_shared_memory_fd(fd) {
        return true;
    }
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).is_ok_and(|l| {
        let name = l.as_os_str().as_bytes();
        [&b"anon_inode:"[..], b"socket:[", b"pipe:["]
            .iter()
            .any(|p| name.starts_with(p))
    })
}
