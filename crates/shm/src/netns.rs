//! Network namespaces for the calling thread: how tests put TAP interfaces (and the sockets
//! that talk through them) somewhere other than the machine's own network.
//!
//! Both calls move only the calling thread (Linux namespaces are per thread); sockets and TAP
//! queues it opens there keep working from any thread, and child processes it starts inherit
//! its namespace. Both need CAP_SYS_ADMIN.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::{Result, ShmError};

/// Moves the calling thread into a new, empty network namespace (only a loopback interface,
/// down). The namespace goes away with the last thread, process or socket in it.
pub fn unshare() -> Result<()> {
    // SAFETY: unshare() has no memory arguments; CLONE_NEWNET changes only this thread's view.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(ShmError::Io {
            op: "create",
            what: "a network namespace".into(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Turns IPv6 off in the calling thread's namespace, for interfaces made from now on and those
/// already there (`/proc/sys/net` shows the namespace of the thread that opens it). An
/// interface brought up with IPv6 on sends router solicitations and MLD reports by itself, at
/// times of the kernel's choosing; a test that expects silence needs it off.
pub fn disable_ipv6() -> Result<()> {
    for knob in ["default", "all"] {
        let path = format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6");
        std::fs::write(&path, "1").map_err(|source| ShmError::Io {
            op: "write",
            what: path,
            source,
        })?;
    }
    Ok(())
}

/// Moves the calling thread into the network namespace at `path` (`/run/netns/NAME`, as
/// `ip netns add` makes them, or `/proc/PID/ns/net`).
pub fn enter(path: &Path) -> Result<()> {
    let what = || format!("network namespace {}", path.display());
    let f = File::open(path).map_err(|source| ShmError::Io {
        op: "open",
        what: what(),
        source,
    })?;
    // SAFETY: setns() on a live descriptor borrowed for the call; no memory arguments. The
    // kernel refuses a descriptor that is not a network namespace (CLONE_NEWNET).
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(ShmError::Io {
            op: "enter",
            what: what(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn my_netns() -> std::path::PathBuf {
        std::fs::read_link("/proc/thread-self/ns/net").unwrap()
    }

    #[test]
    fn a_thread_leaves_and_reenters_namespaces() {
        let outer = my_netns();
        let o = outer.clone();
        std::thread::spawn(move || {
            let outer = o;
            let home = File::open("/proc/thread-self/ns/net").unwrap();
            unshare().unwrap();
            assert_ne!(my_netns(), outer);
            enter(Path::new(&format!("/proc/self/fd/{}", home.as_raw_fd()))).unwrap();
            assert_eq!(my_netns(), outer);
            assert!(enter(Path::new("/proc/self/ns/mnt")).is_err());
            assert!(enter(Path::new("/nonexistent/ns")).is_err());
        })
        .join()
        .unwrap();
        // The test's own thread never moved.
        assert_eq!(my_netns(), outer);
    }
}
