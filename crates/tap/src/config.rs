//! Devargs of a TAP port, with DPDK `net_tap`'s names.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use memnic_ethdev::{Devargs, DevargsError, MacAddr};
use memnic_shm::tap::MAX_NAME_LEN;

/// Devargs keys: DPDK `net_tap`'s `iface`, `mac` and `persist`, and `queues`.
pub const DEVARGS_KEYS: &[&str] = &["iface", "queues", "mac", "persist"];

/// Most queue pairs a port offers (DPDK's `RTE_PMD_TAP_MAX_QUEUES`).
pub const MAX_QUEUES: u16 = 16;

/// The name DPDK gives an interface when `iface` is left out: the kernel picks the number.
pub const DEFAULT_IFACE: &str = "dtap%d";

/// How a TAP port is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapConfig {
    /// The interface's name; `dtap%d` (`DEFAULT_IFACE`) when not given.
    pub iface: String,
    /// Queue pairs (one descriptor each).
    pub queues: u16,
    /// The interface's Ethernet address; the kernel's random one when `None`.
    pub mac: Option<MacAddr>,
    /// Keep the interface when the port closes (`TUNSETPERSIST`).
    pub persist: bool,
}

impl Default for TapConfig {
    fn default() -> TapConfig {
        TapConfig {
            iface: DEFAULT_IFACE.to_string(),
            queues: 1,
            mac: None,
            persist: false,
        }
    }
}

impl TapConfig {
    pub fn from_devargs(a: &Devargs) -> Result<TapConfig, DevargsError> {
        let mut c = TapConfig::default();
        if let Some(name) = a.get("iface") {
            check_iface(a, name)?;
            c.iface = name.to_string();
        }
        c.queues = a.parse_or("queues", 1u16)?;
        if !(1..=MAX_QUEUES).contains(&c.queues) {
            return Err(a.bad(
                "queues",
                &c.queues.to_string(),
                format!("queue pairs, 1..={MAX_QUEUES}"),
            ));
        }
        if let Some(m) = a.get("mac") {
            c.mac = Some(parse_mac(a, m)?);
        }
        c.persist = a.bool_or("persist", false)?;
        Ok(c)
    }
}

/// An interface name the kernel takes as it is: 1 to 15 bytes, not `.` or `..`, no `/`, `:`,
/// `%` or white space.
fn check_iface(a: &Devargs, name: &str) -> Result<(), DevargsError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(a.bad(
            "iface",
            name,
            format!("an interface name is 1 to {MAX_NAME_LEN} bytes"),
        ));
    }
    if name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c == '%' || c.is_whitespace())
    {
        return Err(a.bad(
            "iface",
            name,
            "an interface name has no '/', ':', '%' or spaces and is not '.' or '..' (leave iface out to get dtapN)",
        ));
    }
    Ok(())
}

/// `fixed` (DPDK's 02:64:74:61:70:3N, "\x02dtap" and the digit of the how-manyth fixed
/// address this process hands out) or a unicast address.
fn parse_mac(a: &Devargs, m: &str) -> Result<MacAddr, DevargsError> {
    if m == "fixed" {
        static FIXED: AtomicU8 = AtomicU8::new(0);
        // Relaxed: only the uniqueness of the number matters, nothing is published with it.
        let n = FIXED.fetch_add(1, Relaxed);
        return Ok(MacAddr([
            0x02,
            b'd',
            b't',
            b'a',
            b'p',
            b'0'.wrapping_add(n),
        ]));
    }
    let mac: MacAddr = m.parse().map_err(|e: String| a.bad("mac", m, e))?;
    if mac.is_multicast() || mac.0 == [0; 6] {
        return Err(a.bad(
            "mac",
            m,
            "an interface's address is unicast and not all zeros",
        ));
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<TapConfig, String> {
        let a = Devargs::parse(s, DEVARGS_KEYS).map_err(|e| e.to_string())?;
        TapConfig::from_devargs(&a).map_err(|e| e.to_string())
    }

    #[test]
    fn dpdk_form_and_defaults() {
        assert_eq!(parse("net_tap0").unwrap(), TapConfig::default());
        assert_eq!(TapConfig::default().iface, "dtap%d");
        let c = parse("tap1,iface=veth-a.7,queues=4,mac=02:00:00:00:00:0a,persist=yes").unwrap();
        assert_eq!(
            c,
            TapConfig {
                iface: "veth-a.7".into(),
                queues: 4,
                mac: Some("02:00:00:00:00:0a".parse().unwrap()),
                persist: true,
            }
        );
        // Fixed addresses: DPDK's, one digit further each time.
        let a = parse("tap0,mac=fixed").unwrap().mac.unwrap();
        let b = parse("tap1,mac=fixed").unwrap().mac.unwrap();
        assert_eq!(&a.0[..5], &[0x02, 0x64, 0x74, 0x61, 0x70]);
        assert_eq!(b.0[5], a.0[5] + 1);
        assert!(!a.is_multicast() && a.is_locally_administered());
    }

    #[test]
    fn bad_values_are_one_sentence() {
        for (s, want) in [
            (
                "tap0,iface=",
                "bad value '' for 'iface': an interface name is 1 to 15 bytes",
            ),
            (
                "tap0,iface=sixteen-chars-xx",
                "an interface name is 1 to 15 bytes",
            ),
            ("tap0,iface=a/b", "has no '/', ':', '%' or spaces"),
            ("tap0,iface=tap%d", "has no '/', ':', '%' or spaces"),
            ("tap0,iface=a b", "has no '/', ':', '%' or spaces"),
            ("tap0,iface=..", "is not '.' or '..'"),
            (
                "tap0,queues=0",
                "bad value '0' for 'queues': queue pairs, 1..=16",
            ),
            (
                "tap0,queues=17",
                "bad value '17' for 'queues': queue pairs, 1..=16",
            ),
            ("tap0,queues=x", "bad value 'x' for 'queues'"),
            (
                "tap0,mac=zz",
                "bad value 'zz' for 'mac': 'zz' is not a MAC address",
            ),
            ("tap0,mac=01:00:5e:00:00:01", "unicast and not all zeros"),
            ("tap0,mac=00:00:00:00:00:00", "unicast and not all zeros"),
            (
                "tap0,persist=maybe",
                "bad value 'maybe' for 'persist': expected yes or no",
            ),
            (
                "tap0,remote=eth0",
                "unknown key 'remote' (known keys: iface, queues, mac, persist)",
            ),
        ] {
            let e = parse(s).unwrap_err();
            assert!(e.starts_with("port 'tap0': "), "{s}: {e}");
            assert!(e.contains(want), "{s}: {e}");
        }
    }
}
