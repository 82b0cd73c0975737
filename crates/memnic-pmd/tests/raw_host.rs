//! A host that writes the shared region by hand, as a hostile one would: bad slots a guest
//! must not spend a burst without end on, a frame size it never asked for, and a MAC a guest
//! left in the header for a restarted host.

use memnic_test_support as common;

use std::sync::atomic::{
    AtomicBool,
    Ordering::{Relaxed, Release},
};
use std::sync::Arc;

use common::ShmName;
use memnic_ethdev::Port;
use memnic_pmd::host::{init_region, reset_requested, serve_reset};
use memnic_pmd::layout::*;
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort, Variant};
use memnic_shm::Region;

/// A guest attached to `region`, its reset answered by `answer` (run while it waits).
fn attach_with(
    shm: &ShmName,
    cfg: GuestConfig,
    region: &Region,
    answer: impl Fn(&Region) + Sync,
) -> GuestPort {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Relaxed) {
                if reset_requested(region) {
                    answer(region);
                }
                std::thread::yield_now();
            }
        });
        let g = GuestPort::attach(shm.name(), &cfg);
        stop.store(true, Relaxed);
        g
    })
    .expect("the guest attaches")
}

/// Every slot of the host-to-guest ring FILLED with length 0: one burst of at most one frame
/// takes one slot, in every variant (the 2014 ones took the whole ring, and a host refilling
/// the slots as fast as they were freed kept that burst going for ever).
#[test]
fn a_burst_takes_at_most_max_slots_however_many_are_bad() {
    let _serial = common::serial();
    for v in Variant::ALL {
        let shm = ShmName::new("raw-bad");
        let region = Arc::new(Region::create_shared(shm.name(), AREA_SIZE, 0o600).unwrap());
        init_region(&region, true).unwrap();
        let mut cfg = GuestConfig::new(shm.name());
        cfg.variant = v;
        let mut guest = attach_with(&shm, cfg, &region, |r| {
            serve_reset(r, true);
        });
        let pool = common::pool("raw-bad", 256, 2048);
        let mut rxq = guest.take_rx_queue(0, &pool).unwrap();
        for i in 0..NR_PACKET {
            let off = slot_off(Dir::Up, i);
            region.u32(off + SLOT_LEN).store(0, Relaxed);
            region.u32(off).store(PKT_ST_FILLED, Release);
        }
        let mut got = Vec::new();
        assert_eq!(rxq.rx_burst(&mut got, 1), 0, "{v:?}");
        assert_eq!(rxq.stats().errors, 1, "{v:?}: one slot taken");
        assert_eq!(rxq.rx_burst(&mut got, 4), 0, "{v:?}");
        assert_eq!(rxq.stats().errors, 5, "{v:?}: four more");
    }
}

/// A host that answers a request for 2000-byte frames with 4088 (an honest one answers 2000 or
/// 1518): the guest keeps 1518.
#[test]
fn a_frame_size_the_guest_did_not_ask_for_falls_back_to_1518() {
    let _serial = common::serial();
    let shm = ShmName::new("raw-fsz");
    let region = Region::create_shared(shm.name(), AREA_SIZE, 0o600).unwrap();
    init_region(&region, true).unwrap();
    let mut cfg = GuestConfig::new(shm.name());
    cfg.framesz = Some(2000);
    let answer = |r: &Region, size: u32| {
        r.u32(HDR_FRAMESZ).store(size, Relaxed);
        r.u32(HDR_RESET).store(0, Release);
        r.u32(HDR_VALID).store(1, Release);
    };
    let guest = attach_with(&shm, cfg.clone(), &region, |r| answer(r, 4088));
    assert_eq!(guest.framesz(), 1518);
    drop(guest);
    let guest = attach_with(&shm, cfg, &region, |r| answer(r, 2000));
    assert_eq!(guest.framesz(), 2000, "what it asked for is taken");
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
