//! Fuzz target: the vhost descriptor-chain walkers (split and packed) on a descriptor area, a
//! chain head and an indirect-table area that are all arbitrary bytes (what a hostile guest
//! can write).
//!
//! Run from `fuzz/` (needs `cargo install cargo-fuzz` and a nightly toolchain):
//! `cargo +nightly fuzz run vhost_chain -- -max_total_time=600`.
//!
//! Guest memory is two adjacent 64 KiB regions (so buffers can cross a seam); the ring has 16
//! entries (the packed ring, over the same bytes, 13 slots: no power of two). Contract: no
//! input panics or loops; an accepted chain's pieces lie inside their regions and add up to
//! its length; a refused one has a reason; a packed chain takes 1 to 13 slots.

#![no_main]

use std::fs::File;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use memnic_shm::Region;
use memnic_vhost::chain::{walk, walk_packed, ChainError, Dir, Piece};
use memnic_vhost::mem::{MemTable, RegionDesc};
use memnic_vhost::packed::PackedRing;
use memnic_vhost::split::{RingAddrs, SplitRing};

const GPA: u64 = 0x10000;
const LEN: usize = 0x10000;
const UVA: u64 = 0x7f00_0000_0000;
const Q: u32 = 16;
const PACKED_Q: u32 = 13;
/// Where the fuzzer's indirect-table bytes go (guest-physical).
const TABLES: u64 = GPA + 0x8000;

struct Guest {
    mem: Region,
    table: MemTable,
    ring: SplitRing,
    packed: PackedRing,
}

fn guest() -> &'static Guest {
    static G: OnceLock<Guest> = OnceLock::new();
    G.get_or_init(|| {
        let mem = Region::memfd("fuzz-guest", LEN, false).unwrap();
        let next = Region::memfd("fuzz-guest-2", LEN, false).unwrap();
        let fd = |r: &Region| File::from(r.fd().unwrap().try_clone_to_owned().unwrap());
        let d = |gpa: u64, uva: u64| RegionDesc {
            guest_phys_addr: gpa,
            memory_size: LEN as u64,
            userspace_addr: uva,
            mmap_offset: 0,
        };
        let table = MemTable::new(
            &[d(GPA, UVA), d(GPA + LEN as u64, UVA + 0x100_0000)],
            vec![fd(&mem), fd(&next)],
        )
        .unwrap();
        let ring = SplitRing::new(
            &table,
            Q,
            RingAddrs {
                desc: UVA,
                avail: UVA + 0x1000,
                used: UVA + 0x2000,
            },
        )
        .unwrap();
        let packed = PackedRing::new(
            &table,
            PACKED_Q,
            RingAddrs {
                desc: UVA,
                avail: UVA + 0x1000,
                used: UVA + 0x2000,
            },
        )
        .unwrap();
        std::mem::forget(next); // the table holds its own mapping; keep the memfd too
        Guest {
            mem,
            table,
            ring,
            packed,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let g = guest();
    let desc_bytes = 16 * Q as usize;
    if data.len() < desc_bytes + 2 {
        return;
    }
    g.mem.write_bytes(0, &data[..desc_bytes]).unwrap();
    let head = u16::from_le_bytes([data[desc_bytes], data[desc_bytes + 1]]);
    let rest = &data[desc_bytes + 2..];
    let n = rest.len().min(0x1000);
    g.mem
        .write_bytes((TABLES - GPA) as usize, &rest[..n])
        .unwrap();
    let mut pieces = Vec::new();
    for dir in [Dir::Readable, Dir::Writable] {
        check(walk(&g.ring, &g.table, head, dir, &mut pieces), &pieces);
        match walk_packed(&g.packed, &g.table, head % PACKED_Q as u16, dir, &mut pieces) {
            Ok((chain, walked)) => {
                assert!(chain.descs >= 1 && chain.descs as u32 <= PACKED_Q);
                check(walked, &pieces);
            }
            Err(b) => assert!(!b.to_string().is_empty()),
        }
    }
});

fn check(walked: Result<u32, ChainError>, pieces: &[Piece]) {
    match walked {
        Ok(total) => {
            let sum: usize = pieces.iter().map(|p| p.len).sum();
            assert_eq!(sum, total as usize);
            for p in pieces {
                assert!(p.region < 2 && p.len > 0 && p.off + p.len <= LEN);
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
