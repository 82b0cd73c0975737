//! Running the `memnic` binary from tests: every child is killed if the test fails or times out.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_memnic")
}

/// A child process that is killed when dropped.
pub struct Proc {
    child: Option<Child>,
    what: String,
}

impl Proc {
    pub fn spawn(args: &[&str]) -> Proc {
        Self::spawn_with_stdin(args, None)
    }

    pub fn spawn_with_stdin(args: &[&str], stdin: Option<&str>) -> Proc {
        Self::spawn_program(bin(), args, stdin)
    }

    /// Any program (a DPDK peer), killed on drop like ours.
    pub fn spawn_program(program: &str, args: &[&str], stdin: Option<&str>) -> Proc {
        let mut child = Command::new(program)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn memnic");
        if let Some(text) = stdin {
            let mut s = child.stdin.take().expect("piped stdin");
            s.write_all(text.as_bytes()).expect("write stdin");
        }
        Proc {
            child: Some(child),
            what: format!("memnic {}", args.join(" ")),
        }
    }

    /// Waits up to `limit` for the child to exit by itself; kills it and panics otherwise.
    pub fn wait(mut self, limit: Duration) -> Output {
        let deadline = Instant::now() + limit;
        let mut child = self.child.take().expect("not waited yet");
        loop {
            if child.try_wait().expect("wait").is_some() {
                return child.wait_with_output().expect("output");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "{} did not finish within {limit:?}; stderr:\n{}",
                    self.what,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The child's CPU time so far (user + system), from /proc.
    pub fn cpu_time(&self) -> Duration {
        let pid = self.child.as_ref().map(|c| c.id()).unwrap_or(0);
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields after the command name (which ends with ')'): utime is the 14th field overall.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
        Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
    }

    /// Sends SIGINT (as Ctrl-C would).
    pub fn interrupt(&self) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args(["-INT", &c.id().to_string()])
                .status();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs memnic to completion (60 s at most).
pub fn memnic(args: &[&str]) -> Output {
    Proc::spawn(args).wait(Duration::from_secs(60))
}

/// A /dev/shm name unique to this test run; the file is removed on drop.
pub struct ShmName(pub String);

impl ShmName {
    pub fn new(tag: &str) -> ShmName {
        let n = format!("memnic-test-{tag}-{}", std::process::id());
        let _ = std::fs::remove_file(format!("/dev/shm/{n}"));
        ShmName(n)
    }
}

impl Drop for ShmName {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/dev/shm/{}", self.0));
    }
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

/// Waits until `path` exists (a peer's socket or shared-memory file), at most `limit`.
pub fn wait_for_path(path: &str, limit: Duration) {
    let end = Instant::now() + limit;
    while !std::path::Path::new(path).exists() {
        assert!(
            Instant::now() < end,
            "{path} did not appear within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
