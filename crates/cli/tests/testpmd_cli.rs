//! `memnic testpmd` start-up: bad input gets one sentence and exit code 2; the placement of every
//! queue is printed; the interactive prompt works from piped input.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{memnic, ShmName};

fn one_sentence_error(args: &[&str], needle: &str) {
    common::assert_one_sentence(&memnic(args), &format!("{args:?}"), needle);
}

#[test]
fn bad_input_is_one_sentence() {
    let host = ShmName::new("badinput");
    let h = format!("memnic0,path={},role=host", host.name());
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--forward-mode".into(), "fast".into()], "unknown forwarding mode 'fast' (available: io, mac"),
        (vec!["-l".into(), "4000".into()], "lcore 0: CPU 4000 is not available to this process"),
        (vec!["-l".into(), "0-x".into()], "-l/--lcores: '0-x'"),
        (vec!["-l".into(), "0".into(), "--nb-cores".into(), "2".into()], "--nb-cores=2 must be between 1 and the 1"),
        (vec![], "no ports: give at least one --vdev"),
        (vec!["--vdev".into(), "memnic0,pth=/x,role=guest".into()], "port 'memnic0': unknown key 'pth' (known keys: path, role"),
        (vec!["--vdev".into(), "memnic0,role=guest".into()], "port 'memnic0': missing required key 'path'"),
        (vec!["--vdev".into(), "memnic0,path=x,role=guset".into()], "port 'memnic0': bad value 'guset' for 'role'"),
        (vec!["--vdev".into(), "memnic0,path=/nonexistent/dir/x,role=guest".into()], "port 'memnic0': cannot open /nonexistent/dir/x"),
        (vec!["--vdev".into(), "memnic0,path=x,role=guest,framesz=9000".into()], "bad value '9000' for 'framesz': must be within 1518..=4088"),
        (vec!["--vdev".into(), "memnic0,path=x,role=guest,rx_holdoff_ns=5us".into()], "bad value '5us' for 'rx_holdoff_ns': expected nanoseconds from 0 to 1000000"),
        (vec!["--vdev".into(), "memnic0,path=x,role=host,rx_holdoff_ns=1000001".into()], "bad value '1000001' for 'rx_holdoff_ns'"),
        (vec!["--vdev".into(), "memnic0,path=x,role=host,rx_flush=maybe".into()], "bad value 'maybe' for 'rx_flush': expected auto, on or off"),
        (vec!["--vdev".into(), "memnic0,path=x,role=guest,tx_stream=always".into()], "bad value 'always' for 'tx_stream': expected auto, on or off"),
        (vec!["--vdev".into(), "memif0,rx-flush=2".into()], "bad value '2' for 'rx-flush': expected auto, on or off"),
        (vec!["--vdev".into(), "memif0,tx-stream=sometimes".into()], "bad value 'sometimes' for 'tx-stream': expected auto, on or off"),
        (vec!["--vdev".into(), "vhost0,iface=x,rx-flush=always".into()], "bad value 'always' for 'rx-flush': expected auto, on or off"),
        (vec!["--vdev".into(), "vhost0,iface=x,tx-stream=yes-please".into()], "bad value 'yes-please' for 'tx-stream': expected auto, on or off"),
        (vec!["--vdev".into(), "ring0,size=1".into()], "port 'ring0': no driver 'ring' (available: memnic, memif, vhost, tap, pcap)"),
        (vec!["--vdev".into(), "vhost0".into()], "port 'vhost0': missing required key 'iface'"),
        (vec!["--vdev".into(), "vhost0,iface=/nonexistent/dir/s".into()], "port 'vhost0': cannot listen on /nonexistent/dir/s"),
        (vec!["--vdev".into(), "vhost0,iface=x,queues=9".into()], "bad value '9' for 'queues': queue pairs, 1..=8"),
        (vec!["--vdev".into(), "memif0,role=server,socket=/nonexistent/dir/s".into()], "port 'memif0': "),
        (vec!["--vdev".into(), "memif0,rsize=20".into()], "bad value '20' for 'rsize': log2 of the ring size, 1..=14"),
        (vec!["--vdev".into(), "memif0,role=boss".into()], "bad value 'boss' for 'role'"),
        (vec!["--vdev".into(), "memif0,sokcet=/x".into()], "port 'memif0': unknown key 'sokcet'"),
        (vec!["--vdev".into(), h.clone(), "--rxq".into(), "2".into(), "--txq".into(), "2".into()], "port 'memnic0': --rxq=2 --txq=2 asks for more queues than the driver offers (1 rx, 16 tx)"),
        (vec!["--vdev".into(), h.clone(), "--rxq".into(), "1".into(), "--txq".into(), "2".into()], "--rxq=1 and --txq=2 differ"),
        (vec!["--vdev".into(), h.clone(), "--burst".into(), "0".into()], "--burst=0 is outside 1..=512"),
        (vec!["--vdev".into(), h.clone(), "--txpkts".into(), "20".into()], "--txpkts=20 is outside 60..=9000"),
        (vec!["--vdev".into(), h.clone(), "--forward-mode".into(), "txonly".into(), "--txpkts".into(), "2000".into(), "--mbuf-size".into(), "4096".into()], "--txpkts=2000 is longer than the port's largest frame (1518 bytes)"),
        (vec!["--vdev".into(), h.clone(), "--txpkts".into(), "1500".into(), "--mbuf-size".into(), "1024".into()], "--mbuf-size=1024 cannot hold --txpkts=1500"),
        (vec!["--vdev".into(), h.clone(), "--mbcache".into(), "0".into()], "--mbcache=0 is out of range: a queue's cache holds 1 to 512 buffers"),
        (vec!["--vdev".into(), h.clone(), "--mbcache".into(), "513".into()], "--mbcache=513 is out of range"),
        (vec!["--vdev".into(), h.clone(), "--verify".into()], "--verify works with --forward-mode=txonly, rxonly or ping, not io"),
        (vec!["--vdev".into(), h.clone(), "--tx-count".into(), "10".into()], "--tx-count works with --forward-mode=txonly, flowgen or ping, not io"),
        (vec!["--vdev".into(), h.clone(), "-i".into(), "--rx-count".into(), "10".into()], "--tx-count and --rx-count end a run by themselves: not with -i"),
        (vec!["--vdev".into(), h.clone(), "--eth-peer".into(), "0,zz".into()], "'zz' is not a MAC address"),
        (vec!["--vdev".into(), h.clone(), "--eth-peer".into(), "3,02:00:00:00:00:01".into()], "--eth-peer names port 3, but there are 1 port(s)"),
        (vec!["--vdev".into(), h.clone(), "--port-topology".into(), "ring".into()], "unknown port topology 'ring'"),
        (vec!["--vdev".into(), h.clone(), "--ring-numa-config".into(), "(0,4,0)".into()], "--ring-numa-config: flag 4 in (0,4,0) is not 1 (rx), 2 (tx) or 3 (both)"),
        (vec!["--vdev".into(), h.clone(), "--port-numa-config".into(), "(0,7)".into()], "socket 7 in (0,7) is not a NUMA node of this machine"),
        (vec!["--vdev".into(), h.clone(), "--port-numa-config".into(), "(5,0)".into()], "port 5"),
        (vec!["--burst".into(), "x".into()], "invalid value 'x' for '--burst"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["testpmd".to_string(), "--duration".into(), "0.1".into()];
        args.extend(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        one_sentence_error(&refs, needle);
    }
    // A guest with no host: the reset times out with a sentence, not a hang.
    let lonely = ShmName::new("lonely");
    std::fs::write(lonely.path(), vec![0u8; 16 << 20]).unwrap();
    one_sentence_error(
        &[
            "testpmd",
            "--vdev",
            &format!("memnic0,path={},role=guest", lonely.name()),
        ],
        "not a MEMNIC device",
    );
}

/// A fake sysfs with two NUMA nodes: CPUs 0-3 on node 0, 4-7 on node 1.
struct FakeSysfs(std::path::PathBuf);

impl FakeSysfs {
    fn new() -> FakeSysfs {
        let root = std::env::temp_dir().join(format!("memnic-sysfs-{}", std::process::id()));
        let node = root.join("devices/system/node");
        for (n, cpus) in [(0, "0-3"), (1, "4-7")] {
            std::fs::create_dir_all(node.join(format!("node{n}"))).unwrap();
            std::fs::write(node.join(format!("node{n}/cpulist")), format!("{cpus}\n")).unwrap();
        }
        std::fs::write(node.join("online"), "0-1\n").unwrap();
        std::fs::create_dir_all(root.join("devices/system/cpu")).unwrap();
        std::fs::write(root.join("devices/system/cpu/online"), "0-7\n").unwrap();
        FakeSysfs(root)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Startup placement lines for two host ports, streams on lcores at CPUs 1 and 5.
fn placement(extra: &[&str]) -> Vec<String> {
    let sys = FakeSysfs::new();
    let (a, b) = (ShmName::new("place-a"), ShmName::new("place-b"));
    let mut args = vec![
        "testpmd".to_string(),
        "--sysfs-root".into(),
        sys.path().display().to_string(),
        "-l".into(),
        "1,5".into(),
        "--vdev".into(),
        format!("memnic0,path={},role=host", a.name()),
        "--vdev".into(),
        format!("memnic1,path={},role=host", b.name()),
        "--forward-mode".into(),
        "rxonly".into(),
        "--duration".into(),
        "0.2".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = memnic(&refs);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter(|l| l.trim_start().starts_with("port "))
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn poll_placement_follows_testpmd_rules_on_a_two_node_topology() {
    // Streams: port 0 rxq 0 -> port 1 txq 0 on lcore 0 (CPU 1); port 1 rxq 0 -> port 0 txq 0 on
    // lcore 1 (CPU 5).
    let lines = placement(&[]);
    assert_eq!(
        lines,
        [
            "port 0 rxq 0: lcore 0 (CPU 1), node 0 (default), pool mb_pool_0",
            "port 1 txq 0: lcore 0 (CPU 1), node 0 (default), pool mb_pool_0",
            "port 1 rxq 0: lcore 1 (CPU 5), node 0 (default), pool mb_pool_0",
            "port 0 txq 0: lcore 1 (CPU 5), node 0 (default), pool mb_pool_0",
        ]
    );
    let lines = placement(&["--ring-bind-lcpu"]);
    assert!(
        lines[0].ends_with("node 0 (--ring-bind-lcpu), pool mb_pool_0"),
        "{lines:?}"
    );
    assert!(
        lines[2].ends_with("node 1 (--ring-bind-lcpu), pool mb_pool_1"),
        "{lines:?}"
    );
    assert!(
        lines[3].ends_with("node 1 (--ring-bind-lcpu), pool mb_pool_1"),
        "{lines:?}"
    );
    // An explicit port setting wins over --ring-bind-lcpu.
    let lines = placement(&["--ring-bind-lcpu", "--port-numa-config", "(1,0)"]);
    assert!(
        lines[2].ends_with("node 0 (--port-numa-config), pool mb_pool_0"),
        "{lines:?}"
    );
    assert!(
        lines[3].ends_with("node 1 (--ring-bind-lcpu), pool mb_pool_1"),
        "{lines:?}"
    );
    // A ring setting wins over both, for its direction only.
    let lines = placement(&[
        "--ring-bind-lcpu",
        "--port-numa-config",
        "(0,1)",
        "--ring-numa-config",
        "(0,1,0)",
    ]);
    assert!(
        lines[0].ends_with("node 0 (--ring-numa-config), pool mb_pool_0"),
        "{lines:?}"
    );
    assert!(
        lines[3].ends_with("node 1 (--port-numa-config), pool mb_pool_1"),
        "{lines:?}"
    );
    let lines = placement(&["--socket-num", "1"]);
    assert!(
        lines
            .iter()
            .all(|l| l.ends_with("node 1 (--socket-num), pool mb_pool_1")),
        "{lines:?}"
    );
}

#[test]
fn poll_interactive_prompt_from_piped_input() {
    let shm = ShmName::new("prompt");
    let script = "show config fwd\nstart\nshow port stats all\nset fwd rxonly\nstop\nset fwd rxonly\nset fwd bogus\nclear port stats all\nstart tx_first\nstop\nshow port xstats all\nshow port xstats 0\nshow port xstats 7\nquit\n";
    let p = common::spawn_with_stdin(
        &[
            "testpmd",
            "-i",
            "-l",
            "1",
            "--vdev",
            &format!("memnic0,path={},role=host", shm.name()),
            "--forward-mode",
            "txonly",
        ],
        Some(script),
    );
    let out = p.wait(Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "txonly packet forwarding - ports=1 - cores=1 - streams=1",
        "NIC statistics for port 0",
        "Rx-pps:",
        "Please stop forwarding first",
        "Forward statistics for port 0",
        "Set rxonly packet forwarding mode",
        "unknown forwarding mode 'bogus'",
        "NIC statistics cleared for all ports",
        "rxonly packet forwarding - ports=1",
        "NIC extended statistics for port 0",
        "\ntx_streamed_packets: ",
        "Invalid port 7",
        "Bye...",
    ] {
        assert!(text.contains(needle), "missing '{needle}' in:\n{text}");
    }
    // `show port xstats all`, then of port 0: each prints the port's counters once.
    assert_eq!(
        text.matches("NIC extended statistics for port 0").count(),
        2,
        "{text}"
    );
    // `start` says which streams each lcore forwards, as `show config fwd` does (it once read
    // them after the lcores had taken them: "on 0 streams").
    let started = text.find("Please stop forwarding first").unwrap();
    let at_start = text[..started]
        .matches("forwards packets on 1 streams")
        .count();
    assert_eq!(at_start, 2, "show config fwd, then start:\n{text}");
    assert!(!text.contains("on 0 streams"), "{text}");
    let order = [
        "Please stop forwarding first",
        "Set rxonly packet forwarding mode",
        "Bye...",
    ];
    let pos: Vec<usize> = order.iter().map(|n| text.find(n).unwrap()).collect();
    assert!(
        pos.windows(2).all(|w| w[0] < w[1]),
        "commands ran out of order:\n{text}"
    );
}

/// `--json` at the prompt: the report comes at `quit` even when forwarding was stopped first
/// (stop's statistics go to stderr, as every human-readable line does with `--json`).
#[test]
fn poll_prompt_json_report_comes_at_quit_after_a_stop() {
    let shm = ShmName::new("prompt-json");
    let p = common::spawn_with_stdin(
        &[
            "testpmd",
            "-i",
            "--json",
            "-l",
            "1",
            "--vdev",
            &format!("memnic0,path={},role=host", shm.name()),
            "--forward-mode",
            "txonly",
        ],
        Some("start\nstop\nquit\n"),
    );
    let out = p.wait(Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON report at quit:\n{text}"));
    let r: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(r["mode"], "txonly", "{json}");
    assert_eq!(r["ports"][0]["name"], "memnic0", "{json}");
    assert_eq!(r["lcores"][0]["cpu"], 1, "{json}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("Forward statistics"),
        "stop's statistics:\n{said}"
    );
}

#[test]
fn poll_sigint_stops_and_prints_totals() {
    let shm = ShmName::new("sigint");
    let p = common::spawn(&[
        "testpmd",
        "-l",
        "1",
        "--vdev",
        &format!("memnic0,path={},role=host", shm.name()),
        "--forward-mode",
        "txonly",
        "--json",
    ]);
    std::thread::sleep(Duration::from_millis(800));
    p.interrupt();
    let out = p.wait(Duration::from_secs(20));
    assert!(out.status.success());
    let j = common::json_of(&out);
    assert_eq!(j["mode"], "txonly");
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("Accumulated forward statistics for all ports"));
}

/// A zero-copy memif port hands its pool to its peer, so it gets a pool of its own; every
/// other port copies out of a private pool that no peer maps.
#[test]
fn zero_copy_port_gets_a_pool_of_its_own() {
    let host = ShmName::new("zc-pool");
    let sock = format!("/tmp/memnic-zc-pool-{}.sock", std::process::id());
    let args = [
        "testpmd".to_string(),
        "-l".into(),
        "0".into(),
        "--vdev".into(),
        format!("memif0,role=client,socket={sock},zero-copy=yes"),
        "--vdev".into(),
        format!("memnic0,path={},role=host", host.name()),
        "--forward-mode".into(),
        "io".into(),
        "--duration".into(),
        "0.2".into(),
    ];
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = memnic(&refs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let pool_of = |queue: &str| -> String {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(queue))
            .unwrap_or_else(|| panic!("no line for {queue} in:\n{text}"));
        line.rsplit("pool ").next().unwrap().trim().to_string()
    };
    assert_eq!(pool_of("port 0 rxq 0:"), "zc_pool_p0_0", "{text}");
    assert_eq!(pool_of("port 0 txq 0:"), "zc_pool_p0_0", "{text}");
    assert_eq!(pool_of("port 1 rxq 0:"), "mb_pool_0", "{text}");
    assert_eq!(pool_of("port 1 txq 0:"), "mb_pool_0", "{text}");
    let _ = std::fs::remove_file(&sock);
}
