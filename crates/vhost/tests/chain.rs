//! The descriptor-chain walker and the ring set-up against a guest that writes anything: every
//! bad value is refused with its reason, nothing is read outside guest memory, no walk loops.

use std::fs::File;

use memnic_shm::Region;
use memnic_vhost::chain::{walk, walk_packed, ChainError, Dir, Piece};
use memnic_vhost::mem::{Frontend, MemTable, RegionDesc};
use memnic_vhost::packed::{
    PackedDesc, PackedRing, DESC_F_AVAIL, DESC_F_USED, EVENT_F_DESC, EVENT_F_DISABLE,
    EVENT_F_ENABLE, WRAP,
};
use memnic_vhost::split::{
    Desc, RingAddrs, RingError, SplitRing, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE,
};
use memnic_vhost::vring::{Chain, Vring};

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
        let table = MemTable::new(&[d], vec![fd_of(&mem)], Frontend::default()).unwrap();
        Guest { mem, table }
    }

    fn ring(&self) -> SplitRing {
        SplitRing::new(&self.table, Q, a(DESC, AVAIL, USED)).unwrap()
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

/// The frontend's addresses of ring areas at these guest-physical addresses.
fn a(desc: u64, avail: u64, used: u64) -> RingAddrs {
    RingAddrs {
        desc: desc - GPA + UVA,
        avail: avail - GPA + UVA,
        used: used - GPA + UVA,
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

/// A region file refused (a socket whose close waits on its peer, no shared memory) is closed
/// off this thread and counted against the frontend's user, not against every user.
#[test]
fn a_refused_region_file_counts_against_its_frontends_user() {
    use memnic_shm::unix::{closes_done_within, closes_waiting_from, lingering_socket, Sender};
    let (ours, theirs) = lingering_socket().unwrap();
    let frontend = Frontend {
        pid: None,
        sender: Sender::uid(4242),
    };
    let d = RegionDesc {
        guest_phys_addr: GPA,
        memory_size: 0x10000,
        userspace_addr: UVA,
        mmap_offset: 0,
    };
    let file = File::from(std::os::fd::OwnedFd::from(ours));
    assert!(MemTable::new(&[d], vec![file], frontend).is_err());
    assert_eq!(closes_waiting_from(Sender::uid(4242)), 1);
    assert_eq!(closes_waiting_from(Sender::UNKNOWN), 0);
    drop(theirs);
    assert!(closes_done_within(std::time::Duration::from_secs(5)));
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
        Frontend::default(),
    )
    .unwrap();
    let mut pieces = Vec::new();
    assert!(t.for_each_piece(0x1fff0, 0x20, |r, off, len| pieces.push((r, off, len))));
    // Sorted by guest address: region 0 is `a` (0x10000), region 1 is `b`.
    assert_eq!(pieces, [(0, 0xfff0, 0x10), (1, 0, 0x10)]);
    let gap = MemTable::new(
        &[desc(0x10000, 0x8000_0000), desc(0x30000, 0x9000_0000)],
        vec![fd_of(&a), fd_of(&b)],
        Frontend::default(),
    )
    .unwrap();
    assert!(!gap.for_each_piece(0x1fff0, 0x20, |_, _, _| {}));
    assert!(MemTable::new(
        &[desc(0x10000, 0), desc(0x18000, 0x10_0000)],
        vec![fd_of(&a), fd_of(&b)],
        Frontend::default()
    )
    .is_err());
}

#[test]
fn ring_areas_must_be_mapped_aligned_and_the_size_a_power_of_two() {
    let g = Guest::new();
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

// ---- packed rings ----

/// A packed ring of 6 slots (packed rings need no power of two) at DESC, its event areas at
/// AVAIL (the driver's) and USED (ours).
fn packed(g: &Guest) -> PackedRing {
    PackedRing::new(&g.table, 6, a(DESC, AVAIL, USED)).unwrap()
}

fn pd(addr: u64, len: u32, id: u16, flags: u16) -> PackedDesc {
    PackedDesc {
        addr,
        len,
        id,
        flags,
    }
}

impl Guest {
    fn pdesc(&self, i: u16, d: PackedDesc) {
        self.pat(DESC + 16 * i as u64, d);
    }
    fn pat(&self, gpa: u64, d: PackedDesc) {
        self.mem
            .write_bytes((gpa - GPA) as usize, &d.to_bytes())
            .unwrap();
    }
    fn walk_packed(
        &self,
        idx: u16,
        dir: Dir,
    ) -> Result<(Chain, Result<u32, ChainError>), memnic_vhost::vring::Broken> {
        let mut out = Vec::new();
        walk_packed(&packed(self), &self.table, idx, dir, &mut out)
    }
}

#[test]
fn a_packed_chain_wraps_the_ring_and_returns_its_last_slots_id() {
    let g = Guest::new();
    let r = packed(&g);
    // Slots 4, 5, 0: the chain wraps; only the last slot's id counts.
    g.pdesc(4, pd(BUF, 100, 7, DESC_F_NEXT | DESC_F_AVAIL));
    g.pdesc(5, pd(BUF + 0x1000, 200, 8, DESC_F_NEXT | DESC_F_AVAIL));
    g.pdesc(0, pd(BUF + 0x2000, 300, 42, DESC_F_USED));
    let mut out = Vec::new();
    let (chain, walked) = walk_packed(&r, &g.table, 4, Dir::Readable, &mut out).unwrap();
    assert_eq!(chain, Chain { id: 42, descs: 3 });
    assert_eq!(walked, Ok(600));
    assert_eq!(out.len(), 3);
    assert_eq!(out[2].off, 0x12000);
    assert_eq!(out[2].len, 300);
}

/// A dequeue batch's look at the next chains (`Vring::prefetch_ahead`) reads slots the guest
/// may have filled with anything: from every position and wrap counter, asked for more slots
/// than the ring has, over addresses outside guest memory or wrapping past the top, it never
/// panics and writes nothing.
#[test]
fn looking_ahead_at_hostile_packed_slots_only_reads_them() {
    let g = Guest::new();
    let r = packed(&g);
    let addrs = [
        0,
        u64::MAX - 5,
        GPA - 1,
        GPA + SIZE as u64 - 1,
        GPA + SIZE as u64,
        BUF,
    ];
    for (i, addr) in addrs.into_iter().enumerate() {
        // Available to a device whose wrap counter is set; the fourth (NEXT set) ends nothing.
        let next = if i == 3 { DESC_F_NEXT } else { 0 };
        g.pdesc(i as u16, pd(addr, u32::MAX, i as u16, DESC_F_AVAIL | next));
    }
    let ring = |g: &Guest| {
        let mut b = [0u8; 16 * 6];
        g.mem.read_bytes((DESC - GPA) as usize, &mut b).unwrap();
        b
    };
    let before = ring(&g);
    for pos in 0..6u16 {
        for wrap in [0, WRAP] {
            let cur = r.cursor(pos | wrap).unwrap();
            for n in [0, 1, 6, 7, u16::MAX] {
                for hdr_len in [0, 12, usize::MAX] {
                    r.prefetch_ahead(&g.table, &cur, hdr_len, n);
                }
            }
        }
    }
    assert_eq!(ring(&g), before);
}

#[test]
fn a_packed_chain_that_never_ends_breaks_the_ring() {
    let g = Guest::new();
    for i in 0..6 {
        g.pdesc(i, pd(BUF, 64, i, DESC_F_NEXT | DESC_F_AVAIL));
    }
    assert_eq!(
        g.walk_packed(2, Dir::Readable).unwrap_err(),
        memnic_vhost::vring::Broken::EndlessChain
    );
}

#[test]
fn a_refused_packed_chain_is_walked_to_its_end_so_it_can_be_returned() {
    let g = Guest::new();
    g.pdesc(0, pd(BUF, 64, 0, DESC_F_NEXT | DESC_F_AVAIL));
    g.pdesc(
        1,
        pd(GPA + SIZE as u64 - 8, 64, 0, DESC_F_NEXT | DESC_F_AVAIL),
    );
    g.pdesc(2, pd(BUF, 64, 9, DESC_F_WRITE | DESC_F_AVAIL));
    let (chain, walked) = g.walk_packed(0, Dir::Readable).unwrap();
    assert_eq!(chain, Chain { id: 9, descs: 3 });
    assert_eq!(
        walked,
        Err(ChainError::Unmapped {
            addr: GPA + SIZE as u64 - 8,
            len: 64
        })
    );
    // The direction of every slot is checked too.
    g.pdesc(1, pd(BUF, 64, 0, DESC_F_NEXT | DESC_F_AVAIL));
    let (_, walked) = g.walk_packed(0, Dir::Readable).unwrap();
    assert_eq!(walked, Err(ChainError::WrongDirection("device-writable")));
}

#[test]
fn packed_indirect_tables_are_walked_whole_and_their_abuse_refused() {
    let g = Guest::new();
    let table = BUF + 0x8000;
    // Three entries, linked by nothing but their order (NEXT is meaningless here).
    g.pat(table, pd(BUF, 12, 0, DESC_F_NEXT));
    g.pat(table + 16, pd(BUF + 0x1000, 1000, 0, 0));
    g.pat(table + 32, pd(BUF + 0x2000, 500, 0, 0));
    g.pdesc(3, pd(table, 48, 5, DESC_F_INDIRECT | DESC_F_AVAIL));
    let (chain, walked) = g.walk_packed(3, Dir::Readable).unwrap();
    assert_eq!((chain, walked), (Chain { id: 5, descs: 1 }, Ok(1512)));
    // DPDK's virtio driver leaves WRITE on its tx tables' header entry: read anyway...
    g.pat(table, pd(BUF, 12, 0, DESC_F_WRITE));
    assert_eq!(g.walk_packed(3, Dir::Readable).unwrap().1, Ok(1512));
    // ...but an rx table must be writable throughout.
    assert_eq!(
        g.walk_packed(3, Dir::Writable).unwrap().1,
        Err(ChainError::WrongDirection("device-readable"))
    );
    g.pat(table + 32, pd(table, 48, 0, DESC_F_INDIRECT));
    assert_eq!(
        g.walk_packed(3, Dir::Readable).unwrap().1,
        Err(ChainError::NestedIndirect)
    );
    g.pdesc(3, pd(table, 40, 5, DESC_F_INDIRECT | DESC_F_AVAIL));
    assert_eq!(
        g.walk_packed(3, Dir::Readable).unwrap().1,
        Err(ChainError::BadIndirectLen(40))
    );
    // INDIRECT with NEXT: refused, and the chain still ends where its slots say.
    g.pdesc(
        3,
        pd(table, 48, 5, DESC_F_INDIRECT | DESC_F_NEXT | DESC_F_AVAIL),
    );
    g.pdesc(4, pd(BUF, 10, 6, DESC_F_AVAIL));
    let (chain, walked) = g.walk_packed(3, Dir::Readable).unwrap();
    assert_eq!(chain, Chain { id: 6, descs: 2 });
    assert_eq!(walked, Err(ChainError::IndirectWithNext));
}

#[test]
fn packed_ring_set_up_checks_size_alignment_and_position() {
    let g = Guest::new();
    for size in [0, 32769] {
        assert_eq!(
            PackedRing::new(&g.table, size, a(DESC, AVAIL, USED)).unwrap_err(),
            RingError::BadPackedSize(size)
        );
    }
    assert!(matches!(
        PackedRing::new(&g.table, 6, a(DESC, AVAIL + 2, USED)),
        Err(RingError::Misaligned { .. })
    ));
    assert!(matches!(
        PackedRing::new(&g.table, 6, a(DESC, AVAIL, GPA + SIZE as u64)),
        Err(RingError::Unmapped { .. })
    ));
    let r = packed(&g);
    assert!(r.check_pos(5 | WRAP).is_ok());
    assert_eq!(
        r.check_pos(6 | WRAP),
        Err(RingError::BadBase {
            pos: 6 | WRAP,
            size: 6
        })
    );
}

/// The driver's event suppression decides our calls: DISABLE never, ENABLE always, and with
/// EVENT_IDX a DESC event at (slot, wrap) once the used position passes it, across the wrap.
#[test]
fn packed_calls_follow_the_drivers_event_suppression() {
    let g = Guest::new();
    let r = packed(&g);
    let event = |off_wrap: u16, flags: u16| {
        let at = (AVAIL - GPA) as usize;
        g.mem.write_bytes(at, &off_wrap.to_le_bytes()).unwrap();
        g.mem.write_bytes(at + 2, &flags.to_le_bytes()).unwrap();
    };
    event(0, EVENT_F_DISABLE);
    assert!(!r.wants_call(WRAP, 2 | WRAP, true));
    assert!(!r.wants_call(WRAP, 2 | WRAP, false));
    event(0, EVENT_F_ENABLE);
    assert!(r.wants_call(WRAP, 2 | WRAP, true));
    // DESC is only meaningful with EVENT_IDX: without it, anything but DISABLE calls.
    event(4 | WRAP, EVENT_F_DESC);
    assert!(r.wants_call(WRAP, 2 | WRAP, false));
    // Used 0 -> 2 on the first lap does not pass slot 4; 2 -> 5 does.
    assert!(!r.wants_call(WRAP, 2 | WRAP, true));
    assert!(r.wants_call(2 | WRAP, 5 | WRAP, true));
    // Across the wrap: 4 (lap 1) -> 1 (lap 2) passes slot 5 of lap 1 and slot 0 of lap 2...
    event(5 | WRAP, EVENT_F_DESC);
    assert!(r.wants_call(4 | WRAP, 1, true));
    event(0, EVENT_F_DESC);
    assert!(r.wants_call(4 | WRAP, 1, true));
    // ...but not slot 1 of lap 2, nor slot 3 of lap 1 (already behind).
    event(1, EVENT_F_DESC);
    assert!(!r.wants_call(4 | WRAP, 1, true));
    event(3 | WRAP, EVENT_F_DESC);
    assert!(!r.wants_call(4 | WRAP, 1, true));
}
