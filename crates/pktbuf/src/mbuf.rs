//! [`Mbuf`]: a packet of one or more segments over private, shared or external memory.
//!
//! Each segment is an `Mbuf` of its own (a pool buffer or an external range). A chain links
//! segments through a side table of its home (pool or [`ExtPool`](crate::ExtPool)), indexed by
//! the segment's slot, in private memory: the slot's owner is the only one who reads or writes
//! it, so chaining and unchaining take no lock and no atomic. Invariant: `nb_segs > 1` exactly
//! when the segment has a next one, and every segment's `pkt_len`/`nb_segs` describe the chain
//! that starts at it (so any tail taken off is itself a well-formed packet).

use std::cell::UnsafeCell;
use std::ptr::NonNull;

use memnic_shm::VolatileSlice;

use crate::ext::ExtInner;
use crate::pool::{PoolCache, PoolInner};

/// What kind of memory a segment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SegKind {
    /// A buffer of a private pool: plain slices, the fast path.
    Private,
    /// A buffer of a pool a peer can see: reached only through copies.
    Shared,
    /// Memory we do not own (a peer's region): read-only, completed when freed.
    External,
}

/// The next-segment table of a pool or an external pool, one entry per slot.
pub(crate) struct Links(Box<[UnsafeCell<Option<Mbuf>>]>);

// SAFETY: entry `i` is touched only through the Mbuf that owns slot `i` (take_next, next_seg,
// chain, all through that Mbuf's &/&mut), so no two threads reach one entry at once.
unsafe impl Sync for Links {}
// SAFETY: the entries are owned Mbufs, which are Send.
unsafe impl Send for Links {}

impl Links {
    pub(crate) fn new(count: u32) -> Links {
        Links((0..count).map(|_| UnsafeCell::new(None)).collect())
    }
}

/// One packet (or one segment of a chain). Owns its buffers until freed or dropped.
pub struct Mbuf {
    /// Start of this segment's buffer.
    buf: NonNull<u8>,
    /// A `PoolInner` for pool segments, an `ExtInner` for external ones.
    home: NonNull<()>,
    idx: u32,
    data_off: u32,
    data_len: u32,
    buf_len: u32,
    /// Bytes in the chain from this segment on.
    pkt_len: u32,
    /// Segments in the chain from this segment on.
    nb_segs: u16,
    kind: SegKind,
}

// SAFETY: an Mbuf exclusively owns its buffer bytes (private and shared: a slot of its pool;
// external: a slot of its ExtPool) and its link entry; releasing it touches only a Mutex (pool)
// or a lock-free queue (external), and the memory outlives it (crate docs).
unsafe impl Send for Mbuf {}
// SAFETY: &Mbuf only gives shared reads of the owned bytes and of the link entry.
unsafe impl Sync for Mbuf {}

impl std::fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mbuf")
            .field("kind", &self.kind)
            .field("idx", &self.idx)
            .field("data_off", &self.data_off)
            .field("data_len", &self.data_len)
            .field("pkt_len", &self.pkt_len)
            .field("nb_segs", &self.nb_segs)
            .finish()
    }
}

impl Mbuf {
    #[inline(always)]
    /// Buffer `idx` of a pool as a lone segment of `len` bytes (`len` at most the data room).
    pub(crate) fn from_pool(
        home: NonNull<PoolInner>,
        inner: &PoolInner,
        idx: u32,
        len: u32,
    ) -> Mbuf {
        debug_assert!(len <= inner.buf_size - inner.headroom);
        Mbuf {
            buf: inner.buf_ptr(idx),
            home: home.cast(),
            idx,
            data_off: inner.headroom,
            data_len: len,
            buf_len: inner.buf_size,
            pkt_len: len,
            nb_segs: 1,
            kind: inner.kind,
        }
    }

    /// An external segment of `len` bytes at `buf`, slot `idx` of `home`.
    #[inline(always)]
    pub(crate) fn from_ext(home: NonNull<ExtInner>, idx: u32, buf: NonNull<u8>, len: u32) -> Mbuf {
        Mbuf {
            buf,
            home: home.cast(),
            idx,
            data_off: 0,
            data_len: len,
            buf_len: len,
            pkt_len: len,
            nb_segs: 1,
            kind: SegKind::External,
        }
    }

    #[inline(always)]
    pub(crate) fn home_is(&self, home: NonNull<PoolInner>) -> bool {
        self.home == home.cast()
    }

    /// A lone segment whose buffer belongs to the pool at `home` (the fast free path).
    #[inline(always)]
    pub(crate) fn is_single_of(&self, home: NonNull<PoolInner>) -> bool {
        self.home == home.cast() && self.nb_segs == 1
    }

    /// Gives up a lone pool segment without releasing it; the caller returns `idx` to the pool.
    #[inline(always)]
    pub(crate) fn into_index(self) -> u32 {
        debug_assert!(self.nb_segs == 1 && self.kind != SegKind::External);
        let idx = self.idx;
        std::mem::forget(self);
        idx
    }

    #[inline(always)]
    fn link(&self) -> *mut Option<Mbuf> {
        let links = match self.kind {
            // SAFETY: an external segment's home is a live ExtInner (crate docs: it outlives
            // every segment).
            SegKind::External => unsafe { &self.home.cast::<ExtInner>().as_ref().links },
            // SAFETY: a pool segment's home is a live PoolInner (crate docs).
            _ => unsafe { &self.home.cast::<PoolInner>().as_ref().links },
        };
        links.0[self.idx as usize].get()
    }

    /// Packet length: the bytes of every segment (`rte_pktmbuf_pkt_len`).
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.pkt_len as usize
    }
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.pkt_len == 0
    }
    /// Bytes in this segment (`rte_pktmbuf_data_len`).
    #[inline(always)]
    pub fn data_len(&self) -> usize {
        self.data_len as usize
    }
    /// Segments in the packet.
    #[inline(always)]
    pub fn nb_segs(&self) -> usize {
        self.nb_segs as usize
    }
    #[inline(always)]
    pub fn kind(&self) -> SegKind {
        self.kind
    }
    /// Bytes free in front of the data.
    pub fn headroom(&self) -> usize {
        self.data_off as usize
    }
    /// Bytes free after this segment's data (0 for an external segment: it is read-only).
    #[inline(always)]
    pub fn tailroom(&self) -> usize {
        (self.buf_len - self.data_off - self.data_len) as usize
    }
    /// Largest data length this segment can hold at the current data offset.
    #[inline(always)]
    pub fn capacity(&self) -> usize {
        (self.buf_len - self.data_off) as usize
    }
    /// The slot of the segment: its buffer index in its pool, or its `ExtPool` slot.
    pub fn index(&self) -> u32 {
        self.idx
    }
    /// Offset of the data from the start of the pool's region, for zero-copy descriptors. Only
    /// meaningful for a pool segment ([`SegKind::Private`] or [`SegKind::Shared`]).
    pub fn region_offset(&self) -> usize {
        self.idx as usize * self.buf_len as usize + self.data_off as usize
    }

    /// The whole frame as one plain slice: only for a frame of one private segment (a chain's
    /// first segment is not the frame; see [`Mbuf::as_slice`]).
    #[inline(always)]
    pub fn frame_slice(&self) -> Option<&[u8]> {
        if self.nb_segs != 1 {
            return None;
        }
        self.as_slice()
    }

    /// This segment's data as a plain slice: only for a private segment (peer-visible and
    /// external memory is never behind a reference).
    #[inline(always)]
    pub fn as_slice(&self) -> Option<&[u8]> {
        if self.kind != SegKind::Private {
            return None;
        }
        // SAFETY: private pool memory no one else maps; data_off + data_len <= buf_len is an
        // invariant of every mutator, and the buffer is owned by this Mbuf.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.buf.as_ptr().add(self.data_off as usize),
                self.data_len as usize,
            )
        })
    }

    /// This segment's data as a plain mutable slice: only for a private segment.
    #[inline(always)]
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        if self.kind != SegKind::Private {
            return None;
        }
        // SAFETY: as in as_slice, and &mut self makes the access exclusive.
        Some(unsafe {
            std::slice::from_raw_parts_mut(
                self.buf.as_ptr().add(self.data_off as usize),
                self.data_len as usize,
            )
        })
    }

    /// `len` bytes of this segment's buffer from the data offset, as a window for copies.
    #[inline(always)]
    fn window(&self, len: usize) -> VolatileSlice<'_> {
        debug_assert!(len <= self.capacity());
        // SAFETY: data_off + len <= buf_len (callers pass at most capacity()), inside memory that
        // outlives self; windows are only made over segments no reference covers (shared and
        // external always; private only through &mut self or for reads under &self, where the
        // window, like a slice, is only read).
        unsafe { VolatileSlice::from_raw_parts(self.buf.add(self.data_off as usize), len) }
    }

    /// This segment's data as a window (any kind of memory).
    #[inline(always)]
    pub fn seg_window(&self) -> VolatileSlice<'_> {
        self.window(self.data_len as usize)
    }

    /// Sets the data length of a lone, writable segment; false (and no change) if it does not
    /// fit, if the packet has several segments, or if the segment is external.
    #[inline(always)]
    pub fn set_len(&mut self, len: usize) -> bool {
        if len > self.capacity() || self.nb_segs != 1 || self.kind == SegKind::External {
            return false;
        }
        self.data_len = len as u32;
        self.pkt_len = len as u32;
        true
    }

    /// Receives into a lone, writable segment: copies all of `src` (which may run past `len`,
    /// for copies rounded up to whole vectors) to the data offset and sets the length to `len`.
    /// False (and no change) when `len > src.len()`, `src` does not fit, or the segment cannot
    /// be written.
    #[inline(always)]
    pub fn fill_from(&mut self, src: &VolatileSlice<'_>, len: usize) -> bool {
        let n = src.len();
        if len > n || n > self.capacity() || self.nb_segs != 1 {
            return false;
        }
        match self.kind {
            SegKind::Private => {
                // SAFETY: private memory owned by this Mbuf, data_off + n <= buf_len (checked
                // above); exclusive through &mut self.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(self.buf.as_ptr().add(self.data_off as usize), n)
                };
                src.read(0, dst).expect("dst has src.len() bytes");
            }
            SegKind::Shared => src
                .copy_to(&self.window(n))
                .expect("window has src.len() bytes"),
            SegKind::External => return false,
        }
        self.data_len = len as u32;
        self.pkt_len = len as u32;
        true
    }

    /// Receives into a lone private segment: sets its length to `len` and returns its first
    /// `n` bytes (`len <= n <= capacity`: a copy rounded up) for the caller to write. None for
    /// any other packet (then [`Mbuf::fill_from`]), and no change.
    #[inline(always)]
    pub fn fill_slice(&mut self, len: usize, n: usize) -> Option<&mut [u8]> {
        if self.kind != SegKind::Private || self.nb_segs != 1 || len > n || n > self.capacity() {
            return None;
        }
        self.data_len = len as u32;
        self.pkt_len = len as u32;
        // SAFETY: private memory owned by this Mbuf, data_off + n <= buf_len (checked above);
        // exclusive through &mut self for the slice's lifetime.
        Some(unsafe {
            std::slice::from_raw_parts_mut(self.buf.as_ptr().add(self.data_off as usize), n)
        })
    }

    /// Appends the bytes of `src` to the end of the packet: into the last segment's tailroom,
    /// then into buffers from `cache` chained on. False when the pool runs dry or the chain
    /// would grow past its limits (what was appended so far stays; callers drop the packet).
    #[inline(always)]
    pub fn extend_from(&mut self, src: &VolatileSlice<'_>, cache: &mut PoolCache) -> bool {
        let n = src.len();
        if self.nb_segs == 1 && self.kind != SegKind::External && n <= self.tailroom() {
            // The common case: one segment with the room.
            let at = self.data_len as usize;
            let grown = at + n;
            if let Some(dst) = self.as_mut_slice_upto(grown) {
                src.read(0, &mut dst[at..]).expect("room checked");
            } else {
                src.copy_to(&self.window(grown).subslice(at, n).expect("room checked"))
                    .expect("same length");
            }
            self.data_len = grown as u32;
            self.pkt_len = grown as u32;
            return true;
        }
        self.extend_slow(src, cache)
    }

    #[cold]
    fn extend_slow(&mut self, src: &VolatileSlice<'_>, cache: &mut PoolCache) -> bool {
        let mut done = 0;
        // First into the last segment's tailroom, if it is ours to write.
        let last = self.segments().last().expect("a packet has a segment");
        let room = if last.kind == SegKind::External {
            0
        } else {
            last.tailroom().min(src.len())
        };
        if room > 0 {
            let mut cur: *mut Mbuf = self;
            loop {
                // SAFETY: cur is self or a segment owned through self's chain, which is borrowed
                // mutably: no other reference to it exists.
                let c = unsafe { &mut *cur };
                c.pkt_len += room as u32;
                if c.nb_segs == 1 {
                    let at = c.data_len as usize;
                    let dst = c.window(at + room).subslice(at, room).expect("tailroom");
                    src.subslice(0, room)
                        .and_then(|s| s.copy_to(&dst))
                        .expect("in src");
                    c.data_len += room as u32;
                    break;
                }
                // SAFETY: c's link entry is c's alone; exclusive through &mut.
                cur = unsafe { &mut *c.link() }.as_mut().expect("nb_segs > 1");
            }
            done = room;
        }
        while done < src.len() {
            let Some(mut seg) = cache.alloc() else {
                return false;
            };
            let k = (src.len() - done).min(seg.capacity());
            let part = src.subslice(done, k).expect("in src");
            if k == 0 || !seg.fill_from(&part, k) {
                cache.free(seg);
                return false;
            }
            if let Err(seg) = self.chain(seg) {
                cache.free(seg);
                return false;
            }
            done += k;
        }
        true
    }

    /// The first `len` bytes from the data offset of a private segment, as a mutable slice.
    #[inline(always)]
    fn as_mut_slice_upto(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.kind != SegKind::Private || len > self.capacity() {
            return None;
        }
        // SAFETY: private memory owned by this Mbuf, data_off + len <= buf_len (checked);
        // exclusive through &mut self.
        Some(unsafe {
            std::slice::from_raw_parts_mut(self.buf.as_ptr().add(self.data_off as usize), len)
        })
    }

    /// A lone private segment's first `n` bytes from the data offset (`n` at least its length,
    /// at most its capacity: a copy rounded up), as a plain slice; None for any other packet.
    #[inline(always)]
    pub fn as_slice_padded(&self, n: usize) -> Option<&[u8]> {
        if self.nb_segs != 1 || n < self.data_len as usize {
            return None;
        }
        self.private_upto(n)
    }

    /// `len` bytes of a private segment's buffer from the data offset, for reading.
    #[inline(always)]
    fn private_upto(&self, len: usize) -> Option<&[u8]> {
        if self.kind != SegKind::Private || len > self.capacity() {
            return None;
        }
        // SAFETY: private memory owned by this Mbuf, data_off + len <= buf_len (checked); pool
        // buffers are initialised memory, and &self allows only reads.
        Some(unsafe {
            std::slice::from_raw_parts(self.buf.as_ptr().add(self.data_off as usize), len)
        })
    }

    /// The first `n` bytes of a lone segment's buffer into `dst`: from a private buffer a plain
    /// write (no overlap is possible), from any other a window copy.
    #[inline(always)]
    fn lone_copy_to(&self, n: usize, dst: &VolatileSlice<'_>) -> bool {
        match self.private_upto(n) {
            Some(src) => dst.write(0, src).is_ok(),
            None => self.window(n).copy_to(dst).is_ok(),
        }
    }

    /// Copies the whole packet to the start of `dst`; false if `dst` is shorter.
    #[inline(always)]
    pub fn copy_to(&self, dst: &VolatileSlice<'_>) -> bool {
        let len = self.pkt_len as usize;
        if self.nb_segs == 1 {
            return self.lone_copy_to(len, dst);
        }
        match dst.subslice(0, len) {
            Ok(d) => self.copy_out_to(0, &d),
            Err(_) => false,
        }
    }

    /// As [`Mbuf::copy_to`], but a small lone
    /// segment is copied rounded up to 32 bytes when both buffers have the room (fixed-size
    /// vector moves instead of a `memcpy` call).
    #[inline(always)]
    pub fn copy_padded_to(&self, dst: &VolatileSlice<'_>) -> bool {
        let len = self.pkt_len as usize;
        if self.nb_segs == 1 {
            let n = len.next_multiple_of(32);
            let n = if len <= 128
                && n <= self.capacity()
                && n <= dst.len()
                && self.kind != SegKind::External
            {
                n
            } else {
                len
            };
            if n > dst.len() {
                return false;
            }
            return self.lone_copy_to(n, dst);
        }
        match dst.subslice(0, len) {
            Ok(d) => self.copy_out_to(0, &d),
            Err(_) => false,
        }
    }

    /// Copies packet bytes `off..off + dst.len()` (across segments) into private memory.
    #[inline(always)]
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) -> bool {
        if let Some(w) = self.lone_range(off, dst.len()) {
            return w.read(0, dst).is_ok();
        }
        self.copy_out_slow(off, dst)
    }

    fn copy_out_slow(&self, off: usize, dst: &mut [u8]) -> bool {
        let mut done = 0;
        self.walk(off, dst.len(), |seg, at, n| {
            match seg.as_slice() {
                Some(s) => dst[done..done + n].copy_from_slice(&s[at..at + n]),
                None => seg
                    .seg_window()
                    .read(at, &mut dst[done..done + n])
                    .expect("in segment"),
            }
            done += n;
            true
        })
    }

    /// Copies packet bytes `off..off + dst.len()` (across segments) into a window.
    #[inline(always)]
    pub fn copy_out_to(&self, off: usize, dst: &VolatileSlice<'_>) -> bool {
        if let Some(w) = self.lone_range(off, dst.len()) {
            return w.copy_to(dst).is_ok();
        }
        self.copy_out_to_slow(off, dst)
    }

    fn copy_out_to_slow(&self, off: usize, dst: &VolatileSlice<'_>) -> bool {
        let mut done = 0;
        self.walk(off, dst.len(), |seg, at, n| {
            let d = dst.subslice(done, n).expect("in dst");
            match seg.as_slice() {
                Some(s) => d.write(0, &s[at..at + n]).expect("in dst"),
                None => seg
                    .seg_window()
                    .subslice(at, n)
                    .and_then(|s| s.copy_to(&d))
                    .expect("in segment"),
            }
            done += n;
            true
        })
    }

    /// Copies `src` into packet bytes `off..off + src.len()`; false (nothing written) if the
    /// range is outside the packet or covers an external (read-only) segment.
    #[inline(always)]
    pub fn copy_in(&mut self, off: usize, src: &[u8]) -> bool {
        if self.kind != SegKind::External {
            if let Some(w) = self.lone_range(off, src.len()) {
                // Ours to write (private or our own shared pool), and no reference to its bytes
                // exists while self is borrowed mutably.
                return w.write(0, src).is_ok();
            }
        }
        self.copy_in_slow(off, src)
    }

    fn copy_in_slow(&mut self, off: usize, src: &[u8]) -> bool {
        if !self.walk(off, src.len(), |seg, _, _| seg.kind != SegKind::External) {
            return false;
        }
        let mut done = 0;
        self.walk(off, src.len(), |seg, at, n| {
            // The segments are owned by self, which is borrowed mutably for this call: no
            // reference to their bytes exists, so a window may write them.
            seg.seg_window()
                .write(at, &src[done..done + n])
                .expect("in segment");
            done += n;
            true
        })
    }

    /// Copies a window into packet bytes `off..off + src.len()`; as [`Mbuf::copy_in`].
    pub fn copy_in_from(&mut self, off: usize, src: &VolatileSlice<'_>) -> bool {
        if !self.walk(off, src.len(), |seg, _, _| seg.kind != SegKind::External) {
            return false;
        }
        let mut done = 0;
        self.walk(off, src.len(), |seg, at, n| {
            let s = src.subslice(done, n).expect("in src");
            let d = seg.seg_window().subslice(at, n).expect("in segment");
            s.copy_to(&d).expect("same length");
            done += n;
            true
        })
    }

    /// Bytes `off..off + len` of a lone segment, as a window (the fast path of the copies).
    #[inline(always)]
    fn lone_range(&self, off: usize, len: usize) -> Option<VolatileSlice<'_>> {
        if self.nb_segs != 1 {
            return None;
        }
        match off.checked_add(len) {
            Some(end) if end <= self.data_len as usize => self.seg_window().subslice(off, len).ok(),
            _ => None,
        }
    }

    /// The whole packet, copied into a new vector (tests and diagnostics; never the hot path).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.copy_out(0, &mut v);
        v
    }

    /// Calls `f(segment, offset in segment, bytes)` for each piece of packet range
    /// `off..off + len`, in order, while it returns true; false if the range is outside the
    /// packet or `f` said stop.
    fn walk(&self, off: usize, len: usize, mut f: impl FnMut(&Mbuf, usize, usize) -> bool) -> bool {
        match off.checked_add(len) {
            Some(end) if end <= self.len() => {}
            _ => return false,
        }
        let (mut skip, mut left) = (off, len);
        let mut seg = Some(self);
        while let Some(s) = seg {
            if left == 0 {
                break;
            }
            let dl = s.data_len();
            if skip < dl {
                let n = (dl - skip).min(left);
                if !f(s, skip, n) {
                    return false;
                }
                left -= n;
                skip = 0;
            } else {
                skip -= dl;
            }
            seg = s.next_seg();
        }
        left == 0
    }

    /// Grows a lone private segment's data at the end by `n` bytes and returns them.
    pub fn append(&mut self, n: usize) -> Option<&mut [u8]> {
        let old = self.data_len as usize;
        if self.kind != SegKind::Private || n > self.tailroom() || !self.set_len(old + n) {
            return None;
        }
        self.as_mut_slice().map(|s| &mut s[old..])
    }

    /// Grows the first segment's data at the front by `n` bytes (into the headroom) and returns
    /// them; only a private segment.
    pub fn prepend(&mut self, n: usize) -> Option<&mut [u8]> {
        if n > self.data_off as usize || self.kind != SegKind::Private {
            return None;
        }
        self.data_off -= n as u32;
        self.data_len += n as u32;
        self.pkt_len += n as u32;
        self.as_mut_slice().map(|s| &mut s[..n])
    }

    /// Removes `n` bytes from the front of the first segment; false if it has fewer.
    pub fn adj(&mut self, n: usize) -> bool {
        if n > self.data_len as usize {
            return false;
        }
        self.data_off += n as u32;
        self.data_len -= n as u32;
        self.pkt_len -= n as u32;
        true
    }

    /// Frees every segment after the first, empties it and restores the default headroom.
    pub fn reset(&mut self) {
        drop(self.take_next());
        self.data_off = match self.kind {
            SegKind::External => 0,
            // SAFETY: a pool segment's home is a live PoolInner (crate docs).
            _ => unsafe { self.home.cast::<PoolInner>().as_ref() }.headroom,
        };
        self.data_len = 0;
        self.pkt_len = 0;
    }

    /// The next segment of the chain.
    #[inline(always)]
    pub fn next_seg(&self) -> Option<&Mbuf> {
        if self.nb_segs == 1 {
            return None;
        }
        // SAFETY: our link entry is ours alone (Links); &self gives a shared read of it.
        unsafe { (*self.link()).as_ref() }
    }

    /// The segments of the packet, first to last.
    pub fn segments(&self) -> Segments<'_> {
        Segments { next: Some(self) }
    }

    /// Detaches everything after the first segment (a well-formed packet of its own).
    #[inline(always)]
    pub fn take_next(&mut self) -> Option<Mbuf> {
        if self.nb_segs == 1 {
            return None;
        }
        self.nb_segs = 1;
        self.pkt_len = self.data_len;
        // SAFETY: our link entry is ours alone, and &mut self makes this access exclusive.
        unsafe { (*self.link()).take() }
    }

    /// Appends the packet `tail` (all its segments) after the last segment. Hands `tail` back
    /// if the chain would pass 65535 segments or 4 GiB.
    pub fn chain(&mut self, tail: Mbuf) -> Result<(), Mbuf> {
        let (segs, bytes) = (tail.nb_segs, tail.pkt_len);
        if self.nb_segs.checked_add(segs).is_none() || self.pkt_len.checked_add(bytes).is_none() {
            return Err(tail);
        }
        let mut cur: *mut Mbuf = self;
        loop {
            // SAFETY: cur is self or a segment owned (through link entries) by self, which is
            // borrowed mutably: no other reference to it exists.
            let c = unsafe { &mut *cur };
            let last = c.nb_segs == 1;
            c.nb_segs += segs;
            c.pkt_len += bytes;
            // SAFETY: c's link entry is c's alone; exclusive through &mut.
            let link = unsafe { &mut *c.link() };
            if last {
                *link = Some(tail);
                return Ok(());
            }
            cur = link.as_mut().expect("nb_segs > 1 means a next segment");
        }
    }

    /// Makes the first segment private, writable memory (for header rewrites): a shared or
    /// external first segment is copied into a buffer of `cache`'s pool and released. False
    /// (and no change) when the pool is empty, is not private, or its buffer is too small.
    pub fn make_head_private(&mut self, cache: &mut PoolCache) -> bool {
        if self.kind == SegKind::Private {
            return true;
        }
        let n = self.data_len as usize;
        let Some(mut fresh) = cache.alloc() else {
            return false;
        };
        if !fresh.set_len(n) || fresh.kind != SegKind::Private {
            cache.free(fresh);
            return false;
        }
        let dst = fresh.as_mut_slice().expect("private");
        self.seg_window().read(0, dst).expect("same length");
        let rest = self.take_next();
        let old = std::mem::replace(self, fresh);
        cache.free(old);
        if let Some(r) = rest {
            // Cannot fail: the chain had these segments a moment ago, and as many bytes.
            let _ = self.chain(r).map_err(drop);
        }
        true
    }

    #[inline(always)]
    fn release(&mut self) {
        match self.kind {
            SegKind::External => {
                // SAFETY: an external segment's home is a live ExtInner (crate docs).
                unsafe { self.home.cast::<ExtInner>().as_ref() }.complete(self.idx)
            }
            // SAFETY: a pool segment's home is a live PoolInner (crate docs).
            _ => unsafe { self.home.cast::<PoolInner>().as_ref() }.put(self.idx),
        }
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // Slow path (PoolCache::free is the fast one). Iterative, so a long chain cannot
        // exhaust the stack: each detached segment is dropped with no next of its own.
        let mut rest = self.take_next();
        self.release();
        while let Some(mut s) = rest {
            rest = s.take_next();
        }
    }
}

/// Iterator over the segments of a packet.
pub struct Segments<'a> {
    next: Option<&'a Mbuf>,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a Mbuf;
    fn next(&mut self) -> Option<&'a Mbuf> {
        let s = self.next?;
        self.next = s.next_seg();
        Some(s)
    }
}
