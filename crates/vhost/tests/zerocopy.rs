//! Dequeue zero copy against a frontend over a real socket and guest memory in a memfd: frames
//! go up as read-only external segments over the guest's buffers, each chain comes back used
//! once all its segments are freed (in whatever order, each head exactly once), a consumer
//! that holds everything cannot stall the guest (past the budget frames are copied), and a
//! ring that stops waits for the chains held, or abandons them after the drain's timeout and
//! discards their late completions.

mod common;

use std::time::{Duration, Instant};

use common::*;
use memnic_ethdev::{Mbuf, Mempool, Port, RxQueue, SegKind};
use memnic_vhost::split::DESC_F_NEXT;
use memnic_vhost::ZeroCopyConfig;
use vhost::vhost_user::VhostUserFrontend;
use vhost::VhostBackend;
use vmm_sys_util::eventfd::EventFd;

/// A port with zero copy on (every frame of 64 bytes or more uncopied, at most `budget` chains
/// at a time, a 300-ms drain), its rx queue 0, and a frontend (with REPLY_ACK: `reply_ack`)
/// that set up the guest's tx ring over `g`.
struct Rig {
    tp: TestPort,
    pool: Mempool,
    rxq: Box<dyn RxQueue>,
    g: Guest,
    kick: EventFd,
    f: vhost::vhost_user::Frontend,
}

fn rig(tag: &str, budget: Option<u16>, reply_ack: bool) -> Rig {
    let mut tp = TestPort::new(tag, |c| {
        c.zero_copy = Some(ZeroCopyConfig {
            min_len: 64,
            budget,
            drain_timeout: Duration::from_millis(300),
        })
    });
    let pool = memnic_test_support::pool(tag, 64, 2048);
    let rxq = tp.port.take_rx_queue(0, &pool).unwrap();
    let g = Guest::new();
    let kick = EventFd::new(0).unwrap();
    let f = frontend(&tp.path, &g, &kick, reply_ack);
    Rig {
        tp,
        pool,
        rxq,
        g,
        kick,
        f,
    }
}

/// Writes a chain at descriptors `first..`: the 12-byte header in its own buffer, then the
/// frame `bytes` split into buffers of `split` bytes, each at its own page.
fn chain(g: &Guest, first: u16, page: u64, bytes: &[u8], split: usize) -> u16 {
    let hdr = BUF + page * 0x1000;
    g.mem.write_bytes(hdr as usize, &[0u8; HDR]).unwrap();
    let parts: Vec<&[u8]> = bytes.chunks(split).collect();
    g.desc(first, d(hdr, HDR as u32, DESC_F_NEXT, first + 1));
    for (k, p) in parts.iter().enumerate() {
        let at = BUF + (page + 1 + k as u64) * 0x1000;
        g.mem.write_bytes(at as usize, p).unwrap();
        let i = first + 1 + k as u16;
        let last = k + 1 == parts.len();
        let (flags, next) = if last { (0, 0) } else { (DESC_F_NEXT, i + 1) };
        g.desc(i, d(at, p.len() as u32, flags, next));
    }
    1 + parts.len() as u16
}

fn frame(seq: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seq.wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

/// The used ring's entries `from..to`: (head, length).
fn used(g: &Guest, from: u16, to: u16) -> Vec<(u32, u32)> {
    (from..to).map(|i| g.used_elem_in(TXQ, i)).collect()
}

/// Twenty bursts: enough for anything freed to be handed back.
fn spin(rxq: &mut dyn RxQueue, got: &mut Vec<Mbuf>) {
    for _ in 0..20 {
        rxq.rx_burst(got, 32);
    }
}

/// Bursts (handing back what completed) until the used index reaches `n`.
fn until_used(rxq: &mut dyn RxQueue, g: &Guest, n: u16, what: &str) {
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(5);
    while g.used_idx() != n {
        assert!(
            Instant::now() < end,
            "{what}: used.idx {} != {n}",
            g.used_idx()
        );
        rxq.rx_burst(&mut got, 32);
        assert!(got.is_empty(), "{what}: nothing new was offered");
    }
}

#[test]
fn zero_copy_chains_complete_out_of_order_each_head_exactly_once() {
    let Rig {
        tp,
        pool: _pool,
        mut rxq,
        g,
        kick: _kick,
        f: _f,
    } = rig("zc1", None, false);

    // A: header + three buffers (descriptors 0-3); B, C, D: header + one buffer each; E: a
    // frame below the threshold, copied.
    let frames = [
        frame(1, 300),
        frame(2, 100),
        frame(3, 200),
        frame(4, 64),
        frame(5, 40),
    ];
    let heads = [0u16, 4, 6];
    assert_eq!(chain(&g, 0, 0, &frames[0], 100), 4);
    assert_eq!(chain(&g, 4, 10, &frames[1], 100), 2);
    assert_eq!(chain(&g, 6, 20, &frames[2], 200), 2);
    for (k, h) in heads.iter().enumerate() {
        g.offer(k as u16, *h);
    }
    let mut got = Vec::new();
    poll(&mut *rxq, &mut got, "three zero-copy frames", |v| {
        v.len() == 3
    });
    for (m, f) in got.iter().zip(&frames) {
        assert_eq!(m.to_vec(), *f, "the frame, its header stripped");
        assert!(
            m.segments().all(|s| s.kind() == SegKind::External),
            "every segment over the guest's buffer"
        );
    }
    assert_eq!(
        got[0].nb_segs(),
        3,
        "one segment per buffer after the header"
    );
    assert_eq!(
        g.used_idx(),
        0,
        "nothing comes back while the stack holds it"
    );

    // The chains' descriptors are the guest's until they come back; D and E reuse none.
    let mut a = got.remove(0);
    let b = got.remove(0);
    let c = got.remove(0);
    drop(c);
    until_used(&mut *rxq, &g, 1, "C freed");
    // A freed segment by segment, out of order: it completes once, with its last segment.
    let mut a2 = a.take_next().expect("A's second segment");
    let a3 = a2.take_next().expect("A's third segment");
    drop(a2);
    spin(&mut *rxq, &mut got);
    assert_eq!(
        g.used_idx(),
        1,
        "A is not back with one segment of three freed"
    );
    drop(a);
    drop(b);
    until_used(&mut *rxq, &g, 2, "B freed");
    drop(a3);
    until_used(&mut *rxq, &g, 3, "A's last segment freed");
    assert_eq!(
        used(&g, 0, 3),
        vec![(6, 0), (4, 0), (0, 0)],
        "each head once, in the order the stack let go of them"
    );

    // Below the threshold: copied into our buffer and back in the same burst.
    let (addr, len) = g.frame(30, frames[4].len(), 0);
    g.mem.write_bytes(addr as usize + HDR, &frames[4]).unwrap();
    g.desc(0, d(addr, len, 0, 0));
    g.offer(3, 0);
    poll(&mut *rxq, &mut got, "a short frame", |v| v.len() == 1);
    assert_eq!(got[0].to_vec(), frames[4]);
    assert_ne!(got[0].kind(), SegKind::External, "a short frame is copied");
    assert_eq!(g.used_idx(), 4, "a copied chain comes back at once");
    assert_eq!(tp.port.zero_copy_counts(), (3, 0, 0));
    drop(got);
    drop(rxq);
}

#[test]
fn a_consumer_holding_every_packet_does_not_stall_the_guest() {
    let Rig {
        tp: _tp,
        pool: _pool,
        mut rxq,
        g,
        kick: _kick,
        f: _f,
    } = rig("zc2", Some(2), false);

    // The guest sends 40 frames from its 8 descriptors, reusing each as it comes back; the
    // consumer keeps every packet.
    let mut free: Vec<u16> = (0..Q).rev().collect();
    let mut seen_used = 0u16;
    let mut held: Vec<Mbuf> = Vec::new();
    let mut sent = 0u16;
    let end = Instant::now() + Duration::from_secs(5);
    while sent < 40 || held.len() < 40 {
        assert!(
            Instant::now() < end,
            "the guest stalled after {sent} frames"
        );
        while seen_used != g.used_idx() {
            free.push(g.used_elem_in(TXQ, seen_used).0 as u16);
            seen_used += 1;
        }
        if sent < 40 {
            if let Some(i) = free.pop() {
                g.send(sent, i, i as u64, 200, sent as u8);
                sent += 1;
            }
        }
        rxq.rx_burst(&mut held, 32);
    }
    for (k, m) in held.iter().enumerate() {
        assert_eq!(m.to_vec(), vec![k as u8; 200], "frame {k}");
    }
    let zc = held
        .iter()
        .filter(|m| m.kind() == SegKind::External)
        .count();
    assert_eq!(
        zc, 2,
        "the budget: two chains held uncopied, the rest copied"
    );
    assert_eq!(g.used_idx(), 38, "every copied chain is back");
    drop(held);
    until_used(&mut *rxq, &g, 40, "the held chains, once freed");
}

#[test]
fn a_stopped_ring_waits_for_held_chains_or_abandons_them_after_the_timeout() {
    let Rig {
        tp,
        pool: _pool,
        mut rxq,
        g,
        kick,
        f,
    } = rig("zc3", None, false);
    for i in 0..2u16 {
        g.send(i, i, i as u64, 300, i as u8);
    }
    let mut got = Vec::new();
    poll(&mut *rxq, &mut got, "two frames", |v| v.len() == 2);

    // GET_VRING_BASE waits while the queue keeps polling; one chain freed meanwhile is back
    // before the reply, the other is held past the timeout and abandoned.
    let first = got.remove(0);
    let second = got.remove(0);
    let poller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(first);
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            rxq.rx_burst(&mut got, 32);
            std::thread::sleep(Duration::from_micros(100));
        }
        rxq
    });
    let asked = Instant::now();
    assert_eq!(f.get_vring_base(1).unwrap(), 2);
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "GET_VRING_BASE waited for the held chain ({waited:?})"
    );
    assert_eq!(
        g.used_idx(),
        1,
        "the freed chain came back before the reply"
    );
    assert_eq!(g.used_elem_in(TXQ, 0), (0, 0));
    let mut rxq = poller.join().unwrap();
    assert_eq!(tp.port.zero_copy_counts(), (2, 1, 0), "one chain abandoned");

    // Its late completion is discarded: it neither goes into the ring set up again nor counts
    // down the chain that now holds the same buffer id there.
    g.zero_txq();
    assert!(!tp.port.link().up, "the only ring stopped");
    f.set_vring_base(1, 0).unwrap();
    f.set_vring_kick(1, &kick).unwrap();
    wait_until("the ring set up again", || tp.port.link().up);
    g.send(0, 1, 5, 300, 0x55);
    let mut got = Vec::new();
    poll(&mut *rxq, &mut got, "a frame on the new ring", |v| {
        v.len() == 1
    });
    assert_eq!(got[0].to_vec(), vec![0x55; 300]);
    assert_eq!(got[0].kind(), SegKind::External);
    drop(second);
    spin(&mut *rxq, &mut got);
    assert_eq!(g.used_idx(), 0, "nothing written into the new ring");
    assert_eq!(
        tp.port.zero_copy_counts(),
        (3, 1, 1),
        "the late segment discarded"
    );
    drop(got);
    until_used(&mut *rxq, &g, 1, "the new ring's chain");
    assert_eq!(g.used_elem_in(TXQ, 0), (1, 0));
    drop(f);
    drop(rxq);
}

/// A guest that offers a buffer id the stack still holds (a driver bug, or a hostile one): the
/// second chain is copied and returned at once, the held one when it is freed; each of the
/// two avail entries comes back once.
#[test]
fn a_buffer_id_offered_twice_while_held_is_copied_the_second_time() {
    let Rig {
        tp,
        pool: _pool,
        mut rxq,
        g,
        kick: _kick,
        f: _f,
    } = rig("zc4", None, false);
    g.send(0, 0, 0, 300, 7);
    let mut got = Vec::new();
    poll(&mut *rxq, &mut got, "the first", |v| v.len() == 1);
    g.offer(1, 0);
    poll(&mut *rxq, &mut got, "the same id again", |v| v.len() == 2);
    assert_eq!(got[0].kind(), SegKind::External);
    assert_ne!(
        got[1].kind(),
        SegKind::External,
        "an id already held is copied"
    );
    assert_eq!(got[1].to_vec(), vec![7u8; 300]);
    assert_eq!(g.used_idx(), 1, "the copied one is back at once");
    drop(got);
    until_used(&mut *rxq, &g, 2, "the held one, once freed");
    assert_eq!(used(&g, 0, 2), vec![(0, 0), (0, 0)]);
    assert_eq!(tp.port.zero_copy_counts(), (1, 0, 0));
}

/// SET_VRING_ENABLE 0 and a new memory table while the stack holds packets: each request
/// waits for them up to the drain timeout and goes on; the ring goes on too (the same ring),
/// so each chain comes back into it once freed. A packet held across the new table reads the
/// zero pages the old mapping was replaced with, never a fault.
#[test]
fn packets_held_across_enable_0_and_a_new_memory_table_come_back_to_the_same_ring() {
    let Rig {
        tp,
        pool: _pool,
        mut rxq,
        g,
        kick: _kick,
        mut f,
    } = rig("zc5", None, true);
    for i in 0..2u16 {
        g.send(i, i, i as u64, 300, 1 + i as u8);
    }
    let mut got = Vec::new();
    poll(&mut *rxq, &mut got, "two frames", |v| v.len() == 2);
    let p1 = got.pop().unwrap();
    let p0 = got.pop().unwrap();

    let asked = Instant::now();
    f.set_vring_enable(1, false).unwrap();
    assert!(
        asked.elapsed() >= Duration::from_millis(250),
        "enable 0 waited"
    );
    drop(p0);
    until_used(&mut *rxq, &g, 1, "a chain freed after enable 0");

    f.set_mem_table(&[vhost::VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: SIZE as u64,
        userspace_addr: UVA,
        mmap_offset: 0,
        mmap_handle: std::os::fd::AsRawFd::as_raw_fd(&g.fd),
    }])
    .unwrap();
    assert_eq!(p1.to_vec(), vec![0u8; 300], "the old mapping reads zeros");
    drop(p1);
    until_used(&mut *rxq, &g, 2, "a chain freed after the new table");
    assert_eq!(used(&g, 0, 2), vec![(0, 0), (1, 0)]);
    assert_eq!(tp.port.zero_copy_counts(), (2, 0, 0));

    f.set_vring_enable(1, true).unwrap();
    g.send(2, 0, 2, 300, 9);
    poll(&mut *rxq, &mut got, "a frame after", |v| v.len() == 1);
    assert_eq!(got[0].to_vec(), vec![9u8; 300]);
}

/// A frontend that goes away while the stack holds its packets: the disconnect waits up to
/// the drain timeout, then the chains are abandoned, the packets read zeros (the guest's
/// memory was let go), and their completions are discarded, not written for the next
/// frontend.
#[test]
fn packets_that_outlive_their_frontend_read_zeros_and_their_completions_are_discarded() {
    let Rig {
        tp,
        pool: _pool,
        mut rxq,
        g,
        kick,
        f,
    } = rig("zc6", None, false);
    g.send(0, 0, 0, 300, 5);
    let mut got = Vec::new();
    poll(&mut *rxq, &mut got, "a frame", |v| v.len() == 1);
    let held = got.pop().unwrap();
    drop(f);
    tp.wait_disconnects(1);
    assert_eq!(
        held.to_vec(),
        vec![0u8; 300],
        "the departed guest's memory reads zeros"
    );
    rxq.rx_burst(&mut got, 32);
    assert_eq!(tp.port.zero_copy_counts(), (1, 1, 0), "abandoned");

    let g2 = Guest::new();
    let _f2 = frontend(&tp.path, &g2, &kick, false);
    g2.send(0, 0, 0, 300, 6);
    poll(&mut *rxq, &mut got, "the next frontend's frame", |v| {
        v.len() == 1
    });
    drop(held);
    spin(&mut *rxq, &mut got);
    assert_eq!(g2.used_idx(), 0, "the next frontend's chain is still held");
    assert_eq!(
        tp.port.zero_copy_counts(),
        (2, 1, 1),
        "the late segment discarded"
    );
    assert_eq!(got[0].to_vec(), vec![6u8; 300]);
    got.clear();
    until_used(&mut *rxq, &g2, 1, "the next frontend's chain");
}
