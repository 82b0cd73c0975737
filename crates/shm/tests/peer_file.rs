//! Files a peer hands us to map, on mounts only its own mount namespace has.

use std::os::fd::AsFd;

use memnic_shm::{Region, ShmError};
use memnic_test_support::ForeignMountFile;

/// A file on a ramfs only a child's mount namespace has: unknown in our mount table, so
/// refused, unless the peer's table is asked (its pid, as SO_PEERCRED gives it), which names
/// the mount. Needs root and util-linux's `unshare`.
#[test]
fn a_mount_only_the_peers_namespace_has_is_looked_up_in_the_peers_table() {
    let foreign = ForeignMountFile::new("shm");
    let ours = Region::check_peer_file(foreign.file.as_fd(), None);
    assert!(
        matches!(ours, Err(ShmError::UnknownMount { .. })),
        "not in our table: {ours:?}"
    );
    Region::check_peer_file(foreign.file.as_fd(), Some(foreign.pid()))
        .expect("the peer's table names ramfs");
}
