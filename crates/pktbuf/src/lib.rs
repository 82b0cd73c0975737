//! Packet buffers for memnic, shaped like DPDK's `rte_mbuf` / `rte_mempool`.
//!
//! * A [`Mempool`] owns `count` fixed-size buffers in one [`Region`] (private memory, or a memfd
//!   when the buffers must be visible to a peer for zero copy). Free buffers sit in a shared
//!   free list behind a mutex, touched only in bulk.
//! * A [`PoolCache`] belongs to one lcore (one queue): alloc and free are a `Vec` pop/push, with no
//!   atomic read-modify-write; it refills from and spills to the shared list `cache_size` at a time.
//! * An [`Mbuf`] owns one buffer: data offset, data length, headroom and tailroom, like a
//!   single-segment `rte_mbuf`. Return it with [`PoolCache::free`] (fast) or just drop it (slow
//!   path: one lock).
//!
//! Lifetime: an `Mbuf` points into its pool's memory without a reference count (that would cost an
//! atomic per packet). The pool's memory is therefore released only when the last [`Mempool`]
//! handle goes *and* every buffer is back; if buffers are still out, the memory is leaked instead
//! of freed, so an `Mbuf` can never dangle.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use memnic_shm::Region;

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

/// How to build a pool.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    /// Number of buffers (`--total-num-mbufs`).
    pub count: u32,
    /// Bytes per buffer, headroom included (`--mbuf-size`).
    pub buf_size: u32,
    pub headroom: u32,
    pub cache_size: u32,
    /// Put the buffers in a memfd so a peer can map them (zero copy).
    pub shared: bool,
    /// Ask for 2 MiB hugepages (falls back to normal pages).
    pub huge: bool,
}

impl PoolConfig {
    pub fn new(name: impl Into<String>, count: u32) -> Self {
        PoolConfig {
            name: name.into(),
            count,
            buf_size: DEFAULT_BUF_SIZE,
            headroom: DEFAULT_HEADROOM,
            cache_size: DEFAULT_CACHE_SIZE,
            shared: false,
            huge: true,
        }
    }
}

struct PoolInner {
    region: Region,
    base: NonNull<u8>,
    buf_size: u32,
    count: u32,
    headroom: u32,
    cache_size: usize,
    name: String,
    free: Mutex<Vec<u32>>,
}

impl PoolInner {
    fn put(&self, idx: u32) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(idx);
    }

    #[inline(always)]
    fn buf_ptr(&self, idx: u32) -> NonNull<u8> {
        debug_assert!(idx < self.count);
        // SAFETY: idx < count and count * buf_size <= region.len() (checked at creation), so the
        // result stays inside the mapping.
        unsafe { self.base.add(idx as usize * self.buf_size as usize) }
    }
}

/// Owns the pool memory; frees it only once every buffer is back (see the crate docs).
struct PoolOwner(NonNull<PoolInner>);

// SAFETY: PoolInner is Sync (its mutable state is behind a Mutex; buffers are owned by Mbufs).
unsafe impl Send for PoolOwner {}
// SAFETY: as above.
unsafe impl Sync for PoolOwner {}

impl Drop for PoolOwner {
    fn drop(&mut self) {
        // SAFETY: the pointer came from Box::leak in Mempool::new and is only freed here, once.
        let inner = unsafe { self.0.as_ref() };
        let all_back =
            inner.free.lock().unwrap_or_else(|p| p.into_inner()).len() == inner.count as usize;
        if all_back {
            // SAFETY: no Mbuf exists (all indices are in the free list) and no Mempool handle or
            // cache exists (this is the last Arc), so nothing can reach the allocation any more.
            drop(unsafe { Box::from_raw(self.0.as_ptr()) });
        }
        // Otherwise leak: outstanding Mbufs still point into the region.
    }
}

/// A pool of packet buffers; cheap to clone (a shared handle).
#[derive(Clone)]
pub struct Mempool {
    owner: Arc<PoolOwner>,
}

impl std::fmt::Debug for Mempool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner();
        f.debug_struct("Mempool")
            .field("name", &i.name)
            .field("count", &i.count)
            .field("buf_size", &i.buf_size)
            .finish()
    }
}

impl Mempool {
    pub fn new(cfg: &PoolConfig) -> Result<Mempool, PoolError> {
        let bad = |what: String| PoolError::Config {
            name: cfg.name.clone(),
            what,
        };
        if cfg.count == 0 {
            return Err(bad("needs at least one buffer".into()));
        }
        if cfg.buf_size <= cfg.headroom || cfg.buf_size > 1 << 20 || cfg.headroom > u16::MAX as u32
        {
            return Err(bad(format!(
                "buffer size {} must exceed the headroom {} and be at most 1 MiB",
                cfg.buf_size, cfg.headroom
            )));
        }
        let buf_size = cfg.buf_size.next_multiple_of(64);
        let bytes = (cfg.count as usize)
            .checked_mul(buf_size as usize)
            .ok_or_else(|| {
                bad(format!(
                    "{} buffers of {} bytes overflow",
                    cfg.count, buf_size
                ))
            })?;
        let region = if cfg.shared {
            Region::memfd(&cfg.name, bytes, cfg.huge)
        } else {
            Region::private(bytes, cfg.huge)
        }
        .map_err(|source| PoolError::Memory {
            name: cfg.name.clone(),
            source,
        })?;
        let base = NonNull::new(region.as_mut_ptr()).expect("a mapping is never at address 0");
        // Pop order: index 0 first, so a fresh pool hands out buffers in address order.
        let free: Vec<u32> = (0..cfg.count).rev().collect();
        let inner = Box::new(PoolInner {
            region,
            base,
            buf_size,
            count: cfg.count,
            headroom: cfg.headroom,
            cache_size: cfg.cache_size.max(1) as usize,
            name: cfg.name.clone(),
            free: Mutex::new(free),
        });
        let ptr = NonNull::from(Box::leak(inner));
        Ok(Mempool {
            owner: Arc::new(PoolOwner(ptr)),
        })
    }

    #[inline(always)]
    fn inner(&self) -> &PoolInner {
        // SAFETY: the PoolOwner behind our Arc keeps the allocation alive.
        unsafe { self.owner.0.as_ref() }
    }

    pub fn name(&self) -> &str {
        &self.inner().name
    }
    pub fn count(&self) -> u32 {
        self.inner().count
    }
    /// Bytes per buffer (rounded up to a cache line).
    pub fn buf_size(&self) -> u32 {
        self.inner().buf_size
    }
    pub fn headroom(&self) -> u32 {
        self.inner().headroom
    }
    /// Largest packet a buffer holds after the headroom.
    pub fn data_room(&self) -> u32 {
        self.inner().buf_size - self.inner().headroom
    }
    /// The memory behind the buffers (to register with a peer for zero copy, or to mbind).
    pub fn region(&self) -> &Region {
        &self.inner().region
    }
    /// Buffers in the shared free list (not counting those parked in lcore caches).
    pub fn shared_free(&self) -> u32 {
        self.inner()
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len() as u32
    }

    /// Whether `m` belongs to this pool.
    pub fn owns(&self, m: &Mbuf) -> bool {
        m.pool == self.owner.0
    }

    /// A new per-lcore cache of this pool.
    pub fn cache(&self) -> PoolCache {
        let size = self.inner().cache_size;
        PoolCache {
            pool: self.clone(),
            objs: Vec::with_capacity(size * 2 + 1),
            size,
            foreign: Vec::new(),
        }
    }

    /// Allocates one buffer from the shared list (slow path: takes the lock).
    pub fn alloc(&self) -> Option<Mbuf> {
        let idx = self
            .inner()
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()?;
        Some(Mbuf::new(self.owner.0, self.inner(), idx))
    }
}

/// One packet buffer. Owns its buffer until freed or dropped.
pub struct Mbuf {
    buf: NonNull<u8>,
    pool: NonNull<PoolInner>,
    idx: u32,
    data_off: u32,
    data_len: u32,
    buf_len: u32,
}

// SAFETY: an Mbuf exclusively owns its buffer bytes; the pool state it may touch on drop is
// behind a Mutex, and the pool memory outlives it (crate docs).
unsafe impl Send for Mbuf {}
// SAFETY: &Mbuf only gives shared reads of the owned bytes.
unsafe impl Sync for Mbuf {}

impl std::fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mbuf")
            .field("idx", &self.idx)
            .field("data_off", &self.data_off)
            .field("len", &self.data_len)
            .finish()
    }
}

impl Mbuf {
    #[inline(always)]
    fn new(pool: NonNull<PoolInner>, inner: &PoolInner, idx: u32) -> Mbuf {
        Mbuf {
            buf: inner.buf_ptr(idx),
            pool,
            idx,
            data_off: inner.headroom,
            data_len: 0,
            buf_len: inner.buf_size,
        }
    }

    /// Packet length in bytes (single segment: data length).
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.data_len as usize
    }
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.data_len == 0
    }
    /// Bytes free in front of the data.
    pub fn headroom(&self) -> usize {
        self.data_off as usize
    }
    /// Bytes free after the data.
    #[inline(always)]
    pub fn tailroom(&self) -> usize {
        (self.buf_len - self.data_off - self.data_len) as usize
    }
    /// Largest data length this buffer can hold at the current data offset.
    #[inline(always)]
    pub fn capacity(&self) -> usize {
        (self.buf_len - self.data_off) as usize
    }
    /// Index of the buffer in its pool.
    pub fn index(&self) -> u32 {
        self.idx
    }
    /// Offset of the packet data from the start of the pool's region (for zero-copy descriptors).
    pub fn region_offset(&self) -> usize {
        // SAFETY: pool memory outlives every Mbuf (crate docs).
        let inner = unsafe { self.pool.as_ref() };
        self.idx as usize * inner.buf_size as usize + self.data_off as usize
    }

    /// The packet bytes.
    #[inline(always)]
    pub fn data(&self) -> &[u8] {
        // SAFETY: data_off + data_len <= buf_len is an invariant of every mutator; the buffer is
        // owned by this Mbuf, so no one else writes it while the borrow lives.
        unsafe {
            std::slice::from_raw_parts(
                self.buf.as_ptr().add(self.data_off as usize),
                self.data_len as usize,
            )
        }
    }

    /// The packet bytes, writable.
    #[inline(always)]
    pub fn data_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in data(), and &mut self makes the access exclusive.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.buf.as_ptr().add(self.data_off as usize),
                self.data_len as usize,
            )
        }
    }

    /// The whole room from the data offset to the end of the buffer (for receive copies; follow
    /// with [`Mbuf::set_len`]).
    #[inline(always)]
    pub fn room_mut(&mut self) -> &mut [u8] {
        // SAFETY: data_off <= buf_len; exclusive through &mut self.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.buf.as_ptr().add(self.data_off as usize),
                self.capacity(),
            )
        }
    }

    /// The data followed by whatever the buffer holds after it, `n` bytes in all (for copies
    /// rounded up to a whole vector); None if the buffer is shorter than `n`.
    #[inline(always)]
    pub fn data_padded(&self, n: usize) -> Option<&[u8]> {
        if n < self.len() || n > self.capacity() {
            return None;
        }
        // SAFETY: data_off + n <= buf_len (checked); the whole buffer is initialised mapped
        // memory owned by this Mbuf.
        Some(unsafe {
            std::slice::from_raw_parts(self.buf.as_ptr().add(self.data_off as usize), n)
        })
    }

    /// Sets the data length; false (and no change) if it does not fit.
    #[inline(always)]
    pub fn set_len(&mut self, len: usize) -> bool {
        if len > self.capacity() {
            return false;
        }
        self.data_len = len as u32;
        true
    }

    /// Grows the data at the end by `n` bytes and returns them, or None without room.
    pub fn append(&mut self, n: usize) -> Option<&mut [u8]> {
        if n > self.tailroom() {
            return None;
        }
        let old = self.data_len as usize;
        self.data_len += n as u32;
        Some(&mut self.data_mut()[old..])
    }

    /// Grows the data at the front by `n` bytes (into the headroom) and returns them.
    pub fn prepend(&mut self, n: usize) -> Option<&mut [u8]> {
        if n > self.data_off as usize {
            return None;
        }
        self.data_off -= n as u32;
        self.data_len += n as u32;
        Some(&mut self.data_mut()[..n])
    }

    /// Removes `n` bytes from the front; false if there are fewer.
    pub fn adj(&mut self, n: usize) -> bool {
        if n > self.data_len as usize {
            return false;
        }
        self.data_off += n as u32;
        self.data_len -= n as u32;
        true
    }

    /// Empties the buffer and restores the default headroom.
    pub fn reset(&mut self) {
        // SAFETY: pool memory outlives every Mbuf.
        self.data_off = unsafe { self.pool.as_ref() }.headroom;
        self.data_len = 0;
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // Slow path: an Mbuf dropped instead of freed through a cache goes back under the lock.
        // SAFETY: pool memory (and PoolInner) outlives every Mbuf (crate docs).
        unsafe { self.pool.as_ref() }.put(self.idx);
    }
}

/// A per-lcore cache of one pool: owned by one thread, no atomics on alloc/free.
pub struct PoolCache {
    pool: Mempool,
    objs: Vec<u32>,
    size: usize,
    /// Buffers of other pools freed here, returned to their pools in batches.
    foreign: Vec<Mbuf>,
}

impl PoolCache {
    pub fn pool(&self) -> &Mempool {
        &self.pool
    }

    /// Buffers parked in this cache.
    pub fn len(&self) -> usize {
        self.objs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.objs.is_empty()
    }

    #[cold]
    fn refill(&mut self, want: usize) {
        let inner = self.pool.inner();
        let mut free = inner.free.lock().unwrap_or_else(|p| p.into_inner());
        let take = (self.size + want).min(free.len());
        let from = free.len() - take;
        self.objs.extend(free.drain(from..).rev());
    }

    #[cold]
    fn spill(&mut self) {
        let keep = self.size;
        let inner = self.pool.inner();
        let mut free = inner.free.lock().unwrap_or_else(|p| p.into_inner());
        free.extend(self.objs.drain(keep..));
    }

    /// One buffer, or None if the pool is exhausted.
    #[inline(always)]
    pub fn alloc(&mut self) -> Option<Mbuf> {
        if self.objs.is_empty() {
            self.refill(1);
        }
        let idx = self.objs.pop()?;
        Some(Mbuf::new(self.pool.owner.0, self.pool.inner(), idx))
    }

    /// Appends up to `n` buffers to `out`; returns how many (fewer only when the pool runs dry).
    #[inline(always)]
    pub fn alloc_up_to(&mut self, out: &mut Vec<Mbuf>, n: usize) -> usize {
        if self.objs.len() < n {
            self.refill(n);
        }
        let got = n.min(self.objs.len());
        let ptr = self.pool.owner.0;
        let inner = self.pool.inner();
        let from = self.objs.len() - got;
        out.extend(
            self.objs
                .drain(from..)
                .rev()
                .map(|idx| Mbuf::new(ptr, inner, idx)),
        );
        got
    }

    /// Returns one buffer (of any pool) to the pool it came from.
    #[inline(always)]
    pub fn free(&mut self, m: Mbuf) {
        if m.pool != self.pool.owner.0 {
            return self.free_foreign(m);
        }
        let idx = m.idx;
        std::mem::forget(m);
        self.objs.push(idx);
        if self.objs.len() >= self.size * 2 {
            self.spill();
        }
    }

    #[cold]
    fn free_foreign(&mut self, m: Mbuf) {
        self.foreign.push(m);
        if self.foreign.len() >= 64 {
            self.foreign.clear(); // each drop returns its buffer to its own pool
        }
    }

    /// Frees every buffer in `bufs`, leaving it empty.
    #[inline(always)]
    pub fn free_all(&mut self, bufs: &mut Vec<Mbuf>) {
        for m in bufs.drain(..) {
            self.free(m);
        }
    }

    /// Returns every parked buffer to the shared list.
    pub fn flush(&mut self) {
        self.foreign.clear();
        let inner = self.pool.inner();
        inner
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(&mut self.objs);
    }
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_pool(n: u32) -> Mempool {
        let mut cfg = PoolConfig::new("t", n);
        cfg.cache_size = 4;
        cfg.huge = false;
        Mempool::new(&cfg).unwrap()
    }

    #[test]
    fn alloc_free_returns_every_buffer() {
        let pool = small_pool(32);
        let mut c = pool.cache();
        let mut v = Vec::new();
        assert_eq!(c.alloc_up_to(&mut v, 40), 32);
        assert!(c.alloc().is_none());
        let mut idx: Vec<u32> = v.iter().map(|m| m.index()).collect();
        idx.sort();
        idx.dedup();
        assert_eq!(idx.len(), 32, "every buffer handed out once");
        c.free_all(&mut v);
        c.flush();
        assert_eq!(pool.shared_free(), 32);
    }

    #[test]
    fn buffers_do_not_overlap_and_keep_their_bytes() {
        let pool = small_pool(8);
        let mut c = pool.cache();
        let mut v = Vec::new();
        c.alloc_up_to(&mut v, 8);
        for (i, m) in v.iter_mut().enumerate() {
            let room = m.capacity();
            assert!(m.set_len(room));
            m.data_mut().fill(i as u8);
        }
        for (i, m) in v.iter().enumerate() {
            assert!(m.data().iter().all(|&b| b == i as u8));
        }
        drop(v); // the slow path also returns buffers
        drop(c);
        assert_eq!(pool.shared_free(), 8);
    }

    #[test]
    fn headroom_tailroom_and_bounds() {
        let pool = small_pool(1);
        let mut m = pool.alloc().unwrap();
        assert_eq!(m.headroom(), DEFAULT_HEADROOM as usize);
        assert_eq!(m.capacity(), pool.data_room() as usize);
        assert!(!m.set_len(m.capacity() + 1));
        m.append(10).unwrap().copy_from_slice(b"0123456789");
        m.prepend(2).unwrap().copy_from_slice(b"ab");
        assert_eq!(m.data(), b"ab0123456789");
        assert!(m.adj(3));
        assert_eq!(m.data(), b"123456789");
        assert!(m.prepend(10_000).is_none());
        assert!(m.append(1 << 20).is_none());
        assert!(!m.adj(100));
        m.reset();
        assert!(m.is_empty());
    }

    #[test]
    fn foreign_buffers_go_home() {
        let a = small_pool(4);
        let b = small_pool(4);
        let mut ca = a.cache();
        let m = b.alloc().unwrap();
        assert!(!a.owns(&m) && b.owns(&m));
        ca.free(m);
        ca.flush();
        assert_eq!(b.shared_free(), 4);
        assert_eq!(a.shared_free(), 4);
    }

    #[test]
    fn outstanding_buffer_outlives_its_pool_handle() {
        let pool = small_pool(2);
        let mut m = pool.alloc().unwrap();
        drop(pool);
        assert!(m.set_len(4));
        m.data_mut().copy_from_slice(b"live");
        assert_eq!(m.data(), b"live");
    }

    #[test]
    fn caches_on_two_threads_share_one_pool() {
        let pool = small_pool(64);
        let mut handles = Vec::new();
        for _ in 0..2 {
            let p = pool.clone();
            handles.push(std::thread::spawn(move || {
                let mut c = p.cache();
                let mut v = Vec::new();
                for _ in 0..1000 {
                    c.alloc_up_to(&mut v, 16);
                    c.free_all(&mut v);
                }
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(pool.shared_free(), 64);
    }
}
