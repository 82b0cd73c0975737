//! [`VolatileSlice`]: a bounds-checked window of memory that someone else may write at any time
//! (a peer's region, our own buffers a peer can see), in the shape of rust-vmm's `VolatileSlice`.
//!
//! It never hands out a Rust reference to the bytes: only copies in and out (into private
//! buffers or into another window) and fixed-size reads into locals. Every copy is checked
//! against the window's length, and the window against its mapping when it was made, so no value
//! read from shared memory can make a copy leave the mapping.

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::region::{copy_bytes, stream_bytes};
use crate::{Region, Result, ShmError};

/// `len` bytes of shared memory, borrowed from the mapping that holds them (`'a`).
#[derive(Clone, Copy)]
pub struct VolatileSlice<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _mapping: PhantomData<&'a Region>,
}

// SAFETY: a VolatileSlice only copies bytes in and out; concurrent copies through two threads'
// windows race on the bytes (as a peer's writes do) but never on any Rust object.
unsafe impl Send for VolatileSlice<'_> {}
// SAFETY: as above: &VolatileSlice allows nothing but bounded copies.
unsafe impl Sync for VolatileSlice<'_> {}

impl std::fmt::Debug for VolatileSlice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolatileSlice")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

#[inline(always)]
fn check(offset: usize, size: usize, len: usize) -> Result<()> {
    match offset.checked_add(size) {
        Some(end) if end <= len => Ok(()),
        _ => Err(ShmError::OutOfBounds { offset, size, len }),
    }
}

impl<'a> VolatileSlice<'a> {
    /// A window over `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped and readable and writable for `'a`, and no Rust
    /// reference to those bytes may exist while the window (or a copy of it) is used.
    #[inline(always)]
    pub unsafe fn from_raw_parts(ptr: NonNull<u8>, len: usize) -> VolatileSlice<'a> {
        VolatileSlice {
            ptr,
            len,
            _mapping: PhantomData,
        }
    }

    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at `offset` of this window.
    #[inline(always)]
    pub fn subslice(&self, offset: usize, len: usize) -> Result<VolatileSlice<'a>> {
        check(offset, len, self.len)?;
        Ok(VolatileSlice {
            // SAFETY: offset + len <= self.len (checked), so the result stays inside our window.
            ptr: unsafe { self.ptr.add(offset) },
            len,
            _mapping: PhantomData,
        })
    }

    /// Copies `dst.len()` bytes from `offset` of the window into private memory. A racing writer
    /// can only change which bytes `dst` receives.
    #[inline(always)]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check(offset, dst.len(), self.len)?;
        // SAFETY: the source is inside our window (checked; the window is inside a live mapping by
        // construction), dst is a distinct private buffer, and u8 has no invalid values.
        unsafe { copy_bytes(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the window at `offset`.
    #[inline(always)]
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        check(offset, src.len(), self.len)?;
        // SAFETY: the destination is inside our window (checked) and src is private memory that
        // cannot overlap it (no reference to window bytes exists).
        unsafe { copy_bytes(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Writes back and evicts the window's cache lines from every cache (CLFLUSHOPT), so that
    /// the peer's next store to them fetches nothing from this core: for bytes just copied out
    /// of a buffer the peer writes again with plain stores. Nothing happens on CPUs without
    /// CLFLUSHOPT or elsewhere than x86_64. The bytes do not change.
    #[inline(always)]
    pub fn flush_lines(&self) {
        #[cfg(target_arch = "x86_64")]
        if has_clflushopt() {
            self.each_line(|p| {
                // SAFETY: CLFLUSHOPT neither reads nor writes the bytes of the line; the address
                // lies inside the window, which lies inside a live mapping, and the CPU
                // supports the instruction (checked above).
                unsafe {
                    std::arch::asm!("clflushopt [{p}]", p = in(reg) p, options(nostack, preserves_flags));
                }
            });
        }
    }

    /// Moves the window's cache lines from this core's caches out to the cache it shares with
    /// the other cores (CLDEMOTE, a hint): for bytes just written for a peer that reads them
    /// next, whose read then finds them there instead of fetching them from this core. A NOP on
    /// CPUs without CLDEMOTE (it is encoded in the hint-NOP space) and elsewhere than x86_64.
    /// The bytes do not change.
    #[inline(always)]
    pub fn demote_lines(&self) {
        #[cfg(target_arch = "x86_64")]
        self.each_line(|p| {
            // SAFETY: CLDEMOTE neither reads nor writes the bytes of the line and decodes as a
            // NOP on CPUs without it; the address lies inside the window, which lies inside a
            // live mapping.
            unsafe {
                std::arch::asm!("cldemote [{p}]", p = in(reg) p, options(nostack, preserves_flags));
            }
        });
    }

    /// Calls `f` with an address inside each cache line the window touches (the window's
    /// first byte for its first line).
    #[inline(always)]
    fn each_line(&self, mut f: impl FnMut(usize)) {
        let start = self.ptr.as_ptr() as usize;
        let mut line = start & !63;
        while line < start + self.len {
            f(line.max(start));
            line += 64;
        }
    }

    /// Copies `src` into the window at `offset` with streaming stores where the destination is
    /// 16-byte aligned (see [`crate::Region::write_bytes_streaming`]; weakly ordered: call
    /// [`crate::store_fence`] before publishing the bytes).
    #[inline(always)]
    pub fn write_streaming(&self, offset: usize, src: &[u8]) -> Result<()> {
        check(offset, src.len(), self.len)?;
        // SAFETY: as in `write`.
        unsafe { stream_bytes(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Reads `N` bytes at `offset` into a local (a header, a descriptor).
    #[inline(always)]
    pub fn read_array<const N: usize>(&self, offset: usize) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        self.read(offset, &mut out)?;
        Ok(out)
    }

    /// Copies this whole window to the start of `dst` (which must be at least as long). Two
    /// windows of two different mappings, or of distinct buffers of one mapping.
    #[inline(always)]
    pub fn copy_to(&self, dst: &VolatileSlice<'_>) -> Result<()> {
        check(0, self.len, dst.len)?;
        if ranges_overlap(
            self.ptr.as_ptr() as usize,
            dst.ptr.as_ptr() as usize,
            self.len,
        ) {
            // SAFETY: both ranges are inside live windows (checked); `copy` allows overlap.
            unsafe { std::ptr::copy(self.ptr.as_ptr(), dst.ptr.as_ptr(), self.len) };
        } else {
            // SAFETY: both ranges are inside live windows (checked) and do not overlap.
            unsafe { copy_bytes(self.ptr.as_ptr(), dst.ptr.as_ptr(), self.len) };
        }
        Ok(())
    }

    /// Sets every byte of the window to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the window is live mapped memory with no references into it.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
    }

    /// Hints the CPU to load the line at `offset` (ignored outside the window).
    #[inline(always)]
    pub fn prefetch(&self, offset: usize) {
        #[cfg(target_arch = "x86_64")]
        if offset < self.len {
            // SAFETY: prefetch has no architectural effect; the address is inside the window.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(self.ptr.as_ptr().add(offset).cast());
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = offset;
    }

    /// Start address (diagnostics and identity checks; never dereferenced outside this crate).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

#[inline(always)]
fn ranges_overlap(a: usize, b: usize, len: usize) -> bool {
    a < b.wrapping_add(len) && b < a.wrapping_add(len)
}

impl Region {
    /// The `len` bytes at `offset` of the region as a [`VolatileSlice`], or an error when they
    /// are not all inside it. Use this for ranges that came from a peer.
    #[inline(always)]
    pub fn slice(&self, offset: usize, len: usize) -> Result<VolatileSlice<'_>> {
        check(offset, len, self.len())?;
        let base = NonNull::new(self.as_mut_ptr()).expect("a mapping is never at address 0");
        // SAFETY: offset + len <= len() (checked), so the window lies inside the mapping, which
        // lives as long as the borrow of self; the region never hands out references.
        Ok(unsafe { VolatileSlice::from_raw_parts(base.add(offset), len) })
    }
}

/// Whether the CPU has CLFLUSHOPT (CPUID leaf 7, EBX bit 23), asked once.
#[cfg(target_arch = "x86_64")]
fn has_clflushopt() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    // 0: not asked yet, 1: no, 2: yes. Relaxed: every thread that asks stores the same answer.
    static KNOWN: AtomicU8 = AtomicU8::new(0);
    match KNOWN.load(Relaxed) {
        1 => false,
        2 => true,
        _ => {
            #[allow(unused_unsafe)]
            // SAFETY: CPUID is in the x86_64 baseline; leaf 7 is asked only where leaf 0 says
            // it exists.
            let yes = unsafe {
                std::arch::x86_64::__cpuid(0).eax >= 7
                    && std::arch::x86_64::__cpuid_count(7, 0).ebx & (1 << 23) != 0
            };
            KNOWN.store(if yes { 2 } else { 1 }, Relaxed);
            yes
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flushing a window's lines (any start, any length, the region's last bytes too) leaves
    /// every byte of the region as it was, and what is written afterwards reads back.
    #[test]
    fn flushed_and_demoted_lines_keep_their_bytes() {
        for (what, act) in [
            ("flush", (|w| w.flush_lines()) as fn(&VolatileSlice<'_>)),
            ("demote", |w| w.demote_lines()),
        ] {
            let r = Region::private(8192, false).unwrap();
            let bytes: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
            r.write_bytes(0, &bytes).unwrap();
            for (at, len) in [(0, 0), (0, 1), (63, 2), (100, 128), (4000, 300), (8100, 92)] {
                act(&r.slice(at, len).unwrap());
                let mut back = vec![0u8; 8192];
                r.read_bytes(0, &mut back).unwrap();
                assert!(
                    back == bytes,
                    "{what} of {len} bytes at {at} changed the region"
                );
            }
            let w = r.slice(8100, 92).unwrap();
            w.write(0, &[9; 92]).unwrap();
            act(&w);
            let mut out = [0u8; 92];
            w.read(0, &mut out).unwrap();
            assert_eq!(out, [9; 92], "{what}");
        }
    }

    #[test]
    fn windows_are_bounds_checked() {
        let r = Region::private(4096, false).unwrap();
        assert!(r.slice(4000, 97).is_err());
        assert!(r.slice(usize::MAX, 2).is_err(), "overflowing offset");
        let s = r.slice(100, 64).unwrap();
        assert!(s.subslice(60, 5).is_err());
        assert!(s.write(0, &[1; 65]).is_err());
        assert!(s.read(1, &mut [0; 64]).is_err());
        s.write(0, b"hello").unwrap();
        let mut out = [0u8; 5];
        r.read_bytes(100, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert_eq!(
            s.subslice(1, 4).unwrap().read_array::<4>(0).unwrap(),
            *b"ello"
        );
    }

    #[test]
    fn copies_between_windows() {
        let a = Region::private(4096, false).unwrap();
        let b = Region::private(4096, false).unwrap();
        a.slice(0, 100).unwrap().fill(7);
        let src = a.slice(0, 100).unwrap();
        assert!(src.copy_to(&b.slice(0, 99).unwrap()).is_err());
        src.copy_to(&b.slice(10, 200).unwrap()).unwrap();
        let mut out = [0u8; 102];
        b.read_bytes(9, &mut out).unwrap();
        assert_eq!(out[0], 0);
        assert!(out[1..101].iter().all(|&x| x == 7));
        assert_eq!(out[101], 0);
        // Overlapping windows of one region copy like memmove.
        a.write_bytes(0, &[1, 2, 3, 4]).unwrap();
        a.slice(0, 4)
            .unwrap()
            .copy_to(&a.slice(2, 4).unwrap())
            .unwrap();
        let mut o = [0u8; 6];
        a.read_bytes(0, &mut o).unwrap();
        assert_eq!(o, [1, 2, 1, 2, 3, 4]);
    }
}
