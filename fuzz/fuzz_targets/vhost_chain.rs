//! Fuzz target: the vhost descriptor-chain walker on a descriptor table, a chain head and an
//! indirect-table area that are all arbitrary bytes (what a hostile guest can write).
//!
//! Run from `fuzz/` (needs `cargo install cargo-fuzz` and a nightly toolchain):
//! `cargo +nightly fuzz run vhost_chain -- -max_total_time=600`.
//!
//! Guest memory is two adjacent 64 KiB regions (so buffers can cross a seam); the ring has 16
//! entries. Contract: no input panics or loops; an accepted chain's pieces lie inside their
//! regions and add up to its length; a refused one has a reason.

#![no_main]

use std::fs::File;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use memnic_shm::Region;
use memnic_vhost::chain::{walk, Dir};
use memnic_vhost::mem::{MemTable, RegionDesc};
use memnic_vhost::split::{RingAddrs, SplitRing};

const GPA: u64 = 0x10000;
const LEN: usize = 0x10000;
const UVA: u64 = 0x7f00_0000_0000;
const Q: u32 = 16;
/// Where the fuzzer's indirect-table bytes go (guest-physical).
const TABLES: u64 = GPA + 0x8000;

struct Guest {
    mem: Region,
    table: MemTable,
    ring: SplitRing,
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
        std::mem::forget(next); // the table holds its own mapping; keep the memfd too
        Guest { mem, table, ring }
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
        match walk(&g.ring, &g.table, head, dir, &mut pieces) {
            Ok(total) => {
                let sum: usize = pieces.iter().map(|p| p.len).sum();
                assert_eq!(sum, total as usize);
                for p in &pieces {
                    assert!(p.region < 2 && p.len > 0 && p.off + p.len <= LEN);
                }
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
});
