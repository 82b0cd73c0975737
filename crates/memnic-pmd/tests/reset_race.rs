//! Guest resets under traffic while the host's control thread calls `Port::service()` and the
//! host lcore polls its queues: either may serve a reset. Whoever serves it, frames stay in
//! order without duplicates, and the counters account for every frame:
//!
//! * up:   host tx packets = guest rx packets + host reset_discards;
//! * down: guest tx packets = host rx packets + host rx drops (frames a reset swept).

use memnic_test_support as common;

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use common::{Receiver, Sender, ShmName, DOWN, UP};
use memnic_ethdev::Port;
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort};

const RESETS: u64 = 20;
const DOWN_FRAMES: u64 = 200_000;

/// Sets `flag` if the owning thread unwinds, so the others stop.
struct AbortOnPanic<'a>(&'a AtomicBool);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Relaxed);
        }
    }
}

#[test]
fn poll_resets_served_by_the_control_thread_or_the_rx_queue() {
    let _serial = common::serial();
    let deadline = Instant::now() + Duration::from_secs(60);
    let shm = ShmName::new("race");
    let seed = common::seed();
    let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let hpool = common::pool("host", 4096, 2048);
    let gpool = common::pool("guest", 4096, 2048);
    let mut hrx = host.take_rx_queue(0, &hpool).unwrap();
    let mut htx = host.take_tx_queue(0, &hpool).unwrap();

    let abort = AtomicBool::new(false);
    let host_stop_tx = AtomicBool::new(false);
    let host_stop = AtomicBool::new(false);
    let control_stop = AtomicBool::new(false);
    let served_by_control = AtomicU64::new(0);
    let resets_wanted = AtomicU64::new(0);
    let resets_done = AtomicU64::new(0);
    let host_final = AtomicU64::new(u64::MAX); // host tx packets once it stopped sending
    let discards = AtomicU64::new(0);
    let host_rx_seen = AtomicU64::new(0);

    let (abort, host_stop_tx, host_stop, control_stop) =
        (&abort, &host_stop_tx, &host_stop, &control_stop);
    let (served_by_control, resets_wanted, resets_done, host_final) = (
        &served_by_control,
        &resets_wanted,
        &resets_done,
        &host_final,
    );
    let (discards, host_rx_seen, hpool, gpool) = (&discards, &host_rx_seen, &hpool, &gpool);
    let running = move |stop: &AtomicBool| !stop.load(Relaxed) && !abort.load(Relaxed);
    std::thread::scope(|s| {
        let _a = AbortOnPanic(abort);
        // The host lcore.
        let hl = s.spawn(move || {
            let _a = AbortOnPanic(abort);
            let mut tx = Sender::new(hpool, seed, UP, u64::MAX);
            let mut rx = Receiver::new(hpool, seed, DOWN).gaps();
            let mut idle = Vec::new();
            while running(host_stop) {
                rx.poll(&mut *hrx);
                if host_stop_tx.load(Acquire) {
                    if host_final.load(Relaxed) == u64::MAX {
                        host_final.store(htx.stats().packets, Release);
                    }
                    htx.tx_burst(&mut idle);
                } else {
                    tx.poll(&mut *htx);
                }
            }
            (rx.count, rx.lost, hrx.stats(), htx.stats())
        });
        // The host's control thread: owns the port, serves resets, publishes the counters.
        let ctl = s.spawn(move || {
            let _a = AbortOnPanic(abort);
            while running(control_stop) {
                let before = host.resets();
                host.service();
                if host.resets() > before {
                    served_by_control.fetch_add(1, Relaxed);
                }
                let (rs, _) = host.queue_stats();
                host_rx_seen.store(rs[0].packets + rs[0].drops, Relaxed);
                discards.store(host.reset_discards(), Release);
                std::thread::yield_now();
            }
            host
        });

        let mut cfg = GuestConfig::new(shm.name());
        cfg.reset_timeout = Duration::from_secs(20);
        let mut guest = GuestPort::attach("g", &cfg).expect("attach");
        let mut grx = guest.take_rx_queue(0, gpool).unwrap();
        let mut gtx = guest.take_tx_queue(0, gpool).unwrap();
        // The guest's control thread: a reset whenever the lcore asks for one.
        let gc = s.spawn(move || {
            let _a = AbortOnPanic(abort);
            for i in 0..RESETS {
                while resets_wanted.load(Acquire) <= i {
                    if abort.load(Relaxed) {
                        return guest;
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                assert_eq!(guest.reset().expect("reset under traffic"), 1518);
                resets_done.store(i + 1, Release);
            }
            guest
        });
        // The guest lcore.
        let mut tx = Sender::new(gpool, seed, DOWN, DOWN_FRAMES);
        let mut rx = Receiver::new(gpool, seed, UP).gaps();
        let mut next_reset_at = 2_000;
        loop {
            rx.poll(&mut *grx);
            tx.poll(&mut *gtx);
            let done = resets_done.load(Acquire);
            if rx.count >= next_reset_at && resets_wanted.load(Relaxed) == done && done < RESETS {
                resets_wanted.store(done + 1, Release);
                next_reset_at = rx.count + 5_000;
            }
            if done == RESETS && tx.done() {
                host_stop_tx.store(true, Release);
                let fin = host_final.load(Acquire);
                if fin != u64::MAX && rx.count + discards.load(Acquire) >= fin {
                    break;
                }
            }
            assert!(!abort.load(Relaxed), "another thread panicked");
            assert!(
                Instant::now() < deadline,
                "guest stalled: rx {} tx {} resets {done}",
                rx.count,
                tx.taken
            );
        }
        // Let the host drain the down ring, then stop everything.
        let gts = gtx.stats();
        assert_eq!(gts.packets, DOWN_FRAMES);
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until && host_rx_seen.load(Relaxed) < DOWN_FRAMES {
            std::thread::sleep(Duration::from_millis(1));
        }
        control_stop.store(true, Relaxed);
        host_stop.store(true, Relaxed);
        let host = ctl.join().unwrap();
        let (h_count, h_lost, hrs, hts) = hl.join().unwrap();
        let guest = gc.join().unwrap();
        let (grs, _) = guest.queue_stats();
        eprintln!(
            "resets {} ({} served by Port::service); host rx {hrs:?} tx {hts:?}, \
             discards {}; guest rx {:?} lost {}; host lost {h_lost}",
            host.resets(),
            served_by_control.load(Relaxed),
            host.reset_discards(),
            grs[0],
            rx.lost
        );
        assert_eq!(host.resets(), RESETS + 1);
        // Up: nothing duplicated or reordered (Receiver), and every loss is a counted discard.
        assert_eq!(grs[0].packets, rx.count);
        assert_eq!(
            hts.packets,
            rx.count + host.reset_discards(),
            "up accounting"
        );
        assert_eq!(
            hts.drops, 0,
            "the host back-pressures while the link is down"
        );
        assert_eq!(
            rx.lost + (hts.packets - rx.expect),
            host.reset_discards(),
            "the sequence gaps are the discarded frames"
        );
        // Down: every frame the guest sent was received or counted as dropped by a reset.
        assert_eq!(hrs.packets, h_count);
        assert_eq!(
            hrs.packets + hrs.drops,
            DOWN_FRAMES,
            "down accounting: host rx {hrs:?}, {h_lost} frames missing in the sequence"
        );
        assert_eq!(h_lost, hrs.drops);
    });
}
