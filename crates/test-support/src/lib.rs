//! What the tests of every memnic crate share (a dev-dependency only; never shipped):
//!
//! * [`ShmName`]: a `/dev/shm` name unique to the process *and* the call, removed on drop;
//!   [`TestDir`]: a temporary directory likewise;
//! * [`pool`] / [`shared_pool`]: small pools without hugepages;
//! * the one verified payload format — `memnic-fwd`'s (Ethernet/IPv4/UDP headers, then sequence
//!   number, flow, session and checksum): [`fill`], [`check`], [`write_frame`], [`read_frame`],
//!   with a length schedule ([`frame_len`]) the receiver checks too;
//! * [`Sender`] / [`Receiver`]: one stream over any `TxQueue` / `RxQueue`, retrying what
//!   `tx_burst` hands back and checking every frame for loss, corruption, duplicates and order;
//! * [`Child`]: a child process whose stdout and stderr are always drained (a chatty DPDK peer
//!   never blocks on a full pipe), killed and reaped on drop;
//! * [`pcap`]: pcap files written byte by byte (hostile records too) and what `tcpdump -r`
//!   reads back from a capture;
//! * [`harness`]: a test `main` for binaries whose tests re-execute themselves as a peer, so the
//!   child roles are not listed (or counted) as tests;
//! * [`netns`]: network namespaces (named ones deleted on drop, and fresh ones per thread) for
//!   tests that create interfaces and addresses, never on the machine's own network;
//! * [`guest`]: a real Linux guest in QEMU (TCG): the cloud kernel fetched once, an initramfs of
//!   busybox-static, the virtio-net modules, the test's `/init` and extra files (static builds
//!   of our programs), and QEMU pinned to a CPU with its console captured as a [`Child`]'s
//!   stdout.

mod child;
pub mod guest;
mod harness;
pub mod netns;
mod payload;
pub mod pcap;
mod stream;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

pub use child::{find_line, stdin_lines, Child, Stdin};
pub use harness::{child_name, harness, ENV_CHILD};
pub use payload::{
    check, check_flow, fill, flow_of, frame_len, frame_packet, read_frame, splitmix, write_frame,
    MAX_FRAME, MIN_FRAME,
};
pub use stream::{with_polling_host, Receiver, Sender};

use memnic_pktbuf::{Mempool, PoolConfig, DEFAULT_HEADROOM};

/// Environment variables a parent passes its child.
pub const ENV_ROLE: &str = "MEMNIC_TEST_ROLE";
pub const ENV_SHM: &str = "MEMNIC_TEST_SHM";
pub const ENV_SEED: &str = "MEMNIC_TEST_SEED";

/// Flow ids that keep the two directions' payload streams apart.
pub const UP: u64 = 0x7570; // host -> guest
pub const DOWN: u64 = 0x646f; // guest -> host

/// Under `cargo test` the tests of one binary run on parallel threads; polling tests take this
/// lock so they do not fight over the two CPUs. (nextest runs each test in its own process.)
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// `memnic-test-TAG-PID-N-NANOS`: a name no other process or call gets.
fn unique_name(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "memnic-test-{}-{}-{}-{}",
        tag,
        std::process::id(),
        // Relaxed: only uniqueness matters, which the atomic add gives on its own.
        N.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// A `/dev/shm` name unique to this process and call, removed on drop.
pub struct ShmName {
    name: String,
}

impl ShmName {
    pub fn new(tag: &str) -> ShmName {
        let name = unique_name(tag);
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

/// A directory of its own under the system's temporary directory (unique to the process and
/// the call), removed with everything in it on drop.
pub struct TestDir {
    path: std::path::PathBuf,
}

impl TestDir {
    pub fn new(tag: &str) -> TestDir {
        let path = std::env::temp_dir().join(unique_name(tag));
        std::fs::create_dir_all(&path).expect("create a test directory");
        TestDir { path }
    }

    /// `name` inside the directory.
    pub fn join(&self, name: &str) -> std::path::PathBuf {
        self.path.join(name)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A plain file of `len` bytes in `dir` (not a memfd: unsealed, on whatever filesystem `dir`
/// is), unlinked at once; the descriptor keeps it.
pub fn unlinked_file(dir: &std::path::Path, tag: &str, len: u64) -> std::fs::File {
    let path = dir.join(format!("memnic-{tag}-{}", std::process::id()));
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f.set_len(len).unwrap();
    f
}

/// A file on a mount only another mount namespace has: a child (`unshare -m`) mounts a ramfs
/// in its own namespace and keeps it while this lives; the file is opened through the child's
/// /proc root. Its mount id is in no mount table of ours. Needs root and util-linux.
pub struct ForeignMountFile {
    child: std::process::Child,
    pub file: std::fs::File,
    dir: std::path::PathBuf,
}

impl ForeignMountFile {
    pub fn new(tag: &str) -> ForeignMountFile {
        let dir = std::env::temp_dir().join(format!("memnic-ns-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!(
            "mount -t ramfs memnic-ns {d} && head -c 65536 /dev/zero > {d}/f && echo ready \
             && exec sleep 600",
            d = dir.display()
        );
        let mut child = std::process::Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("unshare (util-linux)");
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "the child mounted its ramfs (root needed)"
        );
        let path = format!("/proc/{}/root{}/f", child.id(), dir.display());
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        // (The directory stays until drop: removing it here would detach the child's mount
        // from its namespace too.)
        ForeignMountFile { child, file, dir }
    }

    /// The child's pid: a process whose mount table names the file's mount.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for ForeignMountFile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A private pool (no hugepages) whose buffers hold `data_room` bytes.
pub fn pool(name: &str, count: u32, data_room: u32) -> Mempool {
    pool_of(name, count, data_room, false)
}

/// A pool in a memfd, as a zero-copy port's: its buffers are reached only through copies.
pub fn shared_pool(name: &str, count: u32, data_room: u32) -> Mempool {
    pool_of(name, count, data_room, true)
}

fn pool_of(name: &str, count: u32, data_room: u32, shared: bool) -> Mempool {
    let mut cfg = PoolConfig::new(name, count);
    cfg.huge = false;
    cfg.shared = shared;
    cfg.buf_size = data_room + DEFAULT_HEADROOM;
    Mempool::new(&cfg).expect("pool")
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

/// The role this process plays, if a two-process test started it: (role, shm name, seed).
pub fn child_role() -> Option<(String, String, u64)> {
    let role = std::env::var(ENV_ROLE).ok()?;
    let shm = std::env::var(ENV_SHM).expect("child without MEMNIC_TEST_SHM");
    let seed = std::env::var(ENV_SEED)
        .expect("child without MEMNIC_TEST_SEED")
        .parse()
        .expect("MEMNIC_TEST_SEED is a number");
    Some((role, shm, seed))
}

/// Parses `key=value` pairs of a result line.
pub fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in '{line}'"))
        .parse()
        .unwrap_or_else(|_| panic!("{key} in '{line}' is not a number"))
}

/// Waits until `path` exists (a peer's socket or shared-memory file), at most `limit`.
pub fn wait_for_path(path: &str, limit: std::time::Duration) {
    let end = std::time::Instant::now() + limit;
    while !std::path::Path::new(path).exists() {
        assert!(
            std::time::Instant::now() < end,
            "{path} did not appear within {limit:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
