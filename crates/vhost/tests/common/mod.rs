//! What the frontend tests share: a guest whose memory is a memfd the test writes as a hostile
//! guest would (rings at fixed places, frames), a rust-vmm `Frontend` that sets up rings over
//! it, a port on a socket in a fresh directory, and polling with a deadline.

#![allow(dead_code)] // each test binary uses its own part

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use memnic_ethdev::{Mbuf, RxQueue};
use memnic_shm::Region;
use memnic_vhost::packed::{PackedDesc, DESC_F_AVAIL, DESC_F_USED};
use memnic_vhost::split::Desc;
use memnic_vhost::{VhostConfig, VhostPort};
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

/// The frontend's virtual address of guest-physical 0.
pub const UVA: u64 = 0x7000_0000_0000;
pub const SIZE: usize = 1 << 20;
pub const Q: u16 = 8;
pub const BUF: u64 = 0x10000;
pub const VERSION_1: u64 = 1 << 32;
pub const PROTOCOL_FEATURES: u64 = 1 << 30;
pub const MRG_RXBUF: u64 = 1 << 15;
pub const INDIRECT_DESC: u64 = 1 << 28;
pub const RING_PACKED: u64 = 1 << 34;
pub const IN_ORDER: u64 = 1 << 35;
/// virtio-net header bytes with VERSION_1.
pub const HDR: usize = 12;
/// A packed ring's first position (SET_VRING_BASE): slot 0, wrap counter 1.
pub const PACKED_START: u16 = 0x8000;

/// Where a virtqueue's three areas are (guest-physical; the frontend adds `UVA`).
#[derive(Debug, Clone, Copy)]
pub struct Vq {
    pub index: u32,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

/// The guest's tx virtqueue (virtio index 1): our rx queue.
pub const TXQ: Vq = Vq {
    index: 1,
    desc: 0,
    avail: 0x1000,
    used: 0x2000,
};
/// The guest's rx virtqueue (virtio index 0): our tx queue.
pub const RXQ: Vq = Vq {
    index: 0,
    desc: 0x4000,
    avail: 0x5000,
    used: 0x6000,
};

pub struct Guest {
    pub mem: Region,
    pub fd: File,
}

impl Guest {
    /// Its memory as the frontend's one region: guest-physical 0, frontend address UVA.
    pub fn region(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: SIZE as u64,
            userspace_addr: UVA,
            mmap_offset: 0,
            mmap_handle: self.fd.as_raw_fd(),
        }
    }

    pub fn new() -> Guest {
        let mem = Region::memfd("fe-guest", SIZE, false).unwrap();
        let fd = File::from(mem.fd().unwrap().try_clone_to_owned().unwrap());
        Guest { mem, fd }
    }
    pub fn desc(&self, i: u16, d: Desc) {
        self.desc_in(TXQ, i, d)
    }
    pub fn desc_in(&self, vq: Vq, i: u16, d: Desc) {
        self.mem
            .write_bytes((vq.desc + 16 * i as u64) as usize, &d.to_bytes())
            .unwrap();
    }
    /// Makes chain `head` available as entry `idx` and publishes avail.idx = idx + 1.
    pub fn offer(&self, idx: u16, head: u16) {
        self.offer_in(TXQ, idx, head)
    }
    pub fn offer_in(&self, vq: Vq, idx: u16, head: u16) {
        let at = vq.avail as usize + 4 + 2 * (idx % Q) as usize;
        self.mem.u16(at).store(head, Relaxed);
        self.set_avail_idx_in(vq, idx.wrapping_add(1));
    }
    /// A `len`-byte frame of `fill` at page `page` (see [`Guest::frame`]) in descriptor `desc`
    /// of the tx ring, made available as entry `idx`.
    pub fn send(&self, idx: u16, desc: u16, page: u64, len: usize, fill: u8) {
        let (a, l) = self.frame(page, len, fill);
        self.desc(desc, d(a, l, 0, 0));
        self.offer(idx, desc);
    }

    /// The driver's new tx ring before it sets it up again: avail and used areas zeroed.
    pub fn zero_txq(&self) {
        self.mem
            .write_bytes(TXQ.avail as usize, &[0u8; 0x1000])
            .unwrap();
        self.mem
            .write_bytes(TXQ.used as usize, &[0u8; 0x1000])
            .unwrap();
    }
    pub fn set_avail_idx(&self, v: u16) {
        self.set_avail_idx_in(TXQ, v)
    }
    pub fn set_avail_idx_in(&self, vq: Vq, v: u16) {
        self.mem.u16(vq.avail as usize + 2).store(v, Release);
    }
    pub fn used_idx(&self) -> u16 {
        self.used_idx_in(TXQ)
    }
    pub fn used_idx_in(&self, vq: Vq) -> u16 {
        self.mem.u16(vq.used as usize + 2).load(Acquire)
    }
    /// Used element `i` (mod Q): (chain head, bytes written).
    pub fn used_elem_in(&self, vq: Vq, i: u16) -> (u32, u32) {
        let at = vq.used as usize + 4 + 8 * (i % Q) as usize;
        (
            self.mem.u32(at).load(Relaxed),
            self.mem.u32(at + 4).load(Relaxed),
        )
    }
    /// Writes used element `i` (mod Q), as a driver that scribbles on the used ring would.
    pub fn set_used_elem_in(&self, vq: Vq, i: u16, (id, len): (u32, u32)) {
        let at = vq.used as usize + 4 + 8 * (i % Q) as usize;
        self.mem.u32(at).store(id, Relaxed);
        self.mem.u32(at + 4).store(len, Relaxed);
    }
    /// Packed slot `i` of `vq`, written as a driver makes a descriptor available: address,
    /// length and id first, the flags last with a Release store.
    pub fn pdesc_in(&self, vq: Vq, i: u16, d: PackedDesc) {
        let at = (vq.desc + 16 * i as u64) as usize;
        self.mem.write_bytes(at, &d.to_bytes()[..14]).unwrap();
        self.mem.u16(at + 14).store(d.flags, Release);
    }
    /// Packed slot `i` of `vq` as it is now (the driver reads the used slots the device wrote).
    pub fn pslot_in(&self, vq: Vq, i: u16) -> PackedDesc {
        let at = (vq.desc + 16 * i as u64) as usize;
        // Acquire: pairs with the device's Release store of the slot's flags.
        let flags = self.mem.u16(at + 14).load(Acquire);
        let mut b = [0u8; 16];
        self.mem.read_bytes(at, &mut b).unwrap();
        PackedDesc {
            flags,
            ..PackedDesc::parse(&b)
        }
    }
    /// A tx frame at `BUF + slot * 0x1000`: a zero header, then `len` bytes of `fill`.
    pub fn frame(&self, slot: u64, len: usize, fill: u8) -> (u64, u32) {
        let at = BUF + slot * 0x1000;
        let mut b = vec![0u8; HDR + len];
        b[HDR..].fill(fill);
        self.mem.write_bytes(at as usize, &b).unwrap();
        (at, (HDR + len) as u32)
    }
}

impl Default for Guest {
    fn default() -> Self {
        Guest::new()
    }
}

/// How [`connect`] sets a frontend up.
pub struct Setup {
    /// PROTOCOL_FEATURES and REPLY_ACK negotiated (every request waits for our answer) and
    /// the rings enabled explicitly; without, rings run as soon as they start.
    pub reply_ack: bool,
    /// Virtio features beside VERSION_1 (and PROTOCOL_FEATURES with `reply_ack`).
    pub features: u64,
    pub vqs: Vec<Vq>,
    pub base: u16,
}

/// A frontend that sets up the guest's tx virtqueue over `g`'s memory (see [`Setup`]).
pub fn frontend(path: &str, g: &Guest, kick: &EventFd, reply_ack: bool) -> Frontend {
    connect(
        path,
        g,
        kick,
        &Setup {
            reply_ack,
            features: 0,
            vqs: vec![TXQ],
            base: 0,
        },
    )
}

pub fn connect(path: &str, g: &Guest, kick: &EventFd, s: &Setup) -> Frontend {
    connect_with(path, g, kick, s, VhostUserProtocolFeatures::empty())
}

/// [`connect`], negotiating `protocol` beside REPLY_ACK (with `reply_ack`).
pub fn connect_with(
    path: &str,
    g: &Guest,
    kick: &EventFd,
    s: &Setup,
    protocol: VhostUserProtocolFeatures,
) -> Frontend {
    let mut f = Frontend::connect(path, 2).unwrap();
    f.set_owner().unwrap();
    assert!(f.get_features().unwrap() & VERSION_1 != 0);
    if s.reply_ack {
        f.set_features(VERSION_1 | PROTOCOL_FEATURES | s.features)
            .unwrap();
        let p = f.get_protocol_features().unwrap();
        assert!(p.contains(VhostUserProtocolFeatures::REPLY_ACK | protocol));
        f.set_protocol_features(VhostUserProtocolFeatures::REPLY_ACK | protocol)
            .unwrap();
        f.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    } else {
        f.set_features(VERSION_1 | s.features).unwrap();
    }
    f.set_mem_table(&[g.region()]).unwrap();
    for vq in &s.vqs {
        let i = vq.index as usize;
        f.set_vring_num(i, Q).unwrap();
        f.set_vring_addr(
            i,
            &VringConfigData {
                queue_max_size: Q,
                queue_size: Q,
                flags: 0,
                desc_table_addr: UVA + vq.desc,
                used_ring_addr: UVA + vq.used,
                avail_ring_addr: UVA + vq.avail,
                log_addr: None,
            },
        )
        .unwrap();
        f.set_vring_base(i, s.base).unwrap();
        f.set_vring_kick(i, kick).unwrap();
        if s.reply_ack {
            f.set_vring_enable(i, true).unwrap();
        }
    }
    f
}

pub fn d(addr: u64, len: u32, flags: u16, next: u16) -> Desc {
    Desc {
        addr,
        len,
        flags,
        next,
    }
}

/// A packed descriptor.
pub fn pd(addr: u64, len: u32, id: u16, flags: u16) -> PackedDesc {
    PackedDesc {
        addr,
        len,
        id,
        flags,
    }
}

/// The AVAIL/USED bits of a slot the driver makes available in the lap whose wrap counter is
/// `wrap`.
pub fn avail_bits(wrap: bool) -> u16 {
    if wrap {
        DESC_F_AVAIL
    } else {
        DESC_F_USED
    }
}

/// The AVAIL/USED bits of a slot the device handed back as used in the lap `wrap`.
pub fn used_bits(wrap: bool) -> u16 {
    if wrap {
        DESC_F_AVAIL | DESC_F_USED
    } else {
        0
    }
}

/// A packed-ring driver that writes whatever it is told: where its next chain goes (slot and
/// wrap counter) on virtqueue `vq` of `Q` slots.
#[derive(Debug, Clone, Copy)]
pub struct PackedDriver {
    pub vq: Vq,
    pub idx: u16,
    pub wrap: bool,
}

impl PackedDriver {
    /// At the ring's first position (slot 0, wrap counter 1: [`PACKED_START`]).
    pub fn new(vq: Vq) -> PackedDriver {
        PackedDriver {
            vq,
            idx: 0,
            wrap: true,
        }
    }

    /// The driver's position as SET/GET_VRING_BASE carry it.
    pub fn pos(&self) -> u16 {
        self.idx | if self.wrap { 0x8000 } else { 0 }
    }

    /// Makes a chain available: one slot per `(addr, len, flags)`, the flags as given (NEXT
    /// included: the caller decides where the chain ends, or that it never does) plus the
    /// AVAIL/USED bits of each slot's lap, every slot with buffer id `id`; the head's flags
    /// are written last. Returns the head's slot and lap; the driver moves past the chain.
    pub fn post(&mut self, g: &Guest, id: u16, bufs: &[(u64, u32, u16)]) -> (u16, bool) {
        let head = (self.idx, self.wrap);
        for (k, &(addr, len, flags)) in bufs.iter().enumerate().rev() {
            let (i, wrap) = self.at(k as u16);
            g.pdesc_in(self.vq, i, pd(addr, len, id, flags | avail_bits(wrap)));
        }
        (self.idx, self.wrap) = self.at(bufs.len() as u16);
        head
    }

    /// Takes back the `n` slots from the driver's position: each as the device left it a lap
    /// before (used, so not available in its lap).
    pub fn take_back(&self, g: &Guest, n: u16) {
        for k in 0..n {
            let (i, wrap) = self.at(k);
            g.pdesc_in(self.vq, i, pd(0, 0, 0, used_bits(!wrap)));
        }
    }

    /// The slot and lap `n` slots on.
    pub fn at(&self, n: u16) -> (u16, bool) {
        let i = self.idx as u32 + n as u32;
        let laps = i / Q as u32;
        ((i % Q as u32) as u16, self.wrap ^ (laps % 2 == 1))
    }

    /// Asserts that the device handed back slot `slot` (in lap `wrap`) as used, with buffer
    /// `id` and `len` bytes written.
    pub fn assert_used(&self, g: &Guest, (slot, wrap): (u16, bool), id: u16, len: u32, what: &str) {
        let s = g.pslot_in(self.vq, slot);
        assert_eq!(
            s.flags & (DESC_F_AVAIL | DESC_F_USED),
            used_bits(wrap),
            "{what}: slot {slot} used in lap {wrap} (flags {:#x})",
            s.flags
        );
        assert_eq!(
            (s.id, s.len),
            (id, len),
            "{what}: slot {slot}'s id and length"
        );
    }

    /// Asserts that slot `slot` is still the driver's: available in lap `wrap`, not used.
    pub fn assert_avail(&self, g: &Guest, (slot, wrap): (u16, bool), what: &str) {
        let f = g.pslot_in(self.vq, slot).flags;
        assert_eq!(
            f & (DESC_F_AVAIL | DESC_F_USED),
            avail_bits(wrap),
            "{what}: slot {slot} still available (flags {f:#x})"
        );
    }
}

/// Waits until `cond` holds, failing the test after 5 s.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < end, "{what}: not within 5 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Polls `rxq` until `until` holds (or 5 s pass).
pub fn poll(
    rxq: &mut dyn RxQueue,
    got: &mut Vec<Mbuf>,
    what: &str,
    until: impl Fn(&[Mbuf]) -> bool,
) {
    let end = Instant::now() + Duration::from_secs(5);
    while !until(got) {
        assert!(Instant::now() < end, "{what}: not within 5 s");
        rxq.rx_burst(got, 32);
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A port listening on a socket in a fresh directory (removed on drop, after the port).
pub struct TestPort {
    pub port: VhostPort,
    pub path: String,
    dir: PathBuf,
}

impl TestPort {
    pub fn new(tag: &str, cfg: impl FnOnce(&mut VhostConfig)) -> TestPort {
        let dir = std::env::temp_dir().join(format!("memnic-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vhost.sock").display().to_string();
        let mut c = VhostConfig::new(&path);
        cfg(&mut c);
        let port = VhostPort::new("vhost0", c).unwrap();
        TestPort { port, path, dir }
    }

    /// Waits until the port has lost `n` frontends in all; returns why the last went.
    pub fn wait_disconnects(&self, n: u64) -> String {
        wait_until(&format!("disconnect #{n}"), || self.port.disconnects() >= n);
        assert_eq!(
            self.port.disconnects(),
            n,
            "more frontends lost than expected"
        );
        self.port.last_reason().expect("a reason is logged")
    }
}

impl Drop for TestPort {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
