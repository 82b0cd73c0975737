//! Capture files for tests, written and read without the code under test: pcap files built byte
//! by byte (so a test can write any record, hostile ones too), and what `tcpdump -r` (Debian's
//! package) reads back from a pcap or pcapng file.

use std::path::Path;
use std::process::Command;

/// One record of a pcap file: its timestamp, the length the frame had on the wire, and the
/// bytes captured (which may be fewer, or, in a hostile file, more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcapRecord {
    pub ts_ns: u64,
    pub orig_len: u32,
    pub data: Vec<u8>,
}

impl PcapRecord {
    /// A whole frame stamped `ts_ns`.
    pub fn frame(ts_ns: u64, data: Vec<u8>) -> PcapRecord {
        PcapRecord {
            ts_ns,
            orig_len: data.len() as u32,
            data,
        }
    }
}

/// The 24-byte header of a little-endian pcap file (nanosecond or microsecond timestamps).
pub fn pcap_header(nanos: bool, snaplen: u32, linktype: u32) -> Vec<u8> {
    let magic: u32 = if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 };
    let mut v = Vec::with_capacity(24);
    v.extend_from_slice(&magic.to_le_bytes());
    v.extend_from_slice(&2u16.to_le_bytes());
    v.extend_from_slice(&4u16.to_le_bytes());
    v.extend_from_slice(&0i32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&snaplen.to_le_bytes());
    v.extend_from_slice(&linktype.to_le_bytes());
    v
}

/// A record's bytes: its 16-byte header (the captured length is `data.len()`) and the data.
pub fn record_bytes(nanos: bool, r: &PcapRecord) -> Vec<u8> {
    let secs = (r.ts_ns / 1_000_000_000) as u32;
    let frac = (r.ts_ns % 1_000_000_000) as u32;
    let frac = if nanos { frac } else { frac / 1000 };
    let mut v = Vec::with_capacity(16 + r.data.len());
    v.extend_from_slice(&secs.to_le_bytes());
    v.extend_from_slice(&frac.to_le_bytes());
    v.extend_from_slice(&(r.data.len() as u32).to_le_bytes());
    v.extend_from_slice(&r.orig_len.to_le_bytes());
    v.extend_from_slice(&r.data);
    v
}

/// Writes an Ethernet pcap file of `records` (nanosecond timestamps).
pub fn write_pcap(path: &Path, records: &[PcapRecord]) {
    let mut v = pcap_header(true, 65535, 1);
    for r in records {
        v.extend_from_slice(&record_bytes(true, r));
    }
    std::fs::write(path, v).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// `n` frames of memnic-fwd's verified payload (flow `flow`, sequence numbers 0..n), lengths
/// from [`frame_len`](crate::frame_len)'s schedule between 60 and 1518 bytes, and every
/// `jumbo_every`-th frame (if not 0) `jumbo` bytes long.
pub fn verified_frames(
    n: u64,
    seed: u64,
    flow: u64,
    jumbo_every: u64,
    jumbo: usize,
) -> Vec<Vec<u8>> {
    (0..n)
        .map(|seq| {
            let len = if jumbo_every > 0 && seq % jumbo_every == jumbo_every - 1 {
                jumbo
            } else {
                crate::frame_len(seed, flow, seq, crate::MIN_FRAME, crate::MAX_FRAME)
            };
            let mut f = vec![0u8; len];
            crate::fill(&mut f, seq, flow);
            f
        })
        .collect()
}

/// One frame as `tcpdump -r FILE -nn -e -xx -tt` prints it.
#[derive(Debug, Clone, PartialEq)]
pub struct DumpedFrame {
    /// The timestamp, seconds since the epoch.
    pub ts: f64,
    /// The line tcpdump prints for the frame (timestamp, MACs, what it decoded).
    pub line: String,
    /// The frame's length on the wire ("length N" of the line).
    pub wire_len: usize,
    /// The captured bytes, from the hex dump.
    pub bytes: Vec<u8>,
}

/// Reads `path` (pcap or pcapng) with `tcpdump -r PATH -nn -e -xx -tt` (timestamps in seconds
/// since the epoch) and returns every frame; panics with tcpdump's stderr if it fails.
pub fn tcpdump(path: &Path) -> Vec<DumpedFrame> {
    let out = Command::new("tcpdump")
        .args(["-r"])
        .arg(path)
        .args(["-nn", "-e", "-xx", "-tt"])
        .output()
        .expect("run tcpdump (apt-get install tcpdump)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tcpdump -r {} failed: {stderr}",
        path.display()
    );
    parse_tcpdump(&String::from_utf8_lossy(&out.stdout))
}

/// Parses the output of `tcpdump -nn -e -xx -tt`: a line per frame, then its hex dump, indented.
pub fn parse_tcpdump(text: &str) -> Vec<DumpedFrame> {
    let mut frames: Vec<DumpedFrame> = Vec::new();
    for line in text.lines() {
        if let Some(hex) = line.trim_start().strip_prefix("0x") {
            let f = frames.last_mut().expect("a hex dump line before any frame");
            let (_, groups) = hex.split_once(':').expect("0xOFFSET: in a hex line");
            for g in groups.split_whitespace() {
                for i in (0..g.len()).step_by(2) {
                    let b = u8::from_str_radix(&g[i..i + 2], 16).expect("hex bytes");
                    f.bytes.push(b);
                }
            }
        } else if !line.trim().is_empty() {
            let wire_len = line
                .split(", length ")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no ', length N' in tcpdump's line: {line}"));
            let ts = line
                .split_whitespace()
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("no timestamp first in tcpdump's line: {line}"));
            frames.push(DumpedFrame {
                ts,
                line: line.to_string(),
                wire_len,
                bytes: Vec::new(),
            });
        }
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcpdump_lines_and_hex() {
        let text = "1764656602.665530 02:00:00:00:00:01 > 02:00:00:00:00:02, ethertype IPv4 (0x0800), length 61: 198.18.0.1.9 > 198.18.0.2.9: UDP, length 19\n\
                    \t0x0000:  0200 0000 0002 0200\n\
                    \t0x0008:  00ab\n";
        let f = parse_tcpdump(text);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].wire_len, 61);
        assert_eq!(f[0].ts, 1764656602.66553);
        assert_eq!(f[0].bytes, [2, 0, 0, 0, 0, 2, 2, 0, 0, 0xab]);
    }
}
