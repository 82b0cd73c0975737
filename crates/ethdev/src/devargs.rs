//! DPDK-style device arguments: `memnic0,path=/dev/shm/vm1,role=guest`.

use std::str::FromStr;

/// A bad device-argument string, said in one sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DevargsError {
    #[error("empty device arguments: expected NAME,key=value,... (for example memnic0,path=/dev/shm/vm1,role=guest)")]
    Empty,
    #[error("port '{port}': '{item}' is not key=value")]
    NotKeyValue { port: String, item: String },
    #[error("port '{port}': unknown key '{key}' (known keys: {known})")]
    UnknownKey {
        port: String,
        key: String,
        known: String,
    },
    #[error("port '{port}': key '{key}' is given twice")]
    Duplicate { port: String, key: String },
    #[error("port '{port}': missing required key '{key}'")]
    Missing { port: String, key: String },
    #[error("port '{port}': bad value '{value}' for '{key}': {why}")]
    BadValue {
        port: String,
        key: String,
        value: String,
        why: String,
    },
}

/// Parsed device arguments: a port name and its key/value pairs, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devargs {
    pub name: String,
    pub pairs: Vec<(String, String)>,
}

impl Devargs {
    /// Parses `s`, accepting only `known` keys.
    pub fn parse(s: &str, known: &[&str]) -> Result<Devargs, DevargsError> {
        let mut items = s.split(',');
        let name = items.next().map(str::trim).unwrap_or("");
        if name.is_empty() || name.contains('=') {
            return Err(DevargsError::Empty);
        }
        let port = name.to_string();
        let mut pairs: Vec<(String, String)> = Vec::new();
        for item in items {
            let Some((k, v)) = item.split_once('=') else {
                return Err(DevargsError::NotKeyValue {
                    port,
                    item: item.to_string(),
                });
            };
            let (k, v) = (k.trim(), v.trim());
            if !known.contains(&k) {
                return Err(DevargsError::UnknownKey {
                    port,
                    key: k.to_string(),
                    known: known.join(", "),
                });
            }
            if pairs.iter().any(|(pk, _)| pk == k) {
                return Err(DevargsError::Duplicate {
                    port,
                    key: k.to_string(),
                });
            }
            pairs.push((k.to_string(), v.to_string()));
        }
        Ok(Devargs { name: port, pairs })
    }

    /// The driver named by the port: `memnic0` and `net_memnic0` both give `memnic`.
    pub fn driver(&self) -> &str {
        let n = self.name.strip_prefix("net_").unwrap_or(&self.name);
        n.trim_end_matches(|c: char| c.is_ascii_digit())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn require(&self, key: &str) -> Result<&str, DevargsError> {
        self.get(key).ok_or_else(|| DevargsError::Missing {
            port: self.name.clone(),
            key: key.to_string(),
        })
    }

    pub fn bad(&self, key: &str, value: &str, why: impl Into<String>) -> DevargsError {
        DevargsError::BadValue {
            port: self.name.clone(),
            key: key.into(),
            value: value.into(),
            why: why.into(),
        }
    }

    /// Parses the value of `key` with `FromStr`, or returns `default` when absent.
    pub fn parse_or<T: FromStr>(&self, key: &str, default: T) -> Result<T, DevargsError>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|e: T::Err| self.bad(key, v, e.to_string())),
        }
    }

    /// A yes/no value (`yes|no|1|0|true|false|on|off`), `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, DevargsError> {
        match self.get(key) {
            None => Ok(default),
            Some("yes" | "1" | "true" | "on") => Ok(true),
            Some("no" | "0" | "false" | "off") => Ok(false),
            Some(v) => Err(self.bad(key, v, "expected yes or no")),
        }
    }

    /// One of `choices`, `default` when absent.
    pub fn choice_or<'a>(
        &self,
        key: &str,
        choices: &[&'a str],
        default: &'a str,
    ) -> Result<&'a str, DevargsError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => {
                choices.iter().find(|c| **c == v).copied().ok_or_else(|| {
                    self.bad(key, v, format!("expected one of {}", choices.join(", ")))
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const KEYS: &[&str] = &["path", "role", "framesz"];

    #[test]
    fn parses_dpdk_form() {
        let d = Devargs::parse("memnic0,path=/dev/shm/vm1,role=guest", KEYS).unwrap();
        assert_eq!(d.name, "memnic0");
        assert_eq!(d.driver(), "memnic");
        assert_eq!(d.get("path"), Some("/dev/shm/vm1"));
        assert_eq!(
            d.choice_or("role", &["host", "guest"], "guest").unwrap(),
            "guest"
        );
        assert_eq!(d.parse_or("framesz", 1518u32).unwrap(), 1518);
        assert_eq!(
            Devargs::parse("net_memnic12", KEYS).unwrap().driver(),
            "memnic"
        );
    }

    #[test]
    fn rejects_with_one_sentence() {
        let e = Devargs::parse("memnic0,pth=/x", KEYS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "port 'memnic0': unknown key 'pth' (known keys: path, role, framesz)"
        );
        assert!(matches!(Devargs::parse("", KEYS), Err(DevargsError::Empty)));
        assert!(matches!(
            Devargs::parse("path=/x", KEYS),
            Err(DevargsError::Empty)
        ));
        assert!(matches!(
            Devargs::parse("m0,path", KEYS),
            Err(DevargsError::NotKeyValue { .. })
        ));
        assert!(matches!(
            Devargs::parse("m0,path=a,path=b", KEYS),
            Err(DevargsError::Duplicate { .. })
        ));
        let d = Devargs::parse("m0,role=gust,framesz=big", KEYS).unwrap();
        assert_eq!(
            d.choice_or("role", &["host", "guest"], "guest")
                .unwrap_err()
                .to_string(),
            "port 'm0': bad value 'gust' for 'role': expected one of host, guest"
        );
        assert!(d.parse_or("framesz", 0u32).is_err());
        assert!(d
            .require("path")
            .unwrap_err()
            .to_string()
            .contains("missing required key 'path'"));
    }
}
