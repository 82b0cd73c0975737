//! Our memif client and server against each other, two processes, copy and zero-copy modes,
//! two queue pairs, each direction, with the integrity verifier.

mod common;

use std::time::Duration;

use common::json_of;

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v["ports"][0][k]
        .as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

#[test]
fn poll_client_and_server_copy_and_zero_copy_two_queue_pairs_verified() {
    for zero_copy in ["no", "yes"] {
        for client_sends in [true, false] {
            let sock = format!(
                "/tmp/memnic-pair-{zero_copy}-{client_sends}-{}.sock",
                std::process::id()
            );
            let _ = std::fs::remove_file(&sock);
            let (smode, cmode) = if client_sends {
                ("rxonly", "txonly")
            } else {
                ("txonly", "rxonly")
            };
            let sdev = format!("memif0,role=server,socket={sock}");
            let cdev = format!("memif0,role=client,socket={sock},zero-copy={zero_copy}");
            let q = [
                "--rxq", "2", "--txq", "2", "--verify", "--txpkts", "1000", "--json",
            ];
            let mut sargs = vec![
                "testpmd",
                "-l",
                "0",
                "--vdev",
                &sdev,
                "--forward-mode",
                smode,
                "--duration",
                "6",
            ];
            sargs.extend_from_slice(&q);
            let server = common::spawn(&sargs);
            common::wait_for_path(&sock, Duration::from_secs(20));
            let mut cargs = vec![
                "testpmd",
                "-l",
                "1",
                "--vdev",
                &cdev,
                "--forward-mode",
                cmode,
                "--duration",
                "3",
            ];
            cargs.extend_from_slice(&q);
            let c = common::spawn(&cargs).wait(Duration::from_secs(30));
            let s = server.wait(Duration::from_secs(30));
            assert!(
                c.status.success() && s.status.success(),
                "{}",
                String::from_utf8_lossy(&c.stderr)
            );
            let (cj, sj) = (json_of(&c), json_of(&s));
            let (tx, rx) = if client_sends { (&cj, &sj) } else { (&sj, &cj) };
            let what = format!("zero-copy={zero_copy} client_sends={client_sends}");
            assert!(n(rx, "good") > 10_000, "{what}: {rx}");
            common::assert_verified_clean(&rx["ports"][0], &format!("{what}: {rx}"));
            assert_eq!(n(rx, "good"), n(rx, "rx_packets"), "{what}");
            // Frames still in the rings when the sender leaves are not read (the link goes down
            // with it); at most two rings of them.
            let (t, r) = (n(tx, "tx_packets"), n(rx, "rx_packets"));
            assert!(
                t >= r && t - r <= 2 * 1024,
                "{what}: sent {t}, received {r}"
            );
            // Two queue pairs, each carrying traffic.
            assert_eq!(rx["lcores"][0]["streams"], 2, "{what}");
            let _ = std::fs::remove_file(&sock);
        }
    }
}

/// `--rx-interrupt`: an idle server lcore sleeps on the eventfd instead of spinning, and wakes up
/// when frames come.
#[test]
fn poll_rx_interrupt_sleeps_when_idle_and_wakes_for_traffic() {
    let (sock, sdev, cdev) = common::memif_pair_socket("irq");
    let server = common::spawn(&[
        "testpmd",
        "-l",
        "0",
        "--vdev",
        &sdev,
        "--forward-mode",
        "rxonly",
        "--rx-interrupt",
        "--duration",
        "7",
        "--json",
    ]);
    common::wait_for_path(&sock, Duration::from_secs(20));
    // A client that sends nothing for 2.5 s.
    let idle = common::spawn(&[
        "testpmd",
        "-l",
        "1",
        "--vdev",
        &cdev,
        "--forward-mode",
        "rxonly",
        "--duration",
        "2.5",
    ]);
    let t0 = server.cpu_time();
    let _ = idle.wait(Duration::from_secs(20));
    let spent = server.cpu_time() - t0;
    assert!(
        spent < Duration::from_millis(1200),
        "an idle interrupt-mode lcore used {spent:?} of CPU in 2.5 s"
    );
    // Then a client that sends: the sleeping lcore wakes up and receives.
    let busy = common::spawn(&[
        "testpmd",
        "-l",
        "1",
        "--vdev",
        &cdev,
        "--forward-mode",
        "txonly",
        "--duration",
        "2",
    ]);
    let _ = busy.wait(Duration::from_secs(20));
    let s = server.wait(Duration::from_secs(20));
    let j = json_of(&s);
    assert!(n(&j, "rx_packets") > 10_000, "{j}");
    let _ = std::fs::remove_file(&sock);
}

/// Once both sides are connected and forwarding, testpmd's control thread sleeps until the next
/// unjam of the interrupt lines (50 ms) instead of waking every few milliseconds: each wake-up
/// takes a CPU from a polling lcore on a machine whose CPUs all poll (it showed in the round
/// trips' p99.9). Counted: the main thread's sleeps over 2 s of traffic, on both sides.
#[test]
fn poll_connected_control_thread_wakes_seldom() {
    let (sock, sdev, cdev) = common::memif_pair_socket("wakes");
    let server = common::testpmd(
        0,
        &sdev,
        "rxonly",
        &["--duration", "8", "--stats-period", "1"],
    );
    common::wait_for_path(&sock, Duration::from_secs(20));
    let client = common::testpmd(1, &cdev, "txonly", &["--duration", "6", "--json"]);
    // Connected and forwarding: the server's stats lines show frames received.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !server.output().lines().any(|l| {
        l.contains("RX-packets")
            && l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|v| v > 0)
    }) {
        assert!(std::time::Instant::now() < deadline, "{}", server.output());
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = (server.main_thread_sleeps(), client.main_thread_sleeps());
    std::thread::sleep(Duration::from_secs(2));
    let after = (server.main_thread_sleeps(), client.main_thread_sleeps());
    // 2 s at one wake-up per 50 ms is 40, plus the stats ticks; every 5 ms would be 400.
    for (side, n) in [
        ("server", after.0 - before.0),
        ("client", after.1 - before.1),
    ] {
        assert!(
            n <= 80,
            "the {side}'s control thread slept {n} times in 2 s"
        );
    }
    let c = client.wait(Duration::from_secs(30));
    let s = server.wait(Duration::from_secs(30));
    assert!(c.status.success() && s.status.success());
    assert!(n(&json_of(&c), "tx_packets") > 10_000);
    let _ = std::fs::remove_file(&sock);
}

/// A client that keeps connecting and hanging up wakes the server's control thread each time
/// (it sleeps on the listening socket), but the services stay 5 ms apart, so the flood cannot
/// take a CPU from the lcores: the control thread's CPU time over 2 s of it is measured.
#[test]
fn poll_a_connect_flood_does_not_make_the_control_thread_spin() {
    use memnic_shm::unix::{SeqpacketConn, SocketAddrSpec};
    let (sock, sdev, _) = common::memif_pair_socket("flood");
    let server = common::testpmd(0, &sdev, "rxonly", &["--duration", "6"]);
    common::wait_for_path(&sock, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    let addr = SocketAddrSpec::Path(sock.clone().into());
    let before = server.main_thread_cpu_time();
    let until = std::time::Instant::now() + Duration::from_secs(2);
    let mut connects = 0u64;
    while std::time::Instant::now() < until {
        if SeqpacketConn::connect(&addr).is_ok() {
            connects += 1;
        }
    }
    let spent = server.main_thread_cpu_time() - before;
    assert!(connects > 100, "only {connects} connections made");
    assert!(
        spent < Duration::from_millis(600),
        "{connects} connections in 2 s took {spent:?} of the control thread"
    );
    let s = server.wait(Duration::from_secs(30));
    assert!(s.status.success());
    let _ = std::fs::remove_file(&sock);
}
