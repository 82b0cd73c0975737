//! vhost-user net backend: the device side of virtio-net for QEMU guests and DPDK's
//! `net_virtio_user` (`shared/specs/vhost-user.md`).
//!
//! * [`mem`]: guest memory as the frontend shares it, every address checked once.
//! * [`vring`]: what the data path needs from a virtqueue, either layout.
//! * [`split`] and [`packed`]: the two virtqueue layouts' areas in guest memory.
//! * [`chain`]: walking a descriptor chain the guest wrote (bounded, indirect, checked).
//! * [`notify`]: when to call the driver and when we may sleep for its kick (the steps the
//!   loom model runs).
//! * [`queue`]: the data path behind the burst API (copies both ways, batched used-ring
//!   updates and calls).
//! * [`zerocopy`]: dequeue zero copy, the guest's tx buffers handed up as external segments.
//! * [`device`]: the state a frontend configures, behind rust-vmm's `vhost` request handler.
//! * [`port`]: devargs, the socket in either role, the control thread, the driver.

#![forbid(unsafe_code)]

pub mod chain;
pub mod device;
pub mod mem;
pub mod notify;
pub mod packed;
pub mod port;
pub mod queue;
pub mod split;
pub mod vring;
pub mod zerocopy;

pub use port::{VhostConfig, VhostError, VhostPort, DEVARGS_KEYS, DRIVER, MAX_QUEUES};
pub use zerocopy::ZeroCopyConfig;
