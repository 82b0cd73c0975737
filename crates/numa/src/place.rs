//! Where a queue's rings and pool go: [`place`] (the rules are in the crate docs).

use std::fmt;

use crate::{NumaConfig, Topology};

/// The direction of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    Rx,
    Tx,
}

impl fmt::Display for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dir::Rx => "rx",
            Dir::Tx => "tx",
        })
    }
}

/// One queue to place: its port, queue id, direction and the CPU of the lcore that polls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueueRef {
    pub port: u16,
    pub queue: u16,
    pub dir: Dir,
    pub lcore_cpu: usize,
}

/// Which rule decided a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// `--ring-numa-config` named this port and direction.
    RingNumaConfig,
    /// `--port-numa-config` named this port.
    PortNumaConfig,
    /// `--ring-bind-lcpu`: the node of the polling lcore's CPU.
    RingBindLcpu,
    /// `--socket-num`.
    SocketNum,
    /// Nothing was configured: the node of the first CPU this process may run on.
    Default,
}

impl fmt::Display for Reason {
    /// The option that decided, as printed in the start-up placement table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::RingNumaConfig => "--ring-numa-config",
            Reason::PortNumaConfig => "--port-numa-config",
            Reason::RingBindLcpu => "--ring-bind-lcpu",
            Reason::SocketNum => "--socket-num",
            Reason::Default => "default",
        })
    }
}

/// The node a queue's rings (and, for an rx queue, its mbuf pool) belong on, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Placement {
    pub node: usize,
    pub reason: Reason,
}

/// Places queue `q`: the first rule that applies, in the order of the crate docs.
///
/// With `--ring-bind-lcpu`, a polling CPU the topology does not know (offline, or not a CPU)
/// gives no node, and the rules below it decide.
pub fn place(topo: &Topology, cfg: &NumaConfig, q: QueueRef) -> Placement {
    let at = |node, reason| Placement { node, reason };
    let ring = match q.dir {
        Dir::Rx => &cfg.rx_ring_numa,
        Dir::Tx => &cfg.tx_ring_numa,
    };
    if let Some(&node) = ring.get(&q.port) {
        return at(node, Reason::RingNumaConfig);
    }
    if let Some(&node) = cfg.port_numa.get(&q.port) {
        return at(node, Reason::PortNumaConfig);
    }
    if cfg.ring_bind_lcpu {
        if let Some(node) = topo.node_of_cpu(q.lcore_cpu) {
            return at(node, Reason::RingBindLcpu);
        }
    }
    if let Some(node) = cfg.socket_num {
        return at(node, Reason::SocketNum);
    }
    at(topo.first_node(), Reason::Default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeSysfs;

    fn topo() -> Topology {
        Topology::from_sysfs(FakeSysfs::two_nodes().root()).unwrap()
    }

    fn cfg(port: Option<&str>, ring: Option<&str>, socket: Option<&str>, bind: bool) -> NumaConfig {
        NumaConfig::from_args(&topo(), port, ring, socket, bind).unwrap()
    }

    fn q(port: u16, queue: u16, dir: Dir, lcore_cpu: usize) -> QueueRef {
        QueueRef {
            port,
            queue,
            dir,
            lcore_cpu,
        }
    }

    /// (node, reason) of every queue of ports 0..2, queues 0..2, both directions, when queue q
    /// of every port is polled by `cpus[q]`.
    fn table(
        t: &Topology,
        c: &NumaConfig,
        cpus: [usize; 2],
    ) -> Vec<(u16, u16, Dir, usize, Reason)> {
        let mut out = Vec::new();
        for port in 0..2 {
            for queue in 0..2 {
                for dir in [Dir::Rx, Dir::Tx] {
                    let p = place(t, c, q(port, queue, dir, cpus[queue as usize]));
                    out.push((port, queue, dir, p.node, p.reason));
                }
            }
        }
        out
    }

    #[test]
    fn default_is_the_node_of_the_first_allowed_cpu() {
        let t = topo();
        let c = NumaConfig::default();
        for row in table(&t, &c, [1, 5]) {
            assert_eq!((row.3, row.4), (0, Reason::Default), "{row:?}");
        }
        // The process (or its lcores) on node 1 only: the default follows, even for a queue
        // polled from node 0, since ring-bind-lcpu is off.
        let t1 = t.with_allowed_cpus(&[4, 5]);
        assert_eq!(
            place(&t1, &c, q(0, 0, Dir::Rx, 1)),
            Placement {
                node: 1,
                reason: Reason::Default
            }
        );
    }

    #[test]
    fn port_numa_config_places_both_directions_of_its_port() {
        let t = topo();
        let c = cfg(Some("(1,1)"), None, None, false);
        for (port, _, _, node, reason) in table(&t, &c, [1, 5]) {
            let want = if port == 1 {
                (1, Reason::PortNumaConfig)
            } else {
                (0, Reason::Default)
            };
            assert_eq!((node, reason), want, "port {port}");
        }
    }

    #[test]
    fn ring_numa_config_rx_only_tx_only_and_both() {
        let t = topo();
        // Port 0: rx rings on node 1 only. Port 1: tx rings on node 1 only.
        let c = cfg(None, Some("(0,1,1),(1,2,1)"), None, false);
        for (port, _, dir, node, reason) in table(&t, &c, [1, 1]) {
            let want = match (port, dir) {
                (0, Dir::Rx) | (1, Dir::Tx) => (1, Reason::RingNumaConfig),
                _ => (0, Reason::Default),
            };
            assert_eq!((node, reason), want, "port {port} {dir}");
        }
        // Flag 3: both directions of port 0; port 1 untouched.
        let c = cfg(None, Some("(0,3,1)"), None, false);
        for (port, _, dir, node, reason) in table(&t, &c, [1, 1]) {
            let want = if port == 0 {
                (1, Reason::RingNumaConfig)
            } else {
                (0, Reason::Default)
            };
            assert_eq!((node, reason), want, "port {port} {dir}");
        }
    }

    #[test]
    fn ring_numa_config_beats_port_numa_config_for_its_direction() {
        let t = topo();
        let c = cfg(Some("(0,1)"), Some("(0,2,0)"), None, false);
        assert_eq!(
            place(&t, &c, q(0, 0, Dir::Tx, 1)),
            Placement {
                node: 0,
                reason: Reason::RingNumaConfig
            }
        );
        assert_eq!(
            place(&t, &c, q(0, 0, Dir::Rx, 1)),
            Placement {
                node: 1,
                reason: Reason::PortNumaConfig
            }
        );
    }

    #[test]
    fn ring_bind_lcpu_follows_the_polling_lcore() {
        let t = topo();
        let c = cfg(None, None, None, true);
        // Queue 0 of each port polled by CPU 1 (node 0), queue 1 by CPU 5 (node 1).
        for (port, queue, dir, node, reason) in table(&t, &c, [1, 5]) {
            assert_eq!(
                reason,
                Reason::RingBindLcpu,
                "port {port} queue {queue} {dir}"
            );
            assert_eq!(node, queue as usize, "port {port} queue {queue} {dir}");
        }
        // A CPU the topology does not know falls through to the default.
        assert_eq!(
            place(&t, &c, q(0, 0, Dir::Rx, 64)),
            Placement {
                node: 0,
                reason: Reason::Default
            }
        );
    }

    #[test]
    fn ring_bind_lcpu_with_a_non_contiguous_cpulist() {
        let fake = FakeSysfs::new();
        fake.file("devices/system/node/online", "0-1\n");
        fake.file("devices/system/node/node0/cpulist", "0,2,4-5\n");
        fake.file("devices/system/node/node1/cpulist", "1,3,6-7\n");
        let t = Topology::from_sysfs(fake.root()).unwrap();
        let c = NumaConfig::from_args(&t, None, None, None, true).unwrap();
        for (cpu, node) in [
            (0, 0),
            (1, 1),
            (2, 0),
            (3, 1),
            (4, 0),
            (5, 0),
            (6, 1),
            (7, 1),
        ] {
            assert_eq!(
                place(&t, &c, q(0, 0, Dir::Rx, cpu)),
                Placement {
                    node,
                    reason: Reason::RingBindLcpu
                },
                "CPU {cpu}"
            );
        }
    }

    #[test]
    fn explicit_port_and_ring_settings_override_ring_bind_lcpu() {
        let t = topo();
        // Port 0 pinned to node 0 by --port-numa-config; port 1's rx rings to node 0 by
        // --ring-numa-config. Every queue is polled from CPU 5 on node 1.
        let c = cfg(Some("(0,0)"), Some("(1,1,0)"), None, true);
        for (port, _, dir, node, reason) in table(&t, &c, [5, 5]) {
            let want = match (port, dir) {
                (0, _) => (0, Reason::PortNumaConfig),
                (1, Dir::Rx) => (0, Reason::RingNumaConfig),
                (1, Dir::Tx) => (1, Reason::RingBindLcpu),
                _ => unreachable!(),
            };
            assert_eq!((node, reason), want, "port {port} {dir}");
        }
    }

    #[test]
    fn socket_num_places_what_nothing_else_does() {
        let t = topo();
        let c = cfg(None, None, Some("1"), false);
        for (_, _, _, node, reason) in table(&t, &c, [1, 1]) {
            assert_eq!((node, reason), (1, Reason::SocketNum));
        }
        // Explicit settings win over it, and so does ring-bind-lcpu.
        let c = cfg(Some("(0,0)"), Some("(1,2,0)"), Some("1"), false);
        assert_eq!(
            place(&t, &c, q(0, 0, Dir::Tx, 5)).reason,
            Reason::PortNumaConfig
        );
        assert_eq!(
            place(&t, &c, q(1, 0, Dir::Tx, 5)).reason,
            Reason::RingNumaConfig
        );
        assert_eq!(
            place(&t, &c, q(1, 0, Dir::Rx, 5)),
            Placement {
                node: 1,
                reason: Reason::SocketNum
            }
        );
        let c = cfg(None, None, Some("1"), true);
        assert_eq!(
            place(&t, &c, q(0, 0, Dir::Rx, 1)),
            Placement {
                node: 0,
                reason: Reason::RingBindLcpu
            }
        );
    }

    #[test]
    fn without_numa_every_queue_is_on_node0() {
        let fake = FakeSysfs::new();
        fake.file("devices/system/cpu/online", "0-3\n");
        let t = Topology::from_sysfs(fake.root()).unwrap();
        let c = NumaConfig::from_args(&t, None, None, None, true).unwrap();
        for cpu in 0..4 {
            assert_eq!(place(&t, &c, q(0, 0, Dir::Rx, cpu)).node, 0);
        }
        assert!(NumaConfig::from_args(&t, Some("(0,1)"), None, None, false).is_err());
    }

    #[test]
    fn reasons_print_as_their_options() {
        assert_eq!(Reason::RingBindLcpu.to_string(), "--ring-bind-lcpu");
        assert_eq!(Reason::Default.to_string(), "default");
        assert_eq!(Dir::Tx.to_string(), "tx");
    }
}
