//! Two TAP ports joined by our testpmd in `io` mode, with the kernel's network stack on both
//! sides: testpmd runs in a network namespace of the test's own, where it creates the two
//! interfaces; the test moves each into a namespace of its own (A and B), gives them 10.77.0.1
//! and 10.77.0.2, and pings and streams TCP from A to B. Every frame between them crosses
//! testpmd. Nothing here touches the machine's own interfaces or addresses.
//!
//! Counters: the kernel counts a TAP's tx frame when a queue reads it and its rx frame when a
//! queue writes it, so a frame it queued that no one read, or one refused, is counted on
//! neither side. The interfaces are persistent (`persist=yes`): they outlive testpmd, and
//! their counters are read after it has stopped, when neither side can count anything more;
//! ours (testpmd's `--json`) and the kernel's must then agree exactly, frames and bytes. The
//! namespaces have IPv6 off, so the kernel sends nothing the test did not ask for (that would
//! be counted on both sides alike anyway).
//!
//! Needs `ip` (iproute2) and busybox's ping (`busybox-static`).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::{json_of, Proc};
use memnic_test_support::netns::{LinkCounters, NetNs};
use memnic_test_support::{splitmix, Stdin};

/// The two interfaces: ours on port 0 goes to namespace A, port 1's to B.
const IFACES: [&str; 2] = ["mtap0", "mtap1"];
const ADDRS: [&str; 2] = ["10.77.0.1", "10.77.0.2"];

/// testpmd forwarding between two TAP ports, its interfaces moved into namespaces A and B.
struct Rig {
    // Fields drop in order: testpmd first, then its namespaces (with the interfaces).
    testpmd: Option<Proc>,
    _home: NetNs,
    ns: [NetNs; 2],
}

impl Rig {
    /// Starts testpmd in its own namespace with two TAP ports (`opts`: more devargs for both,
    /// with a leading comma; `args`: more testpmd flags), waits until both interfaces are up
    /// there (the port's last step of opening), then moves and addresses them.
    fn start(tag: &str, opts: &str, args: &[&str]) -> Rig {
        let home = NetNs::new(&format!("{tag}-pmd"));
        let ns = [
            NetNs::new(&format!("{tag}-a")),
            NetNs::new(&format!("{tag}-b")),
        ];
        let vdevs: Vec<String> = IFACES
            .iter()
            .enumerate()
            .map(|(i, n)| format!("tap{i},iface={n},persist=yes{opts}"))
            .collect();
        let mut cmd = vec![
            common::bin(),
            "testpmd",
            "--vdev",
            &vdevs[0],
            "--vdev",
            &vdevs[1],
            "--forward-mode",
            "io",
            "--json",
        ];
        cmd.extend_from_slice(args);
        let mut testpmd = Proc::spawn(home.command(&cmd), Stdin::Null);
        let end = Instant::now() + Duration::from_secs(20);
        for dev in IFACES {
            while !home
                .try_ip(&["link", "show", "dev", dev, "up"])
                .is_ok_and(|out| !out.is_empty())
            {
                testpmd.check_alive_or_ok("never");
                if Instant::now() > end {
                    testpmd.fail(&format!("{dev} was not up within 20 s"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for (i, dev) in IFACES.iter().enumerate() {
            home.ip(&["link", "set", dev, "netns", ns[i].name()]);
            ns[i].ip(&["addr", "add", &format!("{}/24", ADDRS[i]), "dev", dev]);
            ns[i].ip(&["link", "set", dev, "up"]);
        }
        Rig {
            testpmd: Some(testpmd),
            _home: home,
            ns,
        }
    }

    /// Five pings from A to B; all must come back.
    fn ping(&self) -> String {
        let out = self.ns[0].exec(&["/bin/busybox", "ping", "-c", "5", "-W", "10", ADDRS[1]]);
        assert!(out.contains("5 packets received"), "{out}");
        out.lines()
            .find(|l| l.contains("packets received"))
            .unwrap_or_default()
            .to_string()
    }

    /// `conns` TCP connections from A to B at once, `bytes` each, checked byte for byte.
    fn stream(&self, conns: u16, bytes: usize) {
        let listeners: Vec<TcpListener> = (0..conns)
            .map(|c| {
                self.ns[1]
                    .run(|| TcpListener::bind((ADDRS[1], 5001 + c)))
                    .unwrap()
            })
            .collect();
        let timeout = Some(Duration::from_secs(60));
        std::thread::scope(|s| {
            for (c, listener) in listeners.iter().enumerate() {
                let data: Vec<u8> = (0..bytes.div_ceil(8) as u64)
                    .flat_map(|i| splitmix(i ^ ((c as u64) << 40)).to_le_bytes())
                    .take(bytes)
                    .collect();
                let mut client = self.ns[0]
                    .run(|| {
                        let to = format!("{}:{}", ADDRS[1], 5001 + c as u16);
                        TcpStream::connect_timeout(&to.parse().unwrap(), Duration::from_secs(20))
                    })
                    .unwrap_or_else(|e| panic!("connection {c}: {e}"));
                let (mut server, _) = listener.accept().unwrap();
                client.set_write_timeout(timeout).unwrap();
                server.set_read_timeout(timeout).unwrap();
                let reader = s.spawn(move || {
                    let mut got = Vec::with_capacity(bytes);
                    server.read_to_end(&mut got).unwrap();
                    got
                });
                s.spawn(move || {
                    client.write_all(&data).unwrap();
                    client.shutdown(std::net::Shutdown::Write).unwrap();
                    let got = reader.join().expect("the reader");
                    assert_eq!(got.len(), bytes, "connection {c}: length");
                    assert!(got == data, "connection {c}: the bytes differ");
                });
            }
        });
    }

    /// Stops testpmd (SIGINT) and returns its JSON report, then the kernel's counters of both
    /// interfaces (which outlive it).
    fn stop(&mut self) -> (serde_json::Value, [LinkCounters; 2]) {
        let p = self.testpmd.take().expect("running");
        p.interrupt();
        let out = p.wait(Duration::from_secs(30));
        assert!(
            out.status.success(),
            "testpmd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let kernel = [0, 1].map(|i| self.ns[i].link_counters(IFACES[i]));
        (json_of(&out), kernel)
    }
}

fn num(j: &serde_json::Value, port: usize, key: &str) -> u64 {
    j["ports"][port][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} for port {port}: {j}"))
}

/// Our ports' counters and the kernel's agree exactly; testpmd forwarded everything it got.
/// Prints both, and returns the frames A sent.
fn assert_counters_agree(j: &serde_json::Value, kernel: &[LinkCounters; 2]) -> u64 {
    for (p, k) in kernel.iter().enumerate() {
        let said = format!("port {p} ({}): {k:?}\n{j}", IFACES[p]);
        eprintln!(
            "port {p}: ours rx {}/{} B tx {}/{} B tx_errors {} | kernel {} tx {}/{} B rx {}/{} B rx_dropped {}",
            num(j, p, "rx_packets"),
            num(j, p, "rx_bytes"),
            num(j, p, "tx_packets"),
            num(j, p, "tx_bytes"),
            num(j, p, "tx_errors"),
            IFACES[p],
            k.tx_packets,
            k.tx_bytes,
            k.rx_packets,
            k.rx_bytes,
            k.rx_dropped,
        );
        // What the kernel sent, we received; what we sent, it received.
        assert_eq!(num(j, p, "rx_packets"), k.tx_packets, "{said}");
        assert_eq!(num(j, p, "rx_bytes"), k.tx_bytes, "{said}");
        assert_eq!(num(j, p, "tx_packets"), k.rx_packets, "{said}");
        assert_eq!(num(j, p, "tx_bytes"), k.rx_bytes, "{said}");
        // Frames written while the interface was down (before the test raised it in its
        // namespace) are our tx errors and the kernel's rx drops.
        assert_eq!(num(j, p, "tx_errors"), k.rx_dropped, "{said}");
        for key in ["rx_errors", "rx_missed", "rx_nombuf", "tx_dropped"] {
            assert_eq!(num(j, p, key), 0, "{key}: {said}");
        }
    }
    // io mode: each port passed on everything the other received.
    for (rx, tx) in [(0, 1), (1, 0)] {
        assert_eq!(
            num(j, rx, "rx_packets"),
            num(j, tx, "tx_packets") + num(j, tx, "tx_errors"),
            "port {rx} received what port {tx} did not send: {j}"
        );
    }
    kernel[0].tx_packets
}

/// Ping and a 4 MiB TCP stream from namespace A to namespace B through our testpmd; the
/// counters agree with the kernel's.
#[test]
fn poll_ping_and_tcp_cross_two_tap_ports_between_namespaces() {
    let mut rig = Rig::start("tap", "", &["-l", "1"]);
    eprintln!("ping: {}", rig.ping());
    rig.stream(1, 4 << 20);
    let (j, kernel) = rig.stop();
    let sent = assert_counters_agree(&j, &kernel);
    // 4 MiB in segments of at most 1448 bytes went from A to B.
    assert!(sent > (4 << 20) / 1448, "{sent} frames from A: {j}");
}

/// Two queue pairs per port on two lcores: the kernel spreads eight TCP connections over both
/// queues; everything still crosses intact and the counters agree.
#[test]
fn poll_two_queue_taps_on_two_lcores_carry_the_traffic() {
    let mut rig = Rig::start(
        "tapmq",
        ",queues=2",
        &["-l", "0,1", "--rxq", "2", "--txq", "2"],
    );
    eprintln!("ping: {}", rig.ping());
    rig.stream(8, 512 << 10);
    let (j, kernel) = rig.stop();
    let sent = assert_counters_agree(&j, &kernel);
    assert!(sent > (4 << 20) / 1448, "{sent} frames from A: {j}");
    // Two lcores, each polling both queues of one port, both busy.
    for l in 0..2 {
        let rx = j["lcores"][l]["rx_packets"].as_u64().unwrap_or(0);
        assert!(rx > 0, "lcore {l} received nothing: {j}");
    }
}

/// `--rx-interrupt`: idle TAP queues let their lcores sleep in poll(), and a ping wakes them.
#[test]
fn poll_rx_interrupt_sleeps_while_idle_and_wakes_for_ping() {
    let mut rig = Rig::start("tapirq", "", &["-l", "0,1", "--rx-interrupt"]);
    let pmd = rig.testpmd.as_ref().expect("running");
    let t0 = pmd.cpu_time();
    // A window to measure, not a wait for anything: nothing is sent during it.
    std::thread::sleep(Duration::from_secs(2));
    let spent = pmd.cpu_time() - t0;
    assert!(
        spent < Duration::from_millis(1000),
        "two idle interrupt-mode lcores used {spent:?} of CPU in 2 s"
    );
    eprintln!("idle 2 s: {spent:?} of CPU; ping: {}", rig.ping());
    let (j, kernel) = rig.stop();
    assert_counters_agree(&j, &kernel);
}

/// Bad TAP devargs: one sentence naming the port, exit code 2 (run in a namespace of the
/// test's, so an interface that should not have been made would be made there).
#[test]
fn bad_tap_devargs_are_one_sentence() {
    let ns = NetNs::new("tapbad");
    for (vdev, extra, needle) in [
        ("tap0,iface=sixteen-chars-xx", &[][..], "port 'tap0': bad value 'sixteen-chars-xx' for 'iface': an interface name is 1 to 15 bytes"),
        ("tap0,iface=a/b", &[], "port 'tap0': bad value 'a/b' for 'iface': an interface name has no '/'"),
        ("tap0,queues=17", &[], "port 'tap0': bad value '17' for 'queues': queue pairs, 1..=16"),
        ("tap0,mac=01:00:5e:00:00:01", &[], "port 'tap0': bad value '01:00:5e:00:00:01' for 'mac': an interface's address is unicast"),
        ("tap0,persist=maybe", &[], "port 'tap0': bad value 'maybe' for 'persist': expected yes or no"),
        ("tap0,remote=eth0", &[], "port 'tap0': unknown key 'remote' (known keys: iface, queues, mac, persist)"),
        ("tap0,iface=lo", &[], "port 'tap0': interface lo exists and is not a multi-queue TAP interface"),
        ("tap0,iface=t0", &["--rxq", "2", "--txq", "2"], "port 'tap0': --rxq=2 --txq=2 asks for more queues than the driver offers (1 rx, 1 tx)"),
    ] {
        let mut cmd = vec![common::bin(), "testpmd", "--duration", "0.1", "--vdev", vdev];
        cmd.extend_from_slice(extra);
        let out = Proc::spawn(ns.command(&cmd), Stdin::Null).wait(Duration::from_secs(60));
        common::assert_one_sentence(&out, vdev, needle);
    }
    // lo is as it was: up, and no TAP.
    let lo = ns.ip(&["-d", "link", "show", "dev", "lo"]);
    assert!(lo.contains("UP") && !lo.contains("tun"), "{lo}");
}
