//! Statistics in testpmd's shapes (so scripts written for `dpdk-testpmd` read ours) and as JSON.

use std::fmt::Write;
use std::time::Instant;

use crate::capture::{CaptureCounts, Dir};
use crate::rtt::RttSummary;
use crate::verify::VerifyCounts;
use crate::{Engine, FwdMode, StreamCounters};

/// Counters of one port, since the last clear.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PortReport {
    pub port: u16,
    pub name: String,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub rx_missed: u64,
    pub rx_nombuf: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
    /// Frames the forwarding engine dropped because the tx queue did not take them.
    pub tx_dropped: u64,
    pub rx_pps: u64,
    pub rx_bps: u64,
    pub tx_pps: u64,
    pub tx_bps: u64,
    /// Integrity counts of frames received on this port (with `--verify`).
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    pub verify: Option<VerifyCounts>,
    /// Live capture (`--capture`) of the frames received: those in the file (or on their way
    /// to it), and those missed for want of a free slot. Absent when rx is not captured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_captured: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_capture_missed: Option<u64>,
    /// The same for the frames sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_captured: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_capture_missed: Option<u64>,
    /// The driver's extended counters (cumulative since the port was opened, not cleared).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub xstats: std::collections::BTreeMap<&'static str, u64>,
}

/// Frames forwarded by one lcore.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LcoreReport {
    pub lcore: usize,
    pub cpu: usize,
    pub streams: usize,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub forwarded: u64,
}

/// Everything `--json` prints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub mode: String,
    pub seconds: f64,
    pub ports: Vec<PortReport>,
    pub lcores: Vec<LcoreReport>,
    /// `ping`: the run's round trips, every stream's merged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_trips: Option<RttSummary>,
}

/// Turns cumulative counters into rates between calls, and keeps the clear-stats base.
pub struct Meter {
    last: Vec<(u64, u64, u64, u64)>,
    at: Instant,
    base: Vec<PortReport>,
    pub started: Instant,
}

impl Meter {
    pub fn new(engine: &mut Engine) -> Meter {
        let mut m = Meter {
            last: Vec::new(),
            at: Instant::now(),
            base: Vec::new(),
            started: Instant::now(),
        };
        m.clear(engine);
        m
    }

    /// Zeroes the port counters (testpmd's `clear port stats all`). The engine's stream
    /// counters restart first, so the base taken here already counts from zero where they do
    /// (a base taken before them would exceed the counters read after: negative counts).
    pub fn clear(&mut self, engine: &mut Engine) {
        engine.clear_stream_counters();
        self.base = raw_ports(engine);
        self.last = self
            .base
            .iter()
            .map(|p| (p.rx_packets, p.rx_bytes, p.tx_packets, p.tx_bytes))
            .collect();
        self.at = Instant::now();
    }

    /// Port counters since the last clear, with rates since the previous call.
    pub fn ports(&mut self, engine: &Engine) -> Vec<PortReport> {
        let now = Instant::now();
        let secs = (now - self.at).as_secs_f64().max(1e-9);
        let mut ports = raw_ports(engine);
        for (i, p) in ports.iter_mut().enumerate() {
            let (rp, rb, tp, tb) = self.last[i];
            p.rx_pps = ((p.rx_packets - rp) as f64 / secs) as u64;
            p.rx_bps = ((p.rx_bytes - rb) as f64 * 8.0 / secs) as u64;
            p.tx_pps = ((p.tx_packets - tp) as f64 / secs) as u64;
            p.tx_bps = ((p.tx_bytes - tb) as f64 * 8.0 / secs) as u64;
            self.last[i] = (p.rx_packets, p.rx_bytes, p.tx_packets, p.tx_bytes);
            let b = &self.base[i];
            p.rx_packets -= b.rx_packets;
            p.rx_bytes -= b.rx_bytes;
            p.rx_errors -= b.rx_errors;
            p.rx_missed -= b.rx_missed;
            p.rx_nombuf -= b.rx_nombuf;
            p.tx_packets -= b.tx_packets;
            p.tx_bytes -= b.tx_bytes;
            p.tx_errors -= b.tx_errors;
            p.tx_dropped -= b.tx_dropped;
            let less = |v: &mut Option<u64>, b: Option<u64>| {
                if let Some(v) = v.as_mut() {
                    *v -= b.unwrap_or(0);
                }
            };
            less(&mut p.rx_captured, b.rx_captured);
            less(&mut p.rx_capture_missed, b.rx_capture_missed);
            less(&mut p.tx_captured, b.tx_captured);
            less(&mut p.tx_capture_missed, b.tx_capture_missed);
        }
        self.at = now;
        ports
    }
}

/// Cumulative counters of every port: the driver's queue counters plus the engine's.
fn raw_ports(engine: &Engine) -> Vec<PortReport> {
    let drv = engine.port_counters();
    let streams = engine.stream_counters();
    engine
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (rx, tx) = drv[i];
            let mut dropped = 0;
            let mut verify: Option<VerifyCounts> = None;
            for (spec, c) in &streams {
                if spec.tx_port as usize == i {
                    dropped += c.dropped;
                }
                if spec.rx_port as usize == i
                    && (engine.cfg.verify || engine.cfg.mode == FwdMode::Ping)
                {
                    verify
                        .get_or_insert_with(VerifyCounts::default)
                        .add(&c.verify);
                }
            }
            let mut captured = [None::<CaptureCounts>; 2];
            for c in engine
                .captures()
                .iter()
                .filter(|c| c.spec.port as usize == i)
            {
                for (k, dir) in [Dir::Rx, Dir::Tx].into_iter().enumerate() {
                    if c.takes(dir) {
                        let n = c.counts(dir);
                        let sum = captured[k].get_or_insert_with(CaptureCounts::default);
                        sum.captured += n.captured;
                        sum.missed += n.missed;
                    }
                }
            }
            PortReport {
                port: i as u16,
                name: p.info().name,
                rx_packets: rx.packets,
                rx_bytes: rx.bytes,
                rx_errors: rx.errors,
                rx_missed: rx.drops,
                rx_nombuf: rx.nombuf,
                tx_packets: tx.packets,
                tx_bytes: tx.bytes,
                tx_errors: tx.drops + tx.errors,
                tx_dropped: dropped,
                verify,
                xstats: p.xstats().into_iter().collect(),
                rx_captured: captured[0].map(|c| c.captured),
                rx_capture_missed: captured[0].map(|c| c.missed),
                tx_captured: captured[1].map(|c| c.captured),
                tx_capture_missed: captured[1].map(|c| c.missed),
                ..Default::default()
            }
        })
        .collect()
}

/// Frames forwarded per lcore.
pub fn lcores(engine: &Engine) -> Vec<LcoreReport> {
    let counters = engine.stream_counters();
    let mut out = Vec::new();
    let mut si = 0;
    for (l, specs) in engine.lcores() {
        let mut sum = StreamCounters::default();
        for _ in &specs {
            sum.add(&counters[si].1);
            si += 1;
        }
        let forwarded = match engine.cfg.mode {
            crate::FwdMode::RxOnly => sum.rx,
            crate::FwdMode::TxOnly => sum.tx,
            _ => sum.tx,
        };
        out.push(LcoreReport {
            lcore: l.id,
            cpu: l.cpu,
            streams: specs.len(),
            rx_packets: sum.rx,
            tx_packets: sum.tx,
            forwarded,
        });
    }
    out
}

const NIC_BORDER: &str = "########################";
const FWD_BORDER: &str = "----------------------";
const ACC_BORDER: &str = "+++++++++++++++";

/// `show port xstats` (testpmd's `nic_xstats_display`): the driver's extended counters, a
/// `name: value` line each (zeros too), cumulative since the port was opened.
pub fn nic_xstats(p: &PortReport) -> String {
    let mut s = format!("###### NIC extended statistics for port {:<2}\n", p.port);
    for (name, value) in &p.xstats {
        let _ = writeln!(s, "{name}: {value}");
    }
    s
}

/// `show port stats` (testpmd's `nic_stats_display`).
pub fn nic_stats(p: &PortReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n  {NIC_BORDER} NIC statistics for port {:<2} {NIC_BORDER}",
        p.port
    );
    let _ = writeln!(
        s,
        "  RX-packets: {:<10} RX-missed: {:<10} RX-bytes:  {}",
        p.rx_packets, p.rx_missed, p.rx_bytes
    );
    let _ = writeln!(s, "  RX-errors: {}", p.rx_errors);
    let _ = writeln!(s, "  RX-nombuf:  {:<10}", p.rx_nombuf);
    let _ = writeln!(
        s,
        "  TX-packets: {:<10} TX-errors: {:<10} TX-bytes:  {}",
        p.tx_packets, p.tx_errors, p.tx_bytes
    );
    if let Some(v) = &p.verify {
        let _ = writeln!(
            s,
            "  Verify: good {}  lost {}  corrupted {}  duplicated {}  reordered {}  unknown-flows {}",
            v.good, v.lost, v.corrupted, v.duplicated, v.reordered, v.unknown_flows
        );
    }
    capture_line(&mut s, p);
    let _ = writeln!(s, "\n  Throughput (since last show)");
    let _ = writeln!(
        s,
        "  Rx-pps: {:>12}          Rx-bps: {:>12}",
        p.rx_pps, p.rx_bps
    );
    let _ = writeln!(
        s,
        "  Tx-pps: {:>12}          Tx-bps: {:>12}",
        p.tx_pps, p.tx_bps
    );
    let _ = writeln!(s, "  {NIC_BORDER}############################{NIC_BORDER}");
    s
}

/// `  Capture: RX captured N missed N  TX captured N missed N` for a captured port.
fn capture_line(s: &mut String, p: &PortReport) {
    let mut line = String::new();
    for (dir, c, m) in [
        ("RX", p.rx_captured, p.rx_capture_missed),
        ("TX", p.tx_captured, p.tx_capture_missed),
    ] {
        if let (Some(c), Some(m)) = (c, m) {
            let _ = write!(line, "  {dir} captured {c} missed {m}");
        }
    }
    if !line.is_empty() {
        let _ = writeln!(s, "  Capture:{line}");
    }
}

/// `ping`'s round trips, printed at stop after the forward statistics (microseconds).
pub fn round_trips(r: &RttSummary) -> String {
    let us = |ns: u64| ns as f64 / 1e3;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n  {FWD_BORDER} Round trips (ping) {FWD_BORDER}{}",
        "-".repeat(10)
    );
    let _ = writeln!(
        s,
        "  Sent: {:<14} Returned: {:<14} Lost: {:<10} Stale: {}",
        r.sent, r.count, r.lost, r.stale
    );
    let _ = writeln!(
        s,
        "  RTT us: min {:.2}  mean {:.2}  p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
        us(r.min_ns),
        us(r.mean_ns),
        us(r.p50_ns),
        us(r.p90_ns),
        us(r.p99_ns),
        us(r.p999_ns),
        us(r.max_ns)
    );
    let _ = writeln!(s, "  {}", "-".repeat(76));
    s
}

/// The totals printed at stop (testpmd's `fwd_stats_display`).
pub fn fwd_stats(ports: &[PortReport]) -> String {
    let mut s = String::new();
    let (mut rx, mut rxd, mut tx, mut txd) = (0, 0, 0, 0);
    for p in ports {
        let _ = writeln!(
            s,
            "\n  {FWD_BORDER} Forward statistics for port {:<2} {FWD_BORDER}",
            p.port
        );
        let _ = writeln!(
            s,
            "  RX-packets: {:<14} RX-dropped: {:<14} RX-total: {}",
            p.rx_packets,
            p.rx_missed,
            p.rx_packets + p.rx_missed
        );
        let _ = writeln!(
            s,
            "  TX-packets: {:<14} TX-dropped: {:<14} TX-total: {}",
            p.tx_packets,
            p.tx_dropped,
            p.tx_packets + p.tx_dropped
        );
        if let Some(v) = &p.verify {
            let _ = writeln!(
                s,
                "  Verify: good {}  lost {}  corrupted {}  duplicated {}  reordered {}  unknown-flows {}",
                v.good, v.lost, v.corrupted, v.duplicated, v.reordered, v.unknown_flows
            );
        }
        capture_line(&mut s, p);
        let _ = writeln!(s, "  {}", "-".repeat(76));
        rx += p.rx_packets;
        rxd += p.rx_missed;
        tx += p.tx_packets;
        txd += p.tx_dropped;
    }
    let _ = writeln!(
        s,
        "\n  {ACC_BORDER} Accumulated forward statistics for all ports{ACC_BORDER}"
    );
    let _ = writeln!(
        s,
        "  RX-packets: {:<14} RX-dropped: {:<14} RX-total: {}",
        rx,
        rxd,
        rx + rxd
    );
    let _ = writeln!(
        s,
        "  TX-packets: {:<14} TX-dropped: {:<14} TX-total: {}",
        tx,
        txd,
        tx + txd
    );
    let _ = writeln!(s, "  {}", "+".repeat(76));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_port::{engine, TestPort};
    use crate::FwdMode;

    #[test]
    fn clearing_after_drops_restarts_every_count_at_zero() {
        // Its tx queue takes nothing: every frame txonly makes is dropped by the engine.
        let mut engine = engine(TestPort::default(), FwdMode::TxOnly, "report-test");
        let mut meter = Meter::new(&mut engine);
        engine.start(false).unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while meter.ports(&engine)[0].tx_dropped == 0 {
            assert!(
                Instant::now() < deadline,
                "txonly into a black hole dropped nothing"
            );
            std::thread::yield_now();
        }
        engine.stop().unwrap();
        meter.clear(&mut engine);
        // Stopped: nothing happens between the clear and the read.
        let p = &meter.ports(&engine)[0];
        assert_eq!((p.tx_dropped, p.tx_packets, p.rx_packets), (0, 0, 0));
    }

    #[test]
    fn nic_stats_lines_read_like_testpmd() {
        let p = PortReport {
            port: 0,
            rx_packets: 5,
            rx_pps: 1234567,
            tx_pps: 7,
            ..Default::default()
        };
        let s = nic_stats(&p);
        assert!(
            s.contains("  RX-packets: 5          RX-missed: 0          RX-bytes:  0\n"),
            "{s}"
        );
        assert!(
            s.contains("  Rx-pps:      1234567          Rx-bps:            0\n"),
            "{s}"
        );
        // The DPDK peer guide's scripts take the second field of the Rx-pps line.
        let line = s.lines().find(|l| l.contains("Rx-pps:")).unwrap();
        assert_eq!(line.split_whitespace().nth(1), Some("1234567"));
        let f = fwd_stats(&[p]);
        assert!(f.contains("Forward statistics for port 0 "));
        assert!(f.contains("Accumulated forward statistics for all ports"));
    }
}
