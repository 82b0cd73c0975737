//! A peer's mapping we let go of: the peer's memory is no longer ours to see or change, and
//! the range stays mapped (zeros to read, writes that reach no one).

mod common;

use common::dup;
use memnic_shm::Region;

#[test]
fn a_released_mapping_reads_zeros_and_no_longer_reaches_the_peers_memory() {
    let peer = Region::memfd("release-peer", 1 << 16, false).unwrap();
    peer.fill(0, 1 << 16, 0xa5).unwrap();
    let ours = Region::from_fd_mapping_only(dup(peer.fd().unwrap()), 1 << 16).unwrap();
    assert!(ours.fd().is_none(), "the mapping alone holds the file");
    let mut b = [0u8; 8];
    ours.read_bytes(4096, &mut b).unwrap();
    assert_eq!(b, [0xa5; 8], "shared before the release");

    ours.release().unwrap();
    ours.read_bytes(4096, &mut b).unwrap();
    assert_eq!(b, [0; 8], "zeros after it");
    ours.write_bytes(4096, &[1; 8]).unwrap();
    ours.read_bytes(4096, &mut b).unwrap();
    assert_eq!(b, [1; 8], "our writes land in our own pages");
    peer.read_bytes(4096, &mut b).unwrap();
    assert_eq!(b, [0xa5; 8], "and never in the peer's");
}
