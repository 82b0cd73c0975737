//! Walking a descriptor chain the guest wrote: every index, flag, length and address is the
//! guest's, read once into a local and checked before use (DPDK's CVE-2020-10722…10726 are this
//! class: lengths that overflow, indices past the table, loops, nested indirect tables).
//!
//! * The walk visits at most `queue size` descriptors of the table, and at most `len / 16` of an
//!   indirect table (itself at most `queue size` entries): a loop or an overlong chain ends in
//!   [`ChainError::TooLong`], never in an unbounded loop.
//! * An indirect descriptor must be the only one of its chain (no NEXT beside it: the spec
//!   forbids both) and its table may hold no indirect descriptor.
//! * Every buffer must be device-readable (tx) or device-writable (rx), as the direction wants.
//! * Every buffer's guest range must be mapped; a range crossing from one region into the next
//!   becomes two pieces ([`MemTable::for_each_piece`]).
//! * The chain's total length is checked for overflow.

use crate::mem::MemTable;
use crate::packed::{PackedDesc, PackedRing};
use crate::split::{Desc, SplitRing, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE};
use crate::vring::{Broken, Chain, RingMemory};

/// A checked part of a chain's buffers: `len` bytes at `off` in region `region` of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub region: usize,
    pub off: usize,
    pub len: usize,
}

/// Why a chain was refused. Each is counted and the chain is returned unused (length 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("descriptor index {index} past the queue size {size}")]
    IndexOutOfRange { index: u16, size: u16 },
    #[error("chain longer than the queue (a loop?)")]
    TooLong,
    #[error(
        "indirect table of {0} bytes (not a whole number of descriptors up to the queue size)"
    )]
    BadIndirectLen(u32),
    #[error("indirect descriptor with NEXT set")]
    IndirectWithNext,
    #[error("indirect descriptor inside an indirect table")]
    NestedIndirect,
    #[error("a {0} buffer where the device needs the other kind")]
    WrongDirection(&'static str),
    #[error("buffer at guest address {addr:#x} ({len} bytes) is outside guest memory")]
    Unmapped { addr: u64, len: u32 },
    #[error("chain length overflows")]
    Overflow,
    #[error("tx chain of {0} bytes, shorter than the virtio-net header")]
    ShortHeader(u32),
    #[error("frame longer than the receiving buffers hold")]
    TooBig,
    #[error("rx chain without room")]
    Empty,
}

/// Which way the buffers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Device-readable (a tx chain: the guest's frame).
    Readable,
    /// Device-writable (an rx chain: room for a frame).
    Writable,
}

/// Walks chain `head`: its buffers are appended to `out` as pieces (a burst walks its chains
/// into one Vec, where they stay: copying them out again compiled to wide loads of fields just
/// stored, a store forwarding stall per chain); returns the chain's total length.
#[inline(always)]
pub fn walk<M: RingMemory>(
    ring: &SplitRing<M>,
    mem: &MemTable,
    head: u16,
    dir: Dir,
    out: &mut Vec<Piece>,
) -> Result<u32, ChainError> {
    let size = ring.size();
    let mut walker = Walker::new(mem, dir, out);
    let mut index = head;
    for _ in 0..size {
        if index >= size {
            return Err(ChainError::IndexOutOfRange { index, size });
        }
        let d = ring.desc(index);
        if d.flags & DESC_F_INDIRECT != 0 {
            if d.flags & DESC_F_NEXT != 0 {
                return Err(ChainError::IndirectWithNext);
            }
            walker.indirect(d.addr, d.len, size, Layout::Split)?;
            return Ok(walker.total);
        }
        walker.buffer(d.addr, d.len, d.flags)?;
        if d.flags & DESC_F_NEXT == 0 {
            return Ok(walker.total);
        }
        index = d.next;
    }
    Err(ChainError::TooLong)
}

/// Walks the packed chain that starts at slot `idx` (its head's flags said available): the
/// slots up to the first without NEXT, wrapping at the end of the ring. Returns the chain (its
/// buffer id is the last slot's) and the outcome of its walk; a refused chain is still walked
/// to its end, so it can be handed back (its pieces, as far as they were checked, stay appended
/// to `out`). A chain that does not end within the queue leaves no way to find the next one:
/// the ring is broken.
#[inline(always)]
pub fn walk_packed<M: RingMemory>(
    ring: &PackedRing<M>,
    mem: &MemTable,
    idx: u16,
    dir: Dir,
    out: &mut Vec<Piece>,
) -> Result<(Chain, Result<u32, ChainError>), Broken> {
    let size = ring.size();
    let mut walker = Walker::new(mem, dir, out);
    let mut refused = None;
    let mut i = idx;
    for descs in 1..=size {
        let d = ring.desc(i);
        if refused.is_none() {
            let r = if d.flags & DESC_F_INDIRECT != 0 {
                if d.flags & DESC_F_NEXT != 0 {
                    Err(ChainError::IndirectWithNext)
                } else {
                    walker.indirect(d.addr, d.len, size, Layout::Packed)
                }
            } else {
                walker.buffer(d.addr, d.len, d.flags)
            };
            refused = r.err();
        }
        if d.flags & DESC_F_NEXT == 0 {
            let chain = Chain { id: d.id, descs };
            return Ok((chain, refused.map_or(Ok(walker.total), Err)));
        }
        i = if i + 1 == size { 0 } else { i + 1 };
    }
    Err(Broken::EndlessChain)
}

/// How an indirect table's entries are laid out and linked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Split descriptors, linked by NEXT and `next`.
    Split,
    /// Packed descriptors, one after the other: the whole table is the chain.
    Packed,
}

struct Walker<'a> {
    mem: &'a MemTable,
    dir: Dir,
    out: &'a mut Vec<Piece>,
    total: u32,
}

impl<'a> Walker<'a> {
    /// A walk that appends its pieces to `out`.
    #[inline(always)]
    fn new(mem: &'a MemTable, dir: Dir, out: &'a mut Vec<Piece>) -> Walker<'a> {
        Walker {
            mem,
            dir,
            out,
            total: 0,
        }
    }

    /// One buffer: its direction, its range in guest memory, the running total.
    #[inline(always)]
    fn buffer(&mut self, addr: u64, len: u32, flags: u16) -> Result<(), ChainError> {
        let writable = flags & DESC_F_WRITE != 0;
        match (self.dir, writable) {
            (Dir::Readable, true) => return Err(ChainError::WrongDirection("device-writable")),
            (Dir::Writable, false) => return Err(ChainError::WrongDirection("device-readable")),
            _ => {}
        }
        self.total = self.total.checked_add(len).ok_or(ChainError::Overflow)?;
        let out = &mut *self.out;
        let mapped = self
            .mem
            .for_each_piece(addr, len as u64, |region, off, len| {
                out.push(Piece { region, off, len })
            });
        if !mapped {
            return Err(ChainError::Unmapped { addr, len });
        }
        Ok(())
    }

    /// An indirect table at `addr` (`len` bytes): one region holds it whole, and its chain is
    /// walked as the ring's is (split: by NEXT; packed: every entry in turn), bounded by its
    /// own length.
    fn indirect(
        &mut self,
        addr: u64,
        len: u32,
        size: u16,
        layout: Layout,
    ) -> Result<(), ChainError> {
        let count = len / 16;
        if len == 0 || !len.is_multiple_of(16) || count > size as u32 {
            return Err(ChainError::BadIndirectLen(len));
        }
        let unmapped = ChainError::Unmapped { addr, len };
        let (region, base) = self.mem.gpa(addr, len as u64).ok_or(unmapped)?;
        let table = self.mem.map(region);
        let mut index: u32 = 0;
        for _ in 0..count {
            let mut b = [0u8; 16];
            // index < count: inside the range checked just above.
            table
                .read_bytes(base + 16 * index as usize, &mut b)
                .map_err(|_| unmapped)?;
            let (addr, len, flags, next) = match layout {
                Layout::Split => {
                    let e = Desc::parse(&b);
                    (e.addr, e.len, e.flags, e.next as u32)
                }
                Layout::Packed => {
                    let e = PackedDesc::parse(&b);
                    // DPDK's virtio driver presets every entry of its packed tx indirect
                    // tables device-writable (`vring_desc_init_indirect_packed`) and keeps
                    // the flag on the header entry; its vhost ignores the flag on dequeue. A
                    // buffer we only read is safe either way, so a tx table's WRITE flags are
                    // ignored (an rx table's buffers must still all be writable).
                    let flags = match self.dir {
                        Dir::Readable => e.flags & !DESC_F_WRITE,
                        Dir::Writable => e.flags,
                    };
                    (e.addr, e.len, flags, index + 1)
                }
            };
            if flags & DESC_F_INDIRECT != 0 {
                return Err(ChainError::NestedIndirect);
            }
            self.buffer(addr, len, flags)?;
            if layout == Layout::Split && flags & DESC_F_NEXT == 0 {
                return Ok(());
            }
            index = next;
            if layout == Layout::Split && index >= count {
                return Err(ChainError::IndexOutOfRange {
                    index: next as u16,
                    size: count as u16,
                });
            }
        }
        match layout {
            Layout::Split => Err(ChainError::TooLong),
            Layout::Packed => Ok(()),
        }
    }
}
