//! Packet buffers for memnic, shaped like DPDK's `rte_mbuf` / `rte_mempool`.
//!
//! * A [`Mempool`] owns `count` fixed-size buffers in one [`Region`](memnic_shm::Region): private
//!   memory, or a memfd a peer can map (memif zero copy). Free buffers sit in a shared free list
//!   behind a mutex, touched only in bulk.
//! * A [`PoolCache`] belongs to one lcore (one queue): alloc and free are a `Vec` pop/push, with no
//!   atomic read-modify-write; it refills from and spills to the shared list `cache_size` at a time.
//! * An [`Mbuf`] is a packet: one segment, or a chain of them (`rte_mbuf`'s `next`/`nb_segs`).
//!   Each segment is one of three kinds of memory ([`SegKind`]):
//!   - **private**: a buffer of a private pool, the fast path — plain slices
//!     ([`Mbuf::as_slice`]);
//!   - **shared**: a buffer of a pool a peer can see and write. Its bytes are reached only through
//!     bounds-checked copies ([`VolatileSlice`](memnic_shm::VolatileSlice)), never a reference;
//!   - **external**: memory we do not own (a range of a peer's region, such as a guest's vhost tx
//!     buffer), read-only, attached through an [`ExtPool`]. Freeing it sets the slot's
//!     completion flag, exactly once, for the `ExtPool`'s owner to reap; it never enters a
//!     `Mempool`.
//!
//! Freeing is by ownership: an `Mbuf` is not `Clone`, so each segment is released exactly once,
//! whichever way the chain is taken apart and whichever thread frees it. [`PoolCache::free`] is
//! the fast path (no lock for its own pool's buffers); a plain drop takes the pool's lock.
//!
//! Lifetime: an `Mbuf` points into its pool's memory without a reference count (that would cost an
//! atomic per packet). A pool's memory is released only when the last handle goes *and* every
//! buffer is back; if buffers are still out, the memory is leaked instead, so an `Mbuf` can never
//! dangle. An [`ExtPool`] keeps the regions its segments point into mapped on the same terms.

mod ext;
mod mbuf;
mod pool;

pub use ext::{Completions, ExtError, ExtPool};
pub use mbuf::{Mbuf, SegKind, Segments};
pub use pool::{Mempool, PoolCache, PoolConfig};

/// Bytes reserved in front of the packet data, as DPDK's `RTE_PKTMBUF_HEADROOM`.
pub const DEFAULT_HEADROOM: u32 = 128;
/// Default buffer size: 2048 bytes of data room plus headroom (DPDK's `RTE_MBUF_DEFAULT_BUF_SIZE`).
pub const DEFAULT_BUF_SIZE: u32 = 2048 + DEFAULT_HEADROOM;
/// Default per-lcore cache size (testpmd's `--mbcache` default is 250).
pub const DEFAULT_CACHE_SIZE: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("pool {name}: {what}")]
    Config { name: String, what: String },
    #[error("pool {name}: {source}")]
    Memory {
        name: String,
        #[source]
        source: memnic_shm::ShmError,
    },
}
