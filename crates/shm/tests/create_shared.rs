//! `Region::create_shared` on a path someone else may have prepared: a planted symbolic link,
//! a file of another user, a file open to others. Each is refused with a sentence naming the
//! path; nothing is created, resized or written through it.
//!
//! These tests use only the API that predates the checks (they assert on the message text), so
//! they run unchanged against the old code, where each of them fails.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use memnic_shm::Region;

/// A fresh path under /dev/shm, removed (with whatever is there) when dropped.
struct ShmPath(PathBuf);

impl ShmPath {
    fn new(tag: &str) -> ShmPath {
        // Relaxed: only the uniqueness of the value matters.
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        ShmPath(PathBuf::from(format!(
            "/dev/shm/memnic-shm-create-{}-{tag}-{n}",
            std::process::id()
        )))
    }
    fn name(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ShmPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn refused(name: &str, mode: u32) -> String {
    match Region::create_shared(name, 1 << 16, mode) {
        Ok(_) => panic!("create_shared({name}) must be refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn planted_symlink_is_refused_and_its_target_untouched() {
    let target = ShmPath::new("target");
    std::fs::write(&target.0, b"precious").unwrap();
    let link = ShmPath::new("link");
    std::os::unix::fs::symlink(&target.0, &link.0).unwrap();

    let msg = refused(link.name(), 0o600);
    assert!(msg.contains(link.name()), "{msg}");
    assert!(msg.contains("symbolic link"), "{msg}");
    assert_eq!(
        std::fs::read(&target.0).unwrap(),
        b"precious",
        "target not resized"
    );

    // A dangling link is no way in either: nothing is created where it points.
    let nowhere = ShmPath::new("nowhere");
    let dangling = ShmPath::new("dangling");
    std::os::unix::fs::symlink(&nowhere.0, &dangling.0).unwrap();
    let msg = refused(dangling.name(), 0o600);
    assert!(msg.contains("symbolic link"), "{msg}");
    assert!(!nowhere.0.exists(), "no file was created through the link");
}

#[test]
fn file_owned_by_another_user_is_refused() {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: chown to another uid needs root");
        return;
    }
    let p = ShmPath::new("foreign");
    std::fs::write(&p.0, b"theirs").unwrap();
    std::fs::set_permissions(&p.0, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&p.0, Some(12345), Some(12345)).unwrap();

    let msg = refused(p.name(), 0o600);
    assert!(msg.contains(p.name()), "{msg}");
    assert!(msg.contains("uid 12345"), "{msg}");
    let meta = std::fs::metadata(&p.0).unwrap();
    assert_eq!((meta.len(), meta.uid()), (6, 12345), "left as it was");
}

#[test]
fn file_open_to_others_beyond_the_requested_mode_is_refused() {
    let p = ShmPath::new("wide");
    std::fs::write(&p.0, b"x").unwrap();
    std::fs::set_permissions(&p.0, std::fs::Permissions::from_mode(0o666)).unwrap();

    let msg = refused(p.name(), 0o600);
    assert!(msg.contains(p.name()), "{msg}");
    assert!(msg.contains("0666"), "{msg}");
    assert!(msg.contains("0600"), "{msg}");
    assert_eq!(std::fs::metadata(&p.0).unwrap().len(), 1, "not resized");

    // Group read on a region shared with the group is what was asked for: accepted.
    std::fs::set_permissions(&p.0, std::fs::Permissions::from_mode(0o640)).unwrap();
    let r = Region::create_shared(p.name(), 1 << 16, 0o660).unwrap();
    assert_eq!(r.len(), 1 << 16);
}

#[test]
fn fresh_file_is_created_and_reopened_with_its_content() {
    let p = ShmPath::new("fresh");
    let a = Region::create_shared(p.name(), 1 << 16, 0o600).unwrap();
    a.write_bytes(100, b"kept").unwrap();
    let meta = std::fs::symlink_metadata(&p.0).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.mode() & 0o777, 0o600);
    drop(a);
    let b = Region::create_shared(p.name(), 1 << 16, 0o600).unwrap();
    let mut out = [0u8; 4];
    b.read_bytes(100, &mut out).unwrap();
    assert_eq!(&out, b"kept");
}
