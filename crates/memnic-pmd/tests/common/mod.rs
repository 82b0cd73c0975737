//! Helpers shared by the memnic-pmd integration tests: unique shm names, pools, payloads that
//! carry a sequence number and a checksum, senders/receivers that check them, and child processes
//! for the two-process tests (the re-exec trick: the test binary runs one of its own test
//! functions in a child, selected by name, with the role in the environment).
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use memnic_ethdev::{Mbuf, RxQueue, TxQueue};
use memnic_pktbuf::{Mempool, PoolCache, PoolConfig, DEFAULT_HEADROOM};

/// Environment variables of a child process.
pub const ENV_ROLE: &str = "MEMNIC_TEST_ROLE";
pub const ENV_SHM: &str = "MEMNIC_TEST_SHM";
pub const ENV_SEED: &str = "MEMNIC_TEST_SEED";

/// Salts that keep the two directions' payload streams apart.
pub const UP: u64 = 0x7570_7570; // host -> guest
pub const DOWN: u64 = 0x646f_776e; // guest -> host

/// Under `cargo test` the tests of one binary run on parallel threads; polling tests take this
/// lock so they do not fight over the two CPUs. (nextest runs each test in its own process.)
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// shm names

/// A `/dev/shm` name unique to this process and call, removed on drop.
pub struct ShmName {
    name: String,
}

impl ShmName {
    pub fn new(tag: &str) -> ShmName {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "memnic-test-{}-{}-{}-{}",
            tag,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            nanos
        );
        let _ = std::fs::remove_file(Self::path_of(&name));
        ShmName { name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> std::path::PathBuf {
        Self::path_of(&self.name)
    }

    fn path_of(name: &str) -> std::path::PathBuf {
        std::path::Path::new("/dev/shm").join(name)
    }
}

impl Drop for ShmName {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.path());
    }
}

// ---------------------------------------------------------------------------------------------
// pools

/// A private (non-hugepage) pool whose buffers hold `data_room` bytes.
pub fn pool(name: &str, count: u32, data_room: u32) -> Mempool {
    let mut cfg = PoolConfig::new(name, count);
    cfg.huge = false;
    cfg.buf_size = data_room + DEFAULT_HEADROOM;
    Mempool::new(&cfg).expect("pool")
}

// ---------------------------------------------------------------------------------------------
// payloads
//
// [0..8)  seq (u64 LE)
// [8..12) frame length (u32 LE)
// [12..16) checksum (u32 LE) over the whole frame with this field taken as zero
// [16..)  bytes derived from (seq, salt)
//
// The frame length itself is derived from (seed, salt, seq), so the receiver checks it too.

pub const MIN_FRAME: usize = 60;
pub const MAX_FRAME: usize = 1518;

pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The length of frame `seq` of a stream: uniform in `min..=max`.
pub fn frame_len(seed: u64, salt: u64, seq: u64, min: usize, max: usize) -> usize {
    min + (splitmix(seed ^ salt.rotate_left(17) ^ seq.wrapping_mul(0xA24B_AED4_963E_E407))
        % (max - min + 1) as u64) as usize
}

/// FNV-1a style hash over 8-byte words (fast enough in debug builds), folded to 32 bits. The
/// checksum field (bytes 12..16) counts as zero.
pub fn checksum(frame: &[u8]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut chunks = frame.chunks_exact(8);
    for (i, c) in chunks.by_ref().enumerate() {
        let mut w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        if i == 1 {
            w &= 0xFFFF_FFFF; // keep len, drop the checksum field
        }
        h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h ^ (h >> 32)) as u32
}

/// Writes frame `seq` of stream `salt` into `buf` (its whole length).
pub fn fill(buf: &mut [u8], seq: u64, salt: u64) {
    let len = buf.len();
    assert!(len >= 16, "frames carry a 16-byte test header");
    buf[0..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    buf[12..16].fill(0);
    let mut x = splitmix(seq ^ salt);
    let mut chunks = buf[16..].chunks_exact_mut(8);
    for c in chunks.by_ref() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    for b in chunks.into_remainder() {
        *b = x as u8;
        x = x.rotate_right(8);
    }
    let c = checksum(buf);
    buf[12..16].copy_from_slice(&c.to_le_bytes());
}

/// Checks a received frame; returns its sequence number.
pub fn check(frame: &[u8]) -> Result<u64, String> {
    if frame.len() < 16 {
        return Err(format!(
            "frame of {} bytes is shorter than the header",
            frame.len()
        ));
    }
    let seq = u64::from_le_bytes(frame[0..8].try_into().expect("8"));
    let len = u32::from_le_bytes(frame[8..12].try_into().expect("4")) as usize;
    let sum = u32::from_le_bytes(frame[12..16].try_into().expect("4"));
    if len != frame.len() {
        return Err(format!(
            "seq {seq}: header says {len} bytes, frame has {}",
            frame.len()
        ));
    }
    let c = checksum(frame);
    if c != sum {
        return Err(format!(
            "seq {seq} ({len} bytes): checksum {c:#010x}, header says {sum:#010x}"
        ));
    }
    Ok(seq)
}

// ---------------------------------------------------------------------------------------------
// sender and receiver

/// Sends frames `0..total` of one stream, retrying what `tx_burst` hands back.
pub struct Sender {
    pub seed: u64,
    pub salt: u64,
    pub next: u64,
    pub total: u64,
    pub min: usize,
    pub max: usize,
    pub burst: usize,
    pub pending: Vec<Mbuf>,
    pub cache: PoolCache,
    /// Frames taken by tx_burst and their bytes.
    pub taken: u64,
    pub taken_bytes: u64,
}

impl Sender {
    pub fn new(pool: &Mempool, seed: u64, salt: u64, total: u64) -> Sender {
        Sender {
            seed,
            salt,
            next: 0,
            total,
            min: MIN_FRAME,
            max: MAX_FRAME,
            burst: 32,
            pending: Vec::with_capacity(64),
            cache: pool.cache(),
            taken: 0,
            taken_bytes: 0,
        }
    }

    pub fn sizes(mut self, min: usize, max: usize) -> Sender {
        self.min = min;
        self.max = max;
        self
    }

    /// Tops the burst up to `burst` frames and offers it once. Returns how many were taken.
    pub fn poll(&mut self, txq: &mut dyn TxQueue) -> usize {
        while self.pending.len() < self.burst && self.next < self.total {
            let len = frame_len(self.seed, self.salt, self.next, self.min, self.max);
            let mut m = self.cache.alloc().expect("sender pool exhausted");
            assert!(m.set_len(len), "pool buffer too small for {len} bytes");
            fill(m.as_mut_slice().unwrap(), self.next, self.salt);
            self.pending.push(m);
            self.next += 1;
        }
        let before: u64 = self.pending.iter().map(|m| m.len() as u64).sum();
        let n = txq.tx_burst(&mut self.pending);
        let after: u64 = self.pending.iter().map(|m| m.len() as u64).sum();
        self.taken += n as u64;
        self.taken_bytes += before - after;
        n
    }

    /// Everything generated and taken.
    pub fn done(&self) -> bool {
        self.next == self.total && self.pending.is_empty()
    }
}

/// Receives one stream and checks every frame.
pub struct Receiver {
    pub seed: u64,
    pub salt: u64,
    pub min: usize,
    pub max: usize,
    /// The next sequence number expected.
    pub expect: u64,
    pub count: u64,
    pub bytes: u64,
    /// Sequence numbers skipped (only when gaps are allowed).
    pub lost: u64,
    pub allow_gaps: bool,
    pub buf: Vec<Mbuf>,
    pub cache: PoolCache,
}

impl Receiver {
    pub fn new(pool: &Mempool, seed: u64, salt: u64) -> Receiver {
        Receiver {
            seed,
            salt,
            min: MIN_FRAME,
            max: MAX_FRAME,
            expect: 0,
            count: 0,
            bytes: 0,
            lost: 0,
            allow_gaps: false,
            buf: Vec::with_capacity(64),
            cache: pool.cache(),
        }
    }

    pub fn sizes(mut self, min: usize, max: usize) -> Receiver {
        self.min = min;
        self.max = max;
        self
    }

    pub fn gaps(mut self) -> Receiver {
        self.allow_gaps = true;
        self
    }

    /// One rx_burst; every frame is checked (panics on the first bad one).
    pub fn poll(&mut self, rxq: &mut dyn RxQueue) -> usize {
        let n = rxq.rx_burst(&mut self.buf, 32);
        assert_eq!(
            n,
            self.buf.len(),
            "rx_burst returned {n} but appended {}",
            self.buf.len()
        );
        for m in self.buf.drain(..) {
            if let Err(e) = Self::accept(
                &m.to_vec(),
                self.seed,
                self.salt,
                self.min,
                self.max,
                self.allow_gaps,
                &mut self.expect,
                &mut self.lost,
            ) {
                panic!(
                    "stream {:#x}: after {} good frames: {e}",
                    self.salt, self.count
                );
            }
            self.count += 1;
            self.bytes += m.len() as u64;
            self.cache.free(m);
        }
        n
    }

    #[allow(clippy::too_many_arguments)]
    fn accept(
        data: &[u8],
        seed: u64,
        salt: u64,
        min: usize,
        max: usize,
        allow_gaps: bool,
        expect: &mut u64,
        lost: &mut u64,
    ) -> Result<(), String> {
        let seq = check(data)?;
        if seq != *expect {
            if !allow_gaps {
                return Err(if seq < *expect {
                    format!("seq {seq} again or out of order (expected {})", *expect)
                } else {
                    format!("seq {} to {} lost (got {seq})", *expect, seq - 1)
                });
            }
            if seq < *expect {
                return Err(format!(
                    "seq {seq} duplicated or out of order (expected at least {})",
                    *expect
                ));
            }
            *lost += seq - *expect;
        }
        let want = frame_len(seed, salt, seq, min, max);
        if data.len() != want {
            return Err(format!(
                "seq {seq}: {} bytes, the stream sent {want}",
                data.len()
            ));
        }
        *expect = seq + 1;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// child processes

/// The role this process plays, if it was started as a child by a two-process test.
pub fn child_role() -> Option<(String, String, u64)> {
    let role = std::env::var(ENV_ROLE).ok()?;
    let shm = std::env::var(ENV_SHM).expect("child without MEMNIC_TEST_SHM");
    let seed = std::env::var(ENV_SEED)
        .expect("child without MEMNIC_TEST_SEED")
        .parse()
        .expect("MEMNIC_TEST_SEED is a number");
    Some((role, shm, seed))
}

/// A seed for the payload streams: MEMNIC_TEST_SEED if set (to replay a failure), else random.
pub fn seed() -> u64 {
    let s = match std::env::var(ENV_SEED) {
        Ok(v) => v.parse().expect("MEMNIC_TEST_SEED is a number"),
        Err(_) => rand::random(),
    };
    eprintln!("payload seed: MEMNIC_TEST_SEED={s}");
    s
}

/// A child process running test function `test` of this binary; killed and reaped on drop.
pub struct ChildGuard {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    lines: Arc<Mutex<VecDeque<String>>>,
    output: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl ChildGuard {
    pub fn spawn(test: &str, env: &[(&str, String)]) -> ChildGuard {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn the child test process");
        let lines = Arc::new(Mutex::new(VecDeque::new()));
        let output = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        for (r, keep_lines) in [
            (Box::new(stdout) as Box<dyn std::io::Read + Send>, true),
            (Box::new(stderr) as Box<dyn std::io::Read + Send>, false),
        ] {
            let lines = lines.clone();
            let output = output.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(r).lines() {
                    let Ok(line) = line else { break };
                    output
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_str(&format!("{line}\n"));
                    if keep_lines {
                        lines
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push_back(line);
                    }
                }
            }));
        }
        let stdin = child.stdin.take();
        ChildGuard {
            child: Some(child),
            stdin,
            lines,
            output,
            readers,
            status: None,
        }
    }

    /// Everything the child printed so far.
    pub fn output(&self) -> String {
        self.output
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What follows `tag` on the first stdout line that contains it (libtest may have printed
    /// "test name ... " in front of it).
    pub fn line(&self, tag: &str) -> Option<String> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines
            .iter()
            .find_map(|l| l.find(tag).map(|i| l[i + tag.len()..].trim().to_string()))
    }

    /// Sends a line to the child's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to the child");
        stdin.flush().expect("flush to the child");
    }

    /// Panics (with the child's output) if the child has exited unsuccessfully, or successfully
    /// without printing its `result_tag` line (it did not run its role: a wrong test name).
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

    fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Some(c) = self.child.as_mut() {
                self.status = c.try_wait().expect("try_wait");
            }
        }
        self.status
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
                self.kill();
                self.fail("the child did not finish in time and was killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }

    pub fn fail(&mut self, why: &str) -> ! {
        self.kill();
        self.join_readers();
        panic!(
            "{why}\n----- child output -----\n{}------------------------",
            self.output()
        );
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.status.is_none() {
                let _ = c.kill();
            }
            if let Ok(st) = c.wait() {
                self.status.get_or_insert(st);
            }
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stdin = None;
        self.kill();
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

/// Parses `key=value` pairs of a result line.
pub fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in '{line}'"))
        .parse()
        .unwrap_or_else(|_| panic!("{key} in '{line}' is not a number"))
}
