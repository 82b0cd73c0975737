//! Shared memory for memnic: the layer where the `unsafe` lives.
//!
//! * [`Region`]: a mapping from a memfd, a POSIX shm object (`/dev/shm/NAME`), any mmap-able file
//!   (an ivshmem BAR: `/sys/bus/pci/devices/<BDF>/resource2`), or private memory. 2 MiB hugepages
//!   are used when reserved, normal pages otherwise.
//! * Access to memory a peer may write at any time: atomic loads/stores of aligned words at checked
//!   offsets, and bounds-checked copies in and out. No `&[u8]` is ever formed over the mapping.
//! * [`cpu`]: pinning the current thread, listing CPUs.
//! * [`unix`]: AF_UNIX SEQPACKET sockets passing descriptors (SCM_RIGHTS), eventfds, `poll`: the
//!   system-call side of memif's control channel.
//! * [`tap`]: Linux TAP interfaces (one nonblocking descriptor per queue, the interface's address
//!   and link flags): the system-call side of the `net_tap` driver. [`netns`]: moving a thread
//!   into a network namespace of its own, for tests that create interfaces.
//!
//! Contract: every accessor checks `offset + size <= len` (and alignment for atomics) before it
//! touches memory, so no value a peer writes can make this crate read or write outside a mapping.
//!
//! # Peers that shrink their memory
//!
//! A peer can `ftruncate` the file behind a mapping we share with it; an access past the new end
//! then raises SIGBUS, which would kill the whole process. So:
//!
//! * what we create is sealed: [`Region::memfd`] adds `F_SEAL_SHRINK` (and `F_SEAL_SEAL`), so
//!   nobody can shrink it (see there for hugetlb memfds on old kernels);
//!   [`Region::is_shrink_sealed`] says whether a region's file carries that seal;
//! * every mapping a peer controls is *protected*: a received fd without `F_SEAL_SHRINK`
//!   ([`Region::from_fd`]) and every named file ([`Region::create_shared`],
//!   [`Region::open_shared`]: MEMNIC's region file). [`Region::is_peer_controlled`] says which.
//!   A fault inside a protected mapping is caught by a process-wide SIGBUS handler, which
//!   replaces the whole mapping with private zero pages and flags it; the access that faulted,
//!   and all later ones, read zeros (or what this process wrote since) and reach no peer.
//!   A SIGBUS anywhere else still goes to the previous handler or kills the process as before.
//!
//! Drivers poll [`Region::peer_faulted`] (one atomic load) from their control path and drop
//! the peer with a reason such as "peer shrank its shared memory":
//!
//! ```no_run
//! # fn poll_peer(region: &memnic_shm::Region) -> Result<(), &'static str> {
//! if region.peer_faulted() {
//!     return Err("peer shrank its shared memory");
//! }
//! # Ok(()) }
//! ```
//!
//! At most [`MAX_PEER_MAPPINGS`] protected mappings exist at once; one more fails with
//! [`ShmError::TooManyPeerMappings`].

pub mod cpu;
pub mod netns;
pub mod numa;
mod region;
mod sigbus;
pub mod tap;
pub mod unix;
mod volatile;

pub use region::{store_fence, Backing, Region, HUGE_PAGE_SIZE};
pub use sigbus::{MAX_PEER_BYTES, MAX_PEER_MAPPINGS};
pub use volatile::VolatileSlice;

/// Errors of this crate: each names the object and what went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("cannot {op} {what}: {source}")]
    Io {
        op: &'static str,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} is {actual} bytes, but {needed} bytes are needed")]
    TooSmall {
        what: String,
        actual: u64,
        needed: u64,
    },
    #[error("a region cannot be empty")]
    Empty,
    #[error("access of {size} bytes at offset {offset:#x} is outside the {len}-byte region or misaligned")]
    OutOfBounds {
        offset: usize,
        size: usize,
        len: usize,
    },
    #[error("this kernel has no NUMA support ({op} returned ENOSYS), so memory stays where the kernel puts it")]
    NoNuma { op: &'static str },
    #[error("NUMA node {node} does not exist or this process may not use it (see /sys/devices/system/node/online)")]
    NumaNodeUnavailable { node: usize },
    #[error("socket address {addr} cannot be used: {reason}")]
    BadSocketAddr { addr: String, reason: &'static str },
    #[error("socket {addr} is already in use: another server listens there, or a stale socket file remains (remove it)")]
    AddrInUse { addr: String },
    #[error("nothing listens on socket {addr}: start the server first, or retry")]
    NoListener { addr: String },
    #[error("cannot {op} now without waiting (the descriptor is nonblocking): poll it and retry")]
    WouldBlock { op: &'static str },
    #[error("the peer closed the connection, so this side cannot {op}")]
    PeerClosed { op: &'static str },
    #[error("{count} descriptors cannot travel in one message; Linux allows at most {max}")]
    TooManyFds { count: usize, max: usize },
    #[error(
        "a received descriptor is {kind}, not an eventfd: the peer passed the wrong kind of file"
    )]
    NotEventFd { kind: String },
    #[error("the file is on a {fs} filesystem, which a process serves (the peer could stall every access to it): give shared memory (memfd, tmpfs, hugetlbfs) or a file on a local filesystem")]
    PeerServedFile { fs: String },
    #[error("the file is on mount {mnt_id}, which neither this process's mount table nor the peer's lists, so its filesystem is unknown (it could be one the peer serves): give shared memory (memfd, tmpfs, hugetlbfs) or a file on a filesystem mounted here")]
    UnknownMount { mnt_id: u64 },
    #[error("cannot map another memory region a peer controls: all {max} slots of the SIGBUS protection are in use (drop the regions of peers that are gone)")]
    TooManyPeerMappings { max: usize },
    #[error("{path} is a symbolic link, and a shared-memory region is never opened through one (it could point anywhere): remove the link or give the real path")]
    SymlinkRefused { path: String },
    #[error(
        "cannot open /dev/net/tun: {source} (TAP interfaces need the tun module and CAP_NET_ADMIN)"
    )]
    TunDevice {
        #[source]
        source: std::io::Error,
    },
    #[error("'{name}' is not a usable interface name: 1 to 15 bytes, no NUL")]
    BadInterfaceName { name: String },
    #[error("interface {name} exists and is not a multi-queue TAP interface without packet information (IFF_TAP, IFF_NO_PI, IFF_MULTI_QUEUE), so it cannot be used as one: choose another name")]
    NotMultiQueueTap { name: String },
    #[error("interface {name} is a TAP interface in use by another process that does not share it: choose another name")]
    InterfaceBusy { name: String },
    #[error("not permitted to create or attach to TAP interface {name}: this needs CAP_NET_ADMIN (run as root), or to own the persistent interface")]
    InterfaceNotPermitted { name: String },
    #[error("no interface {name} in this network namespace (it was deleted, or moved to another namespace)")]
    NoSuchInterface { name: String },
    #[error("interface {name} is not an Ethernet interface (its address family is {family})")]
    NotEthernet { name: String, family: u16 },
    #[error("{path} already exists and belongs to uid {owner}, not to this process's uid {euid}: another user may have planted it; remove it, or run as its owner")]
    ForeignOwner { path: String, owner: u32, euid: u32 },
    #[error("{path} already exists with mode {found:04o}, which lets group or others in beyond the requested {requested:04o}: remove it, or chmod it to {requested:04o}")]
    ModeTooWide {
        path: String,
        found: u32,
        requested: u32,
    },
}

pub type Result<T> = std::result::Result<T, ShmError>;
