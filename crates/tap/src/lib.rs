//! A TAP port: a Linux TAP interface behind memnic's burst API, so frames from MEMNIC, memif
//! and vhost ports reach the kernel's network stack and back (DPDK's `net_tap`).
//!
//! `tap0,iface=NAME[,queues=N][,mac=fixed|XX:XX:XX:XX:XX:XX][,persist=yes]`:
//!
//! * the interface is created (or, if a multi-queue TAP of that name exists, joined) when the
//!   port opens, and brought up, as DPDK's does when its port starts; without `iface` the
//!   kernel names it `dtapN` (the first free N);
//! * each queue pair is one descriptor of the interface (`IFF_MULTI_QUEUE`), nonblocking; the
//!   kernel spreads its flows over the queues that are taken (queues 1.. join the interface
//!   when taken, so an unpolled queue is never sent anything);
//! * rx reads frames until the kernel has none or the burst is full, each into one or more
//!   buffers of the queue's pool (a frame longer than a buffer becomes a chain of segments);
//!   tx writes each frame whole (a chain is gathered into a scratch buffer first);
//! * the interface goes away when the port closes, unless `persist=yes`.
//!
//! The system calls live in `memnic_shm::tap`; everything here is safe Rust (see the lint below).
#![forbid(unsafe_code)]

mod config;
mod port;
mod queue;

pub use config::{TapConfig, DEVARGS_KEYS, MAX_QUEUES};
pub use port::{TapError, TapPort};
pub use queue::{TapRxQueue, TapTxQueue, MAX_FRAME, MAX_RX_SEGS};

use memnic_ethdev::{Devargs, Driver, OpenResult};

/// The driver: `tap0[,iface=NAME][,queues=N][,mac=...][,persist=yes]`.
pub const DRIVER: Driver = Driver {
    name: "tap",
    keys: DEVARGS_KEYS,
    open,
};

fn open(a: &Devargs) -> OpenResult {
    let cfg = TapConfig::from_devargs(a)?;
    Ok(Box::new(TapPort::open(&a.name, &cfg)?))
}
