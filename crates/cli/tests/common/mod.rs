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
