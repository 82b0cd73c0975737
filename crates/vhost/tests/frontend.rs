//! Our backend driven by rust-vmm's vhost-user frontend over a real socket, with guest memory
//! in a memfd that the test writes as a hostile guest would: valid frames arrive, every bad
//! chain is refused and returned (counted, with its reason), GET_VRING_BASE tells where the
//! ring got to, a message with a bad value closes the connection with a reason, and the next
//! frontend is served.

mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;

use common::*;
use memnic_ethdev::Port;
use memnic_shm::Region;
use memnic_vhost::chain::ChainError;
use memnic_vhost::split::{Desc, DESC_F_NEXT};
use std::time::{Duration, Instant};
use vhost::vhost_user::VhostUserFrontend;
use vhost::VhostBackend;
use vhost::VhostUserMemoryRegionInfo;
use vmm_sys_util::eventfd::EventFd;

/// A listening port with its rx queue taken over a pool of `bufs` buffers, and the guest's
/// memory and kick eventfd for a frontend to set up.
struct RxRig {
    tp: TestPort,
    pool: memnic_pktbuf::Mempool,
    rxq: Box<dyn memnic_ethdev::RxQueue>,
    g: Guest,
    kick: EventFd,
}

impl RxRig {
    fn new(tag: &str, bufs: u32) -> RxRig {
        let mut tp = TestPort::new(tag, |_| {});
        let pool = memnic_test_support::pool(tag, bufs, 2048);
        let rxq = tp.port.take_rx_queue(0, &pool).unwrap();
        RxRig {
            tp,
            pool,
            rxq,
            g: Guest::new(),
            kick: EventFd::new(0).unwrap(),
        }
    }
}

#[test]
fn a_hostile_guest_and_a_hostile_frontend_are_refused_and_the_next_is_served() {
    let RxRig {
        mut tp,
        pool: _pool,
        mut rxq,
        g,
        kick,
    } = RxRig::new("fe", 256);
    let path = tp.path.clone();
    let port = &mut tp.port;
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
    drop(tp);
}

/// SET_MEM_TABLE while the ring runs (memory hot-added, as QEMU sends it, waiting for our
/// REPLY_ACK before it uses the new memory): the ring goes on where it was, a frame in the new
/// region arrives, and one across the seam of the two regions too.
#[test]
fn a_memory_table_replaced_while_running_keeps_the_ring_and_maps_the_new_region() {
    let RxRig {
        mut tp,
        pool: _pool,
        mut rxq,
        g,
        kick,
    } = RxRig::new("fe2", 256);
    let path = tp.path.clone();
    let port = &mut tp.port;
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
    drop(tp);
}

/// A ring stopped (GET_VRING_BASE) and set up again from index 0, as QEMU does when the guest's
/// driver resets the device (rmmod/insmod, reboot): a second message that reinstalls the rings
/// (SET_VRING_CALL) before our queue polled once must not read the old ring's position back
/// as the new ring's start (it did: the queue then saw avail.idx jump and dropped the ring).
#[test]
fn a_ring_restarted_from_zero_starts_at_zero_even_before_the_queue_polls() {
    let RxRig {
        mut tp,
        pool: _pool,
        mut rxq,
        g,
        kick,
    } = RxRig::new("fe3", 256);
    let path = tp.path.clone();
    let port = &mut tp.port;
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
    g.zero_txq();
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
    drop(tp);
}

/// Out of buffers halfway through a burst: the chains we had buffers for arrive and come back
/// used, the rest stay the guest's (not used, not lost) until buffers are freed, then arrive
/// whole and in order.
#[test]
fn chains_left_without_a_buffer_stay_the_guests_until_buffers_are_freed() {
    let RxRig {
        mut tp,
        pool: _pool,
        mut rxq,
        g,
        kick,
    } = RxRig::new("fe5", 5);
    let path = tp.path.clone();
    let port = &mut tp.port;
    let f = frontend(&path, &g, &kick, false);
    for i in 0..Q {
        let (a, l) = g.frame(i as u64, 60 + i as usize, i as u8);
        g.desc(i, d(a, l, 0, 0));
        g.offer(i, i);
    }
    let mut got = Vec::new();
    poll(&mut *rxq, &mut got, "the frames we have buffers for", |v| {
        !v.is_empty()
    });
    let first = got.len();
    assert!(first <= 5, "{first} frames from a pool of 5");
    assert_eq!(g.used_idx(), first as u16, "only the chains taken are used");
    for _ in 0..10 {
        rxq.rx_burst(&mut got, 32);
    }
    let held = got.len();
    assert!(held <= 5 && held < Q as usize);
    assert_eq!(
        g.used_idx(),
        held as u16,
        "a chain without a buffer stays the guest's"
    );
    assert!(rxq.stats().nombuf > 0, "running out is counted");

    let mut all: Vec<Vec<u8>> = got.drain(..).map(|m| m.to_vec()).collect();
    while all.len() < Q as usize {
        poll(
            &mut *rxq,
            &mut got,
            "the rest, once buffers are free",
            |v| !v.is_empty(),
        );
        all.extend(got.drain(..).map(|m| m.to_vec()));
    }
    for (i, f) in all.iter().enumerate() {
        assert_eq!(*f, vec![i as u8; 60 + i], "frame {i} whole and in order");
    }
    assert_eq!(g.used_idx(), Q);
    assert_eq!(port.bad_chains(), 0);
    drop(f);
    drop(rxq);
    drop(tp);
}

/// QEMU 7.2 sends SET_VRING_ENABLE before SET_FEATURES (rust-vmm's handler refuses it then, and
/// its own frontend will not send it, so this one speaks the wire format): it is accepted and
/// acknowledged (REPLY_ACK), and the connection goes on.
#[test]
fn set_vring_enable_before_set_features_is_accepted_and_acknowledged() {
    use std::io::{Read, Write};
    let tp = TestPort::new("fe4", |_| {});
    let path = tp.path.clone();
    let port = &tp.port;
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
    let reply_ack = vhost::vhost_user::message::VhostUserProtocolFeatures::REPLY_ACK.bits();
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
    drop(tp);
}

/// A frontend that leaves while our queues are not polled (forwarding stopped, say) does not
/// keep its guest memory mapped here until a queue's next burst: the port lets go of it when
/// the connection ends. The queue, polled afterwards, finds no ring (and does not fault).
#[test]
fn a_departed_frontends_memory_is_let_go_without_a_burst() {
    let RxRig {
        tp,
        pool: _pool,
        mut rxq,
        g,
        kick,
    } = RxRig::new("fe-release", 256);
    let path = tp.path.clone();
    let f = frontend(&path, &g, &kick, false);
    wait_until("link up", || tp.port.link().up);
    // A frame moves, so the queue holds this frontend's ring and memory.
    let (a, l) = g.frame(0, 60, 0x5a);
    g.desc(0, d(a, l, 0, 0));
    g.offer(0, 0);
    let mut got = Vec::new();
    poll(&mut *rxq, &mut got, "a frame", |v| v.len() == 1);
    assert_eq!(
        guest_mappings(&g),
        2,
        "the test's mapping of the guest memory, and ours"
    );

    drop(f);
    tp.wait_disconnects(1);
    assert_eq!(guest_mappings(&g), 1, "only the test's own mapping is left");
    got.clear();
    assert_eq!(rxq.rx_burst(&mut got, 32), 0);
}

/// Mappings of `g`'s memfd in this process (`/proc/self/maps`, matched by inode, so other
/// tests' guests in the same process do not count).
fn guest_mappings(g: &Guest) -> usize {
    use std::os::unix::fs::MetadataExt;
    let ino = g.fd.metadata().unwrap().ino().to_string();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.split_whitespace().nth(4) == Some(ino.as_str()))
        .count()
}

/// A burst takes a batch's buffers at once (eight) and gives back those no chain took: with a
/// pool of exactly eight, three frames and then eight arrive, which a spare kept would forbid.
#[test]
fn buffers_a_short_burst_did_not_use_go_back_to_the_pool() {
    let RxRig {
        tp,
        pool: _pool,
        mut rxq,
        g,
        kick,
    } = RxRig::new("fe7", 8);
    let path = tp.path.clone();
    let f = frontend(&path, &g, &kick, false);
    let mut next = 0u16;
    for round in [3u16, 8] {
        for _ in 0..round {
            let (a, l) = g.frame(next as u64, 60 + next as usize, next as u8);
            g.desc(next % Q, d(a, l, 0, 0));
            g.offer(next, next % Q);
            next += 1;
        }
        let mut got = Vec::new();
        poll(&mut *rxq, &mut got, "a round's frames", |v| {
            v.len() == round as usize
        });
        let first = next - round;
        for (k, m) in got.iter().enumerate() {
            let i = first + k as u16;
            assert_eq!(m.to_vec(), vec![i as u8; 60 + i as usize], "frame {i}");
        }
    }
    assert_eq!(g.used_idx(), next);
    drop(f);
    drop(rxq);
    drop(tp);
}

/// Whether the call eventfd was written since the last look (and clears it).
fn called(call: &EventFd) -> bool {
    call.read().is_ok()
}

/// A guest tx ring of either layout, with a call eventfd and the driver's switch for calls:
/// packed (driver event flags DISABLE) or split without EVENT_IDX (avail.flags NO_INTERRUPT).
/// The frontend waits for every answer (REPLY_ACK) and may add and remove memory regions.
struct CallRig {
    rig: RxRig,
    f: vhost::vhost_user::Frontend,
    call: EventFd,
    packed: bool,
    drv: PackedDriver,
    sent: u16,
    got: Vec<memnic_ethdev::Mbuf>,
}

impl CallRig {
    fn new(tag: &str, packed: bool) -> CallRig {
        let rig = RxRig::new(tag, 64);
        let setup = Setup {
            reply_ack: true,
            features: if packed { RING_PACKED } else { 0 },
            vqs: vec![TXQ],
            base: if packed { PACKED_START } else { 0 },
        };
        let slots = vhost::vhost_user::message::VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
        let f = connect_with(&rig.tp.path.clone(), &rig.g, &rig.kick, &setup, slots);
        let call = call_fd();
        f.set_vring_call(1, &call).unwrap();
        CallRig {
            rig,
            f,
            call,
            packed,
            drv: PackedDriver::new(TXQ),
            sent: 0,
            got: Vec::new(),
        }
    }

    fn what(&self) -> &'static str {
        if self.packed {
            "packed"
        } else {
            "split"
        }
    }

    /// Both layouts keep the driver's switch in the u16 at avail + 2 (packed: the driver event
    /// flags) or avail + 0 (split: avail.flags); 1 turns calls off in either.
    fn calls(&self, on: bool) {
        let switch = TXQ.avail as usize + if self.packed { 2 } else { 0 };
        self.rig.g.mem.u16(switch).store(u16::from(!on), Relaxed);
    }

    /// Makes one more frame available and polls until the queue has taken it.
    fn send_and_take(&mut self, what: &str) {
        let (g, n) = (&self.rig.g, self.sent);
        let (a, l) = g.frame(n as u64, 60, n as u8);
        if self.packed {
            self.drv.post(g, n, &[(a, l, 0)]);
        } else {
            g.desc(n % Q, d(a, l, 0, 0));
            g.offer(n, n % Q);
        }
        self.sent += 1;
        let want = usize::from(self.sent);
        poll(&mut *self.rig.rxq, &mut self.got, what, |v| v.len() == want);
    }

    /// Leaves the queue owing a call check: one frame taken while the driver has calls off.
    fn owe_a_check(&mut self) {
        self.calls(false);
        self.send_and_take("a frame with calls off");
    }

    fn burst(&mut self) {
        self.rig.rxq.rx_burst(&mut self.got, 32);
    }

    fn called(&self) -> bool {
        called(&self.call)
    }

    /// Owes a call with calls on, and arms the next notify of the call fd: `then` runs between
    /// our look and our write, and the frontend's copy of the fd is then filled to the top, so
    /// that write blocks. Returns the frontend's copy (to empty it in a failing run).
    fn jam_the_owed_call(
        &mut self,
        then: impl FnOnce() + Send + 'static,
    ) -> std::sync::Arc<memnic_shm::unix::EventFd> {
        self.owe_a_check();
        self.calls(true);
        // The frontend's own descriptor of the call fd: the counter the queue's copy writes.
        let theirs = std::sync::Arc::new(as_shm_eventfd(&self.call));
        let jam = theirs.clone();
        theirs
            .before_next_notify_write(move || {
                then();
                jam.jam().unwrap();
            })
            .unwrap();
        theirs
    }
}

fn call_fd() -> EventFd {
    EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK).unwrap()
}

/// A descriptor of `ev`'s counter as memnic's own eventfd type, passed over a socket as the
/// port got its copy: a received `File`, never a raw number turned into an owned descriptor.
fn as_shm_eventfd(ev: &EventFd) -> memnic_shm::unix::EventFd {
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    a.send_with_fd(&[0u8][..], ev.as_raw_fd()).unwrap();
    let (_, file) = b.recv_with_fd(&mut [0u8; 1]).unwrap();
    let fd = std::os::fd::OwnedFd::from(file.expect("the descriptor sent"));
    memnic_shm::unix::EventFd::from_fd(fd).unwrap()
}

/// A dequeue that publishes while the driver has every call off does not look again at once
/// (no fence): it leaves the look to its next poll, which calls the driver if it turned calls
/// on meanwhile, and only once.
#[test]
fn a_call_skipped_while_calls_were_off_is_made_at_the_next_poll_once_they_are_on() {
    for packed in [true, false] {
        let mut r = CallRig::new(if packed { "fe8p" } else { "fe8s" }, packed);
        let what = r.what();
        r.owe_a_check();
        r.burst();
        assert!(!r.called(), "{what}: no call while calls are off");
        r.send_and_take("a second frame");
        r.calls(true);
        r.burst();
        assert!(r.called(), "{what}: the next (empty) poll calls");
        r.burst();
        assert!(!r.called(), "{what}: once");
        r.send_and_take("a frame with calls on");
        assert!(r.called(), "{what}: calls on, a burst calls");
    }
}

/// The check a burst deferred is made when the frontend stops the ring before the queue polls
/// again (GET_VRING_BASE): the driver, which turned calls on meanwhile, is called then (not
/// when calls stay off), and the ring started again owes nothing.
#[test]
fn a_call_skipped_while_calls_were_off_is_made_when_the_ring_stops_before_the_next_poll() {
    for packed in [true, false] {
        for on in [true, false] {
            let tag = format!("fe9{}{}", u8::from(packed), u8::from(on));
            let mut r = CallRig::new(&tag, packed);
            let what = format!("{}, calls {}", r.what(), if on { "on" } else { "off" });
            r.owe_a_check();
            assert!(!r.called(), "{what}: no call while calls are off");
            r.calls(on);
            let pos = r.f.get_vring_base(1).unwrap();
            assert_eq!(
                pos & 0xffff,
                u32::from(if packed { PACKED_START + 1 } else { 1 })
            );
            assert_eq!(r.called(), on, "{what}: the stop made the deferred check");
            r.f.set_vring_base(1, pos as u16).unwrap();
            r.f.set_vring_kick(1, &r.rig.kick).unwrap();
            r.calls(true);
            r.burst();
            r.burst();
            assert!(!r.called(), "{what}: the restarted ring owes no call");
            r.send_and_take("a frame on the restarted ring");
            assert!(r.called(), "{what}: the restarted ring calls");
        }
    }
}

/// A queue about to sleep makes the call it owes from `wait()`, outside its burst, where its
/// ring can be replaced meanwhile. A frontend that jams that call fd just after our look (the
/// write then blocks) and gives the ring a new call fd has hidden the stuck one from the ring;
/// the watchdog finds it still (the queue lists it in `VringSlot::calling`), empties it, which
/// lets the queue out, and drops the frontend.
#[test]
fn a_call_jammed_in_wait_is_emptied_after_the_ring_got_a_new_call_fd() {
    for packed in [true, false] {
        let mut r = CallRig::new(if packed { "fe11p" } else { "fe11s" }, packed);
        let what = r.what();
        let f = r.f.clone();
        let theirs = r.jam_the_owed_call(move || f.set_vring_call(1, &call_fd()).unwrap());
        let rxq = &mut r.rig.rxq;
        let released = std::thread::scope(|s| {
            let sleeper = s.spawn(move || rxq.wait(Duration::from_millis(1)));
            let deadline = Instant::now() + Duration::from_secs(5);
            while !sleeper.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let released = sleeper.is_finished();
            // A failing run: let the queue out ourselves, so the scope can end.
            while !sleeper.is_finished() {
                let _ = theirs.unjam();
                std::thread::sleep(Duration::from_millis(1));
            }
            released
        });
        assert!(
            released,
            "{what}: the watchdog empties the call stuck in wait()"
        );
        let why = r.rig.tp.wait_disconnects(1);
        assert!(why.contains("filled a call eventfd"), "{what}: {why}");
    }
}

/// The control thread makes the call a stopped ring owed (GET_VRING_BASE after a burst that
/// deferred its check), outside every queue, on a ring no longer in place. A frontend that jams
/// that call fd just after our look leaves the control thread's write blocked; the watchdog
/// finds it (listed in `Shared::calling`), empties it and drops the frontend.
#[test]
fn a_call_jammed_on_the_control_thread_is_emptied() {
    for packed in [true, false] {
        let mut r = CallRig::new(if packed { "fe12p" } else { "fe12s" }, packed);
        let what = r.what();
        let theirs = r.jam_the_owed_call(|| {});
        let f = r.f.clone();
        // Its reply may never come: the frontend is dropped.
        let stop = std::thread::spawn(move || f.get_vring_base(1));
        let deadline = Instant::now() + Duration::from_secs(5);
        while r.rig.tp.port.disconnects() == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if r.rig.tp.port.disconnects() == 0 {
            let _ = theirs.unjam(); // let the control thread out before the port is dropped
            panic!("{what}: the watchdog empties the call stuck on the control thread");
        }
        let why = r.rig.tp.wait_disconnects(1);
        assert!(why.contains("filled a call eventfd"), "{what}: {why}");
        let _ = stop.join();
    }
}

/// The check a burst deferred stays with a ring that goes on in its queue, and is made once:
/// a new call fd (SET_VRING_CALL) gets it at the queue's next poll, the old fd never; a ring
/// whose region is removed (REM_MEM_REG, the ring taken from its queue) has it made then, and
/// owes nothing once the region is added back and the ring goes on.
#[test]
fn a_deferred_call_is_made_once_whether_its_ring_goes_on_or_leaves_and_comes_back() {
    for packed in [true, false] {
        let mut r = CallRig::new(if packed { "fe10p" } else { "fe10s" }, packed);
        let what = r.what();
        r.owe_a_check();
        r.calls(true);
        let new = call_fd();
        r.f.set_vring_call(1, &new).unwrap();
        assert!(!r.called(), "{what}: the replaced fd is not called");
        assert!(!called(&new), "{what}: the ring went on: no call yet");
        r.burst();
        assert!(called(&new), "{what}: the next poll calls the new fd");
        r.burst();
        assert!(!called(&new) && !r.called(), "{what}: once");

        r.call = new;
        r.owe_a_check();
        r.calls(true);
        r.f.remove_mem_region(&r.rig.g.region()).unwrap();
        assert!(r.called(), "{what}: the ring taken away: called then");
        r.f.add_mem_region(&r.rig.g.region()).unwrap();
        r.burst();
        r.burst();
        assert!(!r.called(), "{what}: the ring back: nothing owed");
        r.send_and_take("a frame after the region came back");
        assert!(r.called(), "{what}: calls go on");

        // A queue about to sleep makes the check itself; the ring stopped then owes nothing.
        r.owe_a_check();
        r.calls(true);
        r.rig.rxq.wait(Duration::from_millis(1));
        assert!(r.called(), "{what}: the queue calls before it sleeps");
        r.f.get_vring_base(1).unwrap();
        assert!(!r.called(), "{what}: the stop owes nothing after that");
    }
}
