//! The pcap port through the burst API: replay (whole, chained, forever, at the recorded pace,
//! through an empty pool), hostile records, recording, and the one-sentence errors.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use memnic_ethdev::{Devargs, Mbuf, Port, QueueStats, RxQueue};
use memnic_pcap::{DEVARGS_KEYS, DRIVER};
use memnic_test_support::pcap::{
    pcap_header, record_bytes, verified_frames, write_pcap, PcapRecord,
};
use memnic_test_support::{pool, seed, TestDir};

fn open(devargs: &str) -> memnic_pcap::PcapPort {
    memnic_pcap::open(&Devargs::parse(devargs, DEVARGS_KEYS).unwrap()).unwrap()
}

/// The error sentence of opening `devargs` as testpmd would.
fn open_error(devargs: &str) -> String {
    match memnic_ethdev::open_vdev(&[DRIVER], devargs) {
        Ok(_) => panic!("{devargs} opened"),
        Err(e) => e,
    }
}

fn xstat(port: &dyn Port, name: &str) -> u64 {
    port.xstats()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no xstat {name}"))
        .1
}

/// Bursts until `n` frames came or nothing came `idle` times in a row.
fn receive(rxq: &mut dyn RxQueue, n: usize) -> Vec<Mbuf> {
    let mut got = Vec::new();
    let mut idle = 0;
    while got.len() < n && idle < 8 {
        let want = (n - got.len()).min(32);
        if rxq.rx_burst(&mut got, want) == 0 {
            idle += 1;
        } else {
            idle = 0;
        }
    }
    got
}

fn records(frames: &[Vec<u8>]) -> Vec<PcapRecord> {
    frames
        .iter()
        .enumerate()
        .map(|(i, f)| PcapRecord::frame(1_700_000_000_000_000_000 + i as u64 * 1000, f.clone()))
        .collect()
}

fn path_arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn replays_every_record_intact_and_chains_frames_longer_than_a_buffer() {
    let dir = TestDir::new("pcap-replay");
    let file = dir.join("in.pcap");
    let frames = verified_frames(300, seed(), 7, 25, 9000);
    write_pcap(&file, &records(&frames));
    let mut port = open(&format!("pcap0,rx_pcap={}", path_arg(&file)));
    let pool = pool("replay", 1024, 2048);
    let mut rxq = port.take_rx_queue(0, &pool).unwrap();
    let got = receive(&mut *rxq, 1000);
    assert_eq!(got.len(), frames.len(), "every record, once");
    for (i, (m, f)) in got.iter().zip(&frames).enumerate() {
        assert_eq!(&m.to_vec(), f, "frame {i}");
        let segs = f.len().div_ceil(2048);
        assert_eq!(m.nb_segs(), segs, "frame {i} of {} bytes", f.len());
    }
    // The file is over: the port just has nothing more.
    drop(got);
    let mut more = Vec::new();
    for _ in 0..10 {
        assert_eq!(rxq.rx_burst(&mut more, 32), 0);
    }
    let bytes: u64 = frames.iter().map(|f| f.len() as u64).sum();
    let (rx, _) = port.queue_stats();
    assert_eq!(
        rx[0],
        QueueStats {
            packets: 300,
            bytes,
            ..Default::default()
        }
    );
    assert_eq!(xstat(&port, "rx_file_passes"), 1);
}

#[test]
fn hostile_records_are_skipped_or_delivered_as_captured_and_counted() {
    let dir = TestDir::new("pcap-hostile");
    let file = dir.join("hostile.pcap");
    let good = verified_frames(3, 1, 1, 0, 0);
    let cut = PcapRecord {
        ts_ns: 2,
        orig_len: 1500,
        data: good[1][..60].to_vec(),
    };
    let oversize = PcapRecord::frame(3, vec![0xab; 20_000]);
    let empty = PcapRecord::frame(4, Vec::new());
    let longer_than_wire = PcapRecord {
        ts_ns: 5,
        orig_len: 10,
        data: vec![1; 100],
    };
    let mut bytes = pcap_header(true, 65535, 1);
    for r in [
        &PcapRecord::frame(1, good[0].clone()),
        &cut,
        &oversize,
        &empty,
        &longer_than_wire,
        &PcapRecord::frame(6, good[2].clone()),
    ] {
        bytes.extend_from_slice(&record_bytes(true, r));
    }
    // A last record cut off by the end of the file.
    let tail = record_bytes(true, &PcapRecord::frame(7, good[0].clone()));
    bytes.extend_from_slice(&tail[..tail.len() - 5]);
    std::fs::write(&file, bytes).unwrap();

    let mut port = open(&format!("pcap0,rx_pcap={}", path_arg(&file)));
    let pool = pool("hostile", 64, 2048);
    let mut rxq = port.take_rx_queue(0, &pool).unwrap();
    let got: Vec<Vec<u8>> = receive(&mut *rxq, 100).iter().map(Mbuf::to_vec).collect();
    assert_eq!(got, [good[0].clone(), cut.data.clone(), good[2].clone()]);
    let (rx, _) = port.queue_stats();
    assert_eq!((rx[0].packets, rx[0].drops, rx[0].errors), (3, 1, 3));
    assert_eq!(xstat(&port, "rx_truncated_records"), 1);
    assert_eq!(xstat(&port, "rx_oversize_records"), 1);
    assert_eq!(xstat(&port, "rx_malformed_records"), 3);
}

#[test]
fn a_record_longer_than_any_capture_ends_the_file_there() {
    let dir = TestDir::new("pcap-garbage");
    let frames = verified_frames(2, 2, 2, 0, 0);
    for nanos in [true, false] {
        let file = dir.join(&format!("garbage-{nanos}.pcap"));
        let mut bytes = pcap_header(nanos, 65535, 1);
        bytes.extend_from_slice(&record_bytes(
            nanos,
            &PcapRecord::frame(1, frames[0].clone()),
        ));
        // A header saying 2 GiB follow, then what would be a good record.
        let mut garbage = record_bytes(nanos, &PcapRecord::frame(2, Vec::new()));
        garbage[8..12].copy_from_slice(&0x8000_0000u32.to_le_bytes());
        garbage[12..16].copy_from_slice(&0x8000_0000u32.to_le_bytes());
        bytes.extend_from_slice(&garbage);
        bytes.extend_from_slice(&record_bytes(
            nanos,
            &PcapRecord::frame(3, frames[1].clone()),
        ));
        std::fs::write(&file, bytes).unwrap();
        let mut port = open(&format!("pcap0,rx_pcap={},infinite_rx=1", path_arg(&file)));
        let pool = pool("garbage", 64, 2048);
        let mut rxq = port.take_rx_queue(0, &pool).unwrap();
        let got = receive(&mut *rxq, 100);
        assert_eq!(got.len(), 1, "only the record before the garbage");
        assert_eq!(got[0].to_vec(), frames[0]);
        assert_eq!(port.queue_stats().0[0].errors, 1);
    }
}

#[test]
fn infinite_rx_replays_the_file_forever_whether_or_not_it_fits_the_buffer() {
    let dir = TestDir::new("pcap-loop");
    // 3 frames stay in the read buffer; 1200 of ~1500 bytes (1.8 MB) are read again each pass.
    for (n, len) in [(3u64, 0usize), (1200, 1500)] {
        let file = dir.join(&format!("loop-{n}.pcap"));
        let frames = verified_frames(n, 3, 3, if len > 0 { 1 } else { 0 }, len);
        write_pcap(&file, &records(&frames));
        let mut port = open(&format!("pcap0,rx_pcap={},infinite_rx=1", path_arg(&file)));
        let pool = pool("loop", 4096, 2048);
        let mut rxq = port.take_rx_queue(0, &pool).unwrap();
        let want = (n * 5 / 2) as usize;
        let mut got = 0;
        while got < want {
            let mut burst = Vec::new();
            let k = rxq.rx_burst(&mut burst, 32);
            assert!(k > 0, "a file replayed forever ran dry after {got} frames");
            for m in &burst {
                let expect = &frames[got % n as usize];
                assert_eq!(&m.to_vec(), expect, "frame {got} (n={n})");
                got += 1;
            }
        }
        assert!(xstat(&port, "rx_file_passes") >= 2, "n={n}");
    }
}

#[test]
fn infinite_rx_of_a_file_without_records_has_nothing_and_does_not_spin() {
    let dir = TestDir::new("pcap-empty");
    let file = dir.join("empty.pcap");
    write_pcap(&file, &[]);
    let mut port = open(&format!("pcap0,rx_pcap={},infinite_rx=1", path_arg(&file)));
    let pool = pool("empty", 64, 2048);
    let mut rxq = port.take_rx_queue(0, &pool).unwrap();
    let mut v = Vec::new();
    for _ in 0..100 {
        assert_eq!(rxq.rx_burst(&mut v, 32), 0);
    }
    assert_eq!(xstat(&port, "rx_file_passes"), 1, "one pass, then nothing");
}

#[test]
fn recorded_pace_holds_each_record_until_its_time() {
    let dir = TestDir::new("pcap-pace");
    let file = dir.join("paced.pcap");
    let frames = verified_frames(3, 4, 4, 0, 0);
    let t0 = 1_600_000_000_000_000_000u64;
    let ms = 1_000_000u64;
    let hour = 3600 * 1000 * ms;
    write_pcap(
        &file,
        &[
            PcapRecord::frame(t0, frames[0].clone()),
            PcapRecord::frame(t0 + 20 * ms, frames[1].clone()),
            PcapRecord::frame(t0 + hour, frames[2].clone()),
        ],
    );
    let pool = pool("pace", 64, 2048);
    // At full speed (the default) all three come at once.
    let mut port = open(&format!("pcap0,rx_pcap={}", path_arg(&file)));
    let mut rxq = port.take_rx_queue(0, &pool).unwrap();
    let mut v = Vec::new();
    assert_eq!(rxq.rx_burst(&mut v, 32), 3);
    v.clear();

    let mut port = open(&format!(
        "pcap0,rx_pcap={},rx_pace=recorded",
        path_arg(&file)
    ));
    let mut rxq = port.take_rx_queue(0, &pool).unwrap();
    let start = Instant::now();
    assert_eq!(rxq.rx_burst(&mut v, 32), 1, "the first record goes at once");
    let second = loop {
        if rxq.rx_burst(&mut v, 32) > 0 {
            break start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no second frame");
        std::thread::yield_now();
    };
    assert!(
        second >= Duration::from_millis(20),
        "the second came after {second:?}"
    );
    assert_eq!(v.len(), 2);
    // The third is due in an hour.
    for _ in 0..1000 {
        assert_eq!(rxq.rx_burst(&mut v, 32), 0);
    }
    let got: Vec<Vec<u8>> = v.iter().map(Mbuf::to_vec).collect();
    assert_eq!(got, frames[..2]);
}

#[test]
fn an_empty_pool_keeps_the_record_for_the_next_burst() {
    let dir = TestDir::new("pcap-nombuf");
    let file = dir.join("in.pcap");
    let frames = verified_frames(6, 5, 5, 3, 3000);
    write_pcap(&file, &records(&frames));
    let mut port = open(&format!("pcap0,rx_pcap={}", path_arg(&file)));
    let pool = pool("nombuf", 5, 2048);
    let mut rxq = port.take_rx_queue(0, &pool).unwrap();
    let mut got = Vec::new();
    let mut v = Vec::new();
    for _ in 0..20 {
        rxq.rx_burst(&mut v, 32);
        got.extend(v.iter().map(Mbuf::to_vec));
        v.clear(); // the buffers go home
    }
    assert_eq!(got, frames, "in order, none lost to the empty pool");
    assert!(port.queue_stats().0[0].nombuf > 0);
}

#[test]
fn tx_records_every_frame_with_the_wall_clock_and_flushes_when_dropped() {
    let dir = TestDir::new("pcap-tx");
    let file = dir.join("out.pcap");
    let mut port = open(&format!("pcap1,tx_pcap={}", path_arg(&file)));
    let small = pool("tx-small", 256, 512);
    let shared = memnic_test_support::shared_pool("tx-shared", 64, 2048);
    let mut txq = port.take_tx_queue(0, &small).unwrap();
    let frames = verified_frames(40, 6, 6, 4, 1800);
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let (mut sc, mut hc) = (small.cache(), shared.cache());
    let mut burst: Vec<Mbuf> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| {
            // Chains of 512-byte buffers, and single buffers of a pool a peer could map.
            let cache = if i % 2 == 0 { &mut sc } else { &mut hc };
            let mut m = memnic_test_support::frame_packet(cache, i as u64, 6, f.len());
            assert!(m.copy_in(0, f));
            m
        })
        .collect();
    assert!(burst.iter().any(|m| m.nb_segs() > 1));
    assert_eq!(txq.tx_burst(&mut burst), 40);
    assert!(burst.is_empty());
    let (_, tx) = port.queue_stats();
    assert_eq!(tx[0].packets, 40);
    drop(txq);
    let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();

    let mut r = pcap_file::pcap::PcapReader::new(std::fs::File::open(&file).unwrap()).unwrap();
    let h = r.header();
    assert_eq!(h.ts_resolution, pcap_file::TsResolution::NanoSecond);
    assert_eq!(h.datalink, pcap_file::DataLink::ETHERNET);
    let mut n = 0;
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        assert_eq!(&p.data[..], &frames[n][..], "record {n}");
        assert_eq!(p.orig_len as usize, frames[n].len());
        assert!(
            p.timestamp >= before && p.timestamp <= after,
            "record {n}: wall clock"
        );
        n += 1;
    }
    assert_eq!(n, 40);
}

#[test]
fn an_rx_only_port_drops_what_it_is_sent_and_a_tx_only_port_receives_nothing() {
    let dir = TestDir::new("pcap-halves");
    let file = dir.join("in.pcap");
    write_pcap(&file, &records(&verified_frames(4, 7, 7, 0, 0)));
    let pool = pool("halves", 64, 2048);
    let mut rx_only = open(&format!("pcap0,rx_pcap={}", path_arg(&file)));
    let mut txq = rx_only.take_tx_queue(0, &pool).unwrap();
    let mut burst: Vec<Mbuf> = (0..5).map(|_| pool.alloc().unwrap()).collect();
    assert_eq!(txq.tx_burst(&mut burst), 5, "taken (and dropped)");
    let (_, tx) = rx_only.queue_stats();
    assert_eq!((tx[0].packets, tx[0].drops), (0, 5));

    let mut tx_only = open(&format!(
        "pcap1,tx_pcap={}",
        path_arg(&dir.join("out.pcap"))
    ));
    let mut rxq = tx_only.take_rx_queue(0, &pool).unwrap();
    let mut v = Vec::new();
    assert_eq!(rxq.rx_burst(&mut v, 32), 0);
}

#[test]
fn bad_devargs_and_bad_files_are_one_sentence_naming_the_port() {
    let dir = TestDir::new("pcap-bad");
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    std::fs::write(p("short"), [0xd4, 0xc3, 0xb2]).unwrap();
    std::fs::write(p("text"), "this is not a capture file at all").unwrap();
    let mut ng = vec![0x0a, 0x0d, 0x0d, 0x0a];
    ng.extend_from_slice(&[0; 40]);
    std::fs::write(p("ng"), ng).unwrap();
    std::fs::write(p("raw-ip"), pcap_header(false, 65535, 101)).unwrap();
    write_pcap(&dir.join("ok.pcap"), &[]);
    let ok = p("ok.pcap");
    let cases = [
        ("pcap0".to_string(), "give rx_pcap=FILE"),
        (
            format!("pcap0,rx_pcap={}", p("missing")),
            "cannot open rx_pcap file",
        ),
        (
            format!("pcap0,rx_pcap={}", dir.path().display()),
            "cannot read rx_pcap file",
        ),
        (
            format!("pcap0,rx_pcap={}", p("short")),
            "fewer than a pcap header's 24",
        ),
        (
            format!("pcap0,rx_pcap={}", p("text")),
            "is not a pcap file: its magic number is 74686973",
        ),
        (format!("pcap0,rx_pcap={}", p("ng")), "is pcapng"),
        (
            format!("pcap0,rx_pcap={}", p("raw-ip")),
            "holds link type 101",
        ),
        (
            format!("pcap0,rx_pcap={ok},infinite_rx=maybe"),
            "bad value 'maybe' for 'infinite_rx'",
        ),
        (
            format!("pcap0,rx_pcap={ok},rx_pace=slow"),
            "expected one of full, recorded",
        ),
        (
            format!("pcap0,tx_pcap={},rx_pace=recorded", p("o")),
            "rx_pace needs rx_pcap",
        ),
        (
            format!("pcap0,tx_pcap={},infinite_rx=1", p("o")),
            "infinite_rx needs rx_pcap",
        ),
        (
            format!("pcap0,rx_pcap={ok},tx_pcap={ok}"),
            "is the rx_pcap file",
        ),
        (
            format!("pcap0,tx_pcap={}", p("nodir/out.pcap")),
            "cannot create tx_pcap file",
        ),
        ("pcap0,rx_pcap=".to_string(), "expected a file name"),
        (
            format!("pcap0,rx_iface=eth0,rx_pcap={ok}"),
            "unknown key 'rx_iface'",
        ),
    ];
    for (devargs, want) in cases {
        let e = open_error(&devargs);
        assert!(e.starts_with("port 'pcap0': "), "{devargs}: {e}");
        assert!(e.contains(want), "{devargs}: '{e}' does not say '{want}'");
        assert!(!e.contains('\n'), "{devargs}: one line: {e}");
    }
    // The replayed file is left alone by the refused tx file.
    assert_eq!(std::fs::metadata(&ok).unwrap().len(), 24);
}
