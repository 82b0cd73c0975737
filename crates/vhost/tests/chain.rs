//! The descriptor-chain walker and the ring set-up against a guest that writes anything: every
//! bad value is refused with its reason, nothing is read outside guest memory, no walk loops.

use std::fs::File;

use memnic_shm::Region;
use memnic_vhost::chain::{walk, ChainError, Dir, Piece};
use memnic_vhost::mem::{MemTable, RegionDesc};
use memnic_vhost::split::{
    Desc, RingAddrs, RingError, SplitRing, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE,
};

const GPA: u64 = 0x10_0000;
const UVA: u64 = 0x7f00_0000_0000;
const SIZE: usize = 1 << 20;
const Q: u32 = 8;
/// Where the test puts the rings (guest-physical).
const DESC: u64 = GPA;
const AVAIL: u64 = GPA + 0x1000;
const USED: u64 = GPA + 0x2000;
/// Buffers from here on.
const BUF: u64 = GPA + 0x10000;

/// Guest memory the test writes (a memfd), and the backend's table of it.
struct Guest {
    mem: Region,
    table: MemTable,
}

fn fd_of(r: &Region) -> File {
    File::from(r.fd().expect("a memfd").try_clone_to_owned().unwrap())
}

impl Guest {
    fn new() -> Guest {
        let mem = Region::memfd("guest", SIZE, false).unwrap();
        let d = RegionDesc {
            guest_phys_addr: GPA,
            memory_size: SIZE as u64,
            userspace_addr: UVA,
            mmap_offset: 0,
        };
        let table = MemTable::new(&[d], vec![fd_of(&mem)]).unwrap();
        Guest { mem, table }
    }

    fn ring(&self) -> SplitRing {
        SplitRing::new(
            &self.table,
            Q,
            RingAddrs {
                desc: DESC - GPA + UVA,
                avail: AVAIL - GPA + UVA,
                used: USED - GPA + UVA,
            },
        )
        .unwrap()
    }

    fn desc(&self, i: u16, d: Desc) {
        self.at(DESC + 16 * i as u64, d);
    }

    fn at(&self, gpa: u64, d: Desc) {
        self.mem
            .write_bytes((gpa - GPA) as usize, &d.to_bytes())
            .unwrap();
    }

    fn walk(&self, head: u16, dir: Dir) -> Result<(u32, Vec<Piece>), ChainError> {
        let mut out = Vec::new();
        walk(&self.ring(), &self.table, head, dir, &mut out).map(|t| (t, out))
    }
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> Desc {
    Desc {
        addr,
        len,
        flags,
        next,
    }
}

#[test]
fn a_chain_becomes_its_pieces() {
    let g = Guest::new();
    g.desc(3, d(BUF, 12, DESC_F_NEXT, 5));
    g.desc(5, d(BUF + 0x100, 100, DESC_F_NEXT, 0));
    g.desc(0, d(BUF + 0x1000, 0, 0, 7)); // empty and last (NEXT clear: `next` is ignored)
    let (total, pieces) = g.walk(3, Dir::Readable).unwrap();
    assert_eq!(total, 112);
    let off = (BUF - GPA) as usize;
    assert_eq!(
        pieces,
        [
            Piece {
                region: 0,
                off,
                len: 12
            },
            Piece {
                region: 0,
                off: off + 0x100,
                len: 100
            }
        ]
    );
}

#[test]
fn indices_past_the_queue_are_refused() {
    let g = Guest::new();
    let size = Q as u16;
    assert_eq!(
        g.walk(size, Dir::Readable),
        Err(ChainError::IndexOutOfRange { index: size, size })
    );
    g.desc(1, d(BUF, 10, DESC_F_NEXT, 9000));
    assert_eq!(
        g.walk(1, Dir::Readable),
        Err(ChainError::IndexOutOfRange { index: 9000, size })
    );
}

#[test]
fn a_loop_ends_as_too_long() {
    let g = Guest::new();
    g.desc(0, d(BUF, 10, DESC_F_NEXT, 1));
    g.desc(1, d(BUF, 10, DESC_F_NEXT, 0));
    assert_eq!(g.walk(0, Dir::Readable), Err(ChainError::TooLong));
    g.desc(2, d(BUF, 10, DESC_F_NEXT, 2));
    assert_eq!(g.walk(2, Dir::Readable), Err(ChainError::TooLong));
}

#[test]
fn buffers_outside_guest_memory_or_wrapping_are_refused() {
    let g = Guest::new();
    for (addr, len) in [
        (0, 16),                     // below the region
        (GPA + SIZE as u64 - 8, 16), // runs past its end
        (u64::MAX - 7, 16),          // wraps
        (GPA, u32::MAX),             // longer than guest memory
    ] {
        g.desc(0, d(addr, len, 0, 0));
        assert_eq!(
            g.walk(0, Dir::Readable),
            Err(ChainError::Unmapped { addr, len }),
            "{addr:#x}+{len}"
        );
    }
}

#[test]
fn buffers_of_the_wrong_direction_are_refused() {
    let g = Guest::new();
    g.desc(0, d(BUF, 10, DESC_F_NEXT, 1));
    g.desc(1, d(BUF, 10, DESC_F_WRITE, 0));
    assert_eq!(
        g.walk(0, Dir::Readable),
        Err(ChainError::WrongDirection("device-writable"))
    );
    assert_eq!(
        g.walk(0, Dir::Writable),
        Err(ChainError::WrongDirection("device-readable"))
    );
}

#[test]
fn indirect_tables_are_walked_and_their_abuse_refused() {
    let g = Guest::new();
    let table = BUF + 0x8000;
    g.at(table, d(BUF, 14, DESC_F_NEXT, 2));
    g.at(table + 32, d(BUF + 0x40, 50, 0, 0));
    g.desc(0, d(table, 48, DESC_F_INDIRECT, 0));
    assert_eq!(g.walk(0, Dir::Readable).unwrap().0, 64);
    g.desc(0, d(table, 48, DESC_F_INDIRECT | DESC_F_NEXT, 1));
    assert_eq!(g.walk(0, Dir::Readable), Err(ChainError::IndirectWithNext));
    for len in [0, 20, 16 * (Q + 1)] {
        g.desc(0, d(table, len, DESC_F_INDIRECT, 0));
        assert_eq!(
            g.walk(0, Dir::Readable),
            Err(ChainError::BadIndirectLen(len)),
            "{len}"
        );
    }
    g.desc(0, d(u64::MAX - 31, 32, DESC_F_INDIRECT, 0));
    assert!(matches!(
        g.walk(0, Dir::Readable),
        Err(ChainError::Unmapped { .. })
    ));
    // An indirect descriptor inside the table.
    g.at(table + 32, d(table, 16, DESC_F_INDIRECT, 0));
    g.desc(0, d(table, 48, DESC_F_INDIRECT, 0));
    assert_eq!(g.walk(0, Dir::Readable), Err(ChainError::NestedIndirect));
    // A next index past the table, and a loop inside it.
    g.at(table, d(BUF, 14, DESC_F_NEXT, 3));
    assert_eq!(
        g.walk(0, Dir::Readable),
        Err(ChainError::IndexOutOfRange { index: 3, size: 3 })
    );
    g.at(table, d(BUF, 14, DESC_F_NEXT, 0));
    assert_eq!(g.walk(0, Dir::Readable), Err(ChainError::TooLong));
}

/// Two regions that meet at a guest address: a buffer across the seam is two pieces, one in
/// each mapping; with a gap between them it is refused; overlapping regions are no table.
#[test]
fn a_buffer_across_two_regions_is_split_or_refused() {
    let a = Region::memfd("a", 0x10000, false).unwrap();
    let b = Region::memfd("b", 0x10000, false).unwrap();
    let desc = |gpa, uva| RegionDesc {
        guest_phys_addr: gpa,
        memory_size: 0x10000,
        userspace_addr: uva,
        mmap_offset: 0,
    };
    let t = MemTable::new(
        &[desc(0x20000, 0x9000_0000), desc(0x10000, 0x8000_0000)],
        vec![fd_of(&b), fd_of(&a)],
    )
    .unwrap();
    let mut pieces = Vec::new();
    assert!(t.for_each_piece(0x1fff0, 0x20, |r, off, len| pieces.push((r, off, len))));
    // Sorted by guest address: region 0 is `a` (0x10000), region 1 is `b`.
    assert_eq!(pieces, [(0, 0xfff0, 0x10), (1, 0, 0x10)]);
    let gap = MemTable::new(
        &[desc(0x10000, 0x8000_0000), desc(0x30000, 0x9000_0000)],
        vec![fd_of(&a), fd_of(&b)],
    )
    .unwrap();
    assert!(!gap.for_each_piece(0x1fff0, 0x20, |_, _, _| {}));
    assert!(MemTable::new(
        &[desc(0x10000, 0), desc(0x18000, 0x10_0000)],
        vec![fd_of(&a), fd_of(&b)]
    )
    .is_err());
}

#[test]
fn ring_areas_must_be_mapped_aligned_and_the_size_a_power_of_two() {
    let g = Guest::new();
    let a = |desc, avail, used| RingAddrs {
        desc: desc - GPA + UVA,
        avail: avail - GPA + UVA,
        used: used - GPA + UVA,
    };
    for size in [0, 3, 65536] {
        assert_eq!(
            SplitRing::new(&g.table, size, a(DESC, AVAIL, USED)).unwrap_err(),
            RingError::BadSize(size)
        );
    }
    assert!(matches!(
        SplitRing::new(&g.table, Q, a(DESC + 8, AVAIL, USED)),
        Err(RingError::Misaligned { .. })
    ));
    assert!(matches!(
        SplitRing::new(&g.table, Q, a(DESC, AVAIL, GPA + SIZE as u64 - 16)),
        Err(RingError::Unmapped { .. })
    ));
}
