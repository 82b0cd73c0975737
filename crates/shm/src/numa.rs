//! NUMA placement of mapped memory: `mbind` a range of a [`Region`] to one node, and ask the
//! kernel (`get_mempolicy`) which policy a range has and on which node a page sits.
//!
//! These are raw system calls (libnuma is not assumed). On a kernel built without NUMA the calls
//! fail with ENOSYS, reported as [`ShmError::NoNuma`]; callers may ignore that error, since memory
//! then simply stays where the kernel puts it.
//!
//! Policy choice: [`bind_range`] uses `MPOL_BIND` with `MPOL_MF_MOVE`. testpmd allocates a queue's
//! rings and pool from the chosen socket's heap and fails at start-up when that socket has no
//! memory, rather than silently using another one; `MPOL_BIND` is the kernel equivalent (pages of
//! the range come from that node only), whereas `MPOL_PREFERRED` would fall back to a remote node
//! without telling anyone and skew a benchmark. `MPOL_MF_MOVE` migrates the pages of the range
//! already faulted in by this process; pages also mapped by a peer process stay where they are
//! (moving those needs `MPOL_MF_MOVE_ALL` and CAP_SYS_NICE), and `MPOL_MF_STRICT` is not set, so
//! such pages do not make the call fail. Because a bound node without free memory makes a later
//! page fault fail (SIGBUS on hugepages), touch the memory right after binding, at start-up.
//!
//! For shared mappings of tmpfs objects (memfd, `/dev/shm`) the kernel stores the policy on the
//! object, so it also governs pages a peer faults in later.

use std::io;

use crate::{Region, Result, ShmError, HUGE_PAGE_SIZE};

// From <linux/mempolicy.h>; libc does not export all of them.
const MPOL_F_NODE: libc::c_ulong = 1 << 0;
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;
const MPOL_MF_MOVE: libc::c_ulong = 1 << 1;
/// The mode flags the kernel may OR into the mode it reports (static/relative nodes, balancing).
const MPOL_MODE_FLAGS: libc::c_int =
    libc::MPOL_F_STATIC_NODES | libc::MPOL_F_RELATIVE_NODES | libc::MPOL_F_NUMA_BALANCING;

/// Highest node count the masks here can describe (the kernel's own limit is 1 << NODES_SHIFT,
/// at most 1024 on x86-64).
pub const MAX_NODES: usize = 1024;
const MASK_WORDS: usize = MAX_NODES / 64;
/// The `maxnode` argument: the kernel reads `maxnode - 1` bits (libnuma passes bits + 1 too).
const MAXNODE_ARG: libc::c_ulong = MAX_NODES as libc::c_ulong + 1;

/// The memory policy mode of a range, as `get_mempolicy` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyMode {
    /// No policy of its own: the thread's policy (usually local allocation) applies.
    Default,
    Preferred,
    Bind,
    Interleave,
    Local,
    /// A mode this crate has no name for (MPOL_PREFERRED_MANY, MPOL_WEIGHTED_INTERLEAVE, ...).
    Other(i32),
}

impl PolicyMode {
    fn from_raw(mode: libc::c_int) -> PolicyMode {
        match mode & !MPOL_MODE_FLAGS {
            libc::MPOL_DEFAULT => PolicyMode::Default,
            libc::MPOL_PREFERRED => PolicyMode::Preferred,
            libc::MPOL_BIND => PolicyMode::Bind,
            libc::MPOL_INTERLEAVE => PolicyMode::Interleave,
            libc::MPOL_LOCAL => PolicyMode::Local,
            other => PolicyMode::Other(other),
        }
    }
}

/// A range's policy: the mode and the nodes it names (empty for `Default` and `Local`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemPolicy {
    pub mode: PolicyMode,
    pub nodes: Vec<usize>,
}

fn page_size(region: &Region) -> usize {
    if region.is_huge() {
        return HUGE_PAGE_SIZE;
    }
    // SAFETY: sysconf only reads a system constant; it has no memory arguments.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(ps).ok().filter(|&p| p > 0).unwrap_or(4096)
}

fn check_offset(region: &Region, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region.len() && offset < region.len() => Ok(()),
        _ => Err(ShmError::OutOfBounds {
            offset,
            size: len,
            len: region.len(),
        }),
    }
}

/// Binds the pages holding bytes `[offset, offset + len)` of `region` to NUMA `node`
/// (`MPOL_BIND`, moving pages already faulted in; see the module docs).
///
/// The range is widened outward to whole pages (hugepages for a hugepage region), so bytes that
/// share a page with the range are bound too. `len == 0` binds nothing. Errors: the range is not
/// inside the region; `node` does not exist or the process may not use it
/// ([`ShmError::NumaNodeUnavailable`]); the kernel has no NUMA ([`ShmError::NoNuma`]).
pub fn bind_range(region: &Region, offset: usize, len: usize, node: usize) -> Result<()> {
    check_offset(region, offset, len.max(1)).map_err(|_| ShmError::OutOfBounds {
        offset,
        size: len,
        len: region.len(),
    })?;
    if len == 0 {
        return Ok(());
    }
    if node >= MAX_NODES {
        return Err(ShmError::NumaNodeUnavailable { node });
    }
    let ps = page_size(region);
    let first = region.addr() + offset;
    let start = first & !(ps - 1);
    // The mapping covers whole pages, so rounding the end up stays inside it.
    let end = (first + len).next_multiple_of(ps);
    let mut mask = [0u64; MASK_WORDS];
    mask[node / 64] |= 1 << (node % 64);
    // SAFETY: mbind only changes the policy of [start, end), which lies in this Region's own
    // mapping (bounds checked above, rounded to the pages the mapping consists of); it neither
    // reads nor writes that memory's contents (MPOL_MF_MOVE migrates pages transparently).
    // `mask` is a live array of MASK_WORDS words, and the kernel reads MAXNODE_ARG - 1 =
    // MASK_WORDS * 64 bits from it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            start as libc::c_ulong,
            (end - start) as libc::c_ulong,
            libc::MPOL_BIND as libc::c_ulong,
            mask.as_ptr(),
            MAXNODE_ARG,
            MPOL_MF_MOVE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let source = io::Error::last_os_error();
    Err(match source.raw_os_error() {
        Some(libc::ENOSYS) => ShmError::NoNuma { op: "mbind" },
        // The range is page-aligned and mapped, so EINVAL means the node mask is refused.
        Some(libc::EINVAL) => ShmError::NumaNodeUnavailable { node },
        _ => ShmError::Io {
            op: "bind",
            what: format!("{len} bytes at offset {offset:#x} to NUMA node {node}"),
            source,
        },
    })
}

/// Binds the whole mapping of `region` to NUMA `node`; see [`bind_range`].
pub fn bind_region(region: &Region, node: usize) -> Result<()> {
    bind_range(region, 0, region.len(), node)
}

fn get_mempolicy(
    region: &Region,
    offset: usize,
    mask: Option<&mut [u64; MASK_WORDS]>,
    flags: libc::c_ulong,
) -> Result<libc::c_int> {
    check_offset(region, offset, 1)?;
    let mut mode: libc::c_int = 0;
    let (mask_ptr, maxnode) = match mask {
        Some(m) => (m.as_mut_ptr(), MAXNODE_ARG),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: `mode` is a live c_int; `mask_ptr` is null (with maxnode 0) or a live array of
    // MASK_WORDS words, and with maxnode = MAXNODE_ARG the kernel writes at most
    // ALIGN(MAXNODE_ARG - 1, 64) / 8 bytes = MASK_WORDS words. The address lies inside this
    // Region's mapping (checked); with MPOL_F_ADDR the kernel only looks up its policy (and, with
    // MPOL_F_NODE, the page behind it), never writing the memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask_ptr,
            maxnode,
            (region.addr() + offset) as libc::c_ulong,
            flags,
        )
    };
    if rc == 0 {
        return Ok(mode);
    }
    let source = io::Error::last_os_error();
    Err(match source.raw_os_error() {
        Some(libc::ENOSYS) => ShmError::NoNuma {
            op: "get_mempolicy",
        },
        _ => ShmError::Io {
            op: "query the memory policy of",
            what: format!("the page at offset {offset:#x}"),
            source,
        },
    })
}

/// The memory policy of the page holding byte `offset` of `region` (`get_mempolicy` with
/// `MPOL_F_ADDR`): its mode and node mask.
pub fn policy_of(region: &Region, offset: usize) -> Result<MemPolicy> {
    let mut mask = [0u64; MASK_WORDS];
    let mode = get_mempolicy(region, offset, Some(&mut mask), MPOL_F_ADDR)?;
    let nodes = (0..MAX_NODES)
        .filter(|&n| mask[n / 64] & (1 << (n % 64)) != 0)
        .collect();
    Ok(MemPolicy {
        mode: PolicyMode::from_raw(mode),
        nodes,
    })
}

/// The NUMA node of the physical page behind byte `offset` of `region`.
///
/// The page is touched for writing first (a compare-exchange of a word with itself, which leaves
/// the content unchanged even with a peer writing concurrently), so it is faulted in according to
/// its policy: a read fault of private memory would map the shared zero page, whose node says
/// nothing about the region.
pub fn node_of_page(region: &Region, offset: usize) -> Result<usize> {
    check_offset(region, offset, 1)?;
    touch_for_write(region, offset);
    let node = get_mempolicy(region, offset, None, MPOL_F_NODE | MPOL_F_ADDR)?;
    usize::try_from(node).map_err(|_| ShmError::Io {
        op: "find the NUMA node of",
        what: format!("the page at offset {offset:#x}"),
        source: io::Error::from_raw_os_error(libc::EINVAL),
    })
}

/// Makes the page holding `offset` present and writable without changing its bytes.
fn touch_for_write(region: &Region, offset: usize) {
    use std::sync::atomic::Ordering;
    // The aligned word holding `offset`, or the last whole word of the region when `offset` is
    // in a trailing partial word (same page either way: pages are multiples of 4 bytes). A region
    // shorter than a word is left to the read fault of get_mempolicy.
    let word = (offset & !3).min(region.len().saturating_sub(4) & !3);
    let Ok(w) = region.try_u32(word) else {
        return;
    };
    // A locked compare-exchange is a write access even when it stores the old value back (x86
    // LOCK CMPXCHG always writes; LL/SC stores on a match). Relaxed: only the fault matters, no
    // data is published. A few retries cover a peer changing the word in between.
    for _ in 0..16 {
        let v = w.load(Ordering::Relaxed);
        if w.compare_exchange(v, v, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_bound_to_node0(r: &Region) {
        bind_region(r, 0).unwrap();
        for off in [0, r.len() / 2, r.len() - 1] {
            let p = policy_of(r, off).unwrap();
            assert_eq!(p.mode, PolicyMode::Bind, "offset {off:#x}");
            assert_eq!(p.nodes, vec![0], "offset {off:#x}");
            assert_eq!(node_of_page(r, off).unwrap(), 0, "offset {off:#x}");
        }
    }

    #[test]
    fn private_memory_binds_to_node0() {
        let r = Region::private(1 << 20, false).unwrap();
        // Fault some pages in before binding: MPOL_MF_MOVE must accept them.
        r.fill(0, 8192, 0xab).unwrap();
        assert_eq!(policy_of(&r, 0).unwrap().mode, PolicyMode::Default);
        assert!(policy_of(&r, 0).unwrap().nodes.is_empty());
        assert_bound_to_node0(&r);
        let mut b = [0u8; 4];
        r.read_bytes(4096, &mut b).unwrap();
        assert_eq!(b, [0xab; 4], "binding and touching keep the content");
    }

    #[test]
    fn memfd_binds_to_node0_and_a_second_mapping_sees_the_policy() {
        let r = Region::memfd("numa-test", 1 << 20, false).unwrap();
        assert_bound_to_node0(&r);
        // tmpfs keeps the policy on the object: a peer's mapping of the same fd has it too.
        let fd = r.fd().unwrap().try_clone_to_owned().unwrap();
        let peer = Region::from_fd(fd, 1 << 20).unwrap();
        let p = policy_of(&peer, 4096).unwrap();
        assert_eq!((p.mode, p.nodes), (PolicyMode::Bind, vec![0]));
    }

    #[test]
    fn hugepage_regions_bind_whole_hugepages() {
        // Hugepages when reserved, normal pages otherwise: binding works on either.
        let r = Region::private(HUGE_PAGE_SIZE, true).unwrap();
        bind_range(&r, 10, 10, 0).unwrap();
        assert_eq!(policy_of(&r, r.len() - 1).unwrap().mode, {
            if r.is_huge() {
                PolicyMode::Bind
            } else {
                PolicyMode::Default
            }
        });
        assert_bound_to_node0(&r);
    }

    #[test]
    fn posix_shm_binds_to_node0() {
        let name = format!("memnic-numa-test-{}", std::process::id());
        let r = Region::create_shared(&name, 1 << 20, 0o600).unwrap();
        let result = std::panic::catch_unwind(|| assert_bound_to_node0(&r));
        std::fs::remove_file(Region::shm_path(&name)).unwrap();
        result.unwrap();
    }

    #[test]
    fn a_range_is_widened_to_whole_pages_and_leaves_the_rest_alone() {
        let r = Region::private(16 * 4096, false).unwrap();
        // Bytes 4097..8195 touch pages 1 and 2 only.
        bind_range(&r, 4097, 4098, 0).unwrap();
        for (page, bound) in [(0, false), (1, true), (2, true), (3, false)] {
            let p = policy_of(&r, page * 4096).unwrap();
            let want = if bound {
                PolicyMode::Bind
            } else {
                PolicyMode::Default
            };
            assert_eq!(p.mode, want, "page {page}");
        }
        bind_range(&r, 100, 0, 0).unwrap();
        assert_eq!(policy_of(&r, 0).unwrap().mode, PolicyMode::Default);
    }

    #[test]
    fn a_missing_node_is_named_in_the_error() {
        let r = Region::private(1 << 16, false).unwrap();
        for node in [63, MAX_NODES + 5] {
            let e = bind_region(&r, node).unwrap_err();
            assert!(
                matches!(e, ShmError::NumaNodeUnavailable { node: n } if n == node),
                "{e:?}"
            );
            assert!(e.to_string().contains(&format!("NUMA node {node} ")), "{e}");
        }
        assert_eq!(policy_of(&r, 0).unwrap().mode, PolicyMode::Default);
    }

    #[test]
    fn out_of_range_offsets_are_rejected() {
        let r = Region::private(1 << 16, false).unwrap();
        let len = r.len();
        for (off, n) in [
            (len, 1),
            (len - 1, 2),
            (0, len + 1),
            (usize::MAX, 2),
            (len, 0),
        ] {
            let e = bind_range(&r, off, n, 0).unwrap_err();
            assert!(
                matches!(e, ShmError::OutOfBounds { .. }),
                "{off} {n}: {e:?}"
            );
        }
        assert!(matches!(
            policy_of(&r, len).unwrap_err(),
            ShmError::OutOfBounds { .. }
        ));
        assert!(matches!(
            node_of_page(&r, usize::MAX).unwrap_err(),
            ShmError::OutOfBounds { .. }
        ));
    }

    #[test]
    fn policy_modes_decode_with_flags_stripped() {
        assert_eq!(PolicyMode::from_raw(libc::MPOL_BIND), PolicyMode::Bind);
        assert_eq!(
            PolicyMode::from_raw(libc::MPOL_PREFERRED | libc::MPOL_F_STATIC_NODES),
            PolicyMode::Preferred
        );
        assert_eq!(PolicyMode::from_raw(3), PolicyMode::Interleave);
        assert_eq!(PolicyMode::from_raw(4), PolicyMode::Local);
        assert_eq!(PolicyMode::from_raw(0), PolicyMode::Default);
        assert_eq!(PolicyMode::from_raw(6), PolicyMode::Other(6));
    }
}
