//! DPDK's testpmd as a peer (Debian's dpdk-testpmd 22.11): starting it with one vdev, waiting
//! for its forwarding, stopping it, reading its counters; shared by the memif and vhost interop
//! tests.

use std::time::Duration;

use super::Proc;

pub const DPDK: &str = "dpdk-testpmd";

pub fn have_dpdk() -> bool {
    if std::process::Command::new(DPDK)
        .arg("--version")
        .output()
        .is_ok()
    {
        return true;
    }
    assert!(
        std::env::var_os("MEMNIC_SKIP_DPDK").is_some(),
        "dpdk-testpmd is not installed (apt-get install dpdk librte-net-memif23 librte-net-virtio23), or set MEMNIC_SKIP_DPDK=1"
    );
    false
}

pub struct Sock(pub String);

impl Sock {
    pub fn new(tag: &str) -> Sock {
        let p = format!("/tmp/memnic-dpdk-{tag}-{}.sock", std::process::id());
        let _ = std::fs::remove_file(&p);
        Sock(p)
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A DPDK testpmd on CPU `cpu` with one memif vdev, running `mode` until interrupted.
pub fn dpdk(
    tag: &str,
    cpu: u32,
    vdev: &str,
    mode: &str,
    extra_eal: &[&str],
    extra_app: &[&str],
) -> Proc {
    let lcores = format!("--lcores=0@{cpu},1@{cpu}");
    let prefix = format!("memnic-{tag}-{}", std::process::id());
    let vdev = format!("--vdev={vdev}");
    let fwd = format!("--forward-mode={mode}");
    let mut args = vec![
        "--no-huge",
        "-m",
        "512",
        "--no-pci",
        &lcores,
        "--file-prefix",
        &prefix,
        &vdev,
    ];
    args.extend_from_slice(extra_eal);
    // --stats-period keeps testpmd running until SIGINT (without it, it waits for Enter and a
    // closed stdin ends it at once).
    args.extend_from_slice(&[
        "--",
        "--nb-cores=1",
        "--total-num-mbufs=32768",
        "-a",
        "--stats-period",
        "1",
        &fwd,
    ]);
    args.extend_from_slice(extra_app);
    super::spawn_program(DPDK, &args)
}

/// The largest RX-packets and TX-packets DPDK's per-second port statistics showed. (Its final
/// forward totals are useless here: the memif PMD zeroes its counters when the peer
/// disconnects, and the totals then underflow.)
pub fn dpdk_totals(out: &std::process::Output) -> (u64, u64) {
    dpdk_totals_if_printed(out).unwrap_or_else(|| {
        panic!(
            "DPDK printed no statistics:\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// As [`dpdk_totals`], or `None` where DPDK printed no statistics (a DPDK that crashed loses
/// what its stdout buffer held).
pub fn dpdk_totals_if_printed(out: &std::process::Output) -> Option<(u64, u64)> {
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains("NIC statistics for port 0") {
        return None;
    }
    let max_of = |key: &str, beside: &str| {
        text.lines()
            .filter(|l| l.contains(beside))
            .filter_map(|l| l.trim_start().strip_prefix(key))
            .filter_map(|r| r.split_whitespace().next()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
    };
    Some((
        max_of("RX-packets:", "RX-missed:"),
        max_of("TX-packets:", "TX-errors:"),
    ))
}

/// Waits until DPDK's testpmd has started its port and its forwarding (it creates a server's
/// socket at probe, earlier: a client that connects before the port starts is refused with "ID
/// not found", and frames sent before forwarding starts are not echoed). A fresh machine's
/// first DPDK start loads every driver library from a cold cache: the limit is generous.
pub fn dpdk_forwarding(p: &mut Proc) {
    p.wait_for_line("packet forwarding - ports=", Duration::from_secs(60));
}

/// Lets our `ours` (started without `--duration`) run `secs` seconds once DPDK's `peer`
/// forwards, then interrupts it and returns its output. The time counts from DPDK's start, not
/// ours: on a busy machine DPDK can take longer to start than our whole run would last.
pub fn ours_while_dpdk_forwards(ours: Proc, peer: &mut Proc, secs: u64) -> std::process::Output {
    dpdk_forwarding(peer);
    std::thread::sleep(Duration::from_secs(secs));
    ours.interrupt();
    ours.wait(Duration::from_secs(30))
}

/// As [`ours_while_dpdk_forwards`], for a run where DPDK may crash on its own: DPDK 22.11's
/// memif tx writes chained frames past the free slots (see memif_dpdk's `check_we_received`),
/// our side disconnects it for that, and its disconnect unmaps the regions while its lcore is
/// still sending (SIGSEGV; its buffered stdout, the forwarding line included, may be lost with
/// it). Returns our output, and whether DPDK died while our side ran.
pub fn ours_while_dpdk_forwards_or_dies(
    ours: Proc,
    peer: &mut Proc,
    secs: u64,
) -> (std::process::Output, bool) {
    // Dead or forwarding, the time counts from here.
    let _ = peer.wait_for_lines_or_exit("packet forwarding - ports=", 1, Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(secs));
    // Looked at before ours stops: our own disconnect at exit may crash it too.
    let died = peer.exited();
    ours.interrupt();
    (ours.wait(Duration::from_secs(30)), died)
}

pub fn stop_dpdk(p: Proc) -> std::process::Output {
    p.interrupt();
    p.wait(Duration::from_secs(20))
}

pub fn n(v: &serde_json::Value, k: &str) -> u64 {
    v["ports"][0][k]
        .as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}
