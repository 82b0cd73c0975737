//! The pcap port and `--capture` in `memnic testpmd`, checked with Debian's `tcpdump -r` (CI
//! installs the `tcpdump` package): a replayed file forwarded into a pcap port comes out frame
//! for frame; a replay reaches a memif peer intact; live capture writes what the port counters
//! say; a capture that cannot keep up counts its misses while forwarding goes on.

mod common;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{json_of, Proc};
use memnic_ethdev::{Mbuf, Port};
use memnic_test_support::pcap::{tcpdump, verified_frames, write_pcap, DumpedFrame, PcapRecord};
use memnic_test_support::{pool, seed, TestDir};

/// Frames of the replay tests: lengths 60..=1518 and every 50th a 9000-byte jumbo (a chain of
/// mbufs in testpmd, several memif slots).
const N: u64 = 500;
const FLOW: u64 = 0x7063;

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A pcap file of `N` verified frames, 1 µs apart; returns the frames.
fn replay_file(path: &Path) -> Vec<Vec<u8>> {
    let frames = verified_frames(N, seed(), FLOW, 50, 9000);
    let records: Vec<PcapRecord> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| PcapRecord::frame(1_000_000_000 + i as u64 * 1000, f.clone()))
        .collect();
    write_pcap(path, &records);
    frames
}

fn n(port: &serde_json::Value, k: &str) -> u64 {
    port[k]
        .as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {port}"))
}

/// tcpdump read `dumped` as these frames, each cut at `snaplen`, stamped between `from` and
/// `to` (seconds since the epoch).
fn assert_dumped(dumped: &[DumpedFrame], frames: &[Vec<u8>], snaplen: usize, from: f64, to: f64) {
    assert_eq!(dumped.len(), frames.len(), "frames in the file");
    for (i, (d, f)) in dumped.iter().zip(frames).enumerate() {
        assert_eq!(
            d.wire_len,
            f.len(),
            "frame {i}: length on the wire ({})",
            d.line
        );
        assert_eq!(
            d.bytes,
            f[..f.len().min(snaplen)],
            "frame {i}: bytes ({})",
            d.line
        );
        assert!(
            d.ts >= from - 1.0 && d.ts <= to + 1.0,
            "frame {i}: timestamp {} outside the run {from}..{to}",
            d.ts
        );
    }
}

/// pcap0 replays a file through io mode into pcap1, which records it: tcpdump reads pcap1's
/// file frame for frame, byte for byte, stamped with the time of the run.
#[test]
fn poll_a_replay_forwarded_into_a_pcap_port_is_read_back_by_tcpdump_frame_for_frame() {
    let dir = TestDir::new("pcap-fwd");
    let (input, output) = (dir.join("in.pcap"), dir.join("out.pcap"));
    let frames = replay_file(&input);
    let rx = format!("pcap0,rx_pcap={}", input.display());
    let tx = format!("pcap1,tx_pcap={}", output.display());
    let from = now_secs();
    let mut p = common::interactive(&[
        "-a",
        "-l",
        "0",
        "--vdev",
        &rx,
        "--vdev",
        &tx,
        "--forward-mode",
        "io",
        "--json",
    ]);
    common::wait_for_stats(
        &mut p,
        &format!("TX-packets: {N} "),
        Duration::from_secs(60),
    );
    p.send("quit");
    let out = p.wait(Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let to = now_secs();
    let j = json_of(&out);
    let (p0, p1) = (&j["ports"][0], &j["ports"][1]);
    assert_eq!((n(p0, "rx_packets"), n(p1, "tx_packets")), (N, N), "{j}");
    assert_eq!(n(p1, "tx_dropped"), 0, "{j}");
    assert_dumped(&tcpdump(&output), &frames, usize::MAX, from, to);
}

/// The peer of the replay: an in-process memif client, connected before forwarding starts.
struct Peer {
    port: Box<dyn Port>,
    rxq: Box<dyn memnic_ethdev::RxQueue>,
    _pool: memnic_ethdev::Mempool,
}

impl Peer {
    fn connect(sock: &str, replayer: &mut Proc) -> Peer {
        let drivers = [memnic_memif::DRIVER];
        let mut port =
            memnic_ethdev::open_vdev(&drivers, &format!("memif0,role=client,socket={sock}"))
                .unwrap();
        let pool = pool("peer", 4096, 2048);
        let rxq = port.take_rx_queue(0, &pool).unwrap();
        let _txq = port.take_tx_queue(0, &pool).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !port.link().up {
            if Instant::now() > deadline {
                replayer.fail("the memif peer never connected");
            }
            port.service();
            std::thread::sleep(Duration::from_millis(1));
        }
        Peer {
            port,
            rxq,
            _pool: pool,
        }
    }

    /// Receives until `n` frames came (at most 60 s), then a while longer to see nothing more.
    fn receive(&mut self, n: usize) -> Vec<Vec<u8>> {
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut burst: Vec<Mbuf> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while got.len() < n && Instant::now() < deadline {
            self.port.service();
            self.rxq.rx_burst(&mut burst, 32);
            got.extend(burst.drain(..).map(|m| m.to_vec()));
        }
        for _ in 0..1000 {
            self.rxq.rx_burst(&mut burst, 32);
            got.extend(burst.drain(..).map(|m| m.to_vec()));
        }
        got
    }
}

/// testpmd replays `N` frames (pcap0 → io → memif0, a server) to an in-process memif client,
/// with `extra` flags; returns the frames sent, those received and testpmd's JSON.
fn replay_to_memif(
    dir: &TestDir,
    extra: &[&str],
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, serde_json::Value, f64, f64) {
    let input = dir.join("in.pcap");
    let frames = replay_file(&input);
    let sock = dir.join("memif.sock").display().to_string();
    let rx = format!("pcap0,rx_pcap={}", input.display());
    let server = format!("memif0,role=server,socket={sock}");
    let mut args = vec![
        "-l",
        "1",
        "--vdev",
        &rx,
        "--vdev",
        &server,
        "--forward-mode",
        "io",
        "--json",
    ];
    args.extend_from_slice(extra);
    let mut p = common::interactive(&args);
    common::wait_for_path(&sock, Duration::from_secs(30));
    let mut peer = Peer::connect(&sock, &mut p);
    // The server installed its queues before it answered the handshake, under the lock the
    // prompt takes: from `start` on, nothing is sent into a link that is down.
    let from = now_secs();
    p.send("start");
    let got = peer.receive(N as usize);
    p.send("quit");
    let out = p.wait(Duration::from_secs(30));
    let to = now_secs();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (frames, got, json_of(&out), from, to)
}

/// A replayed capture arrives at a memif peer intact, in order, none lost, none extra.
#[test]
fn poll_a_replayed_capture_reaches_a_memif_peer_intact_in_order() {
    let dir = TestDir::new("pcap-replay");
    let (sent, got, j, _, _) = replay_to_memif(&dir, &[]);
    assert_eq!(got.len(), sent.len(), "frames received: {j}");
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        let seq =
            memnic_test_support::check_flow(g, FLOW).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        assert_eq!(seq, i as u64, "frame {i} out of order");
        assert_eq!(g, s, "frame {i}: bytes");
    }
    let memif = &j["ports"][1];
    assert_eq!(
        (n(memif, "tx_packets"), n(memif, "tx_dropped")),
        (N, 0),
        "{j}"
    );
}

/// Live capture of a running testpmd: its pcapng files are read by tcpdump frame for frame and
/// agree with the port counters (captured + missed = frames in that direction).
#[test]
fn poll_live_capture_writes_what_the_port_counters_say() {
    let dir = TestDir::new("pcap-live");
    let (rx_cap, tx_cap) = (dir.join("rx.pcapng"), dir.join("tx.pcapng"));
    let rx_flag = format!("0:rx={},snaplen=64", rx_cap.display());
    let tx_flag = format!("1:tx={}", tx_cap.display());
    let (sent, got, j, from, to) =
        replay_to_memif(&dir, &["--capture", &rx_flag, "--capture", &tx_flag]);
    assert_eq!(got.len(), sent.len(), "{j}");
    let (pcap, memif) = (&j["ports"][0], &j["ports"][1]);
    // The default rings (thousands of slots) hold every frame of the run: none missed.
    assert_eq!(n(pcap, "rx_captured"), N, "{j}");
    assert_eq!(n(pcap, "rx_capture_missed"), 0, "{j}");
    assert_eq!(
        n(pcap, "rx_captured") + n(pcap, "rx_capture_missed"),
        n(pcap, "rx_packets")
    );
    assert_eq!(n(memif, "tx_captured"), N, "{j}");
    assert_eq!(
        n(memif, "tx_captured") + n(memif, "tx_capture_missed"),
        n(memif, "tx_packets")
    );
    assert!(
        pcap.get("tx_captured").is_none(),
        "tx of port 0 is not captured: {j}"
    );
    assert_dumped(&tcpdump(&rx_cap), &sent, 64, from, to);
    assert_dumped(&tcpdump(&tx_cap), &sent, usize::MAX, from, to);
}

/// A capture whose file is a pipe nobody reads: the writer blocks (once the pipe and its 1 MiB
/// buffer are full), the 64 slots run out, the frames past them are counted as missed, and
/// txonly goes on all the same. Once the pipe is
/// read, everything captured is in it, and tcpdump reads it.
#[test]
fn poll_a_capture_that_cannot_keep_up_counts_misses_and_forwarding_goes_on() {
    let dir = TestDir::new("pcap-slow");
    let fifo = dir.join("slow.pcapng");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo");
    // The reader opens the pipe (so testpmd's open does not wait) and reads only when told.
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::File::open(&fifo).unwrap();
            wait.recv().unwrap();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut bytes).unwrap();
            bytes
        })
    };
    let flag = format!("0:tx={},ring=64", fifo.display());
    let mut p = common::spawn(&[
        "testpmd",
        "-l",
        "0",
        "--vdev",
        "pcap0,tx_pcap=/dev/null",
        "--forward-mode",
        "txonly",
        "--verify",
        "--capture",
        &flag,
        "--duration",
        "1",
        "--json",
    ]);
    p.wait_for_output("Telling cores to stop", Duration::from_secs(60));
    go.send(()).unwrap();
    let out = p.wait(Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = reader.join().unwrap();
    let j = json_of(&out);
    let port = &j["ports"][0];
    let (sent, captured, missed) = (
        n(port, "tx_packets"),
        n(port, "tx_captured"),
        n(port, "tx_capture_missed"),
    );
    assert!(missed > 0, "a blocked writer missed nothing: {j}");
    assert_eq!(captured + missed, sent, "{j}");
    assert!(
        sent > 2 * captured,
        "forwarding waited for the capture: {j}"
    );
    let file = dir.join("read.pcapng");
    std::fs::write(&file, bytes).unwrap();
    let dumped = tcpdump(&file);
    assert_eq!(dumped.len() as u64, captured);
    // The captured frames are txonly's, whole, in the order sent (with gaps where missed).
    let mut last = None;
    for (i, d) in dumped.iter().enumerate() {
        let seq = memnic_test_support::check(&d.bytes).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        assert!(
            last.is_none_or(|l| seq > l),
            "frame {i}: seq {seq} after {last:?}"
        );
        last = Some(seq);
    }
}

/// Bad `--capture` values and pcap devargs: one sentence, exit code 2.
#[test]
fn poll_bad_capture_values_and_pcap_devargs_are_one_sentence() {
    let dir = TestDir::new("pcap-bad");
    let input = dir.join("in.pcap");
    write_pcap(&input, &[]);
    let rx = format!("pcap0,rx_pcap={}", input.display());
    let cap = |s: &str| dir.join(s).display().to_string();
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            vec!["--capture".into(), format!("1={}", cap("a"))],
            "--capture names port 1, but there are 1 port(s)".into(),
        ),
        (
            vec!["--capture".into(), format!("0:up={}", cap("a"))],
            "direction 'up' is not rx, tx or both".into(),
        ),
        (
            vec!["--capture".into(), "0".into()],
            "expected PORT[:rx|tx|both]=FILE".into(),
        ),
        (
            vec!["--capture".into(), format!("0={},snaplen=0", cap("a"))],
            "snaplen=0 is not a number within 1..=262144".into(),
        ),
        (
            vec![
                "--capture".into(),
                format!("0:rx={}", cap("a")),
                "--capture".into(),
                format!("0={}", cap("b")),
            ],
            "--capture: port 0 rx is captured twice".into(),
        ),
        (
            vec![
                "--capture".into(),
                format!("0:rx={}", cap("a")),
                "--capture".into(),
                format!("0:tx={}", cap("a")),
            ],
            "is named twice".into(),
        ),
        (
            vec!["--capture".into(), format!("0={}", cap("no/dir"))],
            "cannot create the file".into(),
        ),
    ];
    for (extra, needle) in cases {
        let mut args: Vec<String> = ["testpmd", "--duration", "0.1", "--vdev", &rx]
            .map(String::from)
            .to_vec();
        args.extend(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        one_sentence(&refs, &needle);
    }
    for (vdev, needle) in [
        (
            "pcap0".to_string(),
            "port 'pcap0': give rx_pcap=FILE".to_string(),
        ),
        (
            format!("pcap0,rx_pcap={}", cap("missing")),
            "port 'pcap0': cannot open rx_pcap file".into(),
        ),
        (
            format!("{rx},rx_pace=slow"),
            "bad value 'slow' for 'rx_pace'".into(),
        ),
    ] {
        one_sentence(&["testpmd", "--duration", "0.1", "--vdev", &vdev], &needle);
    }
}

fn one_sentence(args: &[&str], needle: &str) {
    let out = common::memnic(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: expected '{needle}' in: {err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one line: {err}");
    assert!(lines[0].starts_with("memnic: "), "{err}");
}
