//! Frames the generator builds and the verifier checks: Ethernet + IPv4 + UDP, with an optional
//! sequence-numbered, checksummed payload.
//!
//! Verified payload, right after the 42 bytes of headers: `seq` u64, `flow` u16, `session` u16,
//! `checksum` u32 (over the frame from byte 12 on, this field skipped: the MAC addresses are left
//! out so `mac`/`macswap` forwarding in between keeps it valid), then bytes derived from `seq`.
//! A frame must be at least [`MIN_VERIFY_LEN`] bytes to carry it.

use memnic_ethdev::MacAddr;

pub const ETH_HDR: usize = 14;
pub const IP_HDR: usize = 20;
pub const UDP_HDR: usize = 8;
pub const HDRS: usize = ETH_HDR + IP_HDR + UDP_HDR;
const SEQ_OFF: usize = HDRS;
const FLOW_OFF: usize = HDRS + 8;
const SESSION_OFF: usize = HDRS + 10;
const CSUM_OFF: usize = HDRS + 12;
const FILL_OFF: usize = HDRS + 16;
/// Smallest frame that carries a verified payload.
pub const MIN_VERIFY_LEN: usize = FILL_OFF;
/// Smallest frame the generator builds (Ethernet minimum without FCS).
pub const MIN_FRAME: usize = 60;

/// testpmd's txonly defaults: 198.18.0.1 → 198.18.0.2, UDP port 9 → 9.
pub const IP_SRC: [u8; 4] = [198, 18, 0, 1];
pub const IP_DST: [u8; 4] = [198, 18, 0, 2];
pub const UDP_PORT: u16 = 9;

/// Writes Ethernet/IPv4/UDP headers for a frame of `len` bytes into `f[..HDRS]`.
pub fn write_headers(
    f: &mut [u8],
    dst: MacAddr,
    src: MacAddr,
    ip_src: [u8; 4],
    ip_dst: [u8; 4],
    len: usize,
) {
    f[0..6].copy_from_slice(&dst.0);
    f[6..12].copy_from_slice(&src.0);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (len - ETH_HDR) as u16;
    let ip = &mut f[ETH_HDR..ETH_HDR + IP_HDR];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[4..6].copy_from_slice(&0u16.to_be_bytes());
    ip[6..8].copy_from_slice(&0u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&ip_src);
    ip[16..20].copy_from_slice(&ip_dst);
    let csum = ip_checksum(ip);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    let udp = &mut f[ETH_HDR + IP_HDR..HDRS];
    udp[0..2].copy_from_slice(&UDP_PORT.to_be_bytes());
    udp[2..4].copy_from_slice(&UDP_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&(ip_len - IP_HDR as u16).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
}

/// The IPv4 header checksum (RFC 791).
pub fn ip_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A fast checksum over a frame after its MAC addresses, skipping the checksum field itself.
fn frame_checksum(f: &[u8]) -> u32 {
    let mut acc: u64 = 0x9e37_79b9_7f4a_7c15 ^ f.len() as u64;
    let mut mix = |w: u64| {
        acc = (acc ^ w)
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(29)
    };
    let (head, tail) = f.split_at(CSUM_OFF);
    let (head, tail) = (&head[12..], &tail[4..]);
    for part in [head, tail] {
        let mut chunks = part.chunks_exact(8);
        for c in &mut chunks {
            mix(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let mut last = [0u8; 8];
        let rem = chunks.remainder();
        last[..rem.len()].copy_from_slice(rem);
        mix(u64::from_le_bytes(last) ^ ((rem.len() as u64) << 56));
    }
    (acc ^ (acc >> 32)) as u32
}

/// Writes the verified payload into frame `f` (headers already written).
pub fn write_payload(f: &mut [u8], seq: u64, flow: u16, session: u16) {
    f[SEQ_OFF..SEQ_OFF + 8].copy_from_slice(&seq.to_le_bytes());
    f[FLOW_OFF..FLOW_OFF + 2].copy_from_slice(&flow.to_le_bytes());
    f[SESSION_OFF..SESSION_OFF + 2].copy_from_slice(&session.to_le_bytes());
    let base = (seq as u8).wrapping_mul(31);
    for (i, b) in f[FILL_OFF..].iter_mut().enumerate() {
        *b = base.wrapping_add(i as u8);
    }
    let c = frame_checksum(f);
    f[CSUM_OFF..CSUM_OFF + 4].copy_from_slice(&c.to_le_bytes());
}

/// What a received verified frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Payload {
    pub seq: u64,
    pub flow: u16,
    pub session: u16,
}

/// Reads and checks a verified payload; None when the frame is too short or corrupted.
pub fn read_payload(f: &[u8]) -> Option<Payload> {
    if f.len() < MIN_VERIFY_LEN {
        return None;
    }
    let stored = u32::from_le_bytes(f[CSUM_OFF..CSUM_OFF + 4].try_into().ok()?);
    if stored != frame_checksum(f) {
        return None;
    }
    let seq = u64::from_le_bytes(f[SEQ_OFF..SEQ_OFF + 8].try_into().ok()?);
    let base = (seq as u8).wrapping_mul(31);
    if f[FILL_OFF..]
        .iter()
        .enumerate()
        .any(|(i, &b)| b != base.wrapping_add(i as u8))
    {
        return None;
    }
    Some(Payload {
        seq,
        flow: u16::from_le_bytes([f[FLOW_OFF], f[FLOW_OFF + 1]]),
        session: u16::from_le_bytes([f[SESSION_OFF], f[SESSION_OFF + 1]]),
    })
}

/// Swaps source and destination MAC addresses in place.
#[inline(always)]
pub fn swap_macs(f: &mut [u8]) {
    if f.len() >= 12 {
        let (dst, rest) = f.split_at_mut(6);
        dst.swap_with_slice(&mut rest[..6]);
    }
}

/// Sets destination and source MAC addresses.
#[inline(always)]
pub fn set_macs(f: &mut [u8], dst: MacAddr, src: MacAddr) {
    if f.len() >= 12 {
        f[0..6].copy_from_slice(&dst.0);
        f[6..12].copy_from_slice(&src.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize, seq: u64) -> Vec<u8> {
        let mut f = vec![0u8; len];
        write_headers(
            &mut f,
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            IP_SRC,
            IP_DST,
            len,
        );
        write_payload(&mut f, seq, 3, 7);
        f
    }

    #[test]
    fn payload_round_trips_and_detects_every_single_byte_flip() {
        for len in [MIN_VERIFY_LEN, 64, 65, 1518, 9000] {
            let f = frame(len, 0x1234_5678_9abc);
            assert_eq!(
                read_payload(&f),
                Some(Payload {
                    seq: 0x1234_5678_9abc,
                    flow: 3,
                    session: 7
                })
            );
            for i in 12..len {
                let mut g = f.clone();
                g[i] ^= 0x40;
                assert_eq!(
                    read_payload(&g),
                    None,
                    "len {len}: flip at {i} not detected"
                );
            }
            assert_eq!(read_payload(&f[..len - 1]), None);
        }
    }

    #[test]
    fn mac_rewrites_keep_the_payload_valid() {
        let mut f = frame(64, 9);
        swap_macs(&mut f);
        assert_eq!(read_payload(&f).map(|p| p.seq), Some(9));
    }

    #[test]
    fn ip_header_checksum_verifies_to_zero() {
        let f = frame(64, 1);
        assert_eq!(ip_checksum(&f[ETH_HDR..ETH_HDR + IP_HDR]), 0);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 50, "IP total length");
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 30, "UDP length");
    }

    #[test]
    fn mac_rewrites() {
        let mut f = frame(64, 1);
        swap_macs(&mut f);
        assert_eq!(&f[0..6], &[2, 0, 0, 0, 0, 2]);
        assert_eq!(&f[6..12], &[2, 0, 0, 0, 0, 1]);
        set_macs(&mut f, MacAddr([9; 6]), MacAddr([8; 6]));
        assert_eq!(&f[0..12], &[9, 9, 9, 9, 9, 9, 8, 8, 8, 8, 8, 8]);
    }
}
