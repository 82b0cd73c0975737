//! Child processes for tests: a peer program (ours, DPDK's) or this test binary re-executed in a
//! child role. Both pipes are drained on threads from the start, so a chatty child never blocks
//! on a full pipe; the child is killed and reaped when the handle drops (a failing test leaves
//! nothing behind).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::ENV_CHILD;

/// What the child's stdin is.
pub enum Stdin<'a> {
    /// /dev/null.
    Null,
    /// This text, then end of file.
    Text(&'a str),
    /// A pipe the test writes lines to with [`Child::send`].
    Pipe,
}

#[derive(Default)]
struct Captured {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    lines: VecDeque<String>,
}

/// A running child process.
pub struct Child {
    child: Option<std::process::Child>,
    stdin: Option<ChildStdin>,
    captured: Arc<Mutex<Captured>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    status: Option<ExitStatus>,
    what: String,
}

fn lock(c: &Mutex<Captured>) -> std::sync::MutexGuard<'_, Captured> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

impl Child {
    /// Starts `cmd` with piped stdout/stderr (drained at once) and the given stdin.
    pub fn spawn(mut cmd: Command, stdin: Stdin<'_>) -> Child {
        let what = format!("{cmd:?}");
        cmd.stdin(match stdin {
            Stdin::Null => Stdio::null(),
            _ => Stdio::piped(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let captured = Arc::new(Mutex::new(Captured::default()));
        let mut readers = Vec::new();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        for (r, is_stdout) in [
            (Box::new(out) as Box<dyn Read + Send>, true),
            (Box::new(err) as Box<dyn Read + Send>, false),
        ] {
            let captured = captured.clone();
            readers.push(std::thread::spawn(move || {
                let mut r = BufReader::new(r);
                let mut line = Vec::new();
                while r.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
                    let mut c = lock(&captured);
                    if is_stdout {
                        c.stdout.extend_from_slice(&line);
                        let text = String::from_utf8_lossy(&line);
                        c.lines.push_back(text.trim_end_matches('\n').to_string());
                    } else {
                        c.stderr.extend_from_slice(&line);
                    }
                    line.clear();
                }
            }));
        }
        let mut pipe = child.stdin.take();
        if let Stdin::Text(text) = stdin {
            let mut s = pipe.take().expect("piped stdin");
            s.write_all(text.as_bytes())
                .expect("write the child's stdin");
        }
        Child {
            child: Some(child),
            stdin: pipe,
            captured,
            readers,
            status: None,
            what,
        }
    }

    /// Re-executes this test binary in child role `name` (see [`harness`](crate::harness)),
    /// with `env` set and a stdin pipe for [`Child::send`].
    pub fn role(name: &str, env: &[(&str, String)]) -> Child {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.env(ENV_CHILD, name);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Child::spawn(cmd, Stdin::Pipe)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Everything the child printed so far, stdout then stderr.
    pub fn output(&self) -> String {
        let c = lock(&self.captured);
        format!(
            "{}{}",
            String::from_utf8_lossy(&c.stdout),
            String::from_utf8_lossy(&c.stderr)
        )
    }

    /// What follows `tag` on the first stdout line that contains it.
    pub fn line(&self, tag: &str) -> Option<String> {
        self.lines(tag).into_iter().next()
    }

    /// What follows `tag` on each stdout line that contains it, in order (a guest that reboots
    /// prints its markers once per boot).
    pub fn lines(&self, tag: &str) -> Vec<String> {
        let c = lock(&self.captured);
        c.lines
            .iter()
            .filter_map(|l| l.find(tag).map(|i| l[i + tag.len()..].trim().to_string()))
            .collect()
    }

    /// Waits up to `limit` for a stdout line containing `tag`; panics with everything the child
    /// printed if it exits first or the time runs out.
    pub fn wait_for_line(&mut self, tag: &str, limit: Duration) {
        self.wait_for_lines(tag, 1, limit);
    }

    /// Waits up to `limit` until `n` stdout lines contain `tag`; panics as
    /// [`Child::wait_for_line`] does.
    pub fn wait_for_lines(&mut self, tag: &str, n: usize, limit: Duration) {
        if let Err(st) = self.wait_for_lines_or_exit(tag, n, limit) {
            let what = lines_named(tag, n);
            self.fail(&format!("the child exited ({st}) before printing {what}"));
        }
    }

    /// Waits up to `limit` until `n` stdout lines contain `tag`, or until the child exits
    /// without them (`Err` with its status: for a peer whose own bugs may kill it); panics with
    /// everything it printed if the time runs out.
    pub fn wait_for_lines_or_exit(
        &mut self,
        tag: &str,
        n: usize,
        limit: Duration,
    ) -> Result<(), ExitStatus> {
        let deadline = Instant::now() + limit;
        while self.lines(tag).len() < n {
            if let Some(st) = self.try_status() {
                self.join_readers();
                if self.lines(tag).len() >= n {
                    return Ok(());
                }
                return Err(st);
            }
            if Instant::now() > deadline {
                let what = lines_named(tag, n);
                self.fail(&format!("no {what} from the child within {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Waits up to `limit` until the child has printed `text` (on stdout or stderr); panics as
    /// [`Child::wait_for_line`] does.
    pub fn wait_for_output(&mut self, text: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.output().contains(text) {
            if let Some(st) = self.try_status() {
                self.join_readers();
                if self.output().contains(text) {
                    return;
                }
                self.fail(&format!("the child exited ({st}) before printing {text:?}"));
            }
            if Instant::now() > deadline {
                self.fail(&format!("no {text:?} from the child within {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends a line to the child's stdin (spawned with [`Stdin::Pipe`]).
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is a pipe");
        writeln!(stdin, "{line}").expect("write to the child");
        stdin.flush().expect("flush to the child");
    }

    /// Sends SIGINT (as Ctrl-C would), unless the child was already reaped (its pid may be
    /// another process's by now).
    pub fn interrupt(&self) {
        if self.status.is_some() {
            return;
        }
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args(["-INT", &c.id().to_string()])
                .status();
        }
    }

    /// The child's CPU time so far (user + system), from /proc.
    pub fn cpu_time(&self) -> Duration {
        stat_cpu_time(&format!("/proc/{}/stat", self.pid()))
    }

    /// The CPU time of the child's main thread so far (for testpmd: its control thread).
    pub fn main_thread_cpu_time(&self) -> Duration {
        stat_cpu_time(&format!("/proc/{0}/task/{0}/stat", self.pid()))
    }

    /// How many times the child's main thread has gone to sleep so far (its voluntary context
    /// switches, from /proc): for testpmd, the control thread's wake-ups.
    pub fn main_thread_sleeps(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no voluntary_ctxt_switches in /proc/{}/status", self.pid()))
    }

    /// Whether the child has exited (it is reaped if so).
    pub fn exited(&mut self) -> bool {
        self.try_status().is_some()
    }

    fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Some(c) = self.child.as_mut() {
                self.status = c.try_wait().expect("try_wait");
            }
        }
        self.status
    }

    /// Panics (with the child's output) if the child has exited unsuccessfully, or successfully
    /// without printing its `result_tag` line.
    pub fn check_alive_or_ok(&mut self, result_tag: &str) {
        if let Some(st) = self.try_status() {
            if !st.success() {
                self.fail(&format!("the child exited early with {st}"));
            }
            self.join_readers();
            if self.line(result_tag).is_none() {
                self.fail(&format!("the child exited without printing {result_tag}"));
            }
        }
    }

    /// Waits for the child to exit by `deadline`; panics if it fails or overruns (it is killed).
    pub fn wait_success(&mut self, deadline: Instant) {
        loop {
            if let Some(st) = self.try_status() {
                self.join_readers();
                if !st.success() {
                    self.fail(&format!("the child failed with {st}"));
                }
                return;
            }
            if Instant::now() > deadline {
                self.fail("the child did not finish in time and was killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits up to `limit` for the child to exit by itself (any status) and returns what it
    /// printed; kills it and panics if it overruns.
    pub fn wait(mut self, limit: Duration) -> Output {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.try_status() {
                self.join_readers();
                let c = std::mem::take(&mut *lock(&self.captured));
                return Output {
                    status,
                    stdout: c.stdout,
                    stderr: c.stderr,
                };
            }
            if Instant::now() > deadline {
                self.fail(&format!("{} did not finish within {limit:?}", self.what));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }

    /// Kills the child and panics with `why` and everything it printed.
    pub fn fail(&mut self, why: &str) -> ! {
        self.kill();
        self.join_readers();
        panic!(
            "{why}\n----- child output -----\n{}------------------------",
            self.output()
        );
    }

    fn kill(&mut self) {
        self.stdin = None;
        if let Some(mut c) = self.child.take() {
            if self.status.is_none() {
                let _ = c.kill();
            }
            if let Ok(st) = c.wait() {
                self.status.get_or_insert(st);
            }
            // The readers close the pipes when they see end of file, which follows the exit
            // unless a grandchild keeps a pipe open: wait a moment for them, never forever (a
            // test counting its own descriptors must not see the dead child's pipes).
            let until = Instant::now() + Duration::from_secs(1);
            while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How a wait names the lines it waits for.
fn lines_named(tag: &str, n: usize) -> String {
    if n == 1 {
        format!("{tag:?}")
    } else {
        format!("{tag:?} {n} times")
    }
}

/// Reads lines from this process's stdin on a thread (a child's channel from its parent).
pub fn stdin_lines() -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            l.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        }
    });
    lines
}

/// The first line in `lines` starting with `prefix`, without the prefix.
pub fn find_line(lines: &Mutex<Vec<String>>, prefix: &str) -> Option<String> {
    lines
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find_map(|l| l.strip_prefix(prefix).map(|s| s.trim().to_string()))
}

/// User + system time from a /proc `stat` file (a process's or a thread's); zero when it is
/// gone.
fn stat_cpu_time(path: &str) -> Duration {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the command name (which ends with ')'): utime is the 14th field overall.
    // After it: state (field 3, a letter), then numbers; utime and stime are fields 14 and 15,
    // so the 12th and 13th tokens here (every token counted, the letter too).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(11) + field(12);
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}
