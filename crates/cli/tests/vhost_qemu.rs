//! A real Linux guest as the frontend of our vhost-user backend: QEMU 7.2 (TCG) with Debian's
//! cloud kernel and its own virtio-net driver, two NICs on two of our vhost ports, our testpmd
//! forwarding between them in `io` mode. Inside the guest the second NIC sits in its own network
//! namespace, so every frame between the two addresses crosses our backend twice.
//!
//! The guest's frame counters (/proc/net/dev) must equal our port counters exactly: our testpmd
//! starts before QEMU, so it counts every frame of the guest's life; `ipv6.disable=1` keeps the
//! guest from sending anything but the test's traffic (ARP, ICMP, TCP), and the guest reads its
//! counters half a second after the traffic, when its tx completions are reaped.
//!
//! Two kinds of test restart the guest's side while our testpmd runs on: it reloads virtio_net
//! (the device is reset), or it reboots (QEMU resets the whole machine and boots the same
//! kernel and initramfs again); traffic must resume on the same two vhost ports.
//!
//! Needs `qemu-system-x86` and `busybox-static` (`.ci/run` installs them) and fetches the guest
//! kernel once with `apt-get download` (memnic-test-support's `guest` module).

mod common;

use std::time::{Duration, Instant};

use common::dpdk::Sock;
use common::{json_of, Proc};
use memnic_test_support::guest::{self, Image, Qemu};

/// The guest's NICs: A on our port 0, B (in the namespace) on our port 1.
const MAC_A: &str = "52:54:00:00:00:0a";
const MAC_B: &str = "52:54:00:00:00:0b";

/// Shell functions the test's `/init` scripts share, after the helper's prelude.
///
/// * `nic MAC`: the name of the interface with that address (in this namespace);
/// * `setup`: both NICs up, B moved into namespace `$NS` (a `sleep` started with `unshare -n`),
///   10.0.0.1 on A and 10.0.0.2 on B;
/// * `pings N`: N pings from A to B, `ok` when all N come back;
/// * `counters PHASE`: both NICs' frame counters from /proc/net/dev (per namespace: the /sys
///   mounted in the first namespace shows only its own devices), as one marker line.
const FUNCTIONS: &str = r#"
nic() {
    for d in /sys/class/net/*; do
        [ "$(cat $d/address)" = "$1" ] && { basename $d; return; }
    done
}
wait_nics() {
    for i in $(seq 100); do
        [ -n "$(nic $MAC_A)" ] && [ -n "$(nic $MAC_B)" ] && return 0
        sleep 0.1
    done
    result "GUEST-RESULT setup=fail (no NICs: $(ls /sys/class/net))"
}
setup() {
    wait_nics
    A=$(nic $MAC_A); B=$(nic $MAC_B)
    ip link set $B netns $NS || result "GUEST-RESULT setup=fail (netns)"
    ip addr add 10.0.0.1/24 dev $A
    ip link set $A up
    nsenter -t $NS -n ip addr add 10.0.0.2/24 dev $B
    nsenter -t $NS -n ip link set $B up
    echo "GUEST-SETUP a=$A b=$B"
}
pings() {
    out=$(ping -c $1 -i 0.2 -W 3 10.0.0.2 2>&1)
    echo "$out" | grep -q " $1 packets received" && echo ok || { echo "$out" >&2; echo fail; }
}
dev_stats() {
    # /proc/net/dev: "name: rx_bytes rx_packets ... (8 rx fields) tx_bytes tx_packets ..."
    awk -v d="$1:" '$1 == d { print "rx=" $3 " tx=" $11 }' /proc/net/dev
}
counters() {
    sleep 0.5
    a=$(dev_stats $A); b=$(nsenter -t $NS -n sh -c "cat /proc/net/dev" | awk -v d="$B:" '$1 == d { print "rx=" $3 " tx=" $11 }')
    echo "GUEST-COUNTERS phase=$1 a_$(echo $a | sed 's/ / a_/') b_$(echo $b | sed 's/ / b_/')"
}
"#;

/// The start of both tests' `/init`: modules, loopback, the namespace, both NICs set up.
fn init(body: &str) -> String {
    guest::init_script(&format!(
        "MAC_A={MAC_A}\nMAC_B={MAC_B}\n{FUNCTIONS}\nload_modules\nunshare -n sleep 600 &\nNS=$!\n\
         sleep 0.2\nsetup\n{body}"
    ))
}

/// Our testpmd on CPU 0: two vhost ports (server role) forwarded into each other in io mode.
struct Backend {
    me: Proc,
    socks: [Sock; 2],
}

impl Backend {
    fn start(tag: &str) -> Backend {
        Backend::start_with(tag, "")
    }

    /// With more devargs for both ports (`opts`, with a leading comma).
    fn start_with(tag: &str, opts: &str) -> Backend {
        let socks = [0, 1].map(|i| Sock::new(&format!("qemu-{tag}-{i}")));
        let v0 = format!("vhost0,iface={}{opts}", socks[0].0);
        let v1 = format!("vhost1,iface={}{opts}", socks[1].0);
        let me = common::spawn(&[
            "testpmd",
            "-l",
            "0",
            "--vdev",
            &v0,
            "--vdev",
            &v1,
            "--forward-mode",
            "io",
            "--json",
        ]);
        for s in &socks {
            common::wait_for_path(&s.0, Duration::from_secs(10));
        }
        Backend { me, socks }
    }

    /// Stops testpmd; its final statistics.
    fn stop(self) -> (serde_json::Value, String) {
        let Backend { me, socks } = self;
        me.interrupt();
        let out = me.wait(Duration::from_secs(20));
        drop(socks);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "our testpmd failed: {stderr}");
        (json_of(&out), stderr)
    }
}

/// The guest on CPU 1 with NIC A on `socks[0]` and NIC B on `socks[1]` (`nic`: more of their
/// virtio-net-pci properties), ready to spawn.
fn qemu(name: &str, socks: &[Sock; 2], init: &str, nic: &str) -> Qemu {
    let kernel = guest::kernel().unwrap_or_else(|e| panic!("{e}"));
    let image = Image::new(&kernel, init)
        .build(name)
        .unwrap_or_else(|e| panic!("{e}"));
    Qemu::new(&kernel, &image)
        .cpu(1)
        .append("ipv6.disable=1")
        .vhost_user_nic_with("0", &socks[0].0, MAC_A, nic)
        .vhost_user_nic_with("1", &socks[1].0, MAC_B, nic)
}

/// The `key=value` fields after `tag` on the guest's console.
fn fields(vm: &Proc, tag: &str) -> Vec<(String, String)> {
    let line = vm
        .line(tag)
        .unwrap_or_else(|| panic!("no {tag} line:\n{}", vm.output()));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn num(f: &[(String, String)], key: &str) -> u64 {
    f.iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key}= in {f:?}"))
}

fn text<'a>(f: &'a [(String, String)], key: &str) -> &'a str {
    f.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key}= in {f:?}"))
}

/// Waits for the line with `tag` on the guest's console; its fields.
fn await_fields(vm: &mut Proc, tag: &str, limit: Duration) -> Vec<(String, String)> {
    vm.wait_for_line(tag, limit);
    fields(vm, tag)
}

/// Waits for the verdict line (the guest powers off after it) and QEMU's exit.
fn verdict(mut vm: Proc, limit: Duration) -> (Vec<(String, String)>, String) {
    let f = await_fields(&mut vm, "GUEST-RESULT", limit);
    let console = vm.output();
    let _ = vm.wait(Duration::from_secs(10));
    (f, console)
}

/// Every frame the guest's NICs sent and received, phase by phase, against our port counters:
/// A's tx is our port 0's rx, B's rx is our port 1's tx, and the other way round.
fn assert_counters_agree(j: &serde_json::Value, phases: &[Vec<(String, String)>], said: &str) {
    let sum = |k: &str| phases.iter().map(|p| num(p, k)).sum::<u64>();
    let port = |i: usize, k: &str| {
        j["ports"][i][k]
            .as_u64()
            .unwrap_or_else(|| panic!("no {k} for port {i}: {j}"))
    };
    for (ours, theirs) in [
        ((0, "rx_packets"), "a_tx"),
        ((1, "tx_packets"), "b_rx"),
        ((1, "rx_packets"), "b_tx"),
        ((0, "tx_packets"), "a_rx"),
    ] {
        assert_eq!(
            port(ours.0, ours.1),
            sum(theirs),
            "our port {} {} against the guest's {theirs}: {said}",
            ours.0,
            ours.1
        );
    }
    // io mode: each port sent on, or dropped, everything the other received. A drop is a frame
    // the guest had no receive buffer for (its NIC's ring full: under TCG the guest refills it
    // late while a TCP burst arrives, and TCP sends the frame again), as io mode drops on any NIC.
    for (rx, tx) in [(0, 1), (1, 0)] {
        assert_eq!(
            port(rx, "rx_packets"),
            port(tx, "tx_packets") + port(tx, "tx_dropped"),
            "port {rx} received what port {tx} neither sent nor dropped: {said}"
        );
    }
    for i in 0..2 {
        for k in ["rx_errors", "tx_errors"] {
            assert_eq!(port(i, k), 0, "port {i} {k}: {said}");
        }
        for k in ["bad_chains", "broken_rings"] {
            let n = j["ports"][i]["xstats"][k].as_u64();
            assert_eq!(n, Some(0), "port {i} {k}: {said}");
        }
    }
}

/// Ping and a 1 MiB TCP stream (checked by size and md5sum) from the guest's first NIC to its
/// second, through our two ports; the guest's frame counters and ours agree exactly.
#[test]
fn poll_guest_pings_and_streams_tcp_through_our_ports() {
    ping_and_tcp("tcp", "");
}

/// The same over packed virtqueues (the guest's virtio_net on VIRTIO_F_RING_PACKED, with its
/// interrupts and event suppression).
#[test]
fn poll_guest_on_packed_rings_pings_and_streams_tcp_through_our_ports() {
    ping_and_tcp("tcppk", ",packed=on");
}

/// The same with a legacy virtio device (virtio 0.9.5: no VERSION_1, the 10-byte header
/// without mergeable buffers).
#[test]
fn poll_legacy_guest_pings_and_streams_tcp_through_our_ports() {
    ping_and_tcp("tcplegacy", ",disable-modern=on,mrg_rxbuf=off");
}

/// Five pings from A to B, then 1 MiB of random data over TCP from A to a listener on B: sets
/// `ping` and `tcp` (`ok` or `fail`), `size` (bytes received) and the md5sums `sent` and `got`.
const PING_AND_TCP: &str = r#"
ping=$(pings 5)
dd if=/dev/urandom of=/tmp/data bs=1024 count=1024 2>/dev/null
# The listener's stdin must stay open (a background job's is /dev/null, whose end of file
# would make nc close its sending half and the sender stop early): a fifo a sleep holds.
mkfifo /tmp/hold
sleep 600 > /tmp/hold &
nsenter -t $NS -n sh -c 'nc -l -p 5001 < /tmp/hold > /tmp/recv' &
L=$!
sleep 0.3
timeout 20 nc -w 5 10.0.0.2 5001 < /tmp/data
# The listener ends when the sender's data has all arrived; never wait for it long.
for i in $(seq 30); do kill -0 $L 2>/dev/null || break; sleep 0.1; done
kill $L 2>/dev/null
sent=$(md5sum < /tmp/data | cut -d' ' -f1); got=$(md5sum < /tmp/recv | cut -d' ' -f1)
size=$(wc -c < /tmp/recv)
tcp=fail; [ "$sent" = "$got" ] && [ "$size" = 1048576 ] && tcp=ok
"#;

/// What [`PING_AND_TCP`] must report, and the guest's counters of that phase must show.
fn assert_ping_and_tcp(res: &[(String, String)], phase: &[(String, String)], said: &str) {
    assert_eq!(text(res, "ping"), "ok", "{said}");
    assert_eq!(text(res, "tcp"), "ok", "{said}");
    assert_eq!(num(res, "size"), 1 << 20, "{said}");
    // 1 MiB in frames of at most 1514 bytes, one way, and its acks the other.
    assert!(num(phase, "a_tx") > 700, "{said}");
}

fn ping_and_tcp(tag: &str, nic: &str) {
    ping_and_tcp_with(tag, nic, "");
}

/// [`ping_and_tcp`] with more of our devargs (`ours`); returns our JSON report.
fn ping_and_tcp_with(tag: &str, nic: &str, ours: &str) -> serde_json::Value {
    let t0 = Instant::now();
    let be = Backend::start_with(tag, ours);
    let init = init(&format!(
        r#"{PING_AND_TCP}
counters 1
result "GUEST-RESULT ping=$ping tcp=$tcp size=$size sent=$sent got=$got"
"#
    ));
    let vm = qemu(&format!("vhost-{tag}"), &be.socks, &init, nic).spawn();
    let (res, console) = verdict(vm, Duration::from_secs(60));
    let phase1 = fields_of(&console, "GUEST-COUNTERS");
    let (j, stderr) = be.stop();
    let said = format!("{j}\n----- guest -----\n{console}\n----- ours -----\n{stderr}");
    assert_ping_and_tcp(&res, &phase1, &said);
    assert_counters_agree(&j, &[phase1], &said);
    eprintln!("guest: {}", console_line(&console, "GUEST-RESULT"));
    eprintln!("guest: {}", console_line(&console, "GUEST-COUNTERS"));
    eprintln!("ours: {}", ports_line(&j));
    eprintln!("took {:?}", t0.elapsed());
    j
}

/// The same with dequeue zero copy on both ports: the guest's tx buffers go up as segments,
/// are copied once into the other NIC's rx buffers, and their chains come back when that copy
/// frees them; the TCP stream's full-size frames go uncopied (split and packed rings).
#[test]
fn poll_guest_pings_and_streams_tcp_through_zero_copy_ports() {
    for (tag, nic) in [("tcpzc", ""), ("tcpzcpk", ",packed=on")] {
        let j = ping_and_tcp_with(tag, nic, ",dequeue-zero-copy=1");
        for p in 0..2 {
            let x = &j["ports"][p]["xstats"];
            assert_eq!(x["zero_copy_late"], 0, "{tag}: {j}");
            assert_eq!(x["zero_copy_abandoned"], 0, "{tag}: {j}");
        }
        let zc: u64 = (0..2)
            .map(|p| {
                j["ports"][p]["xstats"]["zero_copy_chains"]
                    .as_u64()
                    .unwrap()
            })
            .sum();
        assert!(
            zc > 600,
            "{tag}: the stream's frames went up uncopied ({zc}): {j}"
        );
    }
}

/// The guest unloads and reloads virtio_net (the device is reset, QEMU stops and restarts both
/// NICs' rings on our still-running ports): pings resume, and every frame of both lives of the
/// NICs is in our counters.
#[test]
fn poll_guest_reloads_virtio_net_and_traffic_resumes() {
    reload("reload", "");
}

/// The same on packed rings: QEMU stops them with GET_VRING_BASE and restarts them with
/// SET_VRING_BASE, both carrying wrap counters.
#[test]
fn poll_guest_on_packed_rings_reloads_virtio_net_and_traffic_resumes() {
    reload("reloadpk", ",packed=on");
}

fn reload(tag: &str, nic: &str) {
    reload_with(tag, nic, "");
}

/// The reload with every frame uncopied (zero copy, no threshold): QEMU's GET_VRING_BASEs wait
/// for the chains our io forwarding holds, and none is abandoned or completed late.
#[test]
fn poll_guest_reloads_virtio_net_with_zero_copy_and_traffic_resumes() {
    let j = reload_with(
        "reloadzc",
        "",
        ",dequeue-zero-copy=1,dequeue-zero-copy-min-len=0",
    );
    for p in 0..2 {
        let x = &j["ports"][p]["xstats"];
        assert!(x["zero_copy_chains"].as_u64().unwrap() > 0, "{j}");
        assert_eq!(x["zero_copy_late"], 0, "{j}");
        assert_eq!(x["zero_copy_abandoned"], 0, "{j}");
    }
}

/// [`reload`] with more of our devargs (`ours`); returns our JSON report.
fn reload_with(tag: &str, nic: &str, ours: &str) -> serde_json::Value {
    let t0 = Instant::now();
    let be = Backend::start_with(tag, ours);
    let init = init(
        r#"
before=$(pings 3)
counters 1
nsenter -t $NS -n ip link set $B down
ip link set $A down
rmmod virtio_net || result "GUEST-RESULT rmmod=fail"
[ -z "$(nic $MAC_A)" ] || result "GUEST-RESULT rmmod=fail (A still there)"
insmod /lib/modules/virtio_net.ko || result "GUEST-RESULT insmod=fail"
setup
after=$(pings 3)
counters 2
result "GUEST-RESULT before=$before after=$after"
"#,
    );
    let vm = qemu(&format!("vhost-{tag}"), &be.socks, &init, nic).spawn();
    let (res, console) = verdict(vm, Duration::from_secs(60));
    let phases = [1, 2].map(|p| fields_of_phase(&console, p));
    let (j, stderr) = be.stop();
    let said = format!("{j}\n----- guest -----\n{console}\n----- ours -----\n{stderr}");
    assert_eq!(text(&res, "before"), "ok", "{said}");
    assert_eq!(text(&res, "after"), "ok", "{said}");
    assert_counters_agree(&j, &phases, &said);
    eprintln!("guest: {}", console_line(&console, "GUEST-RESULT"));
    for p in [1, 2] {
        eprintln!("guest: {}", console_line(&console, &format!("phase={p}")));
    }
    eprintln!("ours: {}", ports_line(&j));
    eprintln!("took {:?}", t0.elapsed());
    j
}

/// The guest reboots (`reboot -f`: QEMU resets the machine, which stops both NICs' rings on our
/// still-running ports and, once the new guest's virtio_net sets them up again, restarts
/// them) and boots the same kernel and initramfs again: ping and TCP pass in both boots, and
/// every frame of both boots is in our counters.
#[test]
fn poll_guest_reboots_and_traffic_resumes() {
    reboot("reboot", "");
}

/// The same on packed rings.
#[test]
fn poll_guest_on_packed_rings_reboots_and_traffic_resumes() {
    reboot("rebootpk", ",packed=on");
}

fn reboot(tag: &str, nic: &str) {
    let t0 = Instant::now();
    let be = Backend::start(tag);
    // Which boot is this? The guest keeps nothing across the reset, and all QEMU hands it
    // (kernel, initramfs, command line, fw_cfg) is the same both times; a disk to remember it
    // on would need virtio_blk and an image. So each boot asks on its console (`ask`), and the
    // test answers each new question with the boot's number: the guest asks only once it is
    // reading its console, and the test writes nothing before the question, so no answer can
    // be lost in the reset or read by the wrong boot.
    let init = init(&format!(
        r#"ask GUEST-BOOT
boot=$ANSWER
{PING_AND_TCP}
counters $boot
line="GUEST-RESULT boot=$boot ping=$ping tcp=$tcp size=$size sent=$sent got=$got"
[ "$boot" = 1 ] && restart "$line"
result "$line"
"#
    ));
    let mut vm = qemu(&format!("vhost-{tag}"), &be.socks, &init, nic)
        .allow_reboot()
        .console_input()
        .spawn();
    let mut results = Vec::new();
    let mut times = Vec::new();
    for boot in 1..=2 {
        let t = Instant::now();
        vm.wait_for_lines("GUEST-BOOT", boot, Duration::from_secs(60));
        let booted = t.elapsed();
        vm.send(&boot.to_string());
        let tag = format!("GUEST-RESULT boot={boot}");
        results.push(await_fields(&mut vm, &tag, Duration::from_secs(60)));
        times.push((booted, t.elapsed()));
    }
    let console = vm.output();
    let _ = vm.wait(Duration::from_secs(10));
    let phases = [1, 2].map(|p| fields_of_phase(&console, p));
    let (j, stderr) = be.stop();
    let said = format!("{j}\n----- guest -----\n{console}\n----- ours -----\n{stderr}");
    for (res, phase) in results.iter().zip(&phases) {
        assert_ping_and_tcp(res, phase, &said);
    }
    assert_counters_agree(&j, &phases, &said);
    for (boot, (booted, done)) in (1..=2).zip(&times) {
        eprintln!("boot {boot}: up and set up after {booted:?}, verdict after {done:?}");
        eprintln!(
            "guest: {}",
            console_line(&console, &format!("GUEST-RESULT boot={boot}"))
        );
        eprintln!(
            "guest: {}",
            console_line(&console, &format!("phase={boot}"))
        );
    }
    eprintln!("ours: {}", ports_line(&j));
    eprintln!("took {:?}", t0.elapsed());
}

fn console_line<'a>(console: &'a str, tag: &str) -> &'a str {
    console
        .lines()
        .find(|l| l.contains(tag))
        .map_or("", |l| l.trim())
}

fn fields_of(console: &str, tag: &str) -> Vec<(String, String)> {
    let l = console_line(console, tag);
    assert!(!l.is_empty(), "no {tag} line:\n{console}");
    l.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn fields_of_phase(console: &str, phase: u32) -> Vec<(String, String)> {
    let tag = format!("GUEST-COUNTERS phase={phase}");
    fields_of(console, &tag)
}

fn ports_line(j: &serde_json::Value) -> String {
    (0..2)
        .map(|i| {
            let p = &j["ports"][i];
            format!(
                "port {i} rx={} tx={} tx_dropped={}",
                p["rx_packets"], p["tx_packets"], p["tx_dropped"]
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
