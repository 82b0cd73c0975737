//! Running the `memnic` binary from tests, on top of memnic-test-support's `Child` (pipes always
//! drained; every child is killed if the test fails or times out).
#![allow(dead_code, unused_imports)]

pub mod dpdk;

use std::process::{Command, Output};
use std::time::Duration;

pub use memnic_test_support::{wait_for_path, Child as Proc, ShmName, Stdin};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_memnic")
}

/// `memnic ARGS`, stdin from /dev/null.
pub fn spawn(args: &[&str]) -> Proc {
    spawn_with_stdin(args, None)
}

/// `memnic ARGS` with `stdin` as its input (then end of file).
pub fn spawn_with_stdin(args: &[&str], stdin: Option<&str>) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    Proc::spawn(cmd, stdin.map_or(Stdin::Null, Stdin::Text))
}

/// Any program (a DPDK peer), killed on drop like ours.
pub fn spawn_program(program: &str, args: &[&str]) -> Proc {
    let mut cmd = Command::new(program);
    cmd.args(args);
    Proc::spawn(cmd, Stdin::Null)
}

/// `memnic testpmd -l CPU --vdev VDEV --forward-mode MODE EXTRA...`.
pub fn testpmd(cpu: u32, vdev: &str, mode: &str, extra: &[&str]) -> Proc {
    let cpu = cpu.to_string();
    let mut args = vec![
        "testpmd",
        "-l",
        &cpu,
        "--vdev",
        vdev,
        "--forward-mode",
        mode,
    ];
    args.extend_from_slice(extra);
    spawn(&args)
}

/// `memnic testpmd -i ARGS` with a pipe to its prompt ([`Proc::send`]).
pub fn interactive(args: &[&str]) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.args(["testpmd", "-i"]).args(args);
    Proc::spawn(cmd, Stdin::Pipe)
}

/// Asks an interactive testpmd for `show port stats all` until what it printed holds `text`.
pub fn wait_for_stats(p: &mut Proc, text: &str, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while !p.output().contains(text) {
        if std::time::Instant::now() > deadline {
            p.fail(&format!("the stats never showed {text:?} within {limit:?}"));
        }
        p.send("show port stats all");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs memnic to completion (60 s at most).
pub fn memnic(args: &[&str]) -> Output {
    spawn(args).wait(Duration::from_secs(60))
}

/// The one-line JSON object testpmd prints last on stdout under --json.
pub fn json_of(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "no JSON on stdout:\n{text}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(line).expect("valid JSON")
}

/// The verifier's counters a clean run leaves at zero.
pub const VERIFY_FAULTS: [&str; 5] = [
    "lost",
    "corrupted",
    "duplicated",
    "reordered",
    "unknown_flows",
];

/// Fails, naming the counter and `context`, unless every verifier fault counter of `port` (one
/// port's object in testpmd's JSON) is zero.
pub fn assert_verified_clean(port: &serde_json::Value, context: &str) {
    for k in VERIFY_FAULTS {
        let v = port[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} missing in {port}"));
        assert_eq!(v, 0, "{k}: {context}");
    }
}

/// Fails unless two testpmd ports (one port's object in each one's JSON), both running txonly
/// with --verify, `--tx-count n` and `--rx-count n`, exchanged exactly `n` frames each way: what
/// one sent the other received, all of it good, nothing dropped, no verifier fault.
pub fn assert_exchanged_exactly(a: &serde_json::Value, b: &serde_json::Value, n: u64, said: &str) {
    let get = |p: &serde_json::Value, k: &str| {
        p[k].as_u64()
            .unwrap_or_else(|| panic!("{k} missing in {p}: {said}"))
    };
    for (tx, rx) in [(a, b), (b, a)] {
        assert_eq!(get(tx, "tx_packets"), n, "sent: {said}");
        assert_eq!(get(rx, "rx_packets"), n, "received: {said}");
        assert_eq!(get(rx, "good"), n, "verified good: {said}");
        assert_eq!(get(tx, "tx_dropped"), 0, "{said}");
        assert_verified_clean(rx, said);
    }
}

/// Waits until the MEMNIC region at `path` is ready for a guest: the whole 16 MiB are there
/// and the host has written the magic (the last step of its set-up, the word a guest checks).
pub fn wait_for_memnic_region(path: &std::path::Path, limit: Duration) {
    use memnic_pmd::layout::{AREA_SIZE, HDR_MAGIC, MAGIC};
    use std::os::unix::fs::FileExt;
    let ready = || -> Option<bool> {
        let f = std::fs::File::open(path).ok()?;
        let size = f.metadata().ok()?.len();
        let mut magic = [0u8; 4];
        f.read_exact_at(&mut magic, HDR_MAGIC as u64).ok()?;
        Some(size >= AREA_SIZE as u64 && u32::from_le_bytes(magic) == MAGIC)
    };
    let end = std::time::Instant::now() + limit;
    while ready() != Some(true) {
        assert!(
            std::time::Instant::now() < end,
            "no MEMNIC region at {} within {limit:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Fails unless `out` (a memnic run, `what`) exited with code 2 and said `needle`, without a
/// panic, in one line (clap's own usage errors add a usage line and a hint; ours do not).
pub fn assert_one_sentence(out: &Output, what: &str, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        err.contains(needle),
        "{what}: expected '{needle}' in: {err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{what}: {err}"
    );
    if err.starts_with("memnic:") {
        assert_eq!(lines.len(), 1, "{what}: {err}");
    }
}

/// A fresh socket path for a memif pair in this test process (`tag` tells the tests apart; a
/// file left by an earlier run is removed), and the server's and client's vdevs on it.
pub fn memif_pair_socket(tag: &str) -> (String, String, String) {
    let sock = format!("/tmp/memnic-{tag}-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let sdev = format!("memif0,role=server,socket={sock}");
    let cdev = format!("memif0,role=client,socket={sock}");
    (sock, sdev, cdev)
}
