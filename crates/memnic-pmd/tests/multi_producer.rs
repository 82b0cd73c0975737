//! Several host tx queues (host lcores) sending into the one `up` ring: compare-and-swap claims
//! on a shared head with the v1 false-positive retry (`specs/memnic.md` §5). Each producer's
//! frames must reach the guest once each, intact and in that producer's order.

use memnic_test_support as common;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use common::{ShmName, UP};
use memnic_ethdev::{Port, TxQueue};
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort};

const PRODUCERS: u64 = 2;
const PER_PRODUCER: u64 = 100_000;

/// Sequence numbers carry the producer in their top 16 bits.
fn seq(p: u64, k: u64) -> u64 {
    (p << 48) | k
}

#[test]
fn poll_two_host_tx_queues_share_the_up_ring() {
    let _serial = common::serial();
    let deadline = Instant::now() + Duration::from_secs(60);
    let shm = ShmName::new("mp");
    let seed = common::seed();
    let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let pool = common::pool("host", 8192, 2048);
    let guest_pool = common::pool("guest", 4096, 2048);
    let mut hrx = host.take_rx_queue(0, &pool).unwrap();
    let mut txqs: Vec<Box<dyn TxQueue>> = (0..PRODUCERS)
        .map(|q| host.take_tx_queue(q as u16, &pool).unwrap())
        .collect();
    // Attach while the host polls rx and every tx queue.
    let stop = AtomicBool::new(false);
    let mut guest = std::thread::scope(|s| {
        let (hrx, txqs, stop) = (&mut hrx, &mut txqs, &stop);
        s.spawn(move || {
            let mut v = Vec::new();
            while !stop.load(Relaxed) {
                hrx.rx_burst(&mut v, 32);
                for t in txqs.iter_mut() {
                    t.tx_burst(&mut v);
                }
                std::thread::yield_now();
            }
        });
        let mut cfg = GuestConfig::new(shm.name());
        cfg.reset_timeout = Duration::from_secs(20);
        let g = GuestPort::attach("g", &cfg);
        stop.store(true, Relaxed);
        g
    })
    .expect("attach");
    let mut grx = guest.take_rx_queue(0, &guest_pool).unwrap();

    let failed = AtomicBool::new(false);
    let received = std::thread::scope(|s| {
        for (p, mut txq) in txqs.drain(..).enumerate() {
            let (pool, failed) = (&pool, &failed);
            s.spawn(move || {
                let p = p as u64;
                let mut cache = pool.cache();
                let mut pending = Vec::new();
                let mut k = 0;
                while (k < PER_PRODUCER || !pending.is_empty()) && !failed.load(Relaxed) {
                    while pending.len() < 32 && k < PER_PRODUCER {
                        let sq = seq(p, k);
                        let len = common::frame_len(seed, UP, sq, 60, 1518);
                        let mut m = cache.alloc().expect("pool");
                        assert!(m.set_len(len));
                        common::fill(m.as_mut_slice().unwrap(), sq, UP);
                        pending.push(m);
                        k += 1;
                    }
                    txq.tx_burst(&mut pending);
                    if Instant::now() > deadline {
                        failed.store(true, Relaxed);
                        panic!("producer {p} timed out at {k}");
                    }
                }
                let st = txq.stats();
                assert_eq!(st.packets, PER_PRODUCER, "producer {p}: {st:?}");
                assert_eq!(st.drops, 0, "producer {p}: {st:?}");
            });
        }
        // The guest: one consumer, checking each producer's stream.
        let mut expect = [0u64; PRODUCERS as usize];
        let mut buf = Vec::new();
        let mut cache = guest_pool.cache();
        let mut total = 0;
        while total < PRODUCERS * PER_PRODUCER {
            grx.rx_burst(&mut buf, 32);
            for m in buf.drain(..) {
                let sq = common::check(&m.to_vec()).unwrap_or_else(|e| {
                    failed.store(true, Relaxed);
                    panic!("after {total} frames: {e}")
                });
                let (p, k) = ((sq >> 48) as usize, sq & 0xFFFF_FFFF_FFFF);
                if p >= expect.len() || k != expect[p] {
                    failed.store(true, Relaxed);
                    panic!("frame {sq:#x}: producer {p}, expected {expect:?}");
                }
                assert_eq!(m.len(), common::frame_len(seed, UP, sq, 60, 1518));
                expect[p] += 1;
                total += 1;
                cache.free(m);
            }
            if Instant::now() > deadline || failed.load(Relaxed) {
                failed.store(true, Relaxed);
                panic!("guest stopped at {expect:?}");
            }
        }
        total
    });
    assert_eq!(received, PRODUCERS * PER_PRODUCER);
    let (_, ts) = host.queue_stats();
    assert_eq!(ts.iter().map(|s| s.packets).sum::<u64>(), received);
    let (gr, _) = guest.queue_stats();
    assert_eq!(gr[0].packets, received);
    assert_eq!(gr[0].errors, 0);
}
