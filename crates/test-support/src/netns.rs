//! Network namespaces for tests that need interfaces and addresses: never the machine's own.
//!
//! * [`NetNs`]: a named namespace (`ip netns add`), unique to the process and the call, deleted
//!   on drop (a failing test leaves none behind); `ip -n NAME ...`, programs run inside it, and
//!   closures run on a thread inside it (sockets made there stay there).
//! * [`in_new_netns`]: a closure on a thread in a fresh, unnamed namespace that goes away with
//!   the thread; [`ip`] runs `ip` in the calling thread's namespace.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// A named network namespace, deleted on drop (with the TAP interfaces in it).
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// `memnic-TAG-PID-N`, created with IPv6 off (the kernel then sends nothing unasked: no
    /// router solicitations or multicast reports), its loopback up.
    pub fn new(tag: &str) -> NetNs {
        static N: AtomicU64 = AtomicU64::new(0);
        // Relaxed: only the uniqueness of the number matters.
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("memnic-{tag}-{}-{n}", std::process::id());
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = NetNs { name };
        ns.run(|| memnic_shm::netns::disable_ipv6().unwrap_or_else(|e| panic!("{e}")));
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its file, for [`memnic_shm::netns::enter`].
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip -n NAME ARGS`; its stdout. Panics with ip's error if it fails.
    pub fn ip(&self, args: &[&str]) -> String {
        self.try_ip(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `ip -n NAME ARGS`: its stdout, or what it said on failure.
    pub fn try_ip(&self, args: &[&str]) -> Result<String, String> {
        try_run(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// `PROGRAM ARGS` inside the namespace (through `ip netns exec`, which execs it: the pid
    /// is the program's); its stdout. Panics if it fails.
    pub fn exec(&self, program_and_args: &[&str]) -> String {
        run(&mut self.command(program_and_args))
    }

    /// A command that runs `PROGRAM ARGS` inside the namespace, for `Child::spawn`.
    pub fn command(&self, program_and_args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(program_and_args);
        c
    }

    /// Runs `f` on a thread inside the namespace: sockets it opens stay there.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = self.path();
        std::thread::scope(|s| {
            s.spawn(|| {
                memnic_shm::netns::enter(&path).unwrap_or_else(|e| panic!("{e}"));
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// What the kernel counted on `dev` in this namespace.
    pub fn link_counters(&self, dev: &str) -> LinkCounters {
        LinkCounters::parse(dev, &self.ip(&["-s", "-j", "link", "show", "dev", dev]))
    }
}

/// Frames and bytes the kernel counted on an interface (`ip -s -j link show`'s `stats64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Frames the kernel handed to the interface that it dropped (for a TAP: written to it
    /// while it was down, or refused).
    pub rx_dropped: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Frames the kernel meant to send that nobody took (for a TAP: no queue attached, or a
    /// queue's backlog full).
    pub tx_dropped: u64,
}

impl LinkCounters {
    fn parse(dev: &str, text: &str) -> LinkCounters {
        let v: serde_json::Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("ip -j output is not JSON ({e}): {text}"));
        let s = &v[0]["stats64"];
        let n = |dir: &str, k: &str| {
            s[dir][k]
                .as_u64()
                .unwrap_or_else(|| panic!("no stats64.{dir}.{k} for {dev}: {text}"))
        };
        LinkCounters {
            rx_packets: n("rx", "packets"),
            rx_bytes: n("rx", "bytes"),
            rx_dropped: n("rx", "dropped"),
            tx_packets: n("tx", "packets"),
            tx_bytes: n("tx", "bytes"),
            tx_dropped: n("tx", "dropped"),
        }
    }
}

/// What the kernel counted on `dev` in the calling thread's network namespace.
pub fn link_counters(dev: &str) -> LinkCounters {
    LinkCounters::parse(dev, &ip(&["-s", "-j", "link", "show", "dev", dev]))
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // The kernel deletes the namespace's virtual interfaces (TAPs, persistent or not) with
        // it, once no process is left inside.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Runs `f` on a thread in a new network namespace of its own, with IPv6 off and loopback
/// down; the namespace goes away when the thread ends (and the sockets and TAP queues it
/// opened are closed).
pub fn in_new_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            memnic_shm::netns::unshare().unwrap_or_else(|e| panic!("{e} (needs root)"));
            memnic_shm::netns::disable_ipv6().unwrap_or_else(|e| panic!("{e}"));
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// `ip ARGS` in the calling thread's network namespace (a child inherits it); its stdout.
pub fn ip(args: &[&str]) -> String {
    run(Command::new("ip").args(args))
}

fn run(cmd: &mut Command) -> String {
    try_run(cmd).unwrap_or_else(|e| panic!("{e}"))
}

fn try_run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
