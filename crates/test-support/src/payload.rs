//! The verified payload, memnic-fwd's format (`memnic_fwd::pkt`): what testpmd's generator
//! writes and its verifier checks, so tests and tools agree on one format. Frame `seq` of flow
//! `flow` carries Ethernet/IPv4/UDP headers, then `seq`, `flow`, session 0 and a checksum over
//! everything after the MAC addresses (the length included), then bytes derived from `seq`.

use memnic_ethdev::MacAddr;
use memnic_fwd::pkt::{self, HDRS, IP_DST, IP_SRC, MIN_VERIFY_LEN};
use memnic_pktbuf::{Mbuf, PoolCache};

/// Lengths the default schedule draws from.
pub const MIN_FRAME: usize = 60;
pub const MAX_FRAME: usize = 1518;

const DST: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x02]);
const SRC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);

pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The length of frame `seq` of a stream: uniform in `min..=max`.
pub fn frame_len(seed: u64, flow: u64, seq: u64, min: usize, max: usize) -> usize {
    min + (splitmix(seed ^ flow.rotate_left(17) ^ seq.wrapping_mul(0xA24B_AED4_963E_E407))
        % (max - min + 1) as u64) as usize
}

/// Writes frame `seq` of `flow` into `buf` (its whole length, at least 58 bytes).
pub fn fill(buf: &mut [u8], seq: u64, flow: u64) {
    let len = buf.len();
    assert!(
        len >= MIN_VERIFY_LEN,
        "a verified frame needs {MIN_VERIFY_LEN} bytes, not {len}"
    );
    pkt::write_headers(&mut buf[..HDRS], DST, SRC, IP_SRC, IP_DST, len);
    pkt::write_payload(buf, seq, flow as u16, 0);
}

/// Checks a received frame; returns its sequence number.
pub fn check(frame: &[u8]) -> Result<u64, String> {
    match pkt::read_payload(frame) {
        Some(p) => Ok(p.seq),
        None => Err(format!(
            "a frame of {} bytes fails the payload check (corrupted, truncated or not ours)",
            frame.len()
        )),
    }
}

/// As [`check`], and the frame must belong to `flow`.
pub fn check_flow(frame: &[u8], flow: u64) -> Result<u64, String> {
    let p = pkt::read_payload(frame).ok_or_else(|| check(frame).unwrap_err())?;
    if p.flow != flow as u16 {
        return Err(format!(
            "seq {}: flow {:#x}, expected {:#x}",
            p.seq, p.flow, flow as u16
        ));
    }
    Ok(p.seq)
}

/// Sets `m` to frame `seq` of `flow`, `len` bytes (any kind of pool: built privately, copied in).
pub fn write_frame(m: &mut Mbuf, seq: u64, flow: u64, len: usize) {
    let mut f = vec![0u8; len];
    fill(&mut f, seq, flow);
    assert!(m.set_len(len), "pool buffer too small for {len} bytes");
    assert!(m.copy_in(0, &f));
}

/// Checks packet `m` (any kind, chained or not) as [`check_flow`].
pub fn read_frame(m: &Mbuf, flow: u64) -> Result<u64, String> {
    check_flow(&m.to_vec(), flow)
}

/// The flow a frame says it belongs to, if it passes the payload check.
pub fn flow_of(frame: &[u8]) -> Option<u16> {
    pkt::read_payload(frame).map(|p| p.flow)
}

/// Frame `seq` of `flow`, `len` bytes, as one packet over as many of `cache`'s buffers as it
/// needs (a chain when `len` is longer than one buffer).
pub fn frame_packet(cache: &mut PoolCache, seq: u64, flow: u64, len: usize) -> Mbuf {
    let mut f = vec![0u8; len];
    fill(&mut f, seq, flow);
    let mut parts = Vec::new();
    let mut done = 0;
    while done < len || parts.is_empty() {
        let mut m = cache.alloc().expect("pool exhausted");
        let n = (len - done).min(m.capacity());
        assert!(m.set_len(n) && m.copy_in(0, &f[done..done + n]));
        parts.push(m);
        done += n;
    }
    let mut parts = parts.into_iter();
    let mut head = parts.next().expect("one segment at least");
    for p in parts {
        head.chain(p).expect("a short chain");
    }
    head
}
