//! Frame-size negotiation, oversize frames and bad lengths, and the edges of the reset handshake.
//!
//! One process: a helper thread polls the host while the guest attaches (the host serves a reset
//! only from its rx poll); afterwards the test drives both sides from one thread, so every
//! exchange is deterministic. Where a side is played by raw slot writes, the test writes the
//! region through its own mapping exactly as a peer would.

use memnic_test_support as common;

use std::sync::atomic::{
    AtomicBool,
    Ordering::{Relaxed, Release},
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Receiver, Sender, ShmName, DOWN, UP};
use memnic_ethdev::{Devargs, Mbuf, Mempool, Port, RxQueue, TxQueue};
use memnic_pmd::host::{init_region, reset_requested, serve_reset};
use memnic_pmd::layout::*;
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort, MemnicError, Variant};
use memnic_shm::Region;

/// Host and guest over one region, queues taken.
struct Pair {
    _shm: ShmName,
    host: HostPort,
    hrx: Box<dyn RxQueue>,
    htx: Box<dyn TxQueue>,
    guest: GuestPort,
    grx: Box<dyn RxQueue>,
    gtx: Box<dyn TxQueue>,
    host_pool: Mempool,
    guest_pool: Mempool,
}

fn pair(feature: bool, framesz: Option<u32>, variant: Variant, room: u32) -> Pair {
    let shm = ShmName::new("fs");
    let mut hcfg = HostConfig::new(shm.name());
    hcfg.frame_size_feature = feature;
    let mut host = HostPort::create("h", &hcfg).unwrap();
    let host_pool = common::pool("host", 4096, room);
    let guest_pool = common::pool("guest", 4096, room);
    let mut hrx = host.take_rx_queue(0, &host_pool).unwrap();
    let mut htx = host.take_tx_queue(0, &host_pool).unwrap();
    let mut gcfg = GuestConfig::new(shm.name());
    gcfg.framesz = framesz;
    gcfg.variant = variant;
    gcfg.reset_timeout = Duration::from_secs(20);
    let mut guest =
        common::with_polling_host(&mut *hrx, Some(&mut *htx), || GuestPort::attach("g", &gcfg))
            .expect("attach");
    let grx = guest.take_rx_queue(0, &guest_pool).unwrap();
    let gtx = guest.take_tx_queue(0, &guest_pool).unwrap();
    Pair {
        _shm: shm,
        host,
        hrx,
        htx,
        guest,
        grx,
        gtx,
        host_pool,
        guest_pool,
    }
}

fn frame(pool: &Mempool, len: usize, seq: u64, salt: u64) -> Mbuf {
    let mut m = pool.alloc().expect("pool");
    assert!(m.set_len(len));
    if len >= 16 {
        common::fill(m.as_mut_slice().unwrap(), seq, salt);
    }
    m
}

/// Moves `count` frames of `min..=max` bytes both ways at once, checking each.
fn exchange(p: &mut Pair, count: u64, min: usize, max: usize) {
    let seed = 42;
    let mut up = Sender::new(&p.host_pool, seed, UP, count).sizes(min, max);
    let mut down = Sender::new(&p.guest_pool, seed, DOWN, count).sizes(min, max);
    let mut grx = Receiver::new(&p.guest_pool, seed, UP).sizes(min, max);
    let mut hrx = Receiver::new(&p.host_pool, seed, DOWN).sizes(min, max);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(up.done() && down.done() && grx.count == count && hrx.count == count) {
        up.poll(&mut *p.htx);
        down.poll(&mut *p.gtx);
        grx.poll(&mut *p.grx);
        hrx.poll(&mut *p.hrx);
        assert!(
            Instant::now() < deadline,
            "stalled: up {}/{} down {}/{}",
            grx.count,
            up.taken,
            hrx.count,
            down.taken
        );
    }
}

fn header(region: &Region, off: usize) -> u32 {
    region.u32(off).load(Relaxed)
}

#[test]
fn poll_jumbo_4088_is_negotiated_and_passes_both_ways() {
    let _serial = common::serial();
    let mut p = pair(true, Some(4088), Variant::Memnic, 4088);
    assert_eq!(p.guest.framesz(), 4088);
    assert_eq!(p.host.framesz(), 4088);
    assert_eq!(p.guest.info().max_frame_len, 4088);
    assert_eq!(p.host.info().max_frame_len, 4088);
    assert_eq!(
        header(p.host.region(), HDR_FRAMESZ),
        4088,
        "accepted value written back"
    );
    assert_eq!(header(p.host.region(), HDR_REQUEST), 0, "request cleared");
    // Full-size frames, more than a ring's worth so both rings wrap; then mixed sizes.
    exchange(&mut p, 3000, 4088, 4088);
    let (hr, ht) = p.host.queue_stats();
    let (gr, gt) = p.guest.queue_stats();
    for s in [hr[0], ht[0], gr[0], gt[0]] {
        assert_eq!(s.packets, 3000, "{s:?}");
        assert_eq!(s.bytes, 3000 * 4088, "{s:?}");
        assert_eq!((s.drops, s.errors, s.nombuf), (0, 0, 0), "{s:?}");
    }
}

#[test]
fn poll_jumbo_frames_on_the_2014_variants() {
    let _serial = common::serial();
    for v in [Variant::After2014, Variant::Before2014] {
        let mut p = pair(true, Some(4088), v, 4088);
        assert_eq!(p.guest.framesz(), 4088, "{v:?}");
        exchange(&mut p, 1500, 60, 4088);
        exchange(&mut p, 1100, 4088, 4088);
    }
}

#[test]
fn frame_size_outside_the_range_is_refused_at_config_time() {
    let shm = ShmName::new("fs-bad");
    let host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    for f in [9000, 1000, 0, 1517, 4089, u32::MAX] {
        let mut cfg = GuestConfig::new(shm.name());
        cfg.framesz = Some(f);
        match GuestPort::attach("g", &cfg) {
            Err(MemnicError::FrameSize(x)) => assert_eq!(x, f),
            other => panic!(
                "framesz {f}: expected FrameSize, got {:?}",
                other.map(|_| ())
            ),
        }
        let text = format!("memnic0,path={},role=guest,framesz={f}", shm.name());
        let args = Devargs::parse(&text, memnic_pmd::DEVARGS_KEYS).unwrap();
        assert!(memnic_pmd::open(&args).is_err(), "{text} must be refused");
    }
    // Refused before anything was asked of the host.
    let r = host.region();
    assert_eq!(header(r, HDR_RESET), 0);
    assert_eq!(header(r, HDR_REQUEST), 0);
    assert_eq!(header(r, HDR_FRAMESZ), 1518);
}

#[test]
fn poll_v1_host_keeps_1518_when_4088_is_requested() {
    let _serial = common::serial();
    let mut p = pair(false, Some(4088), Variant::Memnic, 4088);
    assert_eq!(p.guest.features(), 0);
    assert_eq!(p.guest.framesz(), 1518);
    assert_eq!(p.host.framesz(), 1518);
    assert_eq!(header(p.host.region(), HDR_FRAMESZ), 1518);
    exchange(&mut p, 1100, 1518, 1518);
    // The guest does not send what the host would not accept.
    let mut v = vec![frame(&p.guest_pool, 1519, 0, DOWN)];
    assert_eq!(p.gtx.tx_burst(&mut v), 0);
    assert_eq!(v.len(), 1);
}

/// The host's side of the negotiation (`specs/memnic.md` §4 step 3), table-driven.
#[test]
fn serve_reset_accepts_only_frame_sizes_in_range() {
    let shm = ShmName::new("fs-serve");
    let region = Region::create_shared(shm.name(), AREA_SIZE, 0o600).unwrap();
    init_region(&region, true).unwrap();
    // (host offers the feature, request, requested framesz) -> accepted
    let table = [
        (true, FEAT_FRAME_SIZE, 4088, 4088),
        (true, FEAT_FRAME_SIZE, 1518, 1518),
        (true, FEAT_FRAME_SIZE, 2000, 2000),
        (true, FEAT_FRAME_SIZE, 9000, 1518),
        (true, FEAT_FRAME_SIZE, 1000, 1518),
        (true, FEAT_FRAME_SIZE, 1517, 1518),
        (true, FEAT_FRAME_SIZE, 4089, 1518),
        (true, FEAT_FRAME_SIZE, 0, 1518),
        (true, 0, 4088, 1518),
        (true, 0xffff_fffe, 4088, 1518),
        (true, 0xffff_ffff, 3000, 3000),
        (false, FEAT_FRAME_SIZE, 4088, 1518),
        (false, FEAT_FRAME_SIZE, 2000, 1518),
    ];
    for (feature, request, want, accepted) in table {
        region.u32(HDR_REQUEST).store(request, Relaxed);
        region.u32(HDR_FRAMESZ).store(want, Relaxed);
        region.u32(HDR_RESET).store(1, Relaxed);
        region.u32(HDR_VALID).store(0, Relaxed);
        assert!(reset_requested(&region));
        let out = serve_reset(&region, feature);
        let case = format!("feature {feature}, request {request:#x}, framesz {want}");
        assert_eq!(out.framesz, accepted, "{case}");
        assert_eq!(
            header(&region, HDR_FRAMESZ),
            accepted,
            "{case}: written back"
        );
        assert_eq!(header(&region, HDR_REQUEST), 0, "{case}: request cleared");
        assert_eq!(header(&region, HDR_RESET), 0, "{case}: reset cleared");
        assert_eq!(header(&region, HDR_VALID), 1, "{case}: valid");
        assert!(!reset_requested(&region));
    }
}

#[test]
fn poll_guest_tx_stops_at_an_oversize_frame() {
    let _serial = common::serial();
    for v in Variant::ALL {
        let mut p = pair(true, None, v, 4088);
        assert_eq!(p.guest.framesz(), 1518);
        let mut burst = vec![frame(&p.guest_pool, 1519, 0, DOWN)];
        assert_eq!(p.gtx.tx_burst(&mut burst), 0, "{v:?}: 1519 bytes not sent");
        assert_eq!(burst.len(), 1, "{v:?}: the frame stays with the caller");
        burst = vec![
            frame(&p.guest_pool, 1518, 0, DOWN),
            frame(&p.guest_pool, 1519, 1, DOWN),
            frame(&p.guest_pool, 100, 2, DOWN),
        ];
        assert_eq!(
            p.gtx.tx_burst(&mut burst),
            1,
            "{v:?}: the burst stops at 1519"
        );
        assert_eq!(
            burst.iter().map(|m| m.len()).collect::<Vec<_>>(),
            [1519, 100]
        );
        let st = p.gtx.stats();
        assert_eq!(
            (st.packets, st.bytes, st.drops),
            (1, 1518, 0),
            "{v:?}: {st:?}"
        );
        let mut got = Vec::new();
        assert_eq!(p.hrx.rx_burst(&mut got, 32), 1);
        assert_eq!(got[0].len(), 1518);
        assert_eq!(common::check(&got[0].to_vec()), Ok(0));
        assert_eq!(
            p.hrx.rx_burst(&mut got, 32),
            0,
            "{v:?}: nothing else in the ring"
        );
    }
}

#[test]
fn poll_host_tx_drops_an_oversize_frame_and_counts_it() {
    let _serial = common::serial();
    let mut p = pair(true, None, Variant::Memnic, 4088);
    let mut burst = vec![
        frame(&p.host_pool, 100, 0, UP),
        frame(&p.host_pool, 1519, 1, UP),
        frame(&p.host_pool, 4088, 2, UP),
        frame(&p.host_pool, 1518, 3, UP),
    ];
    assert_eq!(
        p.htx.tx_burst(&mut burst),
        4,
        "the host takes (drops) oversize frames"
    );
    assert!(burst.is_empty());
    let st = p.htx.stats();
    assert_eq!((st.packets, st.bytes, st.drops), (2, 1618, 2), "{st:?}");
    let mut got = Vec::new();
    assert_eq!(p.grx.rx_burst(&mut got, 32), 2);
    let seqs: Vec<_> = got
        .iter()
        .map(|m| common::check(&m.to_vec()).unwrap())
        .collect();
    assert_eq!(seqs, [0, 3]);
}

/// Writes a frame into slot `i` of `dir` as a peer would: len, data, then FILLED.
/// A frame of `segs` segments, each filled with its own byte, and the bytes it should arrive as.
fn chained(pool: &Mempool, segs: &[usize], tag: u8) -> (Mbuf, Vec<u8>) {
    let mut head: Option<Mbuf> = None;
    let mut bytes = Vec::new();
    for (j, &n) in segs.iter().enumerate() {
        let b = tag.wrapping_add(j as u8);
        let mut m = pool.alloc().expect("pool");
        m.append(n).expect("room").fill(b);
        bytes.extend(std::iter::repeat_n(b, n));
        match head.as_mut() {
            None => head = Some(m),
            Some(h) => assert!(h.chain(m).is_ok(), "chain"),
        }
    }
    (head.expect("a segment"), bytes)
}

/// Frames of several segments, short ones too (one-segment frames of their size are written
/// another way), mixed with one-segment frames in one burst, arrive whole and in order, both
/// ways, on every variant.
#[test]
fn poll_chained_frames_arrive_whole_both_ways() {
    let _serial = common::serial();
    let layouts: [&[usize]; 7] = [
        &[60, 40],
        &[64],
        &[100, 1000],
        &[128],
        &[30, 30, 30],
        &[8, 120],
        &[1518],
    ];
    for v in Variant::ALL {
        let mut p = pair(false, None, v, 2048);
        for up in [true, false] {
            let (pool, tx, rx) = if up {
                (&p.host_pool, &mut p.htx, &mut p.grx)
            } else {
                (&p.guest_pool, &mut p.gtx, &mut p.hrx)
            };
            let mut burst = Vec::new();
            let mut want = Vec::new();
            for (k, segs) in layouts.iter().enumerate() {
                let (m, bytes) = chained(pool, segs, 16 * k as u8 + 1);
                burst.push(m);
                want.push(bytes);
            }
            assert_eq!(tx.tx_burst(&mut burst), layouts.len(), "{v:?} up={up}");
            let mut got = Vec::new();
            assert_eq!(rx.rx_burst(&mut got, 32), layouts.len(), "{v:?} up={up}");
            for (k, m) in got.iter().enumerate() {
                assert!(
                    m.to_vec() == want[k],
                    "{v:?} up={up}: frame {k} {:?}",
                    layouts[k]
                );
            }
        }
    }
}

fn raw_put(region: &Region, dir: Dir, i: usize, len: u32, data: &[u8]) {
    let off = slot_off(dir, i);
    region.u32(off + SLOT_LEN).store(len, Relaxed);
    region.write_bytes(off + SLOT_DATA, data).unwrap();
    region
        .u32(off)
        .store(PKT_ST_FILLED, std::sync::atomic::Ordering::Release);
}

fn statuses(region: &Region, dir: Dir, n: usize) -> Vec<u32> {
    (0..n).map(|i| header(region, slot_off(dir, i))).collect()
}

fn good(len: usize, seq: u64, salt: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    common::fill(&mut v, seq, salt);
    v
}

/// A raw guest (the test writing the region) feeds the host bad lengths: each is counted as an
/// error, its slot handed back, and the good frame after them is delivered intact.
#[test]
fn host_rx_counts_bad_lengths_and_frees_the_slots() {
    let shm = ShmName::new("fs-hostbad");
    for (request, framesz) in [(0, 1518u32), (FEAT_FRAME_SIZE, 4088)] {
        let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
        let pool = common::pool("host", 256, 4088);
        let mut rxq = host.take_rx_queue(0, &pool).unwrap();
        let region = host.region().clone();
        // The raw guest's reset request; the host serves it on its next rx poll.
        region.u32(HDR_REQUEST).store(request, Relaxed);
        region.u32(HDR_FRAMESZ).store(framesz, Relaxed);
        region
            .u32(HDR_RESET)
            .store(1, std::sync::atomic::Ordering::Release);
        let mut got = Vec::new();
        assert_eq!(rxq.rx_burst(&mut got, 32), 0);
        assert!(host.link().up);
        assert_eq!(host.framesz(), framesz);
        let bads = [framesz + 1, 0, 5000, 4089, u32::MAX, 0x8000_0000];
        for (i, &len) in bads.iter().enumerate() {
            raw_put(&region, Dir::Down, i, len, &[0xAB; 64]);
        }
        let ok = good(framesz as usize, 7, DOWN);
        raw_put(&region, Dir::Down, bads.len(), framesz, &ok);
        assert_eq!(rxq.rx_burst(&mut got, 32), 1, "framesz {framesz}");
        assert_eq!(got[0].to_vec(), ok[..]);
        let st = rxq.stats();
        assert_eq!(st.errors, bads.len() as u64, "framesz {framesz}: {st:?}");
        assert_eq!((st.packets, st.bytes), (1, framesz as u64), "{st:?}");
        assert_eq!(
            statuses(&region, Dir::Down, bads.len() + 2),
            vec![PKT_ST_FREE; bads.len() + 2],
            "every slot handed back"
        );
        drop(got);
    }
}

/// A pool too small for the negotiated frame size: the frame is counted, not overrun.
#[test]
fn host_rx_with_small_buffers_counts_jumbo_frames_as_errors() {
    let shm = ShmName::new("fs-small");
    let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let pool = common::pool("host", 256, 2048);
    let mut rxq = host.take_rx_queue(0, &pool).unwrap();
    let region = host.region().clone();
    region.u32(HDR_REQUEST).store(FEAT_FRAME_SIZE, Relaxed);
    region.u32(HDR_FRAMESZ).store(4088, Relaxed);
    region
        .u32(HDR_RESET)
        .store(1, std::sync::atomic::Ordering::Release);
    let mut got = Vec::new();
    assert_eq!(rxq.rx_burst(&mut got, 32), 0);
    assert_eq!(host.framesz(), 4088);
    raw_put(&region, Dir::Down, 0, 4000, &good(4000, 0, DOWN));
    let ok = good(2000, 1, DOWN);
    raw_put(&region, Dir::Down, 1, 2000, &ok);
    assert_eq!(rxq.rx_burst(&mut got, 32), 1);
    assert_eq!(got[0].to_vec(), ok[..]);
    assert_eq!(rxq.stats().errors, 1);
    assert_eq!(statuses(&region, Dir::Down, 2), [PKT_ST_FREE, PKT_ST_FREE]);
}

/// A guest attached to `region` while a raw host answers its reset with `answer`.
fn attach_with(cfg: &GuestConfig, region: &Region, answer: impl Fn(&Region) + Sync) -> GuestPort {
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
        let g = GuestPort::attach("g", cfg);
        stop.store(true, Relaxed);
        g
    })
    .expect("attach")
}

/// A fresh region (`tag`), its host played raw: a guest of variant `v` attached while resets
/// are served.
fn served_guest(tag: &str, v: Variant) -> (ShmName, Arc<Region>, GuestPort) {
    let shm = ShmName::new(tag);
    let region = Arc::new(Region::create_shared(shm.name(), AREA_SIZE, 0o600).unwrap());
    init_region(&region, true).unwrap();
    let mut cfg = GuestConfig::new(shm.name());
    cfg.variant = v;
    let guest = attach_with(&cfg, &region, |r| {
        serve_reset(r, true);
    });
    (shm, region, guest)
}

/// A raw host feeds the guest bad lengths, for each guest variant.
#[test]
fn poll_guest_rx_counts_bad_lengths_and_frees_the_slots() {
    let _serial = common::serial();
    for v in Variant::ALL {
        let (_shm, region, mut guest) = served_guest("fs-guestbad", v);
        let pool = common::pool("guest", 256, 2048);
        let mut rxq = guest.take_rx_queue(0, &pool).unwrap();
        let bads = [1519u32, 0, 4088, 4089, u32::MAX];
        for (i, &len) in bads.iter().enumerate() {
            raw_put(&region, Dir::Up, i, len, &[0xCD; 64]);
        }
        let ok = good(1518, 9, UP);
        raw_put(&region, Dir::Up, bads.len(), 1518, &ok);
        let mut got = Vec::new();
        assert_eq!(rxq.rx_burst(&mut got, 32), 1, "{v:?}");
        assert_eq!(got[0].to_vec(), ok[..], "{v:?}");
        let st = rxq.stats();
        assert_eq!(st.errors, bads.len() as u64, "{v:?}: {st:?}");
        assert_eq!(st.packets, 1, "{v:?}: {st:?}");
        assert_eq!(
            statuses(&region, Dir::Up, bads.len() + 2),
            vec![PKT_ST_FREE; bads.len() + 2],
            "{v:?}: every slot handed back"
        );
    }
}

/// A guest reset while one of the guest's queues is taken but never polled: the reset goes
/// through, the polled rx queue resumes at slot 0 with the host, and the idle tx queue, polled
/// for the first time afterwards, starts at slot 0 too. Frames in the ring at the reset are the
/// ones the host counts as discarded; everything else arrives in order.
#[test]
fn poll_reset_with_an_idle_guest_queue() {
    let _serial = common::serial();
    let shm = ShmName::new("fs-idlereset");
    let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let pool = common::pool("p", 4096, 2048);
    let mut hrx = host.take_rx_queue(0, &pool).unwrap();
    let mut htx = host.take_tx_queue(0, &pool).unwrap();
    let mut cfg = GuestConfig::new(shm.name());
    cfg.reset_timeout = Duration::from_secs(10);
    let mut guest =
        common::with_polling_host(&mut *hrx, Some(&mut *htx), || GuestPort::attach("g", &cfg))
            .expect("attach");
    let (mut grx, mut gtx) = guest.take_queue_pair(&pool).unwrap();
    let mut up = Sender::new(&pool, 1, UP, 3000);
    up.burst = 10;
    assert_eq!(up.poll(&mut *htx), 10, "10 frames into the ring");
    let mut rx = Receiver::new(&pool, 1, UP).gaps();
    let mut got = Vec::new();
    assert_eq!(grx.burst(&mut got, 5), 5, "5 read before the reset");
    for m in got.drain(..) {
        assert_eq!(common::check(&m.to_vec()), Ok(rx.expect));
        rx.expect += 1;
        rx.count += 1;
    }
    let mut idle = Vec::new();
    let r = std::thread::scope(|s| {
        let h = s.spawn(|| guest.reset());
        while !h.is_finished() {
            rx.poll(&mut grx);
            hrx.rx_burst(&mut idle, 32);
            htx.tx_burst(&mut idle);
        }
        h.join().unwrap()
    });
    assert_eq!(r.expect("the idle tx queue does not hold the reset"), 1518);
    assert_eq!(host.resets(), 2);
    let deadline = Instant::now() + Duration::from_secs(20);
    up.burst = 32;
    while !(up.done() && rx.count + rx.lost == 3000) {
        up.poll(&mut *htx);
        rx.poll(&mut grx);
        assert!(Instant::now() < deadline, "stalled at {} frames", rx.count);
    }
    assert_eq!(rx.lost, host.reset_discards(), "lost = swept by the reset");
    assert_eq!(rx.count + host.reset_discards(), 3000);
    // The tx queue's first burst ever comes after the reset: it must start where the host reads.
    let mut down = Sender::new(&pool, 1, DOWN, 2000);
    let mut hr = Receiver::new(&pool, 1, DOWN);
    while !(down.done() && hr.count == 2000) {
        down.poll(&mut gtx);
        hr.poll(&mut *hrx);
        assert!(
            Instant::now() < deadline,
            "down stalled at {} frames",
            hr.count
        );
    }
}

/// A host that takes a tx queue but has nothing to send (never calls tx_burst, as testpmd's
/// rxonly mode does) must still serve a guest's reset.
#[test]
fn poll_idle_host_tx_queue_does_not_block_a_reset() {
    let _serial = common::serial();
    let shm = ShmName::new("fs-idle");
    let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let pool = common::pool("p", 1024, 2048);
    let mut hrx = host.take_rx_queue(0, &pool).unwrap();
    let _htx_idle = host.take_tx_queue(0, &pool).unwrap();
    let mut cfg = GuestConfig::new(shm.name());
    cfg.reset_timeout = Duration::from_secs(2);
    let r = common::with_polling_host(&mut *hrx, None, || GuestPort::attach("g", &cfg));
    assert!(r.is_ok(), "{:?}", r.err());
}

/// A dropped host tx queue no longer takes part in resets.
#[test]
fn poll_dropped_host_tx_queue_does_not_block_a_reset() {
    let _serial = common::serial();
    let shm = ShmName::new("fs-dropped");
    let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let pool = common::pool("p", 1024, 2048);
    let mut hrx = host.take_rx_queue(0, &pool).unwrap();
    drop(host.take_tx_queue(0, &pool).unwrap());
    let mut cfg = GuestConfig::new(shm.name());
    cfg.reset_timeout = Duration::from_secs(10);
    let g = common::with_polling_host(&mut *hrx, None, || GuestPort::attach("g", &cfg));
    assert!(g.is_ok(), "{:?}", g.err());
}

/// Nobody polls the host: the guest's attach gives up with NoHost (it does not hang).
#[test]
fn attach_without_a_polling_host_times_out() {
    let shm = ShmName::new("fs-nohost");
    let _host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let mut cfg = GuestConfig::new(shm.name());
    cfg.reset_timeout = Duration::from_millis(200);
    match GuestPort::attach("g", &cfg) {
        Err(MemnicError::NoHost { .. }) => {}
        other => panic!("expected NoHost, got {:?}", other.map(|_| ())),
    }
}

/// Repeated resets between bursts: each one empties the rings, both sides restart at slot 0 and
/// frames keep passing, in order within each epoch.
#[test]
fn poll_repeated_resets_between_bursts() {
    let _serial = common::serial();
    let mut p = pair(true, None, Variant::Memnic, 2048);
    for round in 0..5u64 {
        // Some frames left in both rings when the reset comes.
        let mut up = vec![];
        let mut down = vec![];
        for i in 0..40 {
            up.push(frame(&p.host_pool, 200, round * 1000 + i, UP));
            down.push(frame(&p.guest_pool, 300, round * 1000 + i, DOWN));
        }
        assert_eq!(p.htx.tx_burst(&mut up), 40);
        assert_eq!(p.gtx.tx_burst(&mut down), 40);
        let before = (p.host.reset_discards(), p.hrx.stats().drops);
        let (guest, grx, gtx, hrx, htx) =
            (&mut p.guest, &mut p.grx, &mut p.gtx, &mut p.hrx, &mut p.htx);
        // Frames read before the reset parks the queues are delivered; the rest are swept.
        let mut read = [0u64; 2];
        let r = std::thread::scope(|s| {
            let h = s.spawn(|| guest.reset());
            let mut v = Vec::new();
            let mut idle = Vec::new();
            while !h.is_finished() {
                for (k, n) in [grx.rx_burst(&mut v, 32), hrx.rx_burst(&mut v, 32)]
                    .into_iter()
                    .enumerate()
                {
                    read[k] += n as u64;
                }
                gtx.tx_burst(&mut idle);
                htx.tx_burst(&mut idle);
                for m in v.drain(..) {
                    let seq = common::check(&m.to_vec()).unwrap();
                    assert!(seq / 1000 == round, "round {round}: stale frame {seq}");
                }
            }
            h.join().unwrap()
        });
        assert_eq!(r.unwrap(), 1518);
        let swept_up = p.host.reset_discards() - before.0;
        let swept_down = p.hrx.stats().drops - before.1;
        assert_eq!(swept_up + read[0], 40, "round {round}: up read or swept");
        assert_eq!(
            swept_down + read[1],
            40,
            "round {round}: down read or swept"
        );
        assert_eq!(
            statuses(p.host.region(), Dir::Up, NR_PACKET),
            vec![0; NR_PACKET]
        );
        assert_eq!(
            statuses(p.host.region(), Dir::Down, NR_PACKET),
            vec![0; NR_PACKET]
        );
        // Traffic after the reset, starting again at slot 0 on both sides.
        let mut up = vec![frame(&p.host_pool, 100, 1, UP)];
        assert_eq!(p.htx.tx_burst(&mut up), 1);
        assert_eq!(header(p.host.region(), slot_off(Dir::Up, 0)), PKT_ST_FILLED);
        let mut got = Vec::new();
        assert_eq!(p.grx.rx_burst(&mut got, 32), 1);
        assert_eq!(common::check(&got[0].to_vec()), Ok(1));
    }
    assert_eq!(p.host.resets(), 6);
}

/// A host that polls no rx queue (txonly forwarding) serves the guest's reset from its control
/// path (`Port::service`), and then sends.
#[test]
fn poll_host_service_serves_a_reset_without_an_rx_queue() {
    let _serial = common::serial();
    let shm = ShmName::new("fs-service");
    let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let pool = common::pool("p", 4096, 2048);
    let mut htx = host.take_tx_queue(0, &pool).unwrap();
    let mut cfg = GuestConfig::new(shm.name());
    cfg.reset_timeout = Duration::from_secs(10);
    let stop = AtomicBool::new(false);
    let mut guest = std::thread::scope(|s| {
        let host = &mut host;
        let stop = &stop;
        s.spawn(move || {
            while !stop.load(Relaxed) {
                host.service();
                std::thread::yield_now();
            }
        });
        let g = GuestPort::attach("g", &cfg);
        stop.store(true, Relaxed);
        g
    })
    .expect("attach served by Port::service");
    assert!(host.link().up);
    let mut grx = guest.take_rx_queue(0, &pool).unwrap();
    let mut up = Sender::new(&pool, 3, UP, 3000);
    let mut rx = Receiver::new(&pool, 3, UP);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(up.done() && rx.count == 3000) {
        up.poll(&mut *htx);
        rx.poll(&mut *grx);
        assert!(Instant::now() < deadline, "stalled at {} frames", rx.count);
    }
}

/// Every slot of the host-to-guest ring FILLED with length 0: one burst of at most one frame
/// takes one slot, in every variant (the 2014 ones took the whole ring, and a host refilling
/// the slots as fast as they were freed kept that burst going for ever).
#[test]
fn a_burst_takes_at_most_max_slots_however_many_are_bad() {
    let _serial = common::serial();
    for v in Variant::ALL {
        let (_shm, region, mut guest) = served_guest("raw-bad", v);
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
    let guest = attach_with(&cfg, &region, |r| answer(r, 4088));
    assert_eq!(guest.framesz(), 1518);
    drop(guest);
    let guest = attach_with(&cfg, &region, |r| answer(r, 2000));
    assert_eq!(guest.framesz(), 2000, "what it asked for is taken");
}
