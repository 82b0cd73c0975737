//! MEMNIC, the shared-memory virtual NIC of the 2014 DPDK `memnic` PMD, wire-exact to
//! `specs/memnic.md`: the guest PMD ([`guest`]) and the host side ([`host`]) over one 16 MiB
//! region, behind memnic's burst API.
//!
//! Layers: [`layout`] holds the wire constants, [`slot`] the per-slot handshake steps, `ring` the
//! burst loops both sides share, `memnic_ethdev::gate` parks the queues during a reset.
#![forbid(unsafe_code)]

pub mod guest;
pub mod host;
pub mod layout;
mod ring;
pub mod slot;

pub use guest::{GuestConfig, GuestPort, GuestRxQueue, GuestTxQueue, Variant};
pub use host::{HostConfig, HostPort, RESET_INTERVAL};
pub use ring::DEFAULT_RX_HOLDOFF;

use memnic_ethdev::flush::FlushMode;
use memnic_ethdev::stream::StreamMode;
use memnic_ethdev::{Devargs, DevargsError, Port};

/// Devargs keys of the memnic driver.
pub const DEVARGS_KEYS: &[&str] = &[
    "path",
    "role",
    "framesz",
    "variant",
    "mode",
    "rx_holdoff_ns",
    "rx_flush",
    "tx_stream",
];

/// Errors of the MEMNIC driver, each a sentence a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum MemnicError {
    #[error(transparent)]
    Shm(#[from] memnic_shm::ShmError),
    #[error(transparent)]
    Devargs(#[from] DevargsError),
    #[error("the region is {len} bytes; a MEMNIC region is 16 MiB (16777216 bytes)")]
    TooSmall { len: usize },
    #[error("the region is not a MEMNIC device (magic {magic:#010x}, expected 0x43494e76): is the host side running on it?")]
    NotMemnic { magic: u32 },
    #[error("MEMNIC version {0} is not supported (only version 1 exists)")]
    Version(u32),
    #[error("frame size {0} is outside 1518..=4088")]
    FrameSize(u32),
    #[error("no host answered the reset within {secs} s: is the host side running and polling its rx queue?")]
    NoHost { secs: f64 },
    #[error("the reset could not start: a queue of this port is not being polled")]
    QueuesNotPolled,
}

/// Opens a memnic port from devargs (`memnic0,path=/dev/shm/vm1,role=guest`).
///
/// Keys: `path` (required: shm name, file or ivshmem BAR), `role=host|guest` (default guest),
/// `framesz=N` (guest: frame size to request, 1518..=4088), `variant=memnic|2014-after|2014-before`
/// (guest burst implementation), `mode=OCTAL` (host: permissions of a new region, default 600),
/// `rx_holdoff_ns=N` (either role: how long rx leaves the ring alone after an empty poll that
/// followed a run of frames,
/// default [`DEFAULT_RX_HOLDOFF`], 0 to poll without pause), `rx_flush=auto|on|off` (either
/// role: whether rx flushes the frames it copied from our caches; `auto`, the default, tries
/// both ways while traffic runs: `memnic_ethdev::flush`), `tx_stream=auto|on|off` (either
/// role: whether tx writes frames of up to 128 B with streaming stores, the same way:
/// `memnic_ethdev::stream`).
pub fn open(args: &Devargs) -> Result<Box<dyn Port>, MemnicError> {
    let path = args.require("path")?;
    let role = args.choice_or("role", &["host", "guest"], "guest")?;
    let rx_holdoff =
        memnic_ethdev::holdoff::from_devargs(args, "rx_holdoff_ns", DEFAULT_RX_HOLDOFF)?;
    let rx_flush = args.parse_or("rx_flush", FlushMode::Auto)?;
    let tx_stream = args.parse_or("tx_stream", StreamMode::Auto)?;
    if role == "host" {
        for k in ["framesz", "variant"] {
            if args.get(k).is_some() {
                return Err(args
                    .bad(k, args.get(k).unwrap_or(""), "only a guest takes this key")
                    .into());
            }
        }
        let mut cfg = HostConfig::new(path);
        cfg.rx_holdoff = rx_holdoff;
        cfg.rx_flush = rx_flush;
        cfg.tx_stream = tx_stream;
        if let Some(m) = args.get("mode") {
            cfg.mode = u32::from_str_radix(m, 8)
                .map_err(|_| args.bad("mode", m, "expected octal permission bits like 600"))?;
        }
        return Ok(Box::new(HostPort::create(&args.name, &cfg)?));
    }
    if args.get("mode").is_some() {
        return Err(args
            .bad(
                "mode",
                args.get("mode").unwrap_or(""),
                "only a host creates the region",
            )
            .into());
    }
    let mut cfg = GuestConfig::new(path);
    cfg.rx_holdoff = rx_holdoff;
    cfg.rx_flush = rx_flush;
    cfg.tx_stream = tx_stream;
    cfg.framesz = match args.get("framesz") {
        None => None,
        Some(v) => {
            let f: u32 = v
                .parse()
                .map_err(|_| args.bad("framesz", v, "expected a number of bytes"))?;
            if !(layout::MAX_FRAME_LEN..=layout::MAX_JUMBO_FRAME_LEN).contains(&f) {
                return Err(args.bad("framesz", v, "must be within 1518..=4088").into());
            }
            Some(f)
        }
    };
    cfg.variant = args.parse_or("variant", Variant::Memnic)?;
    Ok(Box::new(GuestPort::attach(&args.name, &cfg)?))
}

/// The memnic driver for the devargs registry (`--vdev memnic0,path=...,role=...`).
pub const DRIVER: memnic_ethdev::Driver = memnic_ethdev::Driver {
    name: "memnic",
    keys: DEVARGS_KEYS,
    open: |a| open(a).map_err(|e| e.into()),
};
