//! NUMA placement for `memnic testpmd`: the CPU → node map ([`Topology`], read from sysfs), the
//! NUMA options of DPDK's testpmd ([`NumaConfig`]), and the rules that put each queue's rings and
//! pool on a node ([`place`]). Binding the memory itself is `memnic_shm::numa::bind_range`.
//!
//! # Placement rules
//!
//! For a queue (port, queue, direction, CPU of the lcore polling it) the first rule that applies
//! decides; [`Placement::reason`] says which. Explicit settings win, as in testpmd:
//!
//! 1. **`--ring-numa-config=(port,flag,socket)`** for that port and direction (flag 1: rx,
//!    2: tx, 3: both). testpmd `start_port()` (app/test-pmd/testpmd.c): a tx queue is set up on
//!    `txring_numa[pi]` when configured, else on `port->socket_id`; an rx queue is set up on
//!    `rxring_numa[pi]` *with the mbuf pool of that socket* (`mbuf_pool_find(rxring_numa[pi])`),
//!    else on `port->socket_id` with that socket's pool. So an rx queue's pool follows its ring.
//! 2. **`--port-numa-config=(port,socket)`** for that port, both directions. testpmd
//!    `init_fwd_streams()`: `port->socket_id = port_numa[pid]` when configured; that socket is
//!    the fallback of rule 1 for rings and pools.
//! 3. **`--ring-bind-lcpu`**: the node of the polling lcore's CPU. This is a *proposed* testpmd
//!    option, not in DPDK; the rule (and that 1 and 2 override it) is from the memnic testpmd issue.
//!    testpmd's nearest precedent is `init_config()`, which gives every forwarding lcore the pool
//!    of its own socket (`fwd_lcores[lc]->mbp = mbuf_pool_find(rte_lcore_to_socket_id(cpu))`),
//!    the pool the generator engines (txonly, flowgen) allocate from.
//! 4. **`--socket-num=N`**. In testpmd it applies only with `--no-numa` (`numa_support = 0`;
//!    NUMA mode is the default): then `port->socket_id = socket_num` and the single pool lives
//!    there (`init_fwd_streams()`, `init_config()`), and rules 1 and 2 are ignored. memnic
//!    testpmd has no `--no-numa`, so `--socket-num` is the node for whatever rules 1-3 leave
//!    unplaced (the role `rte_eth_dev_socket_id()` plays for a port in testpmd's NUMA mode).
//! 5. **Default**: the node of the first CPU the process may run on ([`Topology::first_node`]).
//!    testpmd: a port without `--port-numa-config` gets `rte_eth_dev_socket_id(pid)`, and when
//!    that is not a valid socket (virtual devices such as memnic have none) `socket_ids[0]`, the
//!    socket of the first enabled lcore (`set_default_fwd_lcores_config()`).
//!
//! # Parsing (testpmd `parse_portnuma_config()` / `parse_ringnuma_config()`, parameters.c)
//!
//! Items are `(a,b)` / `(a,b,c)` separated by commas; numbers are decimal or `0x` hex (testpmd's
//! `strtoul(.., 0)`); a later item for the same port overwrites an earlier one (testpmd fills
//! arrays indexed by port); the ring flag must be 1, 2 or 3 (`RX_RING_ONLY`, `TX_RING_ONLY`,
//! `RXTX_RING`). Differences, each stricter or clearer than testpmd: text between or around items
//! is an error (testpmd skips to the next `(`); a socket must be an online node of the topology
//! (testpmd: one of the sockets in use, printing "Invalid socket id, options are: ..."); ports go
//! up to 65535 (testpmd: 255) and are checked against the ports by [`NumaConfig::check_ports`]
//! once those exist (testpmd's ports exist while it parses); octal (`010`) is read as decimal.
#![forbid(unsafe_code)]

mod config;
#[cfg(test)]
mod fake;
mod place;
mod topology;

use std::path::PathBuf;

pub use config::NumaConfig;
pub use place::{place, Dir, Placement, QueueRef, Reason};
pub use topology::{format_cpu_list, parse_cpu_list, Topology};

/// Errors of this crate: each is one sentence naming the file or the option item at fault.
#[derive(Debug, thiserror::Error)]
pub enum NumaError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {text:?} is not a list like 0-3,8-11")]
    List { what: String, text: String },
    #[error("CPU {cpu} is listed in both node {first} and node {second}")]
    CpuInTwoNodes {
        cpu: usize,
        first: usize,
        second: usize,
    },
    #[error("{option} is empty; give one or more {form}")]
    Empty {
        option: &'static str,
        form: &'static str,
    },
    #[error("{option}: {item:?} is not of the form {form}[,{form}...]")]
    Syntax {
        option: &'static str,
        item: String,
        form: &'static str,
    },
    #[error("{option}: {field} {text:?}{context} is not a number")]
    Number {
        option: &'static str,
        field: &'static str,
        text: String,
        /// " in (item)", or empty for a single-value option.
        context: String,
    },
    #[error("{option}: port {port} in {item} is above the largest port id 65535")]
    PortTooLarge {
        option: &'static str,
        port: u64,
        item: String,
    },
    #[error("--ring-numa-config: flag {flag} in {item} is not 1 (rx), 2 (tx) or 3 (both)")]
    RingFlag { flag: u64, item: String },
    #[error("{option}: socket {socket}{context} is not a NUMA node of this machine (its nodes are {nodes})")]
    UnknownSocket {
        option: &'static str,
        socket: u64,
        context: String,
        nodes: String,
    },
    #[error("{option} names port {port}, but {known}")]
    UnknownPort {
        option: &'static str,
        port: u16,
        known: String,
    },
}

pub type Result<T> = std::result::Result<T, NumaError>;
