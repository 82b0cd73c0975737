//! Dequeue zero copy (`dequeue-zero-copy=1`): a guest tx chain goes up the stack as a packet of
//! read-only external segments, one per buffer after the virtio-net header, and its used entry
//! is written only once every segment has been freed (by whoever holds the packet, on any
//! thread, in any order).
//!
//! Each segment carries a tag: the ring it came from and the chain's buffer id. Freed segments
//! queue up in the queue's [`ExtPool`]; the polling lcore reaps them at every burst (whether or
//! not the ring has anything new) and writes the used entry of each chain whose last segment
//! came back, with the burst's own, in one publish. Chains complete out of order, so IN_ORDER
//! is not offered while zero copy is on.
//!
//! What stays a copy: frames below [`ZeroCopyConfig::min_len`] (a segment costs more than
//! copying a small frame), chains past the budget of chains held at once (a consumer that holds
//! every packet must not stall the guest's tx ring: past the budget we copy, and the guest keeps
//! transmitting), chains of more than [`MAX_SEGS`] buffers, a buffer id already held (a guest
//! that offers one twice) or not below the queue size, and anything while the control thread
//! drains the queue.
//!
//! A ring that stops (GET_VRING_BASE, a reset, a disconnect) after the drain's timeout abandons
//! the chains still held: they are counted, their segments keep the memory they point into
//! mapped (as zero pages once the frontend's table is let go, never a fault), and their
//! completions, whenever they come, are discarded: never written into a later ring.

use std::sync::Arc;
use std::time::Duration;

use memnic_ethdev::{ExtPool, Mbuf};

use crate::chain::Piece;
use crate::mem::MemTable;
use crate::vring::Chain;

/// How dequeue zero copy is set up (devarg `dequeue-zero-copy=1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroCopyConfig {
    /// Frames shorter than this are copied.
    pub min_len: usize,
    /// Chains held at once, past which frames are copied; `None`: half the queue size.
    pub budget: Option<u16>,
    /// How long a request that stops or remaps a ring waits for the chains still held.
    pub drain_timeout: Duration,
}

impl Default for ZeroCopyConfig {
    fn default() -> Self {
        ZeroCopyConfig {
            min_len: DEFAULT_MIN_LEN,
            budget: None,
            drain_timeout: Duration::from_secs(1),
        }
    }
}

/// The default [`ZeroCopyConfig::min_len`]: the break-even measured here (an Intel Xeon, 2
/// vCPUs). virtio-user txonly -> our rxonly, zero copy on every frame (min_len 0) against
/// copy, runs alternating, two sittings of 2 rounds x 10 s, Mpps at p50, copy / zero copy:
/// split 512 B 14.98 / 12.59, 640 B 8.92 / 12.60, 768 B 8.54 / 13.17, 1024 B 8.09 / 13.49,
/// 1518 B 7.50 / 13.61; packed 512 B 15.64 / 13.05, 640 B 8.45 / 13.07, 768 B 7.94 / 13.01,
/// 1024 B 8.24 / 13.10, 1518 B 7.39 / 12.89. Zero copy runs at the frontend's own rate without
/// IN_ORDER (about 13 Mpps at every size), copy falls with the length: it wins up to 512 B,
/// zero copy from 640 (the copy of 640-1023-B frames got about 8% faster afterwards, by
/// prefetching them whole, which does not move the line). The first measurement, on an AMD
/// EPYC, put it at 1024.
pub const DEFAULT_MIN_LEN: usize = 640;

/// Buffers a zero-copy chain may have (after the header); a longer chain is copied.
pub const MAX_SEGS: usize = 8;

/// External segments a queue has (every held chain's, and the freed ones not yet reaped).
const EXT_SLOTS: u32 = 4096;

/// Buffers a chain's frame spans after its `hdr_len`-byte header.
#[inline(always)]
fn segments(pieces: &[Piece], hdr_len: usize) -> usize {
    let mut skip = hdr_len;
    let mut n = 0;
    for p in pieces {
        if skip >= p.len {
            skip -= p.len;
        } else {
            skip = 0;
            n += 1;
        }
    }
    n
}

/// A chain held by the stack: segments not yet freed, ring slots it took.
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    segs: u16,
    descs: u16,
}

/// What a queue's reap found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// Chains whose last segment came back (their used entries were put).
    pub chains: u16,
    /// Segments of an abandoned ring's chains, discarded.
    pub late: u32,
}

/// The zero-copy state of one rx queue.
pub(crate) struct ZeroCopy {
    cfg: ZeroCopyConfig,
    ext: ExtPool,
    /// Per buffer id of the ring in use.
    held: Vec<Held>,
    /// The ring the held chains came from (0: none yet).
    ring_id: u64,
    /// Chains held now, and at most.
    out: u16,
    budget: u16,
    tags: Vec<u64>,
    /// Chains sent up uncopied so far.
    chains: u64,
}

impl ZeroCopy {
    pub fn new(name: &str, cfg: ZeroCopyConfig) -> ZeroCopy {
        ZeroCopy {
            cfg,
            ext: ExtPool::new(format!("{name}-zc"), EXT_SLOTS),
            held: Vec::new(),
            ring_id: 0,
            out: 0,
            budget: 0,
            tags: Vec::new(),
            chains: 0,
        }
    }

    /// Chains held now.
    pub fn out(&self) -> u16 {
        self.out
    }

    /// Chains sent up uncopied since the queue was made.
    pub fn chains(&self) -> u64 {
        self.chains
    }

    /// The queue loaded ring `ring_id` of `size` slots (or none): the same ring goes on with
    /// its chains; any other abandons them. Returns how many were abandoned.
    pub fn load(&mut self, ring: Option<(u64, u16)>) -> u16 {
        if let Some((id, _)) = ring {
            if id == self.ring_id {
                return 0;
            }
        }
        let abandoned = self.out;
        self.out = 0;
        self.held.clear();
        let (id, size) = ring.unwrap_or((0, 0));
        self.ring_id = id;
        self.held.resize(size as usize, Held::default());
        let budget = self.cfg.budget.unwrap_or(size / 2).max(1);
        self.budget = budget.min(size);
        // Let go of the memory only freed slots still name.
        self.ext.release_idle_regions();
        abandoned
    }

    /// Whether chain `id` of `total` bytes in `pieces` (a `hdr_len`-byte header first) may go
    /// up uncopied. The cheap checks come first: most frames that are copied stop at the size.
    #[inline(always)]
    pub fn takes(&self, id: u16, total: u32, pieces: &[Piece], hdr_len: usize) -> bool {
        if (total as usize).saturating_sub(hdr_len) < self.cfg.min_len
            || self.out >= self.budget
            || self.held.get(id as usize).is_none_or(|h| h.segs != 0)
        {
            return false;
        }
        let segs = segments(pieces, hdr_len);
        segs <= MAX_SEGS && self.ext.capacity() - self.ext.outstanding() >= segs as u32
    }

    /// The chain's frame as a packet of external segments, one per piece after the first
    /// `hdr_len` bytes; `None` (nothing held) if a piece is not inside its region.
    pub fn attach(
        &mut self,
        mem: &MemTable,
        pieces: &[Piece],
        hdr_len: usize,
        chain: Chain,
    ) -> Option<Mbuf> {
        let tag = self.ring_id << 16 | chain.id as u64;
        let mut head: Option<Mbuf> = None;
        let mut segs = 0u16;
        let mut skip = hdr_len;
        for p in pieces {
            if skip >= p.len {
                skip -= p.len;
                continue;
            }
            let region: &Arc<_> = mem.regions()[p.region].region();
            let seg = match self
                .ext
                .attach(region, p.off + skip, (p.len - skip) as u32, tag)
            {
                Ok(s) => s,
                Err(_) => return self.undo(head),
            };
            skip = 0;
            segs += 1;
            match &mut head {
                None => head = Some(seg),
                Some(h) => {
                    if let Err(seg) = h.chain(seg) {
                        drop(seg);
                        return self.undo(head);
                    }
                }
            }
        }
        let m = head?;
        self.held[chain.id as usize] = Held {
            segs,
            descs: chain.descs,
        };
        self.out += 1;
        self.chains += 1;
        Some(m)
    }

    /// Gives back the segments attached for a chain that is copied after all (`takes` makes
    /// this unreachable in practice). Freed here, they are reaped at once, before a chain with
    /// the same id can be held: their tags match no held chain, so they are discarded.
    #[cold]
    fn undo(&mut self, head: Option<Mbuf>) -> Option<Mbuf> {
        drop(head);
        self.reap(|_| {});
        None
    }

    /// Collects freed segments; `put(chain)` for each chain whose last segment came back.
    #[inline(always)]
    pub fn reap(&mut self, mut put: impl FnMut(Chain)) -> Reaped {
        let mut r = Reaped::default();
        self.tags.clear();
        if self.ext.reap(&mut self.tags) == 0 {
            return r;
        }
        for &tag in &self.tags {
            let id = (tag & 0xffff) as usize;
            let held = match self.held.get_mut(id) {
                Some(h) if tag >> 16 == self.ring_id && h.segs > 0 => h,
                _ => {
                    r.late += 1;
                    continue;
                }
            };
            held.segs -= 1;
            if held.segs == 0 {
                self.out -= 1;
                r.chains += 1;
                put(Chain {
                    id: id as u16,
                    descs: held.descs,
                });
            }
        }
        r
    }
}
