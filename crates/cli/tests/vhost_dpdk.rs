//! Interop with DPDK's virtio-user (Debian's dpdk-testpmd 22.11, `net_virtio_user`) as the
//! frontend of our vhost-user backend: both directions at 64, 1518 and 9000 bytes (mergeable
//! buffers), split and packed rings, with DPDK's in-order and mergeable-buffer paths on and
//! off, our backend as the socket's server and as its client, and verified round trips
//! through DPDK's macswap.
//!
//! `.ci/run` installs DPDK; without `dpdk-testpmd` these tests fail (set MEMNIC_SKIP_DPDK=1 to
//! skip them on a machine without DPDK).

mod common;

use std::time::Duration;

use common::dpdk::{
    dpdk, dpdk_forwarding, dpdk_totals, have_dpdk, n, ours_while_dpdk_forwards, stop_dpdk, Sock,
};
use common::{json_of, Proc};

/// DPDK's testpmd on CPU 0 as virtio-user on `sock` (`opts`: more of its devargs, each with a
/// leading comma), forwarding in `mode`. `--no-flush-rx`: testpmd otherwise drops what is in
/// its rx rings when forwarding starts, which is what our side sent as soon as the rings ran.
fn virtio_user(tag: &str, sock: &str, opts: &str, mode: &str) -> Proc {
    dpdk(
        tag,
        0,
        &format!("net_virtio_user0,path={sock},queues=1{opts}"),
        mode,
        &["--single-file-segments"],
        &["--no-flush-rx"],
    )
}

/// Our testpmd on CPU 1 with one vhost port, until interrupted.
fn ours(dev: &str, mode: &str, size: usize) -> Proc {
    let size = size.to_string();
    let args = ["--txpkts", &size, "--mbuf-size", "10240", "--json"];
    common::testpmd(1, dev, mode, &args)
}

/// Frames from DPDK's txonly, received whole and counted by our rxonly; with `rx-flush` on,
/// off and auto, the port's `rx_flushed_packets` says how many were flushed once copied.
#[test]
fn poll_virtio_user_sends_to_our_backend() {
    if !have_dpdk() {
        return;
    }
    for (size, opts, flush) in [
        (64, "", "on"),
        (1518, "", "auto"),
        (64, ",in_order=0,mrg_rxbuf=0", "off"),
        (64, ",packed_vq=1", "auto"),
        (1518, ",packed_vq=1,in_order=0,mrg_rxbuf=0", "on"),
    ] {
        let sock = Sock::new(&format!("vu-tx-{size}"));
        let dev = format!("vhost0,iface={},rx-flush={flush}", sock.0);
        let me = ours(&dev, "rxonly", size);
        common::wait_for_path(&sock.0, Duration::from_secs(10));
        let txp = format!("--txpkts={size}");
        let mut peer = dpdk(
            "vutx",
            0,
            &format!("net_virtio_user0,path={},queues=1{opts}", sock.0),
            "txonly",
            &["--single-file-segments"],
            &[&txp],
        );
        let j = json_of(&ours_while_dpdk_forwards(me, &mut peer, 5));
        let d = stop_dpdk(peer);
        let (_, dtx) = dpdk_totals(&d);
        let rx = n(&j, "rx_packets");
        assert!(rx > 100_000, "{size}{opts}: {j}");
        // (DPDK prints its counters every 2 s, so its last figure lags ours.)
        assert!(dtx > 0, "{size}{opts}: DPDK printed no tx counters");
        assert_eq!(n(&j, "rx_errors"), 0, "{size}{opts}: {j}");
        assert_eq!(n(&j, "rx_bytes"), rx * size as u64, "{size}{opts}: {j}");
        let flushed = j["ports"][0]["xstats"]["rx_flushed_packets"].as_u64();
        match flush {
            "on" => assert_eq!(flushed, Some(rx), "{size}{opts}: {j}"),
            "off" => assert_eq!(flushed, Some(0), "{size}{opts}: {j}"),
            _ => assert!(flushed.is_some_and(|f| f <= rx), "{size}{opts}: {j}"),
        }
    }
}

/// Our txonly into DPDK's rxonly: its in-order and mergeable paths on and off, and 9000-byte
/// frames spread over mergeable buffers.
#[test]
fn poll_our_backend_sends_to_virtio_user() {
    if !have_dpdk() {
        return;
    }
    for (size, opts) in [
        (64, ""),
        (1518, ""),
        (1518, ",in_order=0,mrg_rxbuf=0"),
        (9000, ",mrg_rxbuf=1"),
        (64, ",packed_vq=1"),
        (1518, ",packed_vq=1,mrg_rxbuf=0"),
        (9000, ",packed_vq=1,mrg_rxbuf=1"),
    ] {
        let sock = Sock::new(&format!("vu-rx-{size}"));
        let me = ours(&format!("vhost0,iface={}", sock.0), "txonly", size);
        common::wait_for_path(&sock.0, Duration::from_secs(10));
        let mut peer = virtio_user("vurx", &sock.0, opts, "rxonly");
        let j = json_of(&ours_while_dpdk_forwards(me, &mut peer, 5));
        std::thread::sleep(Duration::from_millis(200));
        let d = stop_dpdk(peer);
        let (drx, _) = dpdk_totals(&d);
        let tx = n(&j, "tx_packets");
        assert!(tx > 10_000, "{size}{opts}: {j}");
        assert!(
            drx > 0 && drx <= tx,
            "{size}{opts}: DPDK got {drx}, we sent {tx}"
        );
        assert_eq!(n(&j, "tx_errors"), 0, "{size}{opts}: {j}");
    }
}

/// Our verified frames through DPDK's macswap and back: nothing lost, corrupted, duplicated
/// or reordered, with a window below what DPDK's rings hold.
fn round_trip(tag: &str, size: usize, opts: &str, window: &str, client: bool) {
    round_trip_with(tag, size, opts, window, client, "");
}

/// Our testpmd on CPU 1 with one vhost port, at its prompt: verified txonly that starts when
/// told ([`start_after_dpdk`]).
fn ours_at_prompt(dev: &str, size: usize, window: &str) -> Proc {
    let size = size.to_string();
    common::interactive(&[
        "-l",
        "1",
        "--vdev",
        dev,
        "--forward-mode",
        "txonly",
        "--txpkts",
        &size,
        "--mbuf-size",
        "10240",
        "--json",
        "--verify",
        "--window",
        window,
    ])
}

/// Starts our forwarding once DPDK's is running, runs it for `secs` and quits.
///
/// Not sooner: virtio-user says DRIVER_OK while its port is probed, so our link is up (and
/// a txonly would send) before the port starts; `virtio_dev_start` then fills the rx ring
/// and flushes what is already used in it, and frames we placed between the two are gone
/// without a count on either side. A NIC's peer loses frames sent before the port started
/// too; the verifier would call them lost.
fn start_after_dpdk(me: &mut Proc, peer: &mut Proc, secs: u64) {
    dpdk_forwarding(peer);
    me.send("start");
    std::thread::sleep(Duration::from_secs(secs));
    me.send("stop");
    me.send("quit");
}

/// [`round_trip`] with more of our devargs (`ours`, each with a leading comma); returns our
/// JSON report.
fn round_trip_with(
    tag: &str,
    size: usize,
    opts: &str,
    window: &str,
    client: bool,
    ours_opts: &str,
) -> Option<serde_json::Value> {
    if !have_dpdk() {
        return None;
    }
    let sock = Sock::new(tag);
    let (mut me, mut peer) = if client {
        // virtio-user is the socket's server (`server=1`): it waits for us before it starts.
        let peer = virtio_user(tag, &sock.0, &format!("{opts},server=1"), "macswap");
        common::wait_for_path(&sock.0, Duration::from_secs(30));
        let dev = format!("vhost0,iface={},client=1{ours_opts}", sock.0);
        (ours_at_prompt(&dev, size, window), peer)
    } else {
        let dev = format!("vhost0,iface={}{ours_opts}", sock.0);
        let me = ours_at_prompt(&dev, size, window);
        common::wait_for_path(&sock.0, Duration::from_secs(10));
        (me, virtio_user(tag, &sock.0, opts, "macswap"))
    };
    start_after_dpdk(&mut me, &mut peer, 4);
    let out = me.wait(Duration::from_secs(60));
    let d = stop_dpdk(peer);
    let j = json_of(&out);
    let said = format!(
        "{j}\n----- ours (stderr) -----\n{}----- DPDK -----\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&d.stdout)
    );
    assert!(n(&j, "good") > 10_000, "{said}");
    common::assert_verified_clean(&j["ports"][0], &said);
    for k in ["rx_errors", "tx_errors"] {
        assert_eq!(n(&j, k), 0, "{k}: {said}");
    }
    Some(j)
}

/// Split rings; the 64-B frames written into the guest's buffers with streaming stores
/// (`tx-stream=on`) and with plain ones (`off`).
#[test]
fn poll_round_trip_through_virtio_user_macswap_is_clean() {
    streamed_and_plain_round_trips(
        [("vumac64", "on", false), ("vumac64plain", "off", false)],
        "",
    );
    round_trip("vumac1518", 1518, "", "256", false);
}

/// 64-B round trips (`opts` for virtio-user) with our enqueue's streaming fixed by `tx-stream`
/// (`on` or `off`, our backend the socket's client or not): streamed, almost every frame is
/// (`tx_streamed_packets`); plain, none.
fn streamed_and_plain_round_trips(runs: [(&str, &str, bool); 2], opts: &str) {
    for (tag, stream, client) in runs {
        let ours_opts = format!(",tx-stream={stream}");
        let Some(j) = round_trip_with(tag, 64, opts, "256", client, &ours_opts) else {
            return;
        };
        let streamed = j["ports"][0]["xstats"]["tx_streamed_packets"].as_u64();
        let sent = n(&j, "tx_packets");
        if stream == "on" {
            // Every frame a batch places is streamed; one the one-frame path writes (a chain
            // the guest posted just after a batch found the ring empty) is not.
            let streamed = streamed.expect("tx_streamed_packets");
            assert!(streamed <= sent && streamed * 10 >= sent * 9, "{tag}: {j}");
        } else {
            assert_eq!(streamed, Some(0), "{tag}: {j}");
        }
    }
}

/// DPDK's other rx and tx paths: no in-order, no mergeable buffers.
#[test]
fn poll_round_trip_without_in_order_or_mergeable_buffers() {
    round_trip("vumacplain", 128, ",in_order=0,mrg_rxbuf=0", "256", false);
}

/// 9000-byte frames: five of DPDK's 2 KiB mergeable buffers on the way in, a five-segment chain
/// on the way out. A small window keeps DPDK's tx ring (256 descriptors) from overflowing,
/// where its macswap would drop.
#[test]
fn poll_chained_round_trip_through_virtio_user_macswap_is_clean() {
    round_trip("vumac9000", 9000, ",in_order=0", "32", false);
}

/// Our backend as the socket's client, virtio-user as its server (`server=1`), as OVS runs
/// its ports.
#[test]
fn poll_round_trip_with_our_backend_as_socket_client() {
    round_trip("vumacclient", 64, "", "256", true);
}

/// Packed rings (VIRTIO_F_RING_PACKED), through each of DPDK's packed paths: in order with
/// mergeable buffers, neither, a 9000-byte chain, and our backend as the socket's client; the
/// 64-B frames written into the guest's buffers with streaming stores (`tx-stream=on`) and
/// with plain ones (`off`).
#[test]
fn poll_packed_round_trips_through_virtio_user_macswap_are_clean() {
    streamed_and_plain_round_trips(
        [("vupk64", "on", false), ("vupkclient", "off", true)],
        ",packed_vq=1",
    );
    round_trip(
        "vupkplain",
        1518,
        ",packed_vq=1,in_order=0,mrg_rxbuf=0",
        "256",
        false,
    );
    round_trip("vupk9000", 9000, ",packed_vq=1,in_order=0", "32", false);
}

/// Dequeue zero copy: the frames DPDK's macswap sends back go up as segments over its buffers
/// into our verifier, each chain returned once verified and freed; split and packed, with
/// and without mergeable buffers, and a 9000-byte frame in five buffers (five segments).
#[test]
fn poll_zero_copy_round_trips_through_virtio_user_macswap_are_clean() {
    for (tag, size, opts, window) in [
        ("vuzc", 1518, "", "128"),
        ("vuzcplain", 1024, ",in_order=0,mrg_rxbuf=0", "128"),
        ("vuzcpk", 1518, ",packed_vq=1", "128"),
        (
            "vuzcpkplain",
            1200,
            ",packed_vq=1,in_order=0,mrg_rxbuf=0",
            "128",
        ),
        ("vuzc9000", 9000, ",in_order=0", "32"),
    ] {
        let Some(j) = round_trip_with(tag, size, opts, window, false, ",dequeue-zero-copy=1")
        else {
            return;
        };
        let x = &j["ports"][0]["xstats"];
        let good = n(&j, "good");
        assert!(
            x["zero_copy_chains"].as_u64().unwrap_or(0) >= good / 2,
            "{tag}: most frames went up uncopied: {j}"
        );
        assert_eq!(x["zero_copy_late"], 0, "{tag}: {j}");
    }
}

/// The largest RX-packets our testpmd's periodic statistics have shown so far.
fn our_rx_so_far(p: &Proc) -> u64 {
    p.output()
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("RX-packets:"))
        .filter_map(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}

fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A frontend killed during traffic, ten times in a row in each socket role: each time our
/// port goes link down and serves the next frontend (traffic resumes), and our descriptors do
/// not pile up (each frontend's memory fd, kick and call eventfds are closed with it).
#[test]
fn poll_frontend_killed_ten_times_during_traffic() {
    if !have_dpdk() {
        return;
    }
    for client in [false, true] {
        let sock = Sock::new(&format!("vu-kill-{client}"));
        let dev = if client {
            format!("vhost0,iface={},client=1", sock.0)
        } else {
            format!("vhost0,iface={}", sock.0)
        };
        let me = common::testpmd(1, &dev, "rxonly", &["--stats-period", "1"]);
        if !client {
            common::wait_for_path(&sock.0, Duration::from_secs(10));
        }
        let server = if client { ",server=1" } else { "" };
        let mut seen = 0;
        let mut fds = Vec::new();
        for round in 0..10 {
            if client {
                // A killed virtio-user server leaves its socket file, and the next one refuses
                // to bind over it ("Address already in use"): clear it, as a supervisor would.
                let _ = std::fs::remove_file(&sock.0);
            }
            let mut peer = dpdk(
                "vukill",
                0,
                &format!("net_virtio_user0,path={},queues=1{server}", sock.0),
                "txonly",
                &["--single-file-segments"],
                &[],
            );
            dpdk_forwarding(&mut peer);
            // Traffic until our statistics show more frames than before this frontend.
            let until = std::time::Instant::now() + Duration::from_secs(20);
            while our_rx_so_far(&me) <= seen {
                assert!(
                    std::time::Instant::now() < until,
                    "client={client} round {round}: no traffic from the new frontend:\n{}",
                    me.output()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            seen = our_rx_so_far(&me);
            drop(peer); // SIGKILL, as a crash
            std::thread::sleep(Duration::from_millis(500));
            fds.push(fds_of(me.pid()));
        }
        let (lo, hi) = (fds.iter().min().unwrap(), fds.iter().max().unwrap());
        assert!(hi - lo <= 2, "client={client}: our fd count went {fds:?}");
        me.interrupt();
        let out = me.wait(Duration::from_secs(20));
        assert!(out.status.success(), "client={client}: {out:?}");
    }
}

/// `--rx-interrupt`: with a frontend that sends nothing our rx lcore sleeps on the kick eventfd
/// (we ask virtio-user to kick: used.flags without NO_NOTIFY, or a packed ring's device event
/// flags ENABLE), and it wakes up for traffic.
#[test]
fn poll_rx_interrupt_sleeps_while_idle_and_wakes_for_traffic() {
    if !have_dpdk() {
        return;
    }
    for opts in ["", ",packed_vq=1"] {
        rx_interrupt(opts);
    }
}

fn rx_interrupt(opts: &str) {
    let sock = Sock::new("vu-irq");
    let dev = format!("vhost0,iface={}", sock.0);
    let me = common::testpmd(1, &dev, "rxonly", &["--rx-interrupt", "--json"]);
    common::wait_for_path(&sock.0, Duration::from_secs(10));
    let mut idle = virtio_user("vuirq", &sock.0, opts, "rxonly");
    dpdk_forwarding(&mut idle);
    std::thread::sleep(Duration::from_millis(300));
    let t0 = me.cpu_time();
    std::thread::sleep(Duration::from_millis(2500));
    let spent = me.cpu_time() - t0;
    drop(idle);
    // (Measured: about 10 ms asleep; a spinning lcore used 1.6 s with the machine loaded.)
    assert!(
        spent < Duration::from_millis(600),
        "{opts}: an idle interrupt-mode lcore used {spent:?} of CPU in 2.5 s"
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut busy = virtio_user("vuirq", &sock.0, opts, "txonly");
    let j = json_of(&ours_while_dpdk_forwards(me, &mut busy, 2));
    drop(busy);
    assert!(n(&j, "rx_packets") > 10_000, "{opts}: {j}");
    assert_eq!(n(&j, "rx_errors"), 0, "{opts}: {j}");
}

/// Two queue pairs (MQ): virtio-user sends on both of its tx queues and each of our two rx
/// queues, on its own lcore, receives its share. (Three busy lcores on two CPUs: counts, not
/// rates.) Split and packed rings.
#[test]
fn poll_two_queue_pairs_each_receive_their_share() {
    if !have_dpdk() {
        return;
    }
    for opts in ["", ",packed_vq=1"] {
        two_queue_pairs(opts);
    }
}

fn two_queue_pairs(opts: &str) {
    let sock = Sock::new("vu-mq");
    let me = common::spawn(&[
        "testpmd",
        "-l",
        "0,1",
        "--nb-cores",
        "2",
        "--rxq",
        "2",
        "--txq",
        "2",
        "--vdev",
        &format!("vhost0,iface={},queues=2", sock.0),
        "--forward-mode",
        "rxonly",
        "--json",
    ]);
    common::wait_for_path(&sock.0, Duration::from_secs(10));
    let mut peer = dpdk(
        "vumq",
        0,
        &format!("net_virtio_user0,path={},queues=2{opts}", sock.0),
        "txonly",
        &["--single-file-segments"],
        &["--rxq=2", "--txq=2"],
    );
    let j = json_of(&ours_while_dpdk_forwards(me, &mut peer, 4));
    drop(peer);
    let per_lcore: Vec<u64> = j["lcores"]
        .as_array()
        .expect("lcores")
        .iter()
        .map(|l| l["rx_packets"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(per_lcore.len(), 2, "{opts}: {j}");
    assert!(per_lcore.iter().all(|&r| r > 1000), "{opts}: {j}");
    assert_eq!(n(&j, "rx_errors"), 0, "{opts}: {j}");
}
