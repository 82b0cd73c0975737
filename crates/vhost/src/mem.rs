//! Guest memory as the frontend shares it (SET_MEM_TABLE, ADD_MEM_REG): a table of regions, each
//! a shm [`Region`] over the fd the frontend sent, mapped `MAP_SHARED` and lazily (never
//! pre-faulted or copied; a 512 MiB virtio-user memfd costs nothing until touched).
//!
//! Addresses come from the guest (descriptors: guest-physical) or the frontend (ring addresses:
//! its own virtual addresses) and are checked here, once, against the table: a range is
//! accepted only when every byte of it lies in mapped memory, and a range that straddles two
//! regions is split at the boundary ([`MemTable::for_each_piece`]) or, for ring areas, refused.
//! Nothing here trusts a value it did not check; no arithmetic on a peer's value can overflow
//! (`checked_add` throughout).
//!
//! A table is immutable once built; a new table replaces it as a whole (`Arc` snapshots), so a
//! data path that holds the old one keeps its mappings until it lets go.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use memnic_shm::unix::{dispose_from, Sender};
use memnic_shm::{Region, ShmError};

/// The most regions a table holds (SET_MEM_TABLE carries at most 8; ADD_MEM_REG can add more,
/// up to what GET_MAX_MEM_SLOTS announced).
pub const MAX_MEM_SLOTS: usize = 32;

/// The most bytes one frontend's memory table maps, all regions together (each mapped from
/// its file's start: `mmap_offset + memory_size`).
pub const MAX_MAPPED: u64 = memnic_shm::MAX_PEER_BYTES;

/// One region as the frontend describes it (`VhostUserMemoryRegion`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionDesc {
    pub guest_phys_addr: u64,
    pub memory_size: u64,
    pub userspace_addr: u64,
    pub mmap_offset: u64,
}

/// Why a memory table was refused.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    #[error("{0} memory regions, more than the {MAX_MEM_SLOTS} supported")]
    TooMany(usize),
    #[error("{regions} memory regions but {fds} file descriptors")]
    FdCount { regions: usize, fds: usize },
    #[error("memory regions of {total:#x} bytes in all (mmap_offset included), more than the {MAX_MAPPED:#x} one frontend may map")]
    TooLarge { total: u128 },
    #[error("memory region at guest address {0:#x} is empty")]
    Empty(u64),
    #[error("memory region at guest address {gpa:#x} (size {size:#x}, offset {offset:#x}) wraps the address space")]
    Wraps { gpa: u64, size: u64, offset: u64 },
    #[error("memory regions at guest addresses {0:#x} and {1:#x} overlap")]
    Overlap(u64, u64),
    #[error("memory regions at frontend addresses {0:#x} and {1:#x} overlap")]
    UvaOverlap(u64, u64),
    #[error("no memory region at guest address {0:#x}")]
    NotFound(u64),
    #[error("memory region at guest address {gpa:#x}: {source}")]
    Map {
        gpa: u64,
        #[source]
        source: ShmError,
    },
}

/// Who a frontend is: its pid, whose mount table names a file's filesystem when ours does not
/// (`Region::check_peer_file`), and its user, whose closes a file we refuse counts against
/// (`dispose_from`). Both from SO_PEERCRED; the default knows neither.
#[derive(Debug, Clone, Copy, Default)]
pub struct Frontend {
    pub pid: Option<i32>,
    pub sender: Sender,
}

impl Frontend {
    /// The frontend at the other end of connected socket `sock`.
    pub fn of(sock: BorrowedFd<'_>) -> Frontend {
        let cred = memnic_shm::unix::peer_cred(sock).ok();
        Frontend {
            pid: cred.map(|c| c.pid),
            sender: cred.map_or(Sender::UNKNOWN, |c| Sender::uid(c.uid)),
        }
    }
}

/// A mapped region.
#[derive(Debug)]
pub struct GuestRegion {
    pub desc: RegionDesc,
    /// `mmap_offset + memory_size` bytes of the fd from offset 0 (an offset into a file is
    /// honoured by mapping from its start, as DPDK does, so no offset needs page alignment).
    map: Arc<Region>,
}

impl GuestRegion {
    /// Maps `fd` as `desc` says; a refused fd is closed elsewhere (`dispose_from`: a FUSE
    /// file's close waits for its server, maybe the frontend).
    fn map(desc: RegionDesc, fd: OwnedFd, peer: Frontend) -> Result<GuestRegion, MemError> {
        let len = match GuestRegion::check(desc, fd.as_fd(), peer.pid) {
            Ok(len) => len,
            Err(e) => {
                dispose_from(fd, peer.sender);
                return Err(e);
            }
        };
        let map = Region::from_fd_mapping_only(fd, len).map_err(|source| MemError::Map {
            gpa: desc.guest_phys_addr,
            source,
        })?;
        Ok(GuestRegion {
            desc,
            map: Arc::new(map),
        })
    }

    /// What must hold of a region before its fd is mapped; the length to map.
    fn check(desc: RegionDesc, fd: BorrowedFd<'_>, peer: Option<i32>) -> Result<usize, MemError> {
        let RegionDesc {
            guest_phys_addr: gpa,
            memory_size: size,
            userspace_addr: uva,
            mmap_offset: offset,
        } = desc;
        if size == 0 {
            return Err(MemError::Empty(gpa));
        }
        let wraps = || MemError::Wraps { gpa, size, offset };
        gpa.checked_add(size - 1).ok_or_else(wraps)?;
        uva.checked_add(size - 1).ok_or_else(wraps)?;
        let len = offset.checked_add(size).ok_or_else(wraps)?;
        let len = usize::try_from(len).map_err(|_| wraps())?;
        Region::check_peer_file(fd, peer).map_err(|source| MemError::Map { gpa, source })?;
        Ok(len)
    }

    /// The mapping and where guest address `gpa` is in it, when `gpa..gpa+len` is inside this
    /// region.
    #[inline(always)]
    fn at(&self, start: u64, addr: u64, len: u64) -> Option<usize> {
        let off = addr.checked_sub(start)?;
        if off.checked_add(len)? > self.desc.memory_size {
            return None;
        }
        // mmap_offset + memory_size fits a usize (checked when mapped).
        Some((self.desc.mmap_offset + off) as usize)
    }

    pub fn region(&self) -> &Arc<Region> {
        &self.map
    }

    /// Whether the frontend shrank the file under this mapping (see `memnic_shm`).
    pub fn faulted(&self) -> bool {
        self.map.peer_faulted()
    }
}

/// Guest memory: regions sorted by guest-physical address, none overlapping.
#[derive(Debug, Default)]
pub struct MemTable {
    regions: Vec<GuestRegion>,
}

impl MemTable {
    /// Maps a SET_MEM_TABLE: one fd per region, in order, from frontend `peer`.
    pub fn new(
        descs: &[RegionDesc],
        files: Vec<File>,
        peer: Frontend,
    ) -> Result<MemTable, MemError> {
        let refused = |e: MemError, files: &mut dyn Iterator<Item = File>| {
            files.for_each(|f| dispose_from(f.into(), peer.sender));
            Err(e)
        };
        let mut files = files.into_iter();
        if descs.len() > MAX_MEM_SLOTS {
            return refused(MemError::TooMany(descs.len()), &mut files);
        }
        if descs.len() != files.len() {
            let e = MemError::FdCount {
                regions: descs.len(),
                fds: files.len(),
            };
            return refused(e, &mut files);
        }
        let mut t = MemTable::default();
        for (d, f) in descs.iter().zip(&mut files) {
            t = match t.with(*d, f, peer) {
                Ok(t) => t,
                Err(e) => return refused(e, &mut files),
            };
        }
        Ok(t)
    }

    /// This table plus one region (ADD_MEM_REG).
    pub fn with(&self, desc: RegionDesc, file: File, peer: Frontend) -> Result<MemTable, MemError> {
        if self.regions.len() >= MAX_MEM_SLOTS {
            dispose_from(file.into(), peer.sender);
            return Err(MemError::TooMany(self.regions.len() + 1));
        }
        let mapped = |d: &RegionDesc| u128::from(d.mmap_offset) + u128::from(d.memory_size);
        let total = self.regions.iter().map(|r| mapped(&r.desc)).sum::<u128>() + mapped(&desc);
        if total > u128::from(MAX_MAPPED) {
            dispose_from(file.into(), peer.sender);
            return Err(MemError::TooLarge { total });
        }
        let new = GuestRegion::map(desc, OwnedFd::from(file), peer)?;
        let mut regions: Vec<GuestRegion> = self.regions.iter().map(GuestRegion::share).collect();
        let at = regions.partition_point(|r| r.desc.guest_phys_addr < desc.guest_phys_addr);
        regions.insert(at, new);
        for w in regions.windows(2) {
            let (a, b) = (&w[0].desc, &w[1].desc);
            // a.gpa + a.size - 1 does not wrap (checked when mapped).
            if a.guest_phys_addr + (a.memory_size - 1) >= b.guest_phys_addr {
                return Err(MemError::Overlap(a.guest_phys_addr, b.guest_phys_addr));
            }
        }
        // Nor may the frontend's addresses of two regions overlap: ring areas are found by
        // them (SET_VRING_ADDR), and an address in two regions would mean two places.
        for (i, a) in regions.iter().enumerate() {
            for b in &regions[i + 1..] {
                let (a, b) = (&a.desc, &b.desc);
                // uva + size - 1 does not wrap (checked when mapped).
                if a.userspace_addr <= b.userspace_addr + (b.memory_size - 1)
                    && b.userspace_addr <= a.userspace_addr + (a.memory_size - 1)
                {
                    return Err(MemError::UvaOverlap(a.userspace_addr, b.userspace_addr));
                }
            }
        }
        Ok(MemTable { regions })
    }

    /// This table less the region REM_MEM_REG names (matched by guest address, size and
    /// frontend address, as QEMU and DPDK match it).
    pub fn without(&self, desc: &RegionDesc) -> Result<MemTable, MemError> {
        let same = |r: &GuestRegion| {
            r.desc.guest_phys_addr == desc.guest_phys_addr
                && r.desc.memory_size == desc.memory_size
                && r.desc.userspace_addr == desc.userspace_addr
        };
        if !self.regions.iter().any(same) {
            return Err(MemError::NotFound(desc.guest_phys_addr));
        }
        Ok(MemTable {
            regions: self
                .regions
                .iter()
                .filter(|r| !same(r))
                .map(GuestRegion::share)
                .collect(),
        })
    }

    pub fn regions(&self) -> &[GuestRegion] {
        &self.regions
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The region holding guest-physical `gpa..gpa+len` whole (its index in
    /// [`MemTable::regions`]), and the offset of `gpa` in its mapping.
    #[inline(always)]
    pub fn gpa(&self, gpa: u64, len: u64) -> Option<(usize, usize)> {
        // Few regions (virtio-user: one; QEMU: two or three): a scan beats a search.
        self.regions
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.at(r.desc.guest_phys_addr, gpa, len).map(|off| (i, off)))
    }

    /// The mapping holding frontend virtual `uva..uva+len` whole (ring addresses of
    /// SET_VRING_ADDR), and the offset of `uva` in it.
    pub fn uva(&self, uva: u64, len: u64) -> Option<(&Arc<Region>, usize)> {
        self.regions.iter().find_map(|r| {
            r.at(r.desc.userspace_addr, uva, len)
                .map(|off| (&r.map, off))
        })
    }

    /// The mapping of region `i`.
    #[inline(always)]
    pub fn map(&self, i: usize) -> &Region {
        &self.regions[i].map
    }

    /// Calls `f(region index, offset, len)` for each piece of guest range `gpa..gpa+len`, split
    /// where it crosses from one region into the next; false when some byte is in no region or
    /// the range wraps (pieces before the gap have been passed to `f` by then). An empty range
    /// has no piece.
    #[inline(always)]
    pub fn for_each_piece(
        &self,
        mut gpa: u64,
        mut len: u64,
        mut f: impl FnMut(usize, usize, usize),
    ) -> bool {
        if let Some((i, off)) = self.gpa(gpa, len) {
            if len > 0 {
                f(i, off, len as usize);
            }
            return true;
        }
        if gpa.checked_add(len).is_none() {
            return false;
        }
        while len > 0 {
            let Some((i, r)) = self.regions.iter().enumerate().find(|(_, r)| {
                let d = &r.desc;
                gpa >= d.guest_phys_addr && gpa - d.guest_phys_addr < d.memory_size
            }) else {
                return false;
            };
            let d = &r.desc;
            let room = d.memory_size - (gpa - d.guest_phys_addr);
            let n = room.min(len);
            f(
                i,
                (d.mmap_offset + (gpa - d.guest_phys_addr)) as usize,
                n as usize,
            );
            gpa += n;
            len -= n;
        }
        true
    }

    /// Lets go of the guest memory behind each region of this table that `now` does not
    /// share ([`Region::release`]): for a table the device replaced or dropped, once the
    /// queues were told to let go of it (the gate's reset), so that a queue that is not polled
    /// again for a long time does not keep a dead frontend's memory mapped. A queue that still
    /// looks before it reloads reads zeros, never a fault.
    pub fn release_regions_not_in(&self, now: Option<&MemTable>) {
        for r in &self.regions {
            let kept = now.is_some_and(|t| t.regions.iter().any(|n| Arc::ptr_eq(&n.map, &r.map)));
            if !kept {
                if let Err(e) = r.map.release() {
                    crate::device::trace(format_args!("releasing a memory region: {e}"));
                }
            }
        }
    }

    /// Whether the frontend shrank any region's file under us.
    pub fn faulted(&self) -> bool {
        self.regions.iter().any(GuestRegion::faulted)
    }
}

impl GuestRegion {
    fn share(&self) -> GuestRegion {
        GuestRegion {
            desc: self.desc,
            map: self.map.clone(),
        }
    }
}
