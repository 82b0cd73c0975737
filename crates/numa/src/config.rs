//! testpmd's NUMA options: `--port-numa-config`, `--ring-numa-config`, `--socket-num` and the
//! proposed `--ring-bind-lcpu`.

use std::collections::BTreeMap;

use crate::{NumaError, Result, Topology};

const PORT_NUMA: &str = "--port-numa-config";
const RING_NUMA: &str = "--ring-numa-config";
const SOCKET_NUM: &str = "--socket-num";
const PORT_FORM: &str = "(port,socket)";
const RING_FORM: &str = "(port,flag,socket)";

/// The NUMA settings of a testpmd run, validated against a [`Topology`].
///
/// Build it with [`NumaConfig::from_args`] or the `add_*`/`set_*` methods (each may be called
/// repeatedly, as testpmd allows an option to be repeated; a later entry for the same port wins,
/// as in testpmd's arrays `port_numa[]`, `rxring_numa[]` and `txring_numa[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NumaConfig {
    /// `--port-numa-config`: port → node of its pools and, unless a ring setting says otherwise,
    /// its rings.
    pub port_numa: BTreeMap<u16, usize>,
    /// `--ring-numa-config` with flag 1 or 3: port → node of its rx rings (and their pools).
    pub rx_ring_numa: BTreeMap<u16, usize>,
    /// `--ring-numa-config` with flag 2 or 3: port → node of its tx rings.
    pub tx_ring_numa: BTreeMap<u16, usize>,
    /// `--socket-num`: the node for everything no other setting places.
    pub socket_num: Option<usize>,
    /// `--ring-bind-lcpu`: place each queue on the node of the lcore that polls it.
    pub ring_bind_lcpu: bool,
}

impl NumaConfig {
    /// The configuration of one command line: every `--port-numa-config` and
    /// `--ring-numa-config` value given (an `Option<&str>` or a list of them), `--socket-num` and
    /// `--ring-bind-lcpu`.
    pub fn from_args<'a>(
        topo: &Topology,
        port_numa_config: impl IntoIterator<Item = &'a str>,
        ring_numa_config: impl IntoIterator<Item = &'a str>,
        socket_num: Option<&str>,
        ring_bind_lcpu: bool,
    ) -> Result<NumaConfig> {
        let mut cfg = NumaConfig {
            ring_bind_lcpu,
            ..NumaConfig::default()
        };
        for arg in port_numa_config {
            cfg.add_port_numa_config(topo, arg)?;
        }
        for arg in ring_numa_config {
            cfg.add_ring_numa_config(topo, arg)?;
        }
        if let Some(arg) = socket_num {
            cfg.set_socket_num(topo, arg)?;
        }
        Ok(cfg)
    }

    /// Adds the entries of `--port-numa-config=(port,socket)[,(port,socket)]`.
    pub fn add_port_numa_config(&mut self, topo: &Topology, arg: &str) -> Result<()> {
        for item in groups(PORT_NUMA, PORT_FORM, arg)? {
            let [port, socket] = fields::<2>(PORT_NUMA, PORT_FORM, item)?;
            let port = port_id(PORT_NUMA, port, item)?;
            let socket = socket_id(topo, PORT_NUMA, socket, item)?;
            self.port_numa.insert(port, socket);
        }
        Ok(())
    }

    /// Adds the entries of `--ring-numa-config=(port,flag,socket)[,(port,flag,socket)]`, where
    /// flag 1 names the rx rings, 2 the tx rings and 3 both.
    pub fn add_ring_numa_config(&mut self, topo: &Topology, arg: &str) -> Result<()> {
        for item in groups(RING_NUMA, RING_FORM, arg)? {
            let [port, flag, socket] = fields::<3>(RING_NUMA, RING_FORM, item)?;
            let port = port_id(RING_NUMA, port, item)?;
            let flag = number(RING_NUMA, "flag", flag, item)?;
            if !(1..=3).contains(&flag) {
                return Err(NumaError::RingFlag {
                    flag,
                    item: item.to_string(),
                });
            }
            let socket = socket_id(topo, RING_NUMA, socket, item)?;
            if flag & 1 != 0 {
                self.rx_ring_numa.insert(port, socket);
            }
            if flag & 2 != 0 {
                self.tx_ring_numa.insert(port, socket);
            }
        }
        Ok(())
    }

    /// Sets `--socket-num=N`.
    pub fn set_socket_num(&mut self, topo: &Topology, arg: &str) -> Result<()> {
        let n = number(SOCKET_NUM, "socket", arg.trim(), "")?;
        self.socket_num = Some(known_socket(topo, SOCKET_NUM, n, "")?);
        Ok(())
    }

    /// Checks that every port named by `--port-numa-config` or `--ring-numa-config` exists, once
    /// the ports are known (testpmd checks this while parsing, as its ports exist by then).
    pub fn check_ports(&self, nb_ports: u16) -> Result<()> {
        let named = [
            (PORT_NUMA, &self.port_numa),
            (RING_NUMA, &self.rx_ring_numa),
            (RING_NUMA, &self.tx_ring_numa),
        ];
        for (option, map) in named {
            if let Some(&port) = map.keys().find(|&&p| p >= nb_ports) {
                return Err(NumaError::UnknownPort {
                    option,
                    port,
                    known: match nb_ports {
                        0 => "there are no ports".to_string(),
                        n => format!("the ports are 0 to {}", n - 1),
                    },
                });
            }
        }
        Ok(())
    }
}

/// Splits `(a,b),(c,d)` into the items `(a,b)` and `(c,d)`, refusing anything else.
fn groups<'a>(option: &'static str, form: &'static str, arg: &'a str) -> Result<Vec<&'a str>> {
    let syntax = |item: &str| NumaError::Syntax {
        option,
        item: item.to_string(),
        form,
    };
    let mut rest = arg.trim();
    if rest.is_empty() {
        return Err(NumaError::Empty { option, form });
    }
    let mut items = Vec::new();
    loop {
        if !rest.starts_with('(') {
            return Err(syntax(rest));
        }
        let Some(close) = rest.find(')') else {
            return Err(syntax(rest));
        };
        items.push(&rest[..=close]);
        rest = rest[close + 1..].trim_start();
        if rest.is_empty() {
            return Ok(items);
        }
        let Some(next) = rest.strip_prefix(',') else {
            return Err(syntax(rest));
        };
        rest = next.trim_start();
        if rest.is_empty() {
            return Err(syntax(arg.trim()));
        }
    }
}

/// The N comma-separated fields inside the parentheses of `item`.
fn fields<'a, const N: usize>(
    option: &'static str,
    form: &'static str,
    item: &'a str,
) -> Result<[&'a str; N]> {
    let inner = &item[1..item.len() - 1];
    let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
    parts.try_into().map_err(|_| NumaError::Syntax {
        option,
        item: item.to_string(),
        form,
    })
}

/// A decimal or `0x` hexadecimal number (testpmd uses `strtoul(.., 0)`).
fn number(option: &'static str, field: &'static str, text: &str, item: &str) -> Result<u64> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(hex, 16).ok()
        }
        Some(_) => None,
        None if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => text.parse().ok(),
        None => None,
    };
    parsed.ok_or_else(|| NumaError::Number {
        option,
        field,
        text: text.to_string(),
        context: in_item(item),
    })
}

fn in_item(item: &str) -> String {
    if item.is_empty() {
        String::new()
    } else {
        format!(" in {item}")
    }
}

fn port_id(option: &'static str, text: &str, item: &str) -> Result<u16> {
    let n = number(option, "port", text, item)?;
    u16::try_from(n).map_err(|_| NumaError::PortTooLarge {
        option,
        port: n,
        item: item.to_string(),
    })
}

fn socket_id(topo: &Topology, option: &'static str, text: &str, item: &str) -> Result<usize> {
    let n = number(option, "socket", text, item)?;
    known_socket(topo, option, n, item)
}

fn known_socket(topo: &Topology, option: &'static str, n: u64, item: &str) -> Result<usize> {
    match usize::try_from(n) {
        Ok(node) if topo.has_node(node) => Ok(node),
        _ => Err(NumaError::UnknownSocket {
            option,
            socket: n,
            context: in_item(item),
            nodes: topo
                .nodes()
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeSysfs;

    fn topo() -> Topology {
        Topology::from_sysfs(FakeSysfs::two_nodes().root()).unwrap()
    }

    fn err(port: Option<&str>, ring: Option<&str>, socket: Option<&str>) -> String {
        NumaConfig::from_args(&topo(), port, ring, socket, false)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn port_numa_config_parses_like_testpmd() {
        let t = topo();
        let cfg =
            NumaConfig::from_args(&t, Some("(0,1),(1,0), (2, 0x1)"), None, None, false).unwrap();
        assert_eq!(cfg.port_numa, BTreeMap::from([(0, 1), (1, 0), (2, 1)]));
        assert!(cfg.rx_ring_numa.is_empty() && cfg.tx_ring_numa.is_empty());
        // Repeated options add up; a later entry for a port wins.
        let cfg = NumaConfig::from_args(&t, ["(0,1)", "(0,0),(3,1)"], None, None, false).unwrap();
        assert_eq!(cfg.port_numa, BTreeMap::from([(0, 0), (3, 1)]));
    }

    #[test]
    fn ring_numa_config_flags_select_rx_tx_or_both() {
        let cfg = NumaConfig::from_args(
            &topo(),
            None,
            Some("(0,1,1),(1,2,1),(2,3,1),(3,3,0),(3,1,1)"),
            None,
            true,
        )
        .unwrap();
        assert_eq!(cfg.rx_ring_numa, BTreeMap::from([(0, 1), (2, 1), (3, 1)]));
        assert_eq!(cfg.tx_ring_numa, BTreeMap::from([(1, 1), (2, 1), (3, 0)]));
        assert!(cfg.port_numa.is_empty());
        assert!(cfg.ring_bind_lcpu);
    }

    #[test]
    fn socket_num_must_be_a_node() {
        let t = topo();
        let cfg = NumaConfig::from_args(&t, None, None, Some("1"), false).unwrap();
        assert_eq!(cfg.socket_num, Some(1));
        assert_eq!(
            err(None, None, Some("2")),
            "--socket-num: socket 2 is not a NUMA node of this machine (its nodes are 0, 1)"
        );
        assert_eq!(
            err(None, None, Some("one")),
            "--socket-num: socket \"one\" is not a number"
        );
        assert_eq!(
            err(None, None, Some("")),
            "--socket-num: socket \"\" is not a number"
        );
    }

    #[test]
    fn port_numa_config_errors_name_the_bad_item() {
        let cases = [
            ("", "--port-numa-config is empty; give one or more (port,socket)"),
            (
                "0,1",
                "--port-numa-config: \"0,1\" is not of the form (port,socket)[,(port,socket)...]",
            ),
            (
                "(0,1",
                "--port-numa-config: \"(0,1\" is not of the form (port,socket)[,(port,socket)...]",
            ),
            (
                "(0,1)(1,1)",
                "--port-numa-config: \"(1,1)\" is not of the form (port,socket)[,(port,socket)...]",
            ),
            (
                "(0,1);(1,1)",
                "--port-numa-config: \";(1,1)\" is not of the form (port,socket)[,(port,socket)...]",
            ),
            (
                "(0,1),",
                "--port-numa-config: \"(0,1),\" is not of the form (port,socket)[,(port,socket)...]",
            ),
            (
                "(0,1,1)",
                "--port-numa-config: \"(0,1,1)\" is not of the form (port,socket)[,(port,socket)...]",
            ),
            (
                "(0)",
                "--port-numa-config: \"(0)\" is not of the form (port,socket)[,(port,socket)...]",
            ),
            (
                "(x,1)",
                "--port-numa-config: port \"x\" in (x,1) is not a number",
            ),
            (
                "(-1,1)",
                "--port-numa-config: port \"-1\" in (-1,1) is not a number",
            ),
            (
                "(0,0x)",
                "--port-numa-config: socket \"0x\" in (0,0x) is not a number",
            ),
            (
                "(0,)",
                "--port-numa-config: socket \"\" in (0,) is not a number",
            ),
            (
                "(65536,0)",
                "--port-numa-config: port 65536 in (65536,0) is above the largest port id 65535",
            ),
            (
                "(0,1),(1,2)",
                "--port-numa-config: socket 2 in (1,2) is not a NUMA node of this machine (its nodes are 0, 1)",
            ),
            (
                "(0,99999999999999999999)",
                "--port-numa-config: socket \"99999999999999999999\" in (0,99999999999999999999) is not a number",
            ),
        ];
        for (arg, want) in cases {
            assert_eq!(err(Some(arg), None, None), want, "{arg}");
        }
    }

    #[test]
    fn ring_numa_config_errors_name_the_bad_item() {
        let cases = [
            (
                "(0,4,1)",
                "--ring-numa-config: flag 4 in (0,4,1) is not 1 (rx), 2 (tx) or 3 (both)",
            ),
            (
                "(0,1,1),(1,0,1)",
                "--ring-numa-config: flag 0 in (1,0,1) is not 1 (rx), 2 (tx) or 3 (both)",
            ),
            (
                "(0,rx,1)",
                "--ring-numa-config: flag \"rx\" in (0,rx,1) is not a number",
            ),
            (
                "(0,1)",
                "--ring-numa-config: \"(0,1)\" is not of the form (port,flag,socket)[,(port,flag,socket)...]",
            ),
            (
                "(0,3,7)",
                "--ring-numa-config: socket 7 in (0,3,7) is not a NUMA node of this machine (its nodes are 0, 1)",
            ),
            (
                "(70000,1,0)",
                "--ring-numa-config: port 70000 in (70000,1,0) is above the largest port id 65535",
            ),
            (
                " ",
                "--ring-numa-config is empty; give one or more (port,flag,socket)",
            ),
        ];
        for (arg, want) in cases {
            assert_eq!(err(None, Some(arg), None), want, "{arg}");
        }
    }

    #[test]
    fn ports_are_checked_once_known() {
        let t = topo();
        let cfg = NumaConfig::from_args(&t, Some("(1,0)"), Some("(0,2,1)"), None, false).unwrap();
        cfg.check_ports(2).unwrap();
        assert_eq!(
            cfg.check_ports(1).unwrap_err().to_string(),
            "--port-numa-config names port 1, but the ports are 0 to 0"
        );
        let cfg = NumaConfig::from_args(&t, None, Some("(3,2,1)"), None, false).unwrap();
        assert_eq!(
            cfg.check_ports(0).unwrap_err().to_string(),
            "--ring-numa-config names port 3, but there are no ports"
        );
    }
}
