//! A guest reset while the host is sending, host and guest in two processes.
//!
//! The parent is the host: it sends `N_UP` sequence-numbered frames up as fast as the ring takes
//! them and receives the guest's `M_DOWN` frames. The child is the guest: after `RESET_AFTER`
//! frames it calls `GuestPort::reset()` from a second thread while its polling thread keeps
//! calling the bursts (a reset parks the queues, so they must be polled). Afterwards traffic
//! resumes with increasing sequence numbers, and the losses are exactly what the counters say:
//!
//! * up:   host tx packets + host tx drops = N_UP; host tx packets = guest rx + reset_discards;
//! * down: guest tx packets = M_DOWN = host rx packets + host rx drops (swept by the reset).
//!
//! Channel between the two: the child prints `GUEST_TX_DONE ...` and `GUEST_RESULT ...` on
//! stdout; the parent writes `HOST_DONE ...` to the child's stdin.

use memnic_test_support as common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Child, Receiver, Sender, ShmName, DOWN, ENV_ROLE, ENV_SEED, ENV_SHM, UP};
use memnic_ethdev::Port;
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort};

const TIMEOUT: Duration = Duration::from_secs(90);
const N_UP: u64 = 400_000;
const M_DOWN: u64 = 200_000;
const RESET_AFTER: u64 = 50_000;

fn poll_guest_reset_while_host_sends() {
    let _serial = common::serial();
    let deadline = Instant::now() + TIMEOUT;
    let shm = ShmName::new("2p-reset");
    let seed = common::seed();
    let mut host = HostPort::create("host0", &HostConfig::new(shm.name())).unwrap();
    let rx_pool = common::pool("host-rx", 4096, 2048);
    let tx_pool = common::pool("host-tx", 4096, 2048);
    let mut rxq = host.take_rx_queue(0, &rx_pool).unwrap();
    let mut txq = host.take_tx_queue(0, &tx_pool).unwrap();
    let mut child = Child::role(
        "guest_resets",
        &[
            (ENV_ROLE, "guest".to_string()),
            (ENV_SHM, shm.name().to_string()),
            (ENV_SEED, seed.to_string()),
        ],
    );
    let mut tx = Sender::new(&tx_pool, seed, UP, N_UP);
    let mut rx = Receiver::new(&rx_pool, seed, DOWN).gaps();
    let mut idle = Vec::new();
    let mut told = false;
    let mut guest_tx: Option<u64> = None;
    let mut spins = 0u64;
    loop {
        rx.poll(&mut *rxq);
        if host.link().up && !tx.done() {
            tx.poll(&mut *txq);
        } else {
            // Keeps the queue answering the reset gate without sending into a down link.
            txq.tx_burst(&mut idle);
        }
        spins += 1;
        if !spins.is_multiple_of(1024) {
            continue;
        }
        if !told && tx.done() && host.resets() >= 2 {
            // The guest's reset is served and we have sent everything: final numbers.
            let ts = txq.stats();
            child.send(&format!(
                "HOST_DONE tx_packets={} tx_drops={} discards={} total={N_UP}",
                ts.packets,
                ts.drops,
                host.reset_discards()
            ));
            told = true;
        }
        if guest_tx.is_none() {
            guest_tx = child
                .line("GUEST_TX_DONE")
                .map(|l| common::field(&l, "tx_packets"));
        }
        if let Some(m) = guest_tx {
            let rs = rxq.stats();
            assert!(
                rs.packets + rs.drops <= m,
                "received more than sent: {rs:?}"
            );
            if told && rs.packets + rs.drops == m {
                break;
            }
        }
        child.check_alive_or_ok("GUEST_RESULT");
        if Instant::now() > deadline {
            child.fail(&format!(
                "host timed out: sent {} of {N_UP} (resets {}), received {}, told {told}, guest tx {guest_tx:?}",
                tx.taken,
                host.resets(),
                rx.count
            ));
        }
    }
    child.wait_success(deadline);
    let res = child
        .line("GUEST_RESULT")
        .unwrap_or_else(|| child.fail("the child printed no GUEST_RESULT"));
    let guest_rx = common::field(&res, "rx_packets");
    let guest_lost = common::field(&res, "lost");

    let (rs, ts) = host.queue_stats();
    let (rs, ts) = (rs[0], ts[0]);
    eprintln!(
        "host tx {ts:?}, rx {rs:?}, reset discards {}, guest {res}",
        host.reset_discards()
    );
    assert_eq!(
        host.resets(),
        2,
        "the attach reset and the one under traffic"
    );
    // Up: every sequence number was either sent or dropped while the link was not valid.
    assert_eq!(tx.taken, N_UP);
    assert_eq!(ts.packets + ts.drops, N_UP, "host tx {ts:?}");
    assert_eq!(ts.errors, 0);
    // Sent frames were received unless the reset swept them.
    assert_eq!(
        ts.packets,
        guest_rx + host.reset_discards(),
        "host tx packets = guest rx + reset discards"
    );
    assert_eq!(
        guest_lost,
        ts.drops + host.reset_discards(),
        "the guest missed exactly the dropped and the discarded frames"
    );
    // Down: the guest's frames were received unless the reset swept them (host rx drops).
    assert_eq!(guest_tx, Some(M_DOWN));
    assert_eq!(rs.packets + rs.drops, M_DOWN, "host rx {rs:?}");
    assert_eq!(rx.count, rs.packets);
    assert_eq!(rx.lost + (M_DOWN - rx.expect), rs.drops);
    assert_eq!(rs.errors, 0);
    assert_eq!(rs.nombuf, 0);
}

/// The guest role of `poll_guest_reset_while_host_sends` (nothing unless started by it).
fn guest_resets() {
    let (role, shm, seed) = common::child_role().expect("started by a test as the guest");
    assert_eq!(role, "guest");
    let deadline = Instant::now() + TIMEOUT - Duration::from_secs(5);
    let from_parent = common::stdin_lines();
    let mut cfg = GuestConfig::new(&shm);
    cfg.reset_timeout = Duration::from_secs(20);
    let mut port = GuestPort::attach("guest0", &cfg).expect("guest attach");
    let rx_pool = common::pool("guest-rx", 4096, 2048);
    let tx_pool = common::pool("guest-tx", 4096, 2048);
    // Queues first; then the port moves to the thread that resets it.
    let mut rxq = port.take_rx_queue(0, &rx_pool).unwrap();
    let mut txq = port.take_tx_queue(0, &tx_pool).unwrap();
    let go = Arc::new(AtomicBool::new(false));
    let reset_done = Arc::new(AtomicBool::new(false));
    let resetter = {
        let (go, reset_done) = (go.clone(), reset_done.clone());
        std::thread::spawn(move || {
            while !go.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let r = port.reset();
            reset_done.store(true, Ordering::Release);
            (port, r)
        })
    };
    let mut tx = Sender::new(&tx_pool, seed, DOWN, M_DOWN);
    let mut rx = Receiver::new(&rx_pool, seed, UP).gaps();
    let mut seq_at_reset = None;
    let mut count_at_reset_end = None;
    let mut printed = false;
    let mut expected: Option<(u64, u64, u64, u64)> = None;
    let mut spins = 0u64;
    loop {
        rx.poll(&mut *rxq);
        tx.poll(&mut *txq); // an empty burst still answers the reset gate
        if seq_at_reset.is_none() && rx.count >= RESET_AFTER {
            seq_at_reset = Some(rx.expect);
            go.store(true, Ordering::Release);
        }
        if count_at_reset_end.is_none() && reset_done.load(Ordering::Acquire) {
            count_at_reset_end = Some(rx.count);
        }
        if !printed && count_at_reset_end.is_some() && tx.done() {
            println!("\nGUEST_TX_DONE tx_packets={}", tx.taken);
            printed = true;
        }
        if expected.is_none() {
            expected = common::find_line(&from_parent, "HOST_DONE").map(|l| {
                (
                    common::field(&l, "tx_packets"),
                    common::field(&l, "tx_drops"),
                    common::field(&l, "discards"),
                    common::field(&l, "total"),
                )
            });
        }
        if let Some((sent, _, discards, _)) = expected {
            assert!(
                rx.count <= sent - discards,
                "received {} but the host sent {sent} and a reset discarded {discards}",
                rx.count
            );
            if printed && rx.count == sent - discards {
                break;
            }
        }
        spins += 1;
        if spins.is_multiple_of(4096) && Instant::now() > deadline {
            panic!(
                "guest timed out: sent {} of {M_DOWN}, received {}, reset at {seq_at_reset:?}, \
                 reset done {}, host {expected:?}",
                tx.taken,
                rx.count,
                reset_done.load(Ordering::Relaxed)
            );
        }
    }
    let (port, r) = resetter.join().expect("reset thread");
    assert_eq!(r.expect("reset under traffic"), 1518);
    let (sent, drops, discards, total) = expected.unwrap();
    let seq_at_reset = seq_at_reset.unwrap();
    let after = rx.count - count_at_reset_end.unwrap();
    // Traffic recovered: frames kept coming after the reset, with higher sequence numbers.
    assert!(after > 0, "no frame received after the reset");
    assert!(rx.expect > seq_at_reset);
    // Nothing corrupted, duplicated or reordered (Receiver checks); the gaps are the losses.
    let lost = rx.lost + (total - rx.expect);
    assert_eq!(rx.count + lost, total);
    assert_eq!(lost, drops + discards, "host sent {sent}");
    let (rs, ts) = port.queue_stats();
    assert_eq!(rs[0].packets, rx.count);
    assert_eq!(rs[0].bytes, rx.bytes);
    assert_eq!(rs[0].errors, 0);
    assert_eq!(ts[0].packets, M_DOWN);
    assert_eq!(ts[0].bytes, tx.taken_bytes);
    assert_eq!(ts[0].drops, 0);
    println!(
        "\nGUEST_RESULT rx_packets={} lost={lost} after_reset={after}",
        rx.count
    );
}

fn main() {
    common::harness(
        &[(
            "poll_guest_reset_while_host_sends",
            poll_guest_reset_while_host_sends,
        )],
        &[("guest_resets", guest_resets)],
    )
}
