//! Helpers shared by this crate's integration tests: memfds made the way a peer makes them,
//! truncation from the peer's side, and child processes for tests that may die of a signal.

#![allow(dead_code)] // each test binary uses its own subset

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

/// A memfd of `len` bytes created with libc directly, as a peer (DPDK's EAL, a hostile
/// client) would: `sealable` adds MFD_ALLOW_SEALING but no seal.
pub fn peer_memfd(len: usize, sealable: bool) -> OwnedFd {
    let name = CString::new("peer").unwrap();
    let flags = libc::MFD_CLOEXEC | if sealable { libc::MFD_ALLOW_SEALING } else { 0 };
    // SAFETY: memfd_create takes a valid NUL-terminated name; the result is checked.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    assert!(
        raw >= 0,
        "memfd_create: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: raw is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    truncate(fd_ref(&fd), len as i64).unwrap();
    fd
}

fn fd_ref(fd: &OwnedFd) -> BorrowedFd<'_> {
    use std::os::fd::AsFd;
    fd.as_fd()
}

/// `ftruncate(fd, len)`, as the peer does it.
pub fn truncate(fd: BorrowedFd<'_>, len: i64) -> std::io::Result<()> {
    // SAFETY: ftruncate on a live borrowed descriptor; no memory arguments.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The seals of `fd` (F_GET_SEALS), or the error.
pub fn seals(fd: BorrowedFd<'_>) -> std::io::Result<i32> {
    // SAFETY: fcntl(F_GET_SEALS) on a live borrowed descriptor; no memory arguments.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if r >= 0 {
        Ok(r)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A fresh `dup` of `fd`, as a peer's descriptor arrives over SCM_RIGHTS.
pub fn dup(fd: BorrowedFd<'_>) -> OwnedFd {
    fd.try_clone_to_owned().unwrap()
}

const CHILD_ENV: &str = "MEMNIC_SHM_TEST_CHILD";

/// Runs `body` in a child process: the test binary runs itself with only the test `name`
/// selected and an environment variable set, so the same `#[test]` function, seeing the
/// variable, runs `body` there (and only there); the parent gets the child's output and is the
/// only one that asserts on it. No child entry point appears as a test of its own.
///
/// Returns `None` in the child (after `body` returned), `Some(output)` in the parent.
pub fn in_child(name: &str, body: impl FnOnce()) -> Option<Output> {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        no_core_dumps();
        body();
        println!("CHILD-DONE");
        return None;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .output()
        .unwrap();
    Some(out)
}

/// The child's stdout and stderr, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status {:?} (signal {:?})\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        out.status.signal(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether the child printed `marker` as a line of its own (or at the end of libtest's
/// unterminated "test NAME ... " line).
pub fn stdout_has(out: &Output, marker: &str) -> bool {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim_end().ends_with(marker))
}

/// Asserts that the child ran its body to the end and exited normally.
pub fn assert_survived(out: &Output) {
    assert!(
        out.status.success() && stdout_has(out, "CHILD-DONE"),
        "the child should have survived: {}",
        describe(out)
    );
}

/// A child that dies of a signal must not leave a core file (core_pattern may be "core").
fn no_core_dumps() {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the live local `zero`.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) };
}
