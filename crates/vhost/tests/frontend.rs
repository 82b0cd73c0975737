//! Our backend driven by rust-vmm's vhost-user frontend over a real socket, with guest memory
//! in a memfd that the test writes as a hostile guest would: valid frames arrive, every bad
//! chain is refused and returned (counted, with its reason), GET_VRING_BASE tells where the
//! ring got to, a message with a bad value closes the connection with a reason, and the next
//! frontend is served.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use memnic_ethdev::{Mbuf, Port, RxQueue};
use memnic_shm::Region;
use memnic_vhost::chain::ChainError;
use memnic_vhost::split::{Desc, DESC_F_NEXT};
use memnic_vhost::{VhostConfig, VhostPort};
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

const UVA: u64 = 0x7000_0000_0000;
const SIZE: usize = 1 << 20;
const Q: u16 = 8;
const DESC: u64 = 0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const BUF: u64 = 0x10000;
const VERSION_1: u64 = 1 << 32;
const PROTOCOL_FEATURES: u64 = 1 << 30;
/// virtio-net header bytes with VERSION_1.
const HDR: usize = 12;

struct Guest {
    mem: Region,
    fd: File,
}

impl Guest {
    fn new() -> Guest {
        let mem = Region::memfd("fe-guest", SIZE, false).unwrap();
        let fd = File::from(mem.fd().unwrap().try_clone_to_owned().unwrap());
        Guest { mem, fd }
    }
    fn desc(&self, i: u16, d: Desc) {
        self.mem
            .write_bytes((DESC + 16 * i as u64) as usize, &d.to_bytes())
            .unwrap();
    }
    /// Makes chain `head` available as entry `idx` and publishes avail.idx = idx + 1.
    fn offer(&self, idx: u16, head: u16) {
        let at = AVAIL as usize + 4 + 2 * (idx % Q) as usize;
        self.mem
            .u16(at)
            .store(head, std::sync::atomic::Ordering::Relaxed);
        self.set_avail_idx(idx.wrapping_add(1));
    }
    fn set_avail_idx(&self, v: u16) {
        self.mem
            .u16(AVAIL as usize + 2)
            .store(v, std::sync::atomic::Ordering::Release);
    }
    fn used_idx(&self) -> u16 {
        self.mem
            .u16(USED as usize + 2)
            .load(std::sync::atomic::Ordering::Acquire)
    }
    /// A tx frame at `BUF + slot * 0x1000`: a zero header, then `len` bytes of `fill`.
    fn frame(&self, slot: u64, len: usize, fill: u8) -> (u64, u32) {
        let at = BUF + slot * 0x1000;
        let mut b = vec![0u8; HDR + len];
        b[HDR..].fill(fill);
        self.mem.write_bytes(at as usize, &b).unwrap();
        (at, (HDR + len) as u32)
    }
}

/// A frontend that sets up the guest's tx virtqueue (index 1) over `g`'s memory. With
/// `reply_ack`, PROTOCOL_FEATURES and REPLY_ACK are negotiated (every request waits for our
/// answer, as QEMU's SET_MEM_TABLE does) and the ring is enabled explicitly; without, the ring
/// runs as soon as it starts and requests are not acknowledged.
fn frontend(path: &str, g: &Guest, kick: &EventFd, reply_ack: bool) -> Frontend {
    let mut f = Frontend::connect(path, 2).unwrap();
    f.set_owner().unwrap();
    assert!(f.get_features().unwrap() & VERSION_1 != 0);
    if reply_ack {
        f.set_features(VERSION_1 | PROTOCOL_FEATURES).unwrap();
        let p = f.get_protocol_features().unwrap();
        assert!(p.contains(VhostUserProtocolFeatures::REPLY_ACK));
        f.set_protocol_features(VhostUserProtocolFeatures::REPLY_ACK)
            .unwrap();
        f.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    } else {
        f.set_features(VERSION_1).unwrap();
    }
    f.set_mem_table(&[VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: SIZE as u64,
        userspace_addr: UVA,
        mmap_offset: 0,
        mmap_handle: g.fd.as_raw_fd(),
    }])
    .unwrap();
    f.set_vring_num(1, Q).unwrap();
    f.set_vring_addr(
        1,
        &VringConfigData {
            queue_max_size: Q,
            queue_size: Q,
            flags: 0,
            desc_table_addr: UVA + DESC,
            used_ring_addr: UVA + USED,
            avail_ring_addr: UVA + AVAIL,
            log_addr: None,
        },
    )
    .unwrap();
    f.set_vring_base(1, 0).unwrap();
    f.set_vring_kick(1, kick).unwrap();
    if reply_ack {
        f.set_vring_enable(1, true).unwrap();
    }
    f
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> Desc {
    Desc {
        addr,
        len,
        flags,
        next,
    }
}

/// Polls `rxq` until `until` holds (or 5 s pass).
fn poll(rxq: &mut dyn RxQueue, got: &mut Vec<Mbuf>, what: &str, until: impl Fn(&[Mbuf]) -> bool) {
    let end = Instant::now() + Duration::from_secs(5);
    while !until(got) {
        assert!(Instant::now() < end, "{what}: not within 5 s");
        rxq.rx_burst(got, 32);
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_hostile_guest_and_a_hostile_frontend_are_refused_and_the_next_is_served() {
    let dir = std::env::temp_dir().join(format!("memnic-fe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("vhost.sock").display().to_string();
    let mut port = VhostPort::new("vhost0", VhostConfig::new(&path)).unwrap();
    let pool = memnic_test_support::pool("fe", 256, 2048);
    let mut rxq = port.take_rx_queue(0, &pool).unwrap();
    let g = Guest::new();
    let kick = EventFd::new(0).unwrap();
    let f = frontend(&path, &g, &kick, false);
    let end = Instant::now() + Duration::from_secs(5);
    while !port.link().up {
        assert!(Instant::now() < end, "link up");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut got = Vec::new();

    // A valid frame arrives whole, its header stripped; its chain comes back used.
    let (a, l) = g.frame(0, 60, 0xab);
    g.desc(0, d(a, l, 0, 0));
    g.offer(0, 0);
    poll(&mut *rxq, &mut got, "a valid frame", |v| v.len() == 1);
    assert_eq!(got[0].to_vec(), vec![0xab; 60]);
    assert_eq!(g.used_idx(), 1);

    // Hostile chains: each is returned unused and counted, and nothing is received.
    let bad: [(Desc, ChainError); 4] = [
        (d(a, l, DESC_F_NEXT, 1), ChainError::TooLong), // desc 1 points at itself
        (
            d(0xdead_0000_0000, 64, 0, 0),
            ChainError::Unmapped {
                addr: 0xdead_0000_0000,
                len: 64,
            },
        ),
        (d(a, 5, 0, 0), ChainError::ShortHeader(5)),
        (
            d(a, 64, DESC_F_NEXT, 200),
            ChainError::IndexOutOfRange {
                index: 200,
                size: Q,
            },
        ),
    ];
    for (k, (desc, why)) in bad.into_iter().enumerate() {
        g.desc(1, desc);
        let idx = 1 + k as u16;
        g.offer(idx, 1);
        let end = Instant::now() + Duration::from_secs(5);
        while g.used_idx() != idx + 1 {
            assert!(Instant::now() < end, "{why}: chain not returned");
            rxq.rx_burst(&mut got, 32);
        }
        assert_eq!(got.len(), 1, "{why}: nothing received");
        assert_eq!(port.bad_chains(), k as u64 + 1, "{why}");
    }
    // A head past the queue.
    g.offer(5, 77);
    poll(&mut *rxq, &mut got, "head 77", |_| g.used_idx() == 6);
    assert_eq!(port.bad_chains(), 5);

    // GET_VRING_BASE stops the ring and says where it got to.
    assert_eq!(f.get_vring_base(1).unwrap(), 6);

    // A message with a bad value (a queue size that is no power of two) ends the connection,
    // with a reason, and the link goes down.
    let _ = f.set_vring_num(1, 3);
    let end = Instant::now() + Duration::from_secs(5);
    while port.link().up || port.disconnects() == 0 {
        assert!(Instant::now() < end, "disconnect");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(port.last_reason().is_some());
    drop(f);

    // The next frontend is served: ring from 0 again, a valid frame arrives.
    let g2 = Guest::new();
    let _f2 = frontend(&path, &g2, &kick, false);
    let (a, l) = g2.frame(0, 100, 0x5a);
    g2.desc(0, d(a, l, 0, 0));
    g2.offer(0, 0);
    poll(&mut *rxq, &mut got, "the next frontend's frame", |v| {
        v.len() == 2
    });
    assert_eq!(got[1].to_vec(), vec![0x5a; 100]);
    assert_eq!(port.connects(), 2);
    drop(rxq);
    drop(port);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SET_MEM_TABLE while the ring runs (memory hot-added, as QEMU sends it, waiting for our
/// REPLY_ACK before it uses the new memory): the ring goes on where it was, a frame in the new
/// region arrives, and one across the seam of the two regions too.
#[test]
fn a_memory_table_replaced_while_running_keeps_the_ring_and_maps_the_new_region() {
    let dir = std::env::temp_dir().join(format!("memnic-fe2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("vhost.sock").display().to_string();
    let mut port = VhostPort::new("vhost0", VhostConfig::new(&path)).unwrap();
    let pool = memnic_test_support::pool("fe2", 256, 2048);
    let mut rxq = port.take_rx_queue(0, &pool).unwrap();
    let g = Guest::new();
    let kick = EventFd::new(0).unwrap();
    let f = frontend(&path, &g, &kick, true);
    let mut got = Vec::new();
    let (a, l) = g.frame(0, 60, 1);
    g.desc(0, d(a, l, 0, 0));
    g.offer(0, 0);
    poll(&mut *rxq, &mut got, "a frame before", |v| v.len() == 1);

    // A second region right after the first, in guest-physical and frontend-virtual space.
    let more = Region::memfd("fe2-more", SIZE, false).unwrap();
    let more_fd = File::from(more.fd().unwrap().try_clone_to_owned().unwrap());
    let info = |gpa: u64, fd: &File| VhostUserMemoryRegionInfo {
        guest_phys_addr: gpa,
        memory_size: SIZE as u64,
        userspace_addr: UVA + gpa,
        mmap_offset: 0,
        mmap_handle: fd.as_raw_fd(),
    };
    f.set_mem_table(&[info(0, &g.fd), info(SIZE as u64, &more_fd)])
        .unwrap();
    // A frame whose bytes are in the new region.
    let mut b = vec![0u8; HDR + 80];
    b[HDR..].fill(2);
    more.write_bytes(0x100, &b).unwrap();
    g.desc(1, d(SIZE as u64 + 0x100, b.len() as u32, 0, 0));
    g.offer(1, 1);
    poll(&mut *rxq, &mut got, "a frame in the new region", |v| {
        v.len() == 2
    });
    assert_eq!(got[1].to_vec(), vec![2u8; 80]);
    assert_eq!(g.used_idx(), 2, "the ring went on where it was");
    assert_eq!(port.bad_chains(), 0);
    // A buffer across the seam of the two regions is two pieces, one frame.
    let mut c = [0u8; HDR + 64];
    c[HDR..].fill(3);
    let seam = SIZE as u64 - 40;
    g.mem.write_bytes(seam as usize, &c[..40]).unwrap();
    more.write_bytes(0, &c[40..]).unwrap();
    g.desc(2, d(seam, c.len() as u32, 0, 0));
    g.offer(2, 2);
    poll(&mut *rxq, &mut got, "a frame across the seam", |v| {
        v.len() == 3
    });
    assert_eq!(got[2].to_vec(), vec![3u8; 64]);
    drop(f);
    drop(rxq);
    drop(port);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A ring stopped (GET_VRING_BASE) and set up again from index 0, as QEMU does when the guest's
/// driver resets the device (rmmod/insmod, reboot): a second message that reinstalls the rings
/// (SET_VRING_CALL) before our queue polled once must not read the old ring's position back
/// as the new ring's start (it did: the queue then saw avail.idx jump and dropped the ring).
#[test]
fn a_ring_restarted_from_zero_starts_at_zero_even_before_the_queue_polls() {
    let dir = std::env::temp_dir().join(format!("memnic-fe3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("vhost.sock").display().to_string();
    let mut port = VhostPort::new("vhost0", VhostConfig::new(&path)).unwrap();
    let pool = memnic_test_support::pool("fe3", 256, 2048);
    let mut rxq = port.take_rx_queue(0, &pool).unwrap();
    let g = Guest::new();
    let kick = EventFd::new(0).unwrap();
    let f = frontend(&path, &g, &kick, false);
    let mut got = Vec::new();
    for i in 0..3u16 {
        let (a, l) = g.frame(i as u64, 60, i as u8);
        g.desc(i, d(a, l, 0, 0));
        g.offer(i, i);
    }
    poll(&mut *rxq, &mut got, "three frames", |v| v.len() == 3);
    assert_eq!(f.get_vring_base(1).unwrap(), 3);

    // The driver's new ring: zeroed, from index 0; kick, then call, with no burst between.
    g.mem.write_bytes(AVAIL as usize, &[0u8; 0x1000]).unwrap();
    g.mem.write_bytes(USED as usize, &[0u8; 0x1000]).unwrap();
    f.set_vring_num(1, Q).unwrap();
    f.set_vring_base(1, 0).unwrap();
    f.set_vring_kick(1, &kick).unwrap();
    let call = EventFd::new(0).unwrap();
    f.set_vring_call(1, &call).unwrap();
    let (a, l) = g.frame(5, 70, 0x77);
    g.desc(0, d(a, l, 0, 0));
    g.offer(0, 0);
    poll(&mut *rxq, &mut got, "a frame on the new ring", |v| {
        v.len() == 4
    });
    assert_eq!(got[3].to_vec(), vec![0x77; 70]);
    assert_eq!(g.used_idx(), 1);
    assert_eq!(port.bad_chains(), 0);
    drop(f);
    drop(rxq);
    drop(port);
    let _ = std::fs::remove_dir_all(&dir);
}

/// QEMU 7.2 sends SET_VRING_ENABLE before SET_FEATURES (rust-vmm's handler refuses it then, and
/// its own frontend will not send it, so this one speaks the wire format): it is accepted and
/// acknowledged (REPLY_ACK), and the connection goes on.
#[test]
fn set_vring_enable_before_set_features_is_accepted_and_acknowledged() {
    use std::io::{Read, Write};
    let dir = std::env::temp_dir().join(format!("memnic-fe4-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("vhost.sock").display().to_string();
    let port = VhostPort::new("vhost0", VhostConfig::new(&path)).unwrap();
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let msg = |req: u32, flags: u32, body: &[u8]| {
        let mut m = Vec::new();
        for w in [req, flags, body.len() as u32] {
            m.extend_from_slice(&w.to_le_bytes());
        }
        m.extend_from_slice(body);
        m
    };
    let reply = |s: &mut std::os::unix::net::UnixStream| {
        let mut r = [0u8; 20];
        s.read_exact(&mut r).unwrap();
        let w = |i: usize| u32::from_le_bytes(r[4 * i..4 * i + 4].try_into().unwrap());
        (
            w(0),
            w(1),
            u64::from_le_bytes(r[12..20].try_into().unwrap()),
        )
    };
    const V1: u32 = 0x1;
    // GET_FEATURES, SET_PROTOCOL_FEATURES(REPLY_ACK), then SET_VRING_ENABLE(1, 1) asking for a
    // reply.
    s.write_all(&msg(1, V1, &[])).unwrap();
    let (req, _, features) = reply(&mut s);
    assert_eq!(req, 1);
    assert!(features & PROTOCOL_FEATURES != 0);
    let reply_ack = VhostUserProtocolFeatures::REPLY_ACK.bits();
    s.write_all(&msg(16, V1, &reply_ack.to_le_bytes())).unwrap();
    let mut state = 1u32.to_le_bytes().to_vec();
    state.extend_from_slice(&1u32.to_le_bytes());
    s.write_all(&msg(18, V1 | 0x8, &state)).unwrap();
    assert_eq!(reply(&mut s), (18, V1 | 0x4, 0), "acknowledged, success");
    // The connection goes on: GET_FEATURES is answered.
    s.write_all(&msg(1, V1, &[])).unwrap();
    assert_eq!(reply(&mut s).0, 1);
    assert_eq!(port.disconnects(), 0);
    drop(s);
    drop(port);
    let _ = std::fs::remove_dir_all(&dir);
}
