//! A testpmd (ours or DPDK's) run by the bench: both its output streams read on threads from
//! the start, every periodic counter line stamped with the bench's clock as it arrives, and the
//! last lines kept to explain a failure. Stopped with SIGINT (DPDK then closes its ports), killed
//! if it does not go, and killed when dropped. One run at its prompt (`--interleave`) takes
//! commands on a pipe ([`Proc::send`]); its counters are the blocks `show port stats all`
//! prints, stamped the same way.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::parse::{Counter, PortCounts};
use crate::stats::Stamp;

const TAIL_LINES: usize = 12;

/// What the readers have seen so far.
#[derive(Default)]
pub struct Seen {
    pub rx: Vec<Stamp>,
    pub tx: Vec<Stamp>,
    /// A line containing the process's ready marker has appeared.
    pub ready: bool,
    /// Lines `Done.`: the forwarding stops a testpmd has finished (both print it last).
    pub stops: usize,
    /// Output streams that reached end of file (2: the process is gone).
    pub closed: usize,
    /// The last line that was a JSON object (our testpmd's `--json` report).
    pub json: Option<String>,
    tail: VecDeque<String>,
}

struct Shared {
    seen: Mutex<Seen>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Proc {
    pub name: String,
    child: Child,
    /// The prompt's input, for a process started with one.
    stdin: Option<ChildStdin>,
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<()>>,
}

impl Proc {
    /// Starts `program ARGS`; `clock` is the bench's, `ready` the text of the line that says the
    /// process has started its port; `prompt`: its stdin is a pipe for [`Proc::send`].
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        clock: Instant,
        ready: &'static str,
        prompt: bool,
    ) -> Result<Proc, String> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(if prompt {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {name} ({}): {e}", program.display()))?;
        let shared = Arc::new(Shared {
            seen: Mutex::new(Seen::default()),
            changed: Condvar::new(),
        });
        let streams: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("piped stdout")),
            Box::new(child.stderr.take().expect("piped stderr")),
        ];
        let readers = streams
            .into_iter()
            .map(|stream| {
                let shared = shared.clone();
                std::thread::spawn(move || read_lines(stream, &shared, clock, ready))
            })
            .collect();
        Ok(Proc {
            name: name.to_string(),
            stdin: child.stdin.take(),
            child,
            shared,
            readers,
        })
    }

    /// Waits until `cond` holds of what was seen, at most `limit`; fails (with the process's last
    /// lines) when the process ends first or the time runs out.
    pub fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        cond: impl Fn(&Seen) -> bool,
    ) -> Result<(), String> {
        let end = Instant::now() + limit;
        let mut seen = self.shared.lock();
        loop {
            if cond(&seen) {
                return Ok(());
            }
            let why = if seen.closed == 2 {
                "it exited"
            } else if Instant::now() >= end {
                "time ran out"
            } else {
                let left = end.saturating_duration_since(Instant::now());
                seen = self
                    .shared
                    .changed
                    .wait_timeout(seen, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            };
            return Err(format!(
                "{} did not {what} within {} s ({why}); its last lines:\n{}",
                self.name,
                limit.as_secs(),
                Vec::from(seen.tail.clone()).join("\n")
            ));
        }
    }

    /// Types `line` at the prompt.
    pub fn send(&mut self, line: &str) -> Result<(), String> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| format!("{} has no prompt", self.name))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("cannot type {line:?} at {}'s prompt: {e}", self.name))
    }

    /// `f` of what was seen so far.
    pub fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.shared.lock())
    }

    /// The stamped counter lines so far.
    pub fn stamps(&self, which: Counter) -> Vec<Stamp> {
        let seen = self.shared.lock();
        match which {
            Counter::Rx => seen.rx.clone(),
            Counter::Tx => seen.tx.clone(),
        }
    }

    /// SIGINT, as Ctrl-C (at a prompt: `quit` first); then waits for the process to go (at most `limit`) and kills it if it
    /// has not.
    pub fn stop(mut self, limit: Duration) {
        // At a prompt: `quit` and the end of its input first (a prompt blocked reading its
        // input may not look at the signal's flag until a line comes).
        if self.stdin.is_some() {
            let _ = self.send("quit");
            self.stdin = None;
        }
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.wait_for("exit", limit, |s| s.closed == 2);
        self.reap();
    }

    fn reap(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.reap();
    }
}

fn read_lines(stream: Box<dyn Read + Send>, shared: &Shared, clock: Instant, ready: &str) {
    let mut r = BufReader::new(stream);
    let mut buf = Vec::new();
    // A process with several ports prints a block per port: a stamp carries their sum.
    let mut counts = PortCounts::default();
    while r.read_until(b'\n', &mut buf).unwrap_or(0) > 0 {
        // Stamped before anything else is done with the line.
        let secs = clock.elapsed().as_secs_f64();
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end();
        let mut seen = shared.lock();
        if let Some(count) = counts.read(line, Counter::Rx) {
            seen.rx.push(Stamp { secs, count });
        }
        if let Some(count) = counts.read(line, Counter::Tx) {
            seen.tx.push(Stamp { secs, count });
        }
        if line.contains(ready) {
            seen.ready = true;
        }
        if line.trim() == "Done." {
            seen.stops += 1;
        }
        if line.starts_with('{') {
            seen.json = Some(line.to_string());
        }
        if !line.is_empty() {
            if seen.tail.len() == TAIL_LINES {
                seen.tail.pop_front();
            }
            seen.tail.push_back(line.to_string());
        }
        drop(seen);
        shared.changed.notify_all();
        buf.clear();
    }
    shared.lock().closed += 1;
    shared.changed.notify_all();
}
