//! [`Mempool`] and its per-lcore [`PoolCache`].

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use memnic_shm::Region;

use crate::mbuf::{Links, Mbuf, SegKind};
use crate::{PoolError, DEFAULT_BUF_SIZE, DEFAULT_CACHE_SIZE, DEFAULT_HEADROOM};

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
    /// Put the buffers in a memfd so a peer can map them (zero copy). Their bytes are then
    /// reached only through copies ([`SegKind::Shared`]).
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

pub(crate) struct PoolInner {
    region: Region,
    base: NonNull<u8>,
    pub(crate) buf_size: u32,
    count: u32,
    pub(crate) headroom: u32,
    cache_size: usize,
    name: String,
    pub(crate) kind: SegKind,
    /// The next segment of the chain each buffer heads (private memory, never peer-visible).
    pub(crate) links: Links,
    free: Mutex<Vec<u32>>,
    /// The shelves of this pool's lcore caches, one per thread that has used one.
    shelves: Mutex<Vec<Weak<Shelf>>>,
}

impl PoolInner {
    pub(crate) fn put(&self, idx: u32) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(idx);
    }

    #[inline(always)]
    pub(crate) fn buf_ptr(&self, idx: u32) -> NonNull<u8> {
        debug_assert!(idx < self.count);
        // SAFETY: idx < count and count * buf_size <= region.len() (checked at creation), so the
        // result stays inside the mapping.
        unsafe { self.base.add(idx as usize * self.buf_size as usize) }
    }
}

/// Owns the pool memory; frees it only once every buffer is back (see the crate docs).
struct PoolOwner(NonNull<PoolInner>);

// SAFETY: PoolInner is Sync (its mutable state is behind a Mutex; buffers and their links are
// owned by Mbufs).
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
            .field("kind", &i.kind)
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
            kind: if cfg.shared {
                SegKind::Shared
            } else {
                SegKind::Private
            },
            links: Links::new(cfg.count),
            free: Mutex::new(free),
            shelves: Mutex::new(Vec::new()),
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
    /// Whether a peer can see the buffers (a memfd pool): then they are [`SegKind::Shared`].
    pub fn is_shared(&self) -> bool {
        self.inner().kind == SegKind::Shared
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

    /// Whether the first segment of `m` is a buffer of this pool.
    pub fn owns(&self, m: &Mbuf) -> bool {
        m.home_is(self.owner.0)
    }

    /// A new per-lcore cache of this pool.
    pub fn cache(&self) -> PoolCache {
        self.cache_sized(self.inner().cache_size)
    }

    /// A new per-lcore cache of this pool that keeps `size` buffers (at least 1) instead of
    /// the pool's own cache size.
    pub fn cache_sized(&self, size: usize) -> PoolCache {
        let size = size.max(1);
        PoolCache {
            pool: self.clone(),
            objs: Vec::with_capacity(size * 2 + 1),
            lcore: false,
            shelf: None,
            size,
            foreign: Vec::new(),
        }
    }

    /// A new lcore cache of this pool: like [`Mempool::cache`], but every lcore cache of the
    /// pool used on one thread keeps its buffers on that thread's one shelf, as DPDK's
    /// per-lcore mempool cache does. What a stream or a queue polled on an lcore frees is
    /// what another on the same lcore allocates next, so a receiver's next destinations are
    /// the buffers it has just handed up, still in its caches. With a cache each, a rx queue
    /// and the stream that freed its frames passed them round through the pool (some 500
    /// buffers, more than L2), and each copy wrote lines that came from L3: vhost dequeue at
    /// 1518 B went at 13.5 Mpps into its mbufs, 16.7 into one hot buffer. Drivers' queues and
    /// the forwarding streams use these.
    pub fn lcore_cache(&self) -> PoolCache {
        self.lcore_cache_sized(self.inner().cache_size)
    }

    /// [`Mempool::lcore_cache`] with `size` (at least 1) for this handle's refills and spills.
    pub fn lcore_cache_sized(&self, size: usize) -> PoolCache {
        let mut c = self.cache_sized(size);
        c.lcore = true;
        c
    }

    /// Allocates one buffer from the shared list (slow path: takes the lock).
    pub fn alloc(&self) -> Option<Mbuf> {
        let idx = self
            .inner()
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()?;
        Some(Mbuf::from_pool(self.owner.0, self.inner(), idx, 0))
    }
}

/// The buffers of the lcore caches of one pool on one thread ([`Mempool::lcore_cache`]).
struct Shelf {
    /// The thread that may touch `objs` ([`thread_token`]).
    owner: usize,
    objs: UnsafeCell<Vec<u32>>,
    /// Keeps the pool alive while buffers are on the shelf.
    pool: Mempool,
}

// SAFETY: `objs` is reached only through `PoolCache::parts` on the thread whose token is
// `owner` (checked there before each use), one call at a time, and in `Drop`, which has the
// shelf to itself; every other field is read-only.
unsafe impl Sync for Shelf {}

impl Drop for Shelf {
    fn drop(&mut self) {
        let objs = self.objs.get_mut();
        self.pool
            .inner()
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(objs);
    }
}

/// A number no other live thread has: the address of this thread's own thread-local byte.
#[inline(always)]
fn thread_token() -> usize {
    thread_local! {
        static TOKEN: u8 = const { 0 };
    }
    TOKEN.with(|t| t as *const u8 as usize)
}

/// A per-lcore cache of one pool: owned by one thread, no atomics on alloc/free.
pub struct PoolCache {
    pool: Mempool,
    /// The parked buffers, unless this is an lcore cache (then they are on its shelf).
    objs: Vec<u32>,
    /// An lcore cache ([`Mempool::lcore_cache`]), and the shelf of the thread it was last
    /// used on.
    lcore: bool,
    shelf: Option<Arc<Shelf>>,
    size: usize,
    /// Buffers of other pools freed here, returned to their pools in batches.
    foreign: Vec<Mbuf>,
}

impl PoolCache {
    pub fn pool(&self) -> &Mempool {
        &self.pool
    }

    /// Buffers parked in this cache (an lcore cache: on its shelf, if it was last used on this
    /// thread; otherwise 0).
    pub fn len(&self) -> usize {
        match (&self.shelf, self.lcore) {
            (_, false) => self.objs.len(),
            (Some(s), true) if s.owner == thread_token() => {
                // SAFETY: this thread owns the shelf (checked) and is not inside another call
                // that holds its `objs` (this method holds no other borrow).
                unsafe { (*s.objs.get()).len() }
            }
            _ => 0,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pool, the parked buffers (binding an lcore cache to this thread's shelf first) and
    /// the size.
    #[inline(always)]
    fn parts(&mut self) -> (&Mempool, &mut Vec<u32>, usize) {
        if !self.lcore {
            return (&self.pool, &mut self.objs, self.size);
        }
        let t = thread_token();
        if self.shelf.as_ref().is_none_or(|s| s.owner != t) {
            self.bind(t);
        }
        let shelf = self.shelf.as_ref().expect("bound above");
        // SAFETY: the shelf belongs to this thread (its owner is our token, checked above;
        // tokens of live threads differ), and no other reference to its `objs` is alive: each
        // PoolCache method takes this one at most once and calls no other cache's method while
        // it holds it.
        let objs = unsafe { &mut *shelf.objs.get() };
        (&self.pool, objs, self.size)
    }

    /// Binds an lcore cache to the shelf of the thread `t` (made on its first use there).
    #[cold]
    #[inline(never)]
    fn bind(&mut self, t: usize) {
        let inner = self.pool.inner();
        let mut shelves = inner.shelves.lock().unwrap_or_else(|p| p.into_inner());
        shelves.retain(|w| w.strong_count() > 0);
        let found = shelves
            .iter()
            .filter_map(Weak::upgrade)
            .find(|s| s.owner == t);
        let shelf = found.unwrap_or_else(|| {
            let s = Arc::new(Shelf {
                owner: t,
                objs: UnsafeCell::new(Vec::with_capacity(self.size * 2 + 1)),
                pool: self.pool.clone(),
            });
            shelves.push(Arc::downgrade(&s));
            s
        });
        drop(shelves);
        // The shelf of the thread it was used on before (if this was its last handle, its
        // buffers go back to the pool).
        self.shelf = Some(shelf);
    }

    #[cold]
    fn refill(&mut self, want: usize) {
        let (pool, objs, size) = self.parts();
        let mut free = pool.inner().free.lock().unwrap_or_else(|p| p.into_inner());
        let take = (size + want).min(free.len());
        let from = free.len() - take;
        objs.extend(free.drain(from..).rev());
    }

    #[cold]
    fn spill(&mut self) {
        let (pool, objs, keep) = self.parts();
        let mut free = pool.inner().free.lock().unwrap_or_else(|p| p.into_inner());
        free.extend(objs.drain(keep..));
    }

    /// One buffer, or None if the pool is exhausted.
    #[inline(always)]
    pub fn alloc(&mut self) -> Option<Mbuf> {
        if self.parts().1.is_empty() {
            self.refill(1);
        }
        let (pool, objs, _) = self.parts();
        let idx = objs.pop()?;
        Some(Mbuf::from_pool(pool.owner.0, pool.inner(), idx, 0))
    }

    /// Appends up to `n` empty buffers to `out`; returns how many (fewer only when the pool runs
    /// dry).
    #[inline(always)]
    pub fn alloc_up_to(&mut self, out: &mut Vec<Mbuf>, n: usize) -> usize {
        self.take(out, n, 0)
    }

    /// Appends up to `n` buffers of `len` bytes each to `out` (a generator's burst: their bytes
    /// are whatever the buffers held, for the caller to write); returns how many, none when
    /// `len` is past the pool's data room.
    #[inline(always)]
    pub fn alloc_len_up_to(&mut self, out: &mut Vec<Mbuf>, n: usize, len: usize) -> usize {
        if len > self.pool.data_room() as usize {
            return 0;
        }
        self.take(out, n, len as u32)
    }

    #[inline(always)]
    fn take(&mut self, out: &mut Vec<Mbuf>, n: usize, len: u32) -> usize {
        if self.parts().1.len() < n {
            self.refill(n);
        }
        let (pool, objs, _) = self.parts();
        let got = n.min(objs.len());
        let ptr = pool.owner.0;
        let inner = pool.inner();
        let from = objs.len() - got;
        out.extend(
            objs.drain(from..)
                .rev()
                .map(|idx| Mbuf::from_pool(ptr, inner, idx, len)),
        );
        got
    }

    /// Frees a packet: every segment goes home (a buffer of this pool into the cache, one of
    /// another pool to that pool, an external segment to its completion list).
    #[inline(always)]
    pub fn free(&mut self, m: Mbuf) {
        if !m.is_single_of(self.pool.owner.0) {
            return self.free_slow(m);
        }
        let idx = m.into_index();
        let (_, objs, size) = self.parts();
        objs.push(idx);
        if objs.len() >= size * 2 {
            self.spill();
        }
    }

    #[cold]
    fn free_slow(&mut self, mut m: Mbuf) {
        loop {
            let rest = m.take_next();
            if m.is_single_of(self.pool.owner.0) {
                let (_, objs, size) = self.parts();
                objs.push(m.into_index());
                if objs.len() >= size * 2 {
                    self.spill();
                }
            } else if m.kind() == SegKind::External {
                drop(m); // queues its completion: lock-free
            } else {
                self.foreign.push(m);
                if self.foreign.len() >= 64 {
                    self.foreign.clear(); // each drop returns its buffer to its own pool
                }
            }
            match rest {
                Some(r) => m = r,
                None => break,
            }
        }
    }

    /// Frees every packet in `bufs`, leaving it empty ([`PoolCache::free_front`]).
    #[inline(always)]
    pub fn free_all(&mut self, bufs: &mut Vec<Mbuf>) {
        self.free_front(bufs, bufs.len());
    }

    /// Frees the first `n` packets of `bufs` (all, if it holds fewer) and moves the rest to
    /// its front, as `bufs.drain(..n)` handed to [`PoolCache::free`] one by one would.
    ///
    /// A burst of lone segments of this pool (what a receive or a sent burst nearly always
    /// is) goes onto the cache in one go: the cache is found once and its length kept in a
    /// register, where freeing one by one looked the cache up again and stored and reloaded
    /// its length for every buffer (a dependency through memory each time). In-process flip,
    /// in one go / one by one, 64 B (B/A p20/p50/p80), the receiver counted (testpmd's rxonly
    /// frees each burst): MEMNIC host->guest 1.04/1.07/1.14 and 1.04/1.05/1.07, guest->host
    /// 0.92/1.02/1.07; memif our server <- our client 1.00/1.03/1.04, our client <- our server
    /// 0.97/1.01/1.03. The sender counted (a tx burst frees what it sent): our vhost backend
    /// into virtio-user, packed ring 1.03/1.05/1.07, split 1.01/1.03/1.04; our memif client
    /// into our server 0.97/1.01/1.04.
    #[inline(always)]
    pub fn free_front(&mut self, bufs: &mut Vec<Mbuf>, n: usize) {
        let n = n.min(bufs.len());
        let home = self.pool.owner.0;
        if !bufs[..n].iter().all(|m| m.is_single_of(home)) {
            for m in bufs.drain(..n) {
                self.free(m);
            }
            return;
        }
        let (_, objs, size) = self.parts();
        objs.extend(bufs.drain(..n).map(Mbuf::into_index));
        if objs.len() >= size * 2 {
            self.spill();
        }
    }

    /// Returns every parked buffer to the shared list (an lcore cache: those on this thread's
    /// shelf).
    pub fn flush(&mut self) {
        self.foreign.clear();
        let (pool, objs, _) = self.parts();
        pool.inner()
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(objs);
    }
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        if self.lcore {
            // The shelf stays with the thread's other lcore caches; the last one to go
            // returns its buffers (`Shelf::drop`).
            self.foreign.clear();
        } else {
            self.flush();
        }
    }
}
