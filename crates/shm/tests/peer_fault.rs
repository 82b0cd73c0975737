//! A peer that shrinks the memory behind one of our mappings must not crash us (SIGBUS
//! protection), and a SIGBUS that is not about a peer mapping must still do what it did before.
//!
//! Every scenario runs in a child process (see `common::in_child`): a SIGBUS that gets through
//! kills only that child, the parent `#[test]` reports it, and a scenario that must die can be
//! asserted on. The child re-runs this binary with only its own test selected, so no child entry
//! point shows up as an extra passing test; the parent is the only one that asserts on the
//! outcome.

mod common;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{assert_survived, describe, dup, in_child, peer_memfd, stdout_has, truncate};
use memnic_shm::{Region, ShmError, MAX_PEER_MAPPINGS};

const LEN: usize = 1 << 16;

fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn contents(r: &Region) -> Vec<u8> {
    let mut v = vec![0u8; r.len()];
    r.read_bytes(0, &mut v).unwrap();
    v
}

fn say(marker: &str) {
    println!("{marker}");
}

/// A shared mapping of `fd` that is not a Region, so nothing registers it.
fn map_unregistered(fd: &OwnedFd, len: usize) -> *mut u8 {
    // SAFETY: a fresh shared mapping at an address the kernel picks; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

#[test]
fn received_memfd_shrunk_by_its_peer_reads_zeros_and_is_flagged() {
    let Some(out) = in_child(
        "received_memfd_shrunk_by_its_peer_reads_zeros_and_is_flagged",
        || {
            let peer = peer_memfd(LEN, false);
            let r = Region::from_fd(dup(peer.as_fd()), LEN).unwrap();
            let other_peer = peer_memfd(LEN, false);
            let other = Region::from_fd(dup(other_peer.as_fd()), LEN).unwrap();
            assert!(r.is_peer_controlled() && other.is_peer_controlled());
            r.write_bytes(0, &pattern(1)).unwrap();
            other.write_bytes(0, &pattern(2)).unwrap();
            assert_eq!(contents(&r), pattern(1));
            assert!(!r.peer_faulted());

            truncate(peer.as_fd(), 0).unwrap();

            // Every accessor over the vanished pages: no crash, zeros, and the flag.
            assert_eq!(r.u32(0).load(Ordering::Acquire), 0);
            assert!(r.peer_faulted(), "the fault was recorded");
            assert_eq!(r.u64(LEN - 8).load(Ordering::Relaxed), 0);
            assert_eq!(r.u16(4096).load(Ordering::Relaxed), 0);
            let mut buf = [0xffu8; 300];
            r.read_bytes(LEN - 300, &mut buf).unwrap();
            assert_eq!(buf, [0u8; 300]);
            r.write_bytes(1000, b"after the fault").unwrap();
            let mut back = [0u8; 15];
            r.read_bytes(1000, &mut back).unwrap();
            assert_eq!(&back, b"after the fault", "writes land in private memory");
            r.u32(8).store(5, Ordering::Release);
            assert_eq!(r.u32(8).load(Ordering::Acquire), 5);
            assert_eq!(
                std::fs::File::from(peer).metadata().unwrap().len(),
                0,
                "nothing reached the peer's file"
            );

            // The other peer's mapping is untouched and unflagged.
            assert!(!other.peer_faulted());
            assert_eq!(contents(&other), pattern(2));
            drop(r);
            assert_eq!(contents(&other), pattern(2));
        },
    ) else {
        return;
    };
    assert_survived(&out);
}

#[test]
fn shared_file_truncated_through_another_descriptor_reads_zeros_and_is_flagged() {
    let Some(out) = in_child(
        "shared_file_truncated_through_another_descriptor_reads_zeros_and_is_flagged",
        || {
            let name = truncated_file_name(std::os::unix::process::parent_id());
            let path = Region::shm_path(&name);
            let host = Region::create_shared(&name, LEN, 0o600).unwrap();
            let guest = Region::open_shared(&name, LEN).unwrap();
            assert!(host.is_peer_controlled() && guest.is_peer_controlled());
            host.write_bytes(0, &pattern(3)).unwrap();
            assert_eq!(contents(&guest), pattern(3));

            // Another process (here: another descriptor) shrinks the file to one page.
            let other = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            other.set_len(4096).unwrap();

            // The page that is still there reads as before; the first access past it faults,
            // and from then on the whole mapping is private zeros.
            let mut first = [0u8; 16];
            host.read_bytes(0, &mut first).unwrap();
            assert_eq!(&first[..], &pattern(3)[..16]);
            assert!(!host.peer_faulted());
            assert_eq!(host.u32(LEN / 2).load(Ordering::Relaxed), 0);
            assert!(host.peer_faulted());
            assert_eq!(contents(&host), vec![0u8; LEN]);

            // The guest's own mapping faults on its own first access, and is flagged then.
            assert!(!guest.peer_faulted());
            let mut buf = [1u8; 64];
            guest.read_bytes(LEN - 64, &mut buf).unwrap();
            assert_eq!(buf, [0u8; 64]);
            assert!(guest.peer_faulted());
            guest.write_bytes(LEN - 64, &[9u8; 64]).unwrap();
            std::fs::remove_file(&path).unwrap();
        },
    ) else {
        return;
    };
    // Removed here too, in case the child died before it could.
    let _ = std::fs::remove_file(Region::shm_path(&truncated_file_name(std::process::id())));
    assert_survived(&out);
}

/// The shm object of the truncation test, named after the parent test process.
fn truncated_file_name(parent: u32) -> String {
    format!("memnic-shm-truncated-{parent}")
}

#[test]
fn threads_faulting_on_one_mapping_at_once_all_survive() {
    let Some(out) = in_child(
        "threads_faulting_on_one_mapping_at_once_all_survive",
        || {
            for round in 0..20 {
                let peer = peer_memfd(LEN, false);
                let r = Arc::new(Region::from_fd(dup(peer.as_fd()), LEN).unwrap());
                r.fill(0, LEN, 0x5a).unwrap();
                let go = Arc::new(AtomicBool::new(false));
                let readers: Vec<_> = (0..4)
                    .map(|t| {
                        let (r, go) = (r.clone(), go.clone());
                        std::thread::spawn(move || {
                            // Relaxed: a start signal only; no data is published with it.
                            while !go.load(Ordering::Relaxed) {
                                std::hint::spin_loop();
                            }
                            let mut buf = [0u8; 256];
                            let mut i = t * 4096;
                            while !r.peer_faulted() {
                                r.read_bytes(i % (LEN - 256), &mut buf).unwrap();
                                r.write_bytes((i + 128) % (LEN - 256), &buf[..64]).unwrap();
                                i += 4096 + 64;
                            }
                            // The flag is set: the zero pages are in place.
                            r.read_bytes(LEN - 256, &mut buf).unwrap();
                        })
                    })
                    .collect();
                // Relaxed: see above.
                go.store(true, Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(round % 3));
                truncate(peer.as_fd(), 0).unwrap();
                for t in readers {
                    t.join().unwrap();
                }
                assert!(r.peer_faulted());
            }
        },
    ) else {
        return;
    };
    assert_survived(&out);
}

#[test]
fn sigbus_outside_peer_mappings_still_kills_the_process() {
    let Some(out) = in_child(
        "sigbus_outside_peer_mappings_still_kills_the_process",
        || {
            // A protected mapping exists, so the handler is installed.
            let peer = peer_memfd(LEN, false);
            let protected = Region::from_fd(dup(peer.as_fd()), LEN).unwrap();
            assert!(protected.is_peer_controlled());
            // A mapping no Region owns, whose file shrinks: its SIGBUS is not ours to hide.
            let fd = peer_memfd(LEN, false);
            let p = map_unregistered(&fd, LEN);
            truncate(fd.as_fd(), 0).unwrap();
            say("FAULTING-OUTSIDE");
            // SAFETY: p..p+LEN is a live mapping; the read faults because the file is empty.
            let v = unsafe { std::ptr::read_volatile(p.cast::<u32>()) };
            say(&format!("SURVIVED {v}"));
        },
    ) else {
        return;
    };
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "{}",
        describe(&out)
    );
    assert!(stdout_has(&out, "FAULTING-OUTSIDE"), "{}", describe(&out));
}

/// Set by the previous handler of the chaining test: write(2) and _exit(2) only.
extern "C" fn previous_handler(_sig: libc::c_int) {
    let msg = b"PREVIOUS-HANDLER\n";
    // SAFETY: write(2) and _exit(2) are async-signal-safe; msg is a live static buffer.
    unsafe {
        libc::write(1, msg.as_ptr().cast(), msg.len());
        libc::_exit(42);
    }
}

#[test]
fn sigbus_outside_peer_mappings_goes_to_the_previous_handler() {
    let Some(out) = in_child(
        "sigbus_outside_peer_mappings_goes_to_the_previous_handler",
        || {
            // SAFETY: sigaction is plain data; all-zero is a valid empty value.
            let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
            sa.sa_sigaction = previous_handler as extern "C" fn(libc::c_int) as usize;
            // SAFETY: installs a valid one-argument handler for SIGBUS.
            let rc = unsafe { libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) };
            assert_eq!(rc, 0);
            // Our handler goes in now, in front of it.
            let peer = peer_memfd(LEN, false);
            let r = Region::from_fd(dup(peer.as_fd()), LEN).unwrap();
            truncate(peer.as_fd(), 0).unwrap();
            assert_eq!(r.u32(64).load(Ordering::Relaxed), 0);
            assert!(r.peer_faulted());
            say("SURVIVED-INSIDE");

            let fd = peer_memfd(LEN, false);
            let p = map_unregistered(&fd, LEN);
            truncate(fd.as_fd(), 0).unwrap();
            // SAFETY: p is a live mapping; the read faults because the file is empty.
            let v = unsafe { std::ptr::read_volatile(p.cast::<u32>()) };
            say(&format!("SURVIVED-OUTSIDE {v}"));
        },
    ) else {
        return;
    };
    assert_eq!(out.status.code(), Some(42), "{}", describe(&out));
    assert!(stdout_has(&out, "SURVIVED-INSIDE"), "{}", describe(&out));
    assert!(stdout_has(&out, "PREVIOUS-HANDLER"), "{}", describe(&out));
}

#[test]
fn a_dropped_region_no_longer_hides_faults_at_its_old_address() {
    let Some(out) = in_child(
        "a_dropped_region_no_longer_hides_faults_at_its_old_address",
        || {
            let peer = peer_memfd(LEN, false);
            let r = Region::from_fd(dup(peer.as_fd()), LEN).unwrap();
            let addr = r.addr();
            drop(r);
            // Something else is mapped where the region was; its file shrinks.
            let fd = peer_memfd(LEN, false);
            // SAFETY: MAP_FIXED_NOREPLACE maps only if [addr, addr+LEN) is free (it was just
            // unmapped) and never replaces a mapping; the result is checked.
            let p = unsafe {
                libc::mmap(
                    addr as *mut libc::c_void,
                    LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                    fd.as_raw_fd(),
                    0,
                )
            };
            assert_eq!(p as usize, addr, "the old range is free again");
            truncate(fd.as_fd(), 0).unwrap();
            say("FAULTING-AT-OLD-ADDRESS");
            // SAFETY: p is a live mapping; the read faults because the file is empty.
            let v = unsafe { std::ptr::read_volatile(p.cast::<u32>()) };
            say(&format!("SURVIVED {v}"));
        },
    ) else {
        return;
    };
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "{}",
        describe(&out)
    );
    assert!(
        stdout_has(&out, "FAULTING-AT-OLD-ADDRESS"),
        "{}",
        describe(&out)
    );
}

#[test]
fn more_peer_mappings_than_the_registry_holds_is_a_clear_error() {
    let Some(out) = in_child(
        "more_peer_mappings_than_the_registry_holds_is_a_clear_error",
        || {
            // Each region keeps its descriptor: make room for them all.
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit/setrlimit read and write the live local `lim`.
            unsafe {
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
                lim.rlim_cur = lim.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
            let peer = peer_memfd(4096, false);
            let mut regions: Vec<Region> = (0..MAX_PEER_MAPPINGS)
                .map(|_| Region::from_fd(dup(peer.as_fd()), 4096).unwrap())
                .collect();
            let err = Region::from_fd(dup(peer.as_fd()), 4096).unwrap_err();
            assert!(
                matches!(err, ShmError::TooManyPeerMappings { max } if max == MAX_PEER_MAPPINGS),
                "{err:?}"
            );
            let msg = err.to_string();
            assert!(msg.contains(&MAX_PEER_MAPPINGS.to_string()), "{msg}");
            // Mappings that need no protection are not limited.
            let sealed: Vec<Region> = (0..8)
                .map(|_| Region::memfd("sealed", 4096, false).unwrap())
                .collect();
            assert!(sealed.iter().all(|r| !r.is_peer_controlled()));
            // A slot freed by a drop is taken by the next one, and it still protects.
            regions.swap_remove(17);
            let again = Region::from_fd(dup(peer.as_fd()), 4096).unwrap();
            truncate(peer.as_fd(), 0).unwrap();
            assert_eq!(again.u32(0).load(Ordering::Relaxed), 0);
            assert!(again.peer_faulted());
            assert!(!regions[3].peer_faulted(), "not accessed, not flagged");
            assert_eq!(regions[3].u32(0).load(Ordering::Relaxed), 0);
            assert!(regions[3].peer_faulted());
        },
    ) else {
        return;
    };
    assert_survived(&out);
}

/// The owner of a region file grows it back and maps it again after a peer cut it: the region
/// is shared with the file once more (a new opener sees what the owner writes), and a second
/// cut is caught like the first.
#[test]
fn a_faulted_file_region_is_restored_and_guarded_again() {
    let Some(out) = in_child(
        "a_faulted_file_region_is_restored_and_guarded_again",
        || {
            let name = format!("memnic-shm-restore-{}", std::os::unix::process::parent_id());
            let path = Region::shm_path(&name);
            let host = Region::create_shared(&name, LEN, 0o600).unwrap();
            for round in 0..2u8 {
                host.write_bytes(0, &pattern(round)).unwrap();
                let other = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                other.set_len(0).unwrap();
                assert_eq!(host.u32(LEN - 4).load(Ordering::Relaxed), 0);
                assert!(host.peer_faulted(), "round {round}");
                host.restore_after_fault().unwrap();
                assert!(!host.peer_faulted(), "round {round}: re-armed");
                assert_eq!(contents(&host), vec![0u8; LEN], "what was cut is gone");
                host.write_bytes(0, &pattern(round + 10)).unwrap();
                let next = Region::open_shared(&name, LEN).unwrap();
                assert_eq!(
                    contents(&next),
                    pattern(round + 10),
                    "shared with the file again"
                );
            }
            std::fs::remove_file(&path).unwrap();
        },
    ) else {
        return;
    };
    let _ = std::fs::remove_file(Region::shm_path(&format!(
        "memnic-shm-restore-{}",
        std::process::id()
    )));
    assert_survived(&out);
}
