//! `memnic testpmd` as two processes over one MEMNIC region: generator and verifier on either
//! side, and a reflector. Polling tests: they run serially (nextest group) and need both CPUs.

mod common;

use std::time::Duration;

use common::{json_of, ShmName};

fn port(v: &serde_json::Value) -> &serde_json::Value {
    &v["ports"][0]
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("field {k} missing in {v}"))
}

/// Host generates, guest verifies, for 10 s; then the reverse.
#[test]
fn poll_txonly_to_rxonly_both_ways_verified() {
    for (sender, receiver) in [("host", "guest"), ("guest", "host")] {
        let shm = ShmName::new(&format!("pair-{sender}"));
        let dev = |role: &str| format!("memnic0,path={},role={role}", shm.name());
        // The host side creates the region, so it starts first and runs longer.
        let (host_mode, guest_mode) = if sender == "host" {
            ("txonly", "rxonly")
        } else {
            ("rxonly", "txonly")
        };
        let host = common::spawn(&[
            "testpmd",
            "-l",
            "0",
            "--vdev",
            &dev("host"),
            "--forward-mode",
            host_mode,
            "--verify",
            "--duration",
            "13",
            "--json",
        ]);
        common::wait_for_path(shm.path().to_str().unwrap(), Duration::from_secs(20));
        // The host sizes the file and writes the header right after creating it.
        std::thread::sleep(Duration::from_millis(300));
        let guest = common::spawn(&[
            "testpmd",
            "-l",
            "1",
            "--vdev",
            &dev("guest"),
            "--forward-mode",
            guest_mode,
            "--verify",
            "--duration",
            "10",
            "--json",
        ]);
        let g = guest.wait(Duration::from_secs(40));
        assert!(
            g.status.success(),
            "guest: {}",
            String::from_utf8_lossy(&g.stderr)
        );
        let h = host.wait(Duration::from_secs(40));
        assert!(
            h.status.success(),
            "host: {}",
            String::from_utf8_lossy(&h.stderr)
        );
        let (hj, gj) = (json_of(&h), json_of(&g));
        let (tx, rx) = if sender == "host" {
            (port(&hj), port(&gj))
        } else {
            (port(&gj), port(&hj))
        };
        common::assert_verified_clean(rx, &rx.to_string());
        assert!(
            n(rx, "good") > 100_000,
            "{sender}→{receiver}: too little traffic: {rx}"
        );
        assert_eq!(n(rx, "good"), n(rx, "rx_packets"));
        if sender == "guest" {
            // The host outlives the guest and drains the ring: every frame sent arrived.
            assert_eq!(n(tx, "tx_packets"), n(rx, "rx_packets"), "{tx} vs {rx}");
        } else {
            // The guest stops first; at most one ring of frames was still in flight.
            let (t, r) = (n(tx, "tx_packets"), n(rx, "rx_packets"));
            assert!(t >= r && t - r <= 1024, "sent {t}, received {r}");
        }
        assert_eq!(
            n(tx, "tx_dropped"),
            0,
            "verify mode retries instead of dropping"
        );
    }
}

/// Host generates, guest swaps MACs and sends everything back, host verifies its own frames.
#[test]
fn poll_guest_macswap_reflects_host_frames() {
    let shm = ShmName::new("reflect");
    let dev = |role: &str| format!("memnic0,path={},role={role}", shm.name());
    let host = common::spawn(&[
        "testpmd",
        "-l",
        "0",
        "--vdev",
        &dev("host"),
        "--forward-mode",
        "txonly",
        "--verify",
        "--txpkts",
        "128",
        "--duration",
        "6",
        "--json",
    ]);
    common::wait_for_path(shm.path().to_str().unwrap(), Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    let guest = common::spawn(&[
        "testpmd",
        "-l",
        "1",
        "--vdev",
        &dev("guest"),
        "--forward-mode",
        "macswap",
        "--duration",
        "3",
        "--json",
    ]);
    let g = guest.wait(Duration::from_secs(30));
    let h = host.wait(Duration::from_secs(30));
    assert!(g.status.success() && h.status.success());
    let (hp, gp) = (json_of(&h), json_of(&g));
    let (hp, gp) = (port(&hp), port(&gp));
    assert!(
        n(hp, "rx_packets") > 10_000,
        "the host got its frames back: {hp}"
    );
    for k in ["corrupted", "duplicated", "reordered"] {
        assert_eq!(n(hp, k), 0, "{k}: {hp}");
    }
    // Every gap the host sees is a frame the reflector could not send back (and counted).
    assert_eq!(n(hp, "lost"), n(gp, "tx_dropped"), "host {hp} guest {gp}");
    assert_eq!(
        n(gp, "rx_packets"),
        n(gp, "tx_packets") + n(gp, "tx_dropped")
    );
}

/// Both sides generate and verify at once, each sending a fixed count (`--tx-count`) and
/// running until it has received the other's (`--rx-count`): both exit by themselves, and each
/// received exactly what the other sent, verified. (The same exchange as the VM test's, without
/// the VM.)
#[test]
fn poll_counted_exchange_both_ways_ends_by_itself_exactly() {
    const N: u64 = 200_000;
    let n = N.to_string();
    let shm = ShmName::new("counted");
    let dev = |role: &str| format!("memnic0,path={},role={role}", shm.name());
    let side = |cpu: &str, role: &str, len: &str| {
        common::spawn(&[
            "testpmd",
            "-l",
            cpu,
            "--vdev",
            &dev(role),
            "--forward-mode",
            "txonly",
            "--verify",
            "--txpkts",
            len,
            "--tx-count",
            &n,
            "--rx-count",
            &n,
            "--json",
        ])
    };
    let host = side("0", "host", "1518");
    common::wait_for_memnic_region(&shm.path(), Duration::from_secs(20));
    let guest = side("1", "guest", "64");
    let (g, h) = (
        guest.wait(Duration::from_secs(60)),
        host.wait(Duration::from_secs(60)),
    );
    let said = format!(
        "host: {}\nguest: {}",
        String::from_utf8_lossy(&h.stderr),
        String::from_utf8_lossy(&g.stderr)
    );
    assert!(g.status.success() && h.status.success(), "{said}");
    let (hj, gj) = (json_of(&h), json_of(&g));
    common::assert_exchanged_exactly(port(&hj), port(&gj), N, &format!("{hj}\n{gj}\n{said}"));
}

/// `tx_stream=on|off` reaches either role's tx: a counted exchange of 64-B frames each way, one
/// side streaming every frame, the other none; then the roles swap settings.
#[test]
fn poll_tx_stream_devarg_sets_either_roles_tx() {
    const N: u64 = 100_000;
    let count = N.to_string();
    for host_streams in [true, false] {
        let shm = ShmName::new(&format!("stream-{host_streams}"));
        let side = |cpu: &str, role: &str, streams: bool| {
            let dev = format!(
                "memnic0,path={},role={role},tx_stream={}",
                shm.name(),
                if streams { "on" } else { "off" }
            );
            common::spawn(&[
                "testpmd",
                "-l",
                cpu,
                "--vdev",
                &dev,
                "--forward-mode",
                "txonly",
                "--txpkts",
                "64",
                "--tx-count",
                &count,
                "--rx-count",
                &count,
                "--json",
            ])
        };
        let host = side("0", "host", host_streams);
        common::wait_for_memnic_region(&shm.path(), Duration::from_secs(20));
        let guest = side("1", "guest", !host_streams);
        let (g, h) = (
            guest.wait(Duration::from_secs(60)),
            host.wait(Duration::from_secs(60)),
        );
        assert!(
            g.status.success() && h.status.success(),
            "host: {}\nguest: {}",
            String::from_utf8_lossy(&h.stderr),
            String::from_utf8_lossy(&g.stderr)
        );
        let (hj, gj) = (json_of(&h), json_of(&g));
        let streamed = |j: &serde_json::Value| n(&port(j)["xstats"], "tx_streamed_packets");
        let (on, off) = if host_streams { (&hj, &gj) } else { (&gj, &hj) };
        assert_eq!(streamed(on), N, "the side with tx_stream=on: {on}");
        assert_eq!(streamed(off), 0, "the side with tx_stream=off: {off}");
        assert_eq!(n(&port(on)["xstats"], "tx_stream_switches"), 0, "{on}");
    }
}
