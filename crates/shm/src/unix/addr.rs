//! Where a control socket lives: a path or a Linux abstract name, and the exact
//! `sockaddr_un` (and length) that DPDK uses for each.

use std::fmt;
use std::mem::offset_of;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::{Result, ShmError};

/// Bytes of `sun_path` in a `sockaddr_un` on Linux.
const SUN_PATH_LEN: usize = 108;

/// Where a memif control socket lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SocketAddrSpec {
    /// A socket file, e.g. `/run/memif.sock` (memif's `socket-abstract=no`).
    Path(PathBuf),
    /// A Linux abstract name: `sun_path[0]` is NUL and these bytes follow, with no padding
    /// counted in the address length (memif's `socket-abstract=yes`; DPDK 22.11's default).
    Abstract(Vec<u8>),
}

impl SocketAddrSpec {
    /// The address memif devargs describe: `socket=NAME`, `socket-abstract=yes|no`.
    pub fn memif(socket: &str, is_abstract: bool) -> SocketAddrSpec {
        if is_abstract {
            SocketAddrSpec::Abstract(socket.as_bytes().to_vec())
        } else {
            SocketAddrSpec::Path(PathBuf::from(socket))
        }
    }

    /// The `sockaddr_un` and its length: `offsetof(sun_path) + strlen + 1` for a path,
    /// `offsetof(sun_path) + 1 + len` for an abstract name.
    pub(super) fn to_raw(&self) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
        let bad = |reason| ShmError::BadSocketAddr {
            addr: self.to_string(),
            reason,
        };
        let mut raw = libc::sockaddr_un {
            sun_family: libc::AF_UNIX as libc::sa_family_t,
            sun_path: [0; SUN_PATH_LEN],
        };
        let base = offset_of!(libc::sockaddr_un, sun_path);
        let (start, bytes, len) = match self {
            SocketAddrSpec::Path(p) => {
                let b = p.as_os_str().as_bytes();
                if b.is_empty() {
                    return Err(bad("the path is empty"));
                }
                if b.len() >= SUN_PATH_LEN {
                    return Err(bad(
                        "the path is longer than the 107 bytes a socket path may have",
                    ));
                }
                (0, b, base + b.len() + 1)
            }
            SocketAddrSpec::Abstract(b) => {
                if b.is_empty() {
                    return Err(bad("the abstract name is empty"));
                }
                if b.len() >= SUN_PATH_LEN {
                    return Err(bad("the abstract name is longer than 107 bytes"));
                }
                (1, b.as_slice(), base + 1 + b.len())
            }
        };
        if bytes.contains(&0) {
            return Err(bad("the name contains a NUL byte"));
        }
        for (dst, &src) in raw.sun_path[start..].iter_mut().zip(bytes) {
            *dst = src as libc::c_char;
        }
        Ok((raw, len as libc::socklen_t))
    }
}

impl fmt::Display for SocketAddrSpec {
    /// A path as is; an abstract name as `@name`, the way `ss -x` shows it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SocketAddrSpec::Path(p) => write!(f, "{}", p.display()),
            SocketAddrSpec::Abstract(b) => write!(f, "@{}", String::from_utf8_lossy(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unix::SeqpacketListener;

    #[test]
    fn abstract_address_length_counts_no_padding() {
        let (raw, len) = SocketAddrSpec::Abstract(b"/run/memif.sock".to_vec())
            .to_raw()
            .unwrap();
        assert_eq!(len as usize, 2 + 1 + 15);
        assert_eq!(raw.sun_path[0], 0);
        assert_eq!(raw.sun_path[1] as u8, b'/');
        let (_, len) = SocketAddrSpec::Path("/run/memif.sock".into())
            .to_raw()
            .unwrap();
        assert_eq!(len as usize, 2 + 15 + 1);
    }

    #[test]
    fn bad_addresses_are_refused() {
        for addr in [
            SocketAddrSpec::Path(PathBuf::from("/tmp/".to_string() + &"x".repeat(120))),
            SocketAddrSpec::Path(PathBuf::new()),
            SocketAddrSpec::Abstract(Vec::new()),
            SocketAddrSpec::Abstract(vec![b'a'; 108]),
            SocketAddrSpec::Abstract(b"a\0b".to_vec()),
        ] {
            assert!(
                matches!(
                    SeqpacketListener::bind(&addr),
                    Err(ShmError::BadSocketAddr { .. })
                ),
                "{addr:?}"
            );
        }
    }
}
