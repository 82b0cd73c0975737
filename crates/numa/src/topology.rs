//! The CPU → NUMA node map, read from sysfs.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use crate::{NumaError, Result};

/// Which NUMA node each online CPU belongs to, the online nodes, and the CPUs this process may
/// run on (whose first CPU decides the default node, see [`Topology::first_node`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    cpu_node: BTreeMap<usize, usize>,
    nodes: Vec<usize>,
    allowed: Vec<usize>,
}

impl Topology {
    /// Reads the topology under a sysfs root (`/sys` on a live system, a fake tree in tests):
    ///
    /// * `<root>/devices/system/node/online`: the online nodes (when missing, every `node<N>`
    ///   directory there counts);
    /// * `<root>/devices/system/node/node<N>/cpulist`: the CPUs of node N, in list syntax
    ///   (`0-3,8-11`), limited to `<root>/devices/system/cpu/online` when that file exists;
    /// * without a `node` directory (a kernel without NUMA), every CPU of
    ///   `<root>/devices/system/cpu/online` is on node 0.
    ///
    /// Every online CPU is taken as one this process may run on; see
    /// [`Topology::with_allowed_cpus`].
    pub fn from_sysfs(root: &Path) -> Result<Topology> {
        let node_dir = root.join("devices/system/node");
        let cpu_online_path = root.join("devices/system/cpu/online");
        let cpu_online = if cpu_online_path.exists() {
            Some(read_list(&cpu_online_path)?)
        } else {
            None
        };
        if !node_dir.is_dir() {
            let Some(cpus) = cpu_online else {
                return Err(NumaError::Read {
                    path: cpu_online_path,
                    source: io::Error::from(io::ErrorKind::NotFound),
                });
            };
            let cpu_node = cpus.iter().map(|&c| (c, 0)).collect();
            return Ok(Topology {
                cpu_node,
                nodes: vec![0],
                allowed: cpus,
            });
        }
        let online_path = node_dir.join("online");
        let nodes = if online_path.exists() {
            read_list(&online_path)?
        } else {
            node_dirs(&node_dir)?
        };
        let mut cpu_node = BTreeMap::new();
        for &node in &nodes {
            let path = node_dir.join(format!("node{node}/cpulist"));
            for cpu in read_list(&path)? {
                if cpu_online.as_ref().is_some_and(|on| !on.contains(&cpu)) {
                    continue;
                }
                if let Some(first) = cpu_node.insert(cpu, node) {
                    return Err(NumaError::CpuInTwoNodes {
                        cpu,
                        first,
                        second: node,
                    });
                }
            }
        }
        let allowed = cpu_node.keys().copied().collect();
        Ok(Topology {
            cpu_node,
            nodes,
            allowed,
        })
    }

    /// The live system's topology: [`Topology::from_sysfs`] on `/sys`, with the CPUs this process
    /// may run on taken from `Cpus_allowed_list` in `/proc/self/status` (all online CPUs when that
    /// cannot be read).
    pub fn system() -> Result<Topology> {
        let topo = Topology::from_sysfs(Path::new("/sys"))?;
        let allowed = fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .and_then(|list| parse_list(list).ok())
            });
        Ok(match allowed {
            Some(cpus) => topo.with_allowed_cpus(&cpus),
            None => topo,
        })
    }

    /// The same topology with the process's CPUs limited to `cpus` (ignoring CPUs that are not
    /// online). Set it to the forwarding lcores' CPUs to get testpmd's default node: the socket
    /// of the first enabled lcore. An empty intersection keeps the current set.
    pub fn with_allowed_cpus(mut self, cpus: &[usize]) -> Topology {
        let mut allowed: Vec<usize> = cpus
            .iter()
            .copied()
            .filter(|c| self.cpu_node.contains_key(c))
            .collect();
        allowed.sort_unstable();
        allowed.dedup();
        if !allowed.is_empty() {
            self.allowed = allowed;
        }
        self
    }

    /// The node of `cpu`, or None when it is not an online CPU.
    pub fn node_of_cpu(&self, cpu: usize) -> Option<usize> {
        self.cpu_node.get(&cpu).copied()
    }

    /// The online nodes, ascending (nodes without CPUs included: they may still hold memory).
    pub fn nodes(&self) -> &[usize] {
        &self.nodes
    }

    /// Whether `node` is an online node.
    pub fn has_node(&self, node: usize) -> bool {
        self.nodes.binary_search(&node).is_ok()
    }

    /// The online CPUs, ascending.
    pub fn cpus(&self) -> Vec<usize> {
        self.cpu_node.keys().copied().collect()
    }

    /// The online CPUs of `node`, ascending.
    pub fn cpus_of_node(&self, node: usize) -> Vec<usize> {
        self.cpu_node
            .iter()
            .filter(|&(_, &n)| n == node)
            .map(|(&c, _)| c)
            .collect()
    }

    /// The CPUs this process may run on, ascending.
    pub fn allowed_cpus(&self) -> &[usize] {
        &self.allowed
    }

    /// The default node: that of the first CPU this process may run on (testpmd: `socket_ids[0]`,
    /// the socket of the first enabled lcore), else the first online node, else 0.
    pub fn first_node(&self) -> usize {
        self.allowed
            .iter()
            .find_map(|&c| self.node_of_cpu(c))
            .or_else(|| self.nodes.first().copied())
            .unwrap_or(0)
    }
}

fn read_list(path: &Path) -> Result<Vec<usize>> {
    let text = fs::read_to_string(path).map_err(|source| NumaError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_list(&text).map_err(|()| NumaError::List {
        what: path.display().to_string(),
        text: text.trim().to_string(),
    })
}

/// The N of every `node<N>` entry in `dir`, ascending.
fn node_dirs(dir: &Path) -> Result<Vec<usize>> {
    let read_err = |source| NumaError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut nodes = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_err)? {
        let name = entry.map_err(read_err)?.file_name();
        if let Some(n) = name
            .to_str()
            .and_then(|s| s.strip_prefix("node"))
            .and_then(|n| n.parse().ok())
        {
            nodes.push(n);
        }
    }
    nodes.sort_unstable();
    Ok(nodes)
}

/// Parses the kernel's list syntax (`0-3,8-11`, `0,2,4-5`, or empty) into sorted, distinct
/// numbers.
pub fn parse_cpu_list(text: &str) -> std::result::Result<Vec<usize>, NumaError> {
    parse_list(text).map_err(|()| NumaError::List {
        what: "CPU list".to_string(),
        text: text.trim().to_string(),
    })
}

/// Formats CPUs compactly in the same syntax (`0-3,8`), ranges where they run on.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

fn parse_list(text: &str) -> std::result::Result<Vec<usize>, ()> {
    let text = text.trim();
    let mut out = Vec::new();
    if text.is_empty() {
        return Ok(out);
    }
    for part in text.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => {
                let n = number(part)?;
                (n, n)
            }
        };
        if lo > hi {
            return Err(());
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn number(s: &str) -> std::result::Result<usize, ()> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(());
    }
    s.parse().map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeSysfs;

    #[test]
    fn lists_parse_like_the_kernel_prints_them() {
        assert_eq!(
            parse_list("0-3,8-11\n").unwrap(),
            [0, 1, 2, 3, 8, 9, 10, 11]
        );
        assert_eq!(parse_list("0,2,4-5").unwrap(), [0, 2, 4, 5]);
        assert_eq!(parse_list("7").unwrap(), [7]);
        assert_eq!(parse_list("\n").unwrap(), Vec::<usize>::new());
        for bad in ["3-1", "a", "1-", "-1", "0,,1", "0-7:2/4", "1 2"] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
        assert_eq!(format_cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(format_cpu_list(&[]), "");
        let e = parse_cpu_list("0-x").unwrap_err();
        assert!(e.to_string().contains("\"0-x\""), "{e}");
    }

    #[test]
    fn two_nodes() {
        let fake = FakeSysfs::two_nodes();
        let t = Topology::from_sysfs(fake.root()).unwrap();
        assert_eq!(t.nodes(), [0, 1]);
        assert_eq!(t.cpus(), (0..8).collect::<Vec<_>>());
        assert_eq!(t.node_of_cpu(1), Some(0));
        assert_eq!(t.node_of_cpu(5), Some(1));
        assert_eq!(t.node_of_cpu(8), None);
        assert_eq!(t.cpus_of_node(1), [4, 5, 6, 7]);
        assert_eq!(t.first_node(), 0);
        let t = t.with_allowed_cpus(&[6, 5, 99]);
        assert_eq!(t.allowed_cpus(), [5, 6]);
        assert_eq!(t.first_node(), 1);
        assert_eq!(t.clone().with_allowed_cpus(&[42]).allowed_cpus(), [5, 6]);
    }

    #[test]
    fn non_contiguous_cpulists_and_offline_cpus() {
        let fake = FakeSysfs::new();
        fake.file("devices/system/node/online", "0-1\n");
        fake.file("devices/system/node/node0/cpulist", "0,2,4-5\n");
        fake.file("devices/system/node/node1/cpulist", "1,3,6-7\n");
        fake.file("devices/system/cpu/online", "0-6\n");
        let t = Topology::from_sysfs(fake.root()).unwrap();
        assert_eq!(t.cpus_of_node(0), [0, 2, 4, 5]);
        assert_eq!(t.cpus_of_node(1), [1, 3, 6]);
        assert_eq!(t.node_of_cpu(3), Some(1));
        assert_eq!(t.node_of_cpu(7), None, "CPU 7 is offline");
    }

    #[test]
    fn memoryless_and_cpuless_nodes_and_no_online_file() {
        let fake = FakeSysfs::new();
        fake.file("devices/system/node/node0/cpulist", "0-1\n");
        fake.file("devices/system/node/node2/cpulist", "\n");
        let t = Topology::from_sysfs(fake.root()).unwrap();
        assert_eq!(t.nodes(), [0, 2]);
        assert!(t.has_node(2) && !t.has_node(1));
        assert_eq!(t.cpus(), [0, 1]);
    }

    #[test]
    fn without_a_node_directory_every_cpu_is_on_node0() {
        let fake = FakeSysfs::new();
        fake.file("devices/system/cpu/online", "0-3\n");
        let t = Topology::from_sysfs(fake.root()).unwrap();
        assert_eq!(t.nodes(), [0]);
        assert_eq!(t.cpus(), [0, 1, 2, 3]);
        assert_eq!(t.node_of_cpu(3), Some(0));
        assert_eq!(t.first_node(), 0);
    }

    #[test]
    fn broken_trees_are_reported_with_the_file() {
        let fake = FakeSysfs::new();
        let e = Topology::from_sysfs(fake.root()).unwrap_err();
        assert!(e.to_string().contains("devices/system/cpu/online"), "{e}");

        fake.file("devices/system/node/online", "0-1\n");
        fake.file("devices/system/node/node0/cpulist", "0-3\n");
        let e = Topology::from_sysfs(fake.root()).unwrap_err();
        assert!(e.to_string().contains("node1/cpulist"), "{e}");

        fake.file("devices/system/node/node1/cpulist", "3-4\n");
        let e = Topology::from_sysfs(fake.root()).unwrap_err();
        assert_eq!(e.to_string(), "CPU 3 is listed in both node 0 and node 1");

        fake.file("devices/system/node/node1/cpulist", "4-x\n");
        let e = Topology::from_sysfs(fake.root()).unwrap_err();
        assert!(e.to_string().contains("\"4-x\""), "{e}");
    }

    #[test]
    fn the_live_system_has_a_node_for_every_allowed_cpu() {
        let t = Topology::system().unwrap();
        assert!(!t.nodes().is_empty());
        assert!(!t.allowed_cpus().is_empty());
        for &c in t.allowed_cpus() {
            assert!(t.node_of_cpu(c).is_some_and(|n| t.has_node(n)), "CPU {c}");
        }
    }
}
