//! Host and guest in two processes over one `/dev/shm` region, traffic both ways at once.
//!
//! The parent test plays the host; it re-executes this test binary in its `guest` child role
//! (`memnic_test_support::harness`: a child role is not a test, so it is never listed or run as
//! one). Every payload carries a sequence
//! number and a checksum: the receivers check that nothing is lost, corrupted, duplicated or
//! reordered, and the senders retry what `tx_burst` hands back (back-pressure, not drops).

use memnic_test_support as common;

use std::time::{Duration, Instant};

use common::{
    Child, Receiver, Sender, ShmName, DOWN, ENV_ROLE, ENV_SEED, ENV_SHM, MAX_FRAME, MIN_FRAME, UP,
};
use memnic_ethdev::flush::FlushMode;
use memnic_ethdev::stream::StreamMode;
use memnic_ethdev::{Port, QueueStats};
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort, Variant};

/// A bound on the whole exchange (a debug build moves the million frames in well under it).
const TIMEOUT: Duration = Duration::from_secs(90);

fn variant_name(v: Variant) -> &'static str {
    v.name()
}

/// Parent: the host side. Sends `count` frames up while receiving `count` frames down.
fn run_host(child_test: &str, variant: Variant, count: u64) {
    let _serial = common::serial();
    let deadline = Instant::now() + TIMEOUT;
    let shm = ShmName::new("2p");
    let seed = common::seed();
    // The host's rx flushes every frame it copies, the guest's none; the host's tx streams
    // every frame of up to 128 B, the guest's none: the counters say so.
    let mut cfg = HostConfig::new(shm.name());
    cfg.rx_flush = FlushMode::On;
    cfg.tx_stream = StreamMode::On;
    let mut host = HostPort::create("host0", &cfg).unwrap();
    let rx_pool = common::pool("host-rx", 4096, 2048);
    let tx_pool = common::pool("host-tx", 4096, 2048);
    let mut rxq = host.take_rx_queue(0, &rx_pool).unwrap();
    let mut txq = host.take_tx_queue(0, &tx_pool).unwrap();
    let mut child = Child::role(
        child_test,
        &[
            (ENV_ROLE, "guest".to_string()),
            (ENV_SHM, shm.name().to_string()),
            (ENV_SEED, seed.to_string()),
            ("MEMNIC_TEST_VARIANT", variant_name(variant).to_string()),
            ("MEMNIC_TEST_COUNT", count.to_string()),
        ],
    );
    let mut tx = Sender::new(&tx_pool, seed, UP, count);
    let mut rx = Receiver::new(&rx_pool, seed, DOWN);
    let mut idle = Vec::new();
    let mut spins = 0u64;
    // Poll rx from the start: the guest's attach waits for us to serve its reset.
    while !(tx.done() && rx.count == count) {
        rx.poll(&mut *rxq);
        if host.link().up {
            tx.poll(&mut *txq);
        } else {
            // Sending now would drop (valid == 0); a burst still lets a reset park this queue.
            txq.tx_burst(&mut idle);
        }
        spins += 1;
        if spins.is_multiple_of(4096) {
            child.check_alive_or_ok("GUEST_RESULT");
            if Instant::now() > deadline {
                child.fail(&format!(
                    "host timed out: sent {} of {count}, received {} of {count}",
                    tx.taken, rx.count
                ));
            }
        }
    }
    child.wait_success(deadline);

    // The guest's own count of what it received and sent.
    let line = child
        .line("GUEST_RESULT")
        .unwrap_or_else(|| child.fail("the child printed no GUEST_RESULT"));
    assert_eq!(common::field(&line, "rx_packets"), count, "{line}");
    assert_eq!(common::field(&line, "rx_bytes"), tx.taken_bytes, "{line}");
    assert_eq!(common::field(&line, "tx_packets"), count, "{line}");
    assert_eq!(common::field(&line, "tx_bytes"), rx.bytes, "{line}");

    let (rs, ts) = host.queue_stats();
    assert_eq!(rs.len(), 1);
    assert_eq!(ts.len(), 1);
    let want_rx = with_holds_of(
        &rs[0],
        QueueStats {
            packets: count,
            bytes: rx.bytes,
            tuned: count,
            ..QueueStats::default()
        },
    );
    let (holds, unpaid) = (rs[0].holds, rs[0].holds_unpaid);
    let short = (0..count)
        .filter(|&seq| common::frame_len(seed, UP, seq, MIN_FRAME, MAX_FRAME) <= 128)
        .count() as u64;
    assert!(short > count / 40, "{short} of {count} frames up to 128 B");
    let want_tx = QueueStats {
        packets: count,
        bytes: tx.taken_bytes,
        tuned: short,
        ..QueueStats::default()
    };
    assert_eq!(rs[0], want_rx, "host rx stats");
    assert_eq!(
        host.xstats(),
        vec![
            ("rx_flushed_packets", count),
            ("rx_flush_switches", 0),
            ("tx_streamed_packets", short),
            ("tx_stream_switches", 0),
            ("rx_holdoffs", holds),
            ("rx_holdoffs_unpaid", unpaid)
        ]
    );
    assert_eq!(ts[0], want_tx, "host tx stats");
    assert_eq!(rxq.stats(), want_rx);
    assert_eq!(txq.stats(), want_tx);
    assert_eq!(host.resets(), 1, "only the attach reset");
    assert_eq!(host.reset_discards(), 0);
}

/// Child: the guest side. Attaches, then sends `count` frames down while receiving `count` up.
fn run_guest() {
    let (role, shm, seed) = common::child_role().expect("started by a test as the guest");
    assert_eq!(role, "guest");
    let deadline = Instant::now() + TIMEOUT - Duration::from_secs(5);
    let variant: Variant = std::env::var("MEMNIC_TEST_VARIANT")
        .unwrap()
        .parse()
        .unwrap();
    let count: u64 = std::env::var("MEMNIC_TEST_COUNT").unwrap().parse().unwrap();
    let mut cfg = GuestConfig::new(&shm);
    cfg.variant = variant;
    cfg.reset_timeout = Duration::from_secs(20);
    cfg.rx_flush = FlushMode::Off;
    cfg.tx_stream = StreamMode::Off;
    let mut port = GuestPort::attach("guest0", &cfg).expect("guest attach");
    assert!(port.link().up);
    assert_eq!(port.framesz(), 1518);
    let rx_pool = common::pool("guest-rx", 4096, 2048);
    let tx_pool = common::pool("guest-tx", 4096, 2048);
    let mut rxq = port.take_rx_queue(0, &rx_pool).unwrap();
    let mut txq = port.take_tx_queue(0, &tx_pool).unwrap();
    let mut tx = Sender::new(&tx_pool, seed, DOWN, count);
    let mut rx = Receiver::new(&rx_pool, seed, UP);
    let mut spins = 0u64;
    while !(tx.done() && rx.count == count) {
        rx.poll(&mut *rxq);
        tx.poll(&mut *txq);
        spins += 1;
        if spins.is_multiple_of(4096) && Instant::now() > deadline {
            panic!(
                "guest timed out: sent {} of {count}, received {} of {count}",
                tx.taken, rx.count
            );
        }
    }
    let (rs, ts) = port.queue_stats();
    assert_eq!(rs.len(), 1, "guest rx queues");
    let want_rx = with_holds_of(
        &rs[0],
        QueueStats {
            packets: count,
            bytes: rx.bytes,
            ..QueueStats::default()
        },
    );
    let want_tx = QueueStats {
        packets: count,
        bytes: tx.taken_bytes,
        ..QueueStats::default()
    };
    assert_eq!(rs, vec![want_rx], "guest rx stats");
    assert_eq!(ts, vec![want_tx], "guest tx stats");
    println!(
        "GUEST_RESULT rx_packets={} rx_bytes={} tx_packets={} tx_bytes={}",
        rx.count, rx.bytes, tx.taken, tx.taken_bytes
    );
}

/// `want` with the hold-off counts of `got`: how often an rx queue held off is the machine's
/// timing, so only their sense is checked.
fn with_holds_of(got: &QueueStats, want: QueueStats) -> QueueStats {
    assert!(got.holds_unpaid <= got.holds, "{got:?}");
    QueueStats {
        holds: got.holds,
        holds_unpaid: got.holds_unpaid,
        ..want
    }
}

fn poll_two_process_million_each_way() {
    run_host("guest", Variant::Memnic, 1_000_000);
}

fn poll_two_process_2014_after_variant() {
    run_host("guest", Variant::After2014, 200_000);
}

fn poll_two_process_2014_before_variant() {
    run_host("guest", Variant::Before2014, 200_000);
}

fn main() {
    common::harness(
        &[
            (
                "poll_two_process_million_each_way",
                poll_two_process_million_each_way,
            ),
            (
                "poll_two_process_2014_after_variant",
                poll_two_process_2014_after_variant,
            ),
            (
                "poll_two_process_2014_before_variant",
                poll_two_process_2014_before_variant,
            ),
        ],
        &[("guest", run_guest)],
    )
}
