//! `--forward-mode=ping` through a reflector (our `macswap` on the other side), over memif and
//! over MEMNIC: every frame comes back once, verified, its round trip recorded; and the
//! receive queues' hold-off stays out of the way of an exchange that answers in bursts.
//! Polling tests: they run serially (nextest group) and need both CPUs.

mod common;

use std::time::Duration;

use common::{json_of, ShmName};

/// Rounds of four frames each: one hold per round (the rule before the quiet spells) would be
/// thousands.
const FRAMES: u64 = 20_000;
const BURST: &str = "4";

/// The fewest holds a ping of [`FRAMES`] frames can meet: unpaid holds start quiet spells that
/// double from 0.1 ms to 100 ms, so a run of a few seconds meets some tens.
const FEW_HOLDS: u64 = 100;

fn count(v: &serde_json::Value, k: &str) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{k} missing"))
}

/// Checks how the pinger (`p`) and the reflector (`r`) ended, and their JSON.
fn assert_pinged(p: &std::process::Output, r: &std::process::Output, what: &str) {
    assert!(
        p.status.success() && r.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&p.stderr)
    );
    let (ping, reflector) = (&json_of(p), &json_of(r));
    let r = &ping["round_trips"];
    for (k, want) in [
        ("sent", FRAMES),
        ("count", FRAMES),
        ("lost", 0),
        ("stale", 0),
    ] {
        assert_eq!(count(&r[k], k), want, "{what}: {k} in {r}");
    }
    let (min, p50, p99, max) = (
        count(&r["min_ns"], "min"),
        count(&r["p50_ns"], "p50"),
        count(&r["p99_ns"], "p99"),
        count(&r["max_ns"], "max"),
    );
    assert!(
        0 < min && min <= p50 && p50 <= p99 && p99 <= max,
        "{what}: {r}"
    );
    let port = &ping["ports"][0];
    common::assert_verified_clean(port, &format!("{what}: {port}"));
    assert_eq!(count(&port["good"], "good"), FRAMES, "{what}: {port}");
    for (side, j) in [("pinger", ping), ("reflector", reflector)] {
        let holds = count(&j["ports"][0]["xstats"]["rx_holdoffs"], "rx_holdoffs");
        assert!(
            holds <= FEW_HOLDS,
            "{what}: the {side}'s rx queue held off {holds} times in {FRAMES} frames"
        );
    }
}

/// The pinger's command line: [`FRAMES`] frames (`n`, as text) in bursts of [`BURST`].
fn ping_args<'a>(cpu: &'a str, vdev: &'a str, n: &'a str) -> Vec<&'a str> {
    vec![
        "testpmd",
        "-l",
        cpu,
        "--vdev",
        vdev,
        "--forward-mode",
        "ping",
        "--burst",
        BURST,
        "--tx-count",
        n,
        "--rx-count",
        n,
        "--duration",
        "30",
        "--json",
    ]
}

#[test]
fn poll_ping_through_a_memif_reflector_every_frame_back_and_timed() {
    let (sock, sdev, cdev) = common::memif_pair_socket("ping");
    let reflector = common::testpmd(0, &sdev, "macswap", &["--duration", "8", "--json"]);
    common::wait_for_path(&sock, Duration::from_secs(20));
    let n = FRAMES.to_string();
    let p = common::spawn(&ping_args("1", &cdev, &n)).wait(Duration::from_secs(40));
    let r = reflector.wait(Duration::from_secs(40));
    assert_pinged(&p, &r, "memif");
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn poll_ping_through_a_memnic_reflector_every_frame_back_and_timed() {
    let shm = ShmName::new("ping");
    let dev = |role: &str| format!("memnic0,path={},role={role}", shm.name());
    // The host creates the region: it pings, and starts first.
    let host_dev = dev("host");
    let n = FRAMES.to_string();
    let pinger = common::spawn(&ping_args("1", &host_dev, &n));
    common::wait_for_memnic_region(&shm.path(), Duration::from_secs(20));
    let reflector = common::testpmd(0, &dev("guest"), "macswap", &["--duration", "8", "--json"]);
    let p = pinger.wait(Duration::from_secs(40));
    let r = reflector.wait(Duration::from_secs(40));
    assert_pinged(&p, &r, "MEMNIC");
}
