//! How a memif port is set up: devargs, [`MemifConfig`] and the driver's errors.

use std::time::Duration;

use memnic_ethdev::ahead::AheadMode;
use memnic_ethdev::demote::DemoteMode;
use memnic_ethdev::flush::FlushMode;
use memnic_ethdev::holdoff;
use memnic_ethdev::stream::StreamMode;
use memnic_ethdev::{Devargs, DevargsError, MacAddr};

use crate::msg::{MsgError, Secret};
use crate::queue::{Role, DEFAULT_RX_HOLDOFF};
use crate::socket::RegisterError;

/// Devargs keys, DPDK's names.
pub const DEVARGS_KEYS: &[&str] = &[
    "role",
    "socket",
    "socket-abstract",
    "id",
    "secret",
    "rsize",
    "bsize",
    "zero-copy",
    "mac",
    "rx-flush",
    "tx-stream",
    "tx-demote",
    "tx-ahead-shared",
    "rx-holdoff-ns",
];

/// Most queue pairs a port offers.
pub const MAX_QUEUES: u16 = 16;

/// Errors of the memif driver.
#[derive(Debug, thiserror::Error)]
pub enum MemifError {
    #[error(transparent)]
    Devargs(#[from] DevargsError),
    #[error(transparent)]
    Shm(#[from] memnic_shm::ShmError),
    #[error(transparent)]
    Socket(#[from] RegisterError),
    #[error("the memif secret is refused ({0}): give 1 to 23 bytes without NUL, or no secret")]
    Secret(MsgError),
    #[error("an empty memif secret would admit every client: give 1 to 23 bytes, or no secret")]
    EmptySecret,
    #[error("a ring of 2^{log2} slots is above memif's limit of 2^14: use an rsize of 1 to 14")]
    RingSize { log2: u8 },
    #[error(
        "region 0 would need {size} bytes for {rings} rings of 2^{log2} slots of {bsize} bytes, \
         but memif descriptor offsets are 32-bit, so it must stay within 4 GiB: use fewer queue \
         pairs, a smaller rsize or a smaller bsize"
    )]
    RegionTooLarge {
        size: u64,
        rings: u32,
        log2: u8,
        bsize: u32,
    },
}

/// How a memif port is set up.
#[derive(Debug, Clone)]
pub struct MemifConfig {
    pub role: Role,
    pub socket: String,
    pub is_abstract: bool,
    pub id: u32,
    pub secret: Option<String>,
    pub log2_ring_size: u8,
    pub bsize: u32,
    pub mac: MacAddr,
    /// How long a client keeps retrying before giving up (reported as link down).
    pub connect_patience: Duration,
    /// Client: descriptors point straight at pool buffers (pools must live in a memfd, which
    /// is sent as a region); a server ignores it, as DPDK's does.
    pub zero_copy: bool,
    /// Each step of the handshake (connecting, then every message awaited from the peer) must
    /// finish within this, or the connection is dropped with DISCONNECT and a reason and a
    /// server interface is free for the next client. A server socket gives a new client the
    /// shortest of its interfaces' timeouts to send INIT.
    pub handshake_timeout: Duration,
    /// Whether rx flushes the frames it copied out of the peer's buffers from our caches
    /// (`rx-flush=auto|on|off`, ours: `chain::FromRegions::flush`).
    pub rx_flush: FlushMode,
    /// Whether tx writes short frames into the peer's buffers with streaming stores
    /// (`tx-stream=auto|on|off`, ours: `writer::STREAM_MAX`).
    pub tx_stream: StreamMode,
    /// Whether tx demotes the first lines of the frames it wrote with plain stores to the
    /// shared cache (`tx-demote=auto|on|off`, ours: `memnic_ethdev::demote::DEMOTE_BYTES`).
    pub tx_demote: DemoteMode,
    /// Whether tx asks for the peer's buffer lines ahead of its copy in shared state instead
    /// of exclusive (`tx-ahead-shared=auto|on|off`, ours: `writer::Ahead`).
    pub tx_ahead_shared: AheadMode,
    /// How long rx leaves the ring alone after an empty poll that followed a run of frames
    /// (`rx-holdoff-ns=N`, 0 to 1000000, 0 polls without pause; ours:
    /// `queue::DEFAULT_RX_HOLDOFF`).
    pub rx_holdoff: Duration,
}

impl MemifConfig {
    pub fn new(role: Role, socket: impl Into<String>) -> MemifConfig {
        MemifConfig {
            role,
            socket: socket.into(),
            is_abstract: false,
            id: 0,
            secret: None,
            log2_ring_size: 10,
            bsize: 2048,
            mac: MacAddr([2, 0xfe, 0, 0, 0, 0]),
            connect_patience: Duration::from_secs(30),
            zero_copy: false,
            handshake_timeout: Duration::from_secs(5),
            rx_flush: FlushMode::Auto,
            tx_stream: StreamMode::Auto,
            tx_demote: DemoteMode::Auto,
            tx_ahead_shared: AheadMode::Auto,
            rx_holdoff: DEFAULT_RX_HOLDOFF,
        }
    }

    /// The configured secret as it goes on the wire; an unusable one is an error, never "no
    /// secret" (that would let every client in).
    pub fn checked_secret(&self) -> Result<Secret, MemifError> {
        match self.secret.as_deref() {
            None => Ok(Secret::empty()),
            Some("") => Err(MemifError::EmptySecret),
            Some(s) => Secret::try_from(s).map_err(MemifError::Secret),
        }
    }

    /// Reads DPDK-style devargs: `memif0,role=server,socket=/run/memif.sock,id=0,...`.
    pub fn from_devargs(a: &Devargs) -> Result<MemifConfig, MemifError> {
        let role = match a.choice_or("role", &["server", "client", "master", "slave"], "client")? {
            "server" | "master" => Role::Server,
            _ => Role::Client,
        };
        let mut c = MemifConfig::new(role, a.get("socket").unwrap_or("/run/memif.sock"));
        c.is_abstract = a.bool_or("socket-abstract", false)?;
        c.id = a.parse_or("id", 0u32)?;
        c.secret = a.get("secret").map(str::to_string);
        c.checked_secret()?;
        c.log2_ring_size = a.parse_or("rsize", 10u8)?;
        if !(1..=14).contains(&c.log2_ring_size) {
            return Err(a
                .bad(
                    "rsize",
                    &c.log2_ring_size.to_string(),
                    "log2 of the ring size, 1..=14",
                )
                .into());
        }
        c.bsize = a.parse_or("bsize", 2048u32)?;
        if !(64..=65536).contains(&c.bsize) {
            return Err(a
                .bad(
                    "bsize",
                    &c.bsize.to_string(),
                    "buffer size in bytes, 64..=65536",
                )
                .into());
        }
        c.zero_copy = a.bool_or("zero-copy", false)? && role == Role::Client;
        if let Some(m) = a.get("mac") {
            c.mac = m.parse().map_err(|e: String| a.bad("mac", m, e))?;
        }
        c.rx_flush = a.parse_or("rx-flush", FlushMode::Auto)?;
        c.tx_stream = a.parse_or("tx-stream", StreamMode::Auto)?;
        c.tx_demote = a.parse_or("tx-demote", DemoteMode::Auto)?;
        c.tx_ahead_shared = a.parse_or("tx-ahead-shared", AheadMode::Auto)?;
        c.rx_holdoff = holdoff::from_devargs(a, "rx-holdoff-ns", DEFAULT_RX_HOLDOFF)?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<MemifConfig, MemifError> {
        MemifConfig::from_devargs(&Devargs::parse(s, DEVARGS_KEYS).unwrap())
    }

    #[test]
    fn the_tuned_choices_default_to_auto_and_take_on_or_off() {
        let c = parse("memif0").unwrap();
        assert_eq!(
            (c.rx_flush, c.tx_stream, c.tx_demote, c.tx_ahead_shared),
            (
                FlushMode::Auto,
                StreamMode::Auto,
                DemoteMode::Auto,
                AheadMode::Auto
            )
        );
        let c = parse("memif0,rx-flush=on,tx-stream=off,tx-demote=on,tx-ahead-shared=on").unwrap();
        assert_eq!(
            (c.rx_flush, c.tx_stream, c.tx_demote, c.tx_ahead_shared),
            (
                FlushMode::On,
                StreamMode::Off,
                DemoteMode::On,
                AheadMode::On
            )
        );
        let e = parse("memif0,tx-demote=often").unwrap_err().to_string();
        assert!(e.contains("'tx-demote'"), "{e}");
        let e = parse("memif0,tx-stream=sometimes").unwrap_err().to_string();
        assert!(e.contains("'tx-stream'"), "{e}");
        let e = parse("memif0,tx-ahead-shared=maybe")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'tx-ahead-shared'"), "{e}");
    }

    #[test]
    fn the_hold_off_defaults_to_5_us_and_takes_nanoseconds() {
        assert_eq!(parse("memif0").unwrap().rx_holdoff, DEFAULT_RX_HOLDOFF);
        let c = parse("memif0,rx-holdoff-ns=0").unwrap();
        assert_eq!(c.rx_holdoff, Duration::ZERO);
        let e = parse("memif0,rx-holdoff-ns=2ms").unwrap_err().to_string();
        assert!(e.contains("'rx-holdoff-ns'"), "{e}");
    }
}
