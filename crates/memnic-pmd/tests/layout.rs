//! The wire layout of `specs/memnic.md` §1–§2, checked two ways: the constants of
//! `memnic_pmd::layout` against the numbers of the spec, and a region laid out by the host side
//! read back with plain file reads of `/dev/shm/NAME` (independent of the driver's accessors).

use memnic_test_support as common;

use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use common::ShmName;
use memnic_ethdev::Port;
use memnic_pmd::layout::*;
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort, MemnicError};

// The spec's numbers, written out here rather than taken from the crate.
const SPEC_AREA: usize = 0x100_0000;
const SPEC_UP_INFO: usize = 0x10_0000;
const SPEC_UP_PACKETS: usize = 0x20_0000;
const SPEC_DOWN_INFO: usize = 0x90_0000;
const SPEC_DOWN_PACKETS: usize = 0xA0_0000;
const SPEC_SLOT: usize = 0x1000;

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

fn read_region(shm: &ShmName) -> Vec<u8> {
    let b = std::fs::read(shm.path()).expect("read /dev/shm file");
    assert_eq!(b.len(), SPEC_AREA, "the region file is 16 MiB");
    b
}

fn write_u32(shm: &ShmName, off: usize, v: u32) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(shm.path())
        .unwrap();
    f.seek(SeekFrom::Start(off as u64)).unwrap();
    f.write_all(&v.to_le_bytes()).unwrap();
}

#[test]
fn constants_match_the_spec() {
    assert_eq!(MAGIC, 0x4349_4e76);
    assert_eq!(&MAGIC.to_le_bytes(), b"vNIC");
    assert_eq!(VERSION_1, 1);
    assert_eq!(NR_PACKET, 1024);
    assert_eq!(AREA_SIZE, 16 * 1024 * 1024);
    assert_eq!(AREA_SIZE, SPEC_AREA);
    assert_eq!(MAX_PACKET_SIZE, 4096);
    assert_eq!(MAX_FRAME_LEN, 1518);
    assert_eq!(MAX_FRAME_LEN, 1500 + 14 + 4);
    assert_eq!(MAX_JUMBO_FRAME_LEN, 4088);
    assert_eq!(MAX_JUMBO_FRAME_LEN as usize, MAX_PACKET_SIZE - 8);
    assert_eq!(PKT_ST_FREE, 0);
    assert_eq!(PKT_ST_USED, 1);
    assert_eq!(PKT_ST_FILLED, 2);
    assert_eq!(FEAT_FRAME_SIZE, 0x1);
    assert_eq!(FEAT_ALL, FEAT_FRAME_SIZE);
}

#[test]
fn header_offsets_match_the_spec() {
    assert_eq!(HEADER_OFF, 0);
    assert_eq!(HDR_MAGIC, 0x00);
    assert_eq!(HDR_VERSION, 0x04);
    assert_eq!(HDR_VALID, 0x08);
    assert_eq!(HDR_RESET, 0x0C);
    assert_eq!(HDR_FEATURES, 0x10);
    assert_eq!(HDR_REQUEST, 0x14);
    assert_eq!(HDR_MAC, 0x18);
    assert_eq!(HDR_FRAMESZ, 0x20);
    assert_eq!(HDR_SIZE_V1, 32);
    assert_eq!(HDR_SIZE, 36);
    // The MAC's 6 bytes are padded to 8: framesz follows right after.
    assert_eq!(HDR_MAC + 8, HDR_FRAMESZ);
    assert_eq!(HDR_FRAMESZ + 4, HDR_SIZE);
    // The header (with its 1 MiB pad) ends where up.info starts.
    const { assert!(HDR_SIZE <= UP_INFO_OFF) };
}

#[test]
fn area_and_info_offsets_match_the_spec() {
    assert_eq!(UP_INFO_OFF, SPEC_UP_INFO);
    assert_eq!(UP_PACKETS_OFF, SPEC_UP_PACKETS);
    assert_eq!(DOWN_INFO_OFF, SPEC_DOWN_INFO);
    assert_eq!(DOWN_PACKETS_OFF, SPEC_DOWN_PACKETS);
    assert_eq!(Dir::Up.info_off(), 0x10_0000);
    assert_eq!(Dir::Up.packets_off(), 0x20_0000);
    assert_eq!(Dir::Down.info_off(), 0x90_0000);
    assert_eq!(Dir::Down.packets_off(), 0xA0_0000);
    // info: flags u32 @0, free u32 @4, pkts u64 @8, bytes u64 @16; 24 bytes.
    assert_eq!(INFO_FLAGS, 0);
    assert_eq!(INFO_FREE, 4);
    assert_eq!(INFO_PKTS, 8);
    assert_eq!(INFO_BYTES, 16);
    assert_eq!(INFO_SIZE, 24);
    assert_eq!(INFO_PKTS % 8, 0, "u64 naturally aligned");
    // The packet arrays: 4 MiB each, followed by the unused tails.
    assert_eq!(UP_PACKETS_OFF + NR_PACKET * MAX_PACKET_SIZE, 0x60_0000);
    assert_eq!(DOWN_PACKETS_OFF + NR_PACKET * MAX_PACKET_SIZE, 0xE0_0000);
    const { assert!(0xE0_0000 < AREA_SIZE) };
    // The down area starts 8 MiB in (7 MiB up area + 1 MiB reserved): the layout is symmetric.
    assert_eq!(DOWN_INFO_OFF - UP_INFO_OFF, 0x80_0000);
    assert_eq!(DOWN_PACKETS_OFF - UP_PACKETS_OFF, 0x80_0000);
}

#[test]
fn slot_offsets_match_the_spec() {
    assert_eq!(SLOT_STATUS, 0);
    assert_eq!(SLOT_LEN, 4);
    assert_eq!(SLOT_DATA, 8);
    for i in 0..NR_PACKET {
        assert_eq!(
            slot_off(Dir::Up, i),
            0x20_0000 + i * SPEC_SLOT,
            "up slot {i}"
        );
        assert_eq!(
            slot_off(Dir::Down, i),
            0xA0_0000 + i * SPEC_SLOT,
            "down slot {i}"
        );
        assert_eq!(slot_off(Dir::Up, i) % 4096, 0, "slots are 4 KiB aligned");
    }
    assert_eq!(slot_off(Dir::Up, 1023), 0x5F_F000);
    assert_eq!(slot_off(Dir::Down, 1023), 0xDF_F000);
    // Indices wrap modulo NR_PACKET.
    assert_eq!(slot_off(Dir::Up, 1024), 0x20_0000);
    assert_eq!(slot_off(Dir::Down, 1025), 0xA0_1000);
    assert_eq!(next(0), 1);
    assert_eq!(next(1022), 1023);
    assert_eq!(next(1023), 0);
    // A jumbo frame fills the slot exactly.
    assert_eq!(
        slot_off(Dir::Down, 1023) + SLOT_DATA + MAX_JUMBO_FRAME_LEN as usize,
        0xE0_0000
    );
}

/// Checks a freshly created (or re-initialised) region read from the file.
fn check_fresh_header(b: &[u8], features: u32) -> [u8; 6] {
    assert_eq!(&b[0..4], b"vNIC", "magic reads \"vNIC\"");
    assert_eq!(u32_at(b, 0x00), 0x4349_4e76);
    assert_eq!(u32_at(b, 0x04), 1, "version");
    assert_eq!(u32_at(b, 0x08), 0, "valid is 0 before a guest reset");
    assert_eq!(u32_at(b, 0x0C), 0, "reset");
    assert_eq!(u32_at(b, 0x10), features, "features");
    assert_eq!(u32_at(b, 0x14), 0, "request");
    let mac: [u8; 6] = b[0x18..0x1E].try_into().unwrap();
    assert_eq!(mac[0] & 1, 0, "MAC {mac:02x?} is unicast");
    assert_eq!(mac[0] & 2, 2, "MAC {mac:02x?} is locally administered");
    assert_eq!(&b[0x1E..0x20], &[0, 0], "MAC padding");
    assert_eq!(u32_at(b, 0x20), 1518, "framesz");
    for info in [0x10_0000, 0x90_0000] {
        assert_eq!(u32_at(b, info), 0, "info.flags @{info:#x}");
        assert_eq!(u32_at(b, info + 4), 0, "info.free @{info:#x}");
        assert_eq!(u64_at(b, info + 8), 0, "info.pkts @{info:#x}");
        assert_eq!(u64_at(b, info + 16), 0, "info.bytes @{info:#x}");
    }
    check_all_slots_free(b);
    mac
}

fn check_all_slots_free(b: &[u8]) {
    for base in [0x20_0000, 0xA0_0000] {
        for i in 0..1024 {
            let off = base + i * 0x1000;
            assert_eq!(u32_at(b, off), 0, "status of slot {i} at {off:#x}");
        }
    }
}

#[test]
fn host_lays_out_a_fresh_region() {
    let shm = ShmName::new("layout-fresh");
    let host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let b = read_region(&shm);
    let mac = check_fresh_header(&b, FEAT_ALL);
    assert_eq!(
        host.info().mac.0,
        mac,
        "the port reports the MAC in the header"
    );
    assert_eq!(host.info().max_frame_len, 1518);
    assert!(!host.link().up, "no link before a guest reset");
    // The file is exactly the spec's size: no tail beyond 0x1000000.
    assert_eq!(std::fs::metadata(shm.path()).unwrap().len(), 0x100_0000);
}

#[test]
fn v1_host_offers_no_features() {
    let shm = ShmName::new("layout-v1");
    let mut cfg = HostConfig::new(shm.name());
    cfg.frame_size_feature = false;
    let _host = HostPort::create("h", &cfg).unwrap();
    check_fresh_header(&read_region(&shm), 0);
}

#[test]
fn reopening_keeps_the_mac_and_sweeps_the_rings() {
    let shm = ShmName::new("layout-reopen");
    let first = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let mac = first.info().mac;
    drop(first);
    // A previous life left slots FILLED/USED, garbage lengths and a stale valid = 1.
    for (off, v) in [
        (0x20_0000, PKT_ST_FILLED),
        (0x20_0000 + 4, 9999),
        (0x5F_F000, PKT_ST_USED),
        (0xA0_0000, PKT_ST_FILLED),
        (0xDF_F000, 0xdead_beef),
        (0x08, 1),
    ] {
        write_u32(&shm, off, v);
    }
    let again = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    assert_eq!(again.info().mac, mac, "a valid header keeps its MAC");
    let b = read_region(&shm);
    assert_eq!(&b[0x18..0x1E], &mac.0);
    assert_eq!(u32_at(&b, 0x08), 0, "valid is 0 again until a guest resets");
    check_all_slots_free(&b);
}

#[test]
fn wrong_magic_or_version_gets_a_fresh_header() {
    for (off, bad) in [(0x00, 0x4349_4e77u32), (0x00, 0), (0x04, 2), (0x04, 0)] {
        let shm = ShmName::new("layout-bad");
        drop(HostPort::create("h", &HostConfig::new(shm.name())).unwrap());
        // Garbage everywhere in the header, then a wrong magic or version.
        for (o, v) in [
            (0x08, 7u32),
            (0x0C, 5),
            (0x10, 0xffff),
            (0x14, 3),
            (0x18, 0x0101_0101), // multicast, globally administered MAC
            (0x1C, 0xffff_ffff),
            (0x20, 9000),
            (0x10_0008, 1234), // up.info.pkts
            (0x90_0010, 99),   // down.info.bytes
            (0x20_0000, PKT_ST_FILLED),
            (off, bad),
        ] {
            write_u32(&shm, o, v);
        }
        let host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
        let b = read_region(&shm);
        let mac = check_fresh_header(&b, FEAT_ALL);
        assert_eq!(host.info().mac.0, mac);
    }
}

#[test]
fn guest_refuses_a_region_that_is_not_memnic() {
    let shm = ShmName::new("layout-guest");
    drop(HostPort::create("h", &HostConfig::new(shm.name())).unwrap());
    write_u32(&shm, 0x00, 0x1234_5678);
    match GuestPort::attach("g", &GuestConfig::new(shm.name())) {
        Err(MemnicError::NotMemnic { magic }) => assert_eq!(magic, 0x1234_5678),
        other => panic!("expected NotMemnic, got {:?}", other.map(|_| ())),
    }
    write_u32(&shm, 0x00, MAGIC);
    write_u32(&shm, 0x04, 2);
    match GuestPort::attach("g", &GuestConfig::new(shm.name())) {
        Err(MemnicError::Version(2)) => {}
        other => panic!("expected Version(2), got {:?}", other.map(|_| ())),
    }
    // A region smaller than 16 MiB is refused.
    let small = ShmName::new("layout-small");
    std::fs::write(small.path(), vec![0u8; 4096]).unwrap();
    match GuestPort::attach("g", &GuestConfig::new(small.name())) {
        Err(MemnicError::TooSmall { len }) => assert_eq!(len, 4096),
        other => panic!("expected TooSmall, got {:?}", other.map(|_| ())),
    }
    // Nothing was written by the refused attaches.
    let b = read_region(&shm);
    assert_eq!(u32_at(&b, 0x0C), 0, "reset untouched");
}

/// After a guest reset the host has set valid = 1 and the guest sees the host's MAC and features.
#[test]
fn poll_guest_reset_sets_valid() {
    let _serial = common::serial();
    let shm = ShmName::new("layout-valid");
    let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let pool = common::pool("layout", 512, 2048);
    let mut rxq = host.take_rx_queue(0, &pool).unwrap();
    let stop = AtomicBool::new(false);
    let guest = std::thread::scope(|s| {
        s.spawn(|| {
            let mut v = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                rxq.rx_burst(&mut v, 32);
                std::thread::yield_now();
            }
        });
        let g = GuestPort::attach("g", &GuestConfig::new(shm.name()));
        stop.store(true, Ordering::Relaxed);
        g
    })
    .expect("guest attaches while the host polls");
    let b = read_region(&shm);
    assert_eq!(u32_at(&b, 0x08), 1, "valid after the reset");
    assert_eq!(u32_at(&b, 0x0C), 0, "reset cleared by the host");
    assert_eq!(u32_at(&b, 0x14), 0, "request cleared by the host");
    assert_eq!(u32_at(&b, 0x20), 1518, "framesz");
    assert_eq!(guest.info().mac, host.info().mac);
    assert_eq!(guest.features(), FEAT_ALL);
    assert!(guest.link().up && host.link().up);
    assert_eq!(host.resets(), 1);
}

/// A guest wrote a broadcast (then an all-zero) address into the header: a restarted host
/// makes itself a new unicast MAC instead of taking it over; a good one it keeps.
#[test]
fn a_restarted_host_keeps_only_a_unicast_mac_from_the_header() {
    let _serial = common::serial();
    let shm = ShmName::new("raw-mac");
    let cfg = HostConfig::new(shm.name());
    let first = HostPort::create("h", &cfg).unwrap();
    let mac = first.info().mac;
    drop(first);
    let again = HostPort::create("h", &cfg).unwrap();
    assert_eq!(again.info().mac, mac, "a good MAC is kept");
    for bad in [[0xff; 6], [0; 6], [0x01, 0, 0x5e, 0, 0, 1]] {
        again.region().write_bytes(HDR_MAC, &bad).unwrap();
        let h = HostPort::create("h", &cfg).unwrap();
        let m = h.info().mac.0;
        assert!(
            m != bad && m[0] & 1 == 0 && m != [0; 6],
            "{bad:x?} -> {m:x?}"
        );
        assert_eq!(region_mac(&h), m, "the header says the new one");
    }
}

fn region_mac(h: &HostPort) -> [u8; 6] {
    let mut m = [0u8; 6];
    h.region().read_bytes(HDR_MAC, &mut m).unwrap();
    m
}
