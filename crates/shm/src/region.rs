//! Mapped regions and the bounds-checked accessors over them.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64};

use crate::sigbus::{self, Registration};
use crate::{Result, ShmError};

/// Size of the hugepages the crate asks for.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// Where a region's memory comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// Private anonymous memory (process-local pools).
    Private,
    /// An anonymous memfd, shareable by passing its fd.
    Memfd,
    /// A named file: a POSIX shm object under `/dev/shm`, a hugetlbfs file, a PCI BAR.
    File(PathBuf),
}

/// A mapping of shared or private memory.
///
/// The memory may be written by another process at any moment, so the region never hands out
/// references to plain data: only atomics (valid for any value and for concurrent writers) and
/// copies into or out of private buffers, each checked against the mapping's length.
///
/// A mapping a peer can shrink ([`is_peer_controlled`](Self::is_peer_controlled)) is protected
/// against SIGBUS: see [`peer_faulted`](Self::peer_faulted) and the crate docs.
#[derive(Debug)]
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    /// Bytes the kernel mapped from `base`: `len` rounded up to whole pages of the backing
    /// (2 MiB or more on hugetlbfs).
    extent: usize,
    huge: bool,
    backing: Backing,
    fd: Option<OwnedFd>,
    /// The file's seals (`F_GET_SEALS`) when it was mapped; 0 for files that have none.
    seals: u32,
    /// Present when a peer can shrink the memory: its entry in the SIGBUS registry.
    registration: Option<Registration>,
}

// SAFETY: a Region is a pointer to a mapping that lives until drop; all access goes through
// atomics or copies that are sound under concurrent modification, so it may move between threads.
unsafe impl Send for Region {}
// SAFETY: as above; &Region only allows atomic accesses and racy-but-bounded copies.
unsafe impl Sync for Region {}

/// The filesystem type of mount `mnt_id` in `mountinfo` (the text of `/proc/<pid>/mountinfo`:
/// the mount id first, the type right after the ` - ` separator; paths have their spaces
/// escaped, so the separator is unambiguous).
fn filesystem_of_mount(mountinfo: &str, mnt_id: u64) -> Option<&str> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let id: u64 = mount.split(' ').next()?.parse().ok()?;
        (id == mnt_id).then(|| fs.split(' ').next()).flatten()
    })
}

/// Whether a filesystem type is FUSE's (`fuse`, `fuseblk`, each alone or with a `.<subtype>`):
/// a process, maybe the peer, answers its every request.
fn is_fuse(fs: &str) -> bool {
    ["fuse", "fuseblk"].iter().any(|t| {
        fs.strip_prefix(t)
            .is_some_and(|r| r.is_empty() || r.starts_with('.'))
    })
}

/// The seals of `fd` (`F_GET_SEALS`): 0 for a file that cannot have any (EINVAL: not a memfd
/// or shmem/hugetlbfs file).
fn seals_of(fd: BorrowedFd<'_>) -> io::Result<u32> {
    // SAFETY: fcntl(F_GET_SEALS) on a live descriptor borrowed for the call; no memory arguments.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if r >= 0 {
        return Ok(r as u32);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) => Ok(0),
        _ => Err(e),
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory arguments.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(1)
}

/// How many bytes the kernel maps for `len` bytes of `fd`: whole pages, and whole hugepages on
/// hugetlbfs (whose mmap rounds the length up; the SIGBUS handler must replace exactly that).
fn extent_of(fd: BorrowedFd<'_>, len: usize) -> usize {
    let mut granule = page_size();
    // SAFETY: statfs is plain data; all-zero is a valid value for fstatfs to overwrite.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live statfs the kernel writes; fd is borrowed for the call.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } == 0
        && st.f_type as u32 == libc::HUGETLBFS_MAGIC as u32
    {
        granule = granule.max(usize::try_from(st.f_bsize).unwrap_or(HUGE_PAGE_SIZE));
    }
    len.next_multiple_of(granule)
}

/// Maps `len` bytes of `fd` (or anonymous memory when `fd` is None) read-write.
fn map(fd: Option<BorrowedFd<'_>>, len: usize, flags: libc::c_int) -> std::io::Result<NonNull<u8>> {
    let raw = fd.map_or(-1, |f| f.as_raw_fd());
    // SAFETY: a fresh mapping with a null hint cannot alias any Rust object; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            raw,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(NonNull::new(p.cast()).expect("mmap returned null without MAP_FIXED"))
}

impl Region {
    /// Private anonymous memory of `len` bytes, on 2 MiB hugepages when `huge` and some are
    /// reserved (the size is then rounded up to a whole hugepage), on normal pages otherwise.
    pub fn private(len: usize, huge: bool) -> Result<Region> {
        if len == 0 {
            return Err(ShmError::Empty);
        }
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if huge {
            let hlen = len.next_multiple_of(HUGE_PAGE_SIZE);
            if let Ok(base) = map(None, hlen, anon | libc::MAP_HUGETLB) {
                return Region::new(base, hlen, hlen, true, Backing::Private, None, 0);
            }
        }
        let base = map(None, len, anon).map_err(|source| ShmError::Io {
            op: "map",
            what: format!("{len} bytes of private memory"),
            source,
        })?;
        Region::new(base, len, len, false, Backing::Private, None, 0)
    }

    /// Builds the region over a fresh mapping and, when a peer can shrink the memory behind it
    /// (shared, without `F_SEAL_SHRINK`), registers it for SIGBUS protection. On error the
    /// mapping is unmapped.
    fn new(
        base: NonNull<u8>,
        len: usize,
        extent: usize,
        huge: bool,
        backing: Backing,
        fd: Option<OwnedFd>,
        seals: u32,
    ) -> Result<Region> {
        let peer_controlled =
            backing != Backing::Private && seals & libc::F_SEAL_SHRINK as u32 == 0;
        let mut region = Region {
            base,
            len,
            extent,
            huge,
            backing,
            fd,
            seals,
            registration: None,
        };
        if peer_controlled {
            region.registration = Some(sigbus::register(region.addr(), extent)?);
        }
        Ok(region)
    }

    /// An anonymous memfd of `len` bytes (hugepages as for [`Region::private`]); its fd can be
    /// passed to a peer with SCM_RIGHTS.
    ///
    /// The memfd is created with `MFD_ALLOW_SEALING` and sealed with `F_SEAL_SHRINK` (as DPDK
    /// seals memif region 0), so no peer it is passed to can shrink it under our mapping; it
    /// can still grow. `F_SEAL_SEAL` closes the set, so a peer cannot add seals of its own
    /// (`F_SEAL_FUTURE_WRITE` would stop us mapping it writable again), just as an unsealable
    /// memfd never could. Kernels before 4.16 cannot seal hugetlb memfds: there the hugepage
    /// memfd is created unsealed and the region is protected against SIGBUS instead, like a
    /// peer's ([`Region::is_shrink_sealed`] false, [`Region::is_peer_controlled`] true).
    pub fn memfd(name: &str, len: usize, huge: bool) -> Result<Region> {
        if len == 0 {
            return Err(ShmError::Empty);
        }
        let cname = CString::new(name.replace('\0', "_")).expect("NULs were replaced");
        let attempts: &[(libc::c_uint, usize)] = if huge {
            &[
                (libc::MFD_HUGETLB | libc::MFD_HUGE_2MB, HUGE_PAGE_SIZE),
                (0, 1),
            ]
        } else {
            &[(0, 1)]
        };
        let mut last = None;
        for &(extra, page) in attempts {
            let flen = len.next_multiple_of(page);
            let fd = match create_memfd(&cname, extra) {
                Ok(fd) => fd,
                Err(source) => {
                    last = Some(ShmError::Io {
                        op: "create memfd",
                        what: name.into(),
                        source,
                    });
                    continue;
                }
            };
            let file = File::from(fd);
            if let Err(source) = file.set_len(flen as u64) {
                last = Some(ShmError::Io {
                    op: "size memfd",
                    what: name.into(),
                    source,
                });
                continue;
            }
            let seals = seal_shrink(file.as_fd());
            match map(Some(file.as_fd()), flen, libc::MAP_SHARED) {
                Ok(base) => {
                    let extent = flen.next_multiple_of(page.max(page_size()));
                    return Region::new(
                        base,
                        flen,
                        extent,
                        extra != 0,
                        Backing::Memfd,
                        Some(file.into()),
                        seals,
                    );
                }
                Err(source) => {
                    last = Some(ShmError::Io {
                        op: "map memfd",
                        what: name.into(),
                        source,
                    })
                }
            }
        }
        Err(last.expect("at least one attempt was made"))
    }

    /// The path of POSIX shm object `name`: `/dev/shm/NAME`, or `name` itself if it has a `/`.
    pub fn shm_path(name: &str) -> PathBuf {
        if name.contains('/') {
            PathBuf::from(name)
        } else {
            Path::new("/dev/shm").join(name)
        }
    }

    /// Opens the shm object or file `name` (see [`Region::shm_path`]), creating it with `mode` if it
    /// does not exist, and grows it to `len` bytes if it is smaller. Existing content is kept.
    ///
    /// The file is created with `O_CREAT | O_EXCL` (never through a symbolic link). Only if it
    /// already exists is it opened, with `O_NOFOLLOW`, and checked on the opened descriptor (so
    /// it cannot be swapped after the check): a symbolic link
    /// ([`ShmError::SymlinkRefused`]), a file owned by another uid ([`ShmError::ForeignOwner`])
    /// or one whose group/other permissions go beyond `mode` ([`ShmError::ModeTooWide`]) is
    /// refused. Only the last path component is protected: directories named in `name` are
    /// trusted.
    pub fn create_shared(name: &str, len: usize, mode: u32) -> Result<Region> {
        if len == 0 {
            return Err(ShmError::Empty);
        }
        let path = Self::shm_path(name);
        let file = open_or_create_exclusive(&path, mode)?;
        let size = file
            .metadata()
            .map_err(|source| ShmError::Io {
                op: "stat",
                what: path.display().to_string(),
                source,
            })?
            .len();
        if size < len as u64 {
            file.set_len(len as u64).map_err(|source| ShmError::Io {
                op: "resize",
                what: path.display().to_string(),
                source,
            })?;
        }
        Self::map_file(file, path, len)
    }

    /// Opens an existing shm object or file (an ivshmem BAR such as
    /// `/sys/bus/pci/devices/0000:00:04.0/resource2`) and maps all of it; it must hold at least
    /// `min_len` bytes.
    ///
    /// Whoever else can open the file can also truncate it, so the mapping is protected against
    /// SIGBUS ([`Region::is_peer_controlled`], [`Region::peer_faulted`]).
    pub fn open_shared(name: &str, min_len: usize) -> Result<Region> {
        let path = Self::shm_path(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| ShmError::Io {
                op: "open",
                what: path.display().to_string(),
                source,
            })?;
        let size = file
            .metadata()
            .map_err(|source| ShmError::Io {
                op: "stat",
                what: path.display().to_string(),
                source,
            })?
            .len();
        if size < min_len.max(1) as u64 {
            return Err(ShmError::TooSmall {
                what: path.display().to_string(),
                actual: size,
                needed: min_len as u64,
            });
        }
        let len = usize::try_from(size).map_err(|_| ShmError::TooSmall {
            what: path.display().to_string(),
            actual: size,
            needed: min_len as u64,
        })?;
        Self::map_file(file, path, len)
    }

    /// Maps a named file. Another process can always truncate such a file, so unless it is
    /// sealed against shrinking the mapping is protected against SIGBUS.
    fn map_file(file: File, path: PathBuf, len: usize) -> Result<Region> {
        let seals = seals_of(file.as_fd()).map_err(|source| ShmError::Io {
            op: "read the seals of",
            what: path.display().to_string(),
            source,
        })?;
        let base =
            map(Some(file.as_fd()), len, libc::MAP_SHARED).map_err(|source| ShmError::Io {
                op: "map",
                what: path.display().to_string(),
                source,
            })?;
        // hugetlbfs files are the only files mapped with hugepages here.
        let huge = path.starts_with("/dev/hugepages");
        let extent = extent_of(file.as_fd(), len);
        Region::new(
            base,
            len,
            extent,
            huge,
            Backing::File(path),
            Some(file.into()),
            seals,
        )
    }

    /// Whether `fd` is shared memory: a memfd or a file of tmpfs or hugetlbfs (the files that
    /// can carry seals). Asked of the file's type only, so it never waits on a filesystem: a
    /// file a peer serves itself (FUSE) could make our next `fstat` or page fault wait for
    /// ever.
    pub fn is_shared_memory_fd(fd: BorrowedFd<'_>) -> bool {
        // SAFETY: fcntl(F_GET_SEALS) on a live descriptor borrowed for the call; no memory
        // arguments.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) >= 0 }
    }

    /// Refuses a file a peer gave us to map when the peer could be serving its filesystem
    /// itself (FUSE): our `fstat` of it, and every page fault in its mapping, would wait on
    /// that process, which may never answer. Shared memory passes at once
    /// ([`is_shared_memory_fd`](Self::is_shared_memory_fd)); any other file (QEMU's
    /// file-backed guest memory on a disk) passes when a mount table names its filesystem and
    /// that is not FUSE: ours, or, for a mount only the peer's namespace has, the peer's
    /// (`peer_pid`, from SO_PEERCRED). Asks the filesystem nothing: the mount comes from
    /// `/proc/self/fdinfo`, its type from `/proc/<pid>/mountinfo`.
    pub fn check_peer_file(fd: BorrowedFd<'_>, peer_pid: Option<i32>) -> Result<()> {
        if Region::is_shared_memory_fd(fd) {
            return Ok(());
        }
        let proc_err = |what: &str, source| ShmError::Io {
            op: "read",
            what: what.to_string(),
            source,
        };
        let fdinfo = format!("/proc/self/fdinfo/{}", fd.as_raw_fd());
        let info = std::fs::read_to_string(&fdinfo).map_err(|e| proc_err(&fdinfo, e))?;
        let mnt_id = info
            .lines()
            .find_map(|l| l.strip_prefix("mnt_id:")?.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                proc_err(
                    &fdinfo,
                    io::Error::new(io::ErrorKind::InvalidData, "no mnt_id line"),
                )
            })?;
        // Mount ids are unique system-wide; a namespace lists only its own mounts.
        let tables = std::iter::once("self".to_string()).chain(peer_pid.map(|p| p.to_string()));
        for who in tables {
            let Ok(mounts) = std::fs::read_to_string(format!("/proc/{who}/mountinfo")) else {
                continue;
            };
            match filesystem_of_mount(&mounts, mnt_id) {
                Some(fs) if is_fuse(fs) => {
                    return Err(ShmError::PeerServedFile { fs: fs.to_string() })
                }
                Some(_) => return Ok(()),
                None => {}
            }
        }
        Err(ShmError::UnknownMount { mnt_id })
    }

    /// Maps `len` bytes of a shared-memory fd received from a peer (memif regions).
    ///
    /// Its seals are read first (`F_GET_SEALS`; a file that cannot be sealed has none). Sealed
    /// with `F_SEAL_SHRINK` ([`Region::is_shrink_sealed`]), it can never become smaller than
    /// the size checked here. Without that seal (DPDK's zero-copy client sends its unsealed EAL
    /// memory) the peer can shrink it at any time, so the mapping is protected against SIGBUS
    /// ([`Region::is_peer_controlled`], [`Region::peer_faulted`]).
    pub fn from_fd(fd: OwnedFd, len: usize) -> Result<Region> {
        if len == 0 {
            return Err(ShmError::Empty);
        }
        let file = File::from(fd);
        // Seals before size: seals are never removed, so with F_SEAL_SHRINK set the size read
        // next is a floor for as long as the mapping lives.
        let seals = seals_of(file.as_fd()).map_err(|source| ShmError::Io {
            op: "read the seals of",
            what: "received fd".into(),
            source,
        })?;
        let size = file
            .metadata()
            .map_err(|source| ShmError::Io {
                op: "stat",
                what: "received fd".into(),
                source,
            })?
            .len();
        if size < len as u64 {
            return Err(ShmError::TooSmall {
                what: "received fd".into(),
                actual: size,
                needed: len as u64,
            });
        }
        let base =
            map(Some(file.as_fd()), len, libc::MAP_SHARED).map_err(|source| ShmError::Io {
                op: "map",
                what: "received fd".into(),
                source,
            })?;
        let extent = extent_of(file.as_fd(), len);
        Region::new(
            base,
            len,
            extent,
            false,
            Backing::Memfd,
            Some(file.into()),
            seals,
        )
    }

    /// [`Region::from_fd`] without keeping the fd: the mapping alone holds the peer's file, so
    /// once [released](Self::release) (or dropped) nothing of ours keeps the file's memory
    /// alive (a vhost-user frontend's guest memory).
    pub fn from_fd_mapping_only(fd: OwnedFd, len: usize) -> Result<Region> {
        let mut r = Region::from_fd(fd, len)?;
        r.fd = None;
        Ok(r)
    }

    /// Lets go of the memory behind the mapping while the mapping stays: the range is mapped
    /// anew as private zero pages, so the peer's file is no longer held by it (its memory is
    /// freed once the peer lets go too), while an access that still comes, from a holder that
    /// has not yet dropped its `Arc`, reads zeros and writes into memory no one sees, and never
    /// faults. For a peer that is gone (a vhost-user frontend that disconnected, a memory
    /// region it removed), once every data path has been told to let go of the region.
    pub fn release(&self) -> Result<()> {
        // SAFETY: [base, base + extent) is this Region's own mapping; mapping private zero
        // pages over it with MAP_FIXED keeps every address of it valid and readable and
        // writable, as it was, and no Rust reference to plain data in it exists (atomics and
        // copies only), so no reader can tell but by the values.
        let p = unsafe {
            libc::mmap(
                self.base.as_ptr().cast(),
                self.extent,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ShmError::Io {
                op: "release",
                what: "a peer's mapping".into(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty regions are refused at creation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the mapping is backed by hugepages.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Whether the file behind the mapping is sealed against shrinking (`F_SEAL_SHRINK`, read
    /// when it was mapped; seals are never removed). Our own memfds are; a received fd is when
    /// the peer sealed it; private memory and plain files are not.
    pub fn is_shrink_sealed(&self) -> bool {
        self.seals & libc::F_SEAL_SHRINK as u32 != 0
    }

    /// Whether a peer can shrink the memory behind this mapping (a received fd or an own hugetlb
    /// memfd without `F_SEAL_SHRINK`, any named file), so that it is protected against SIGBUS
    /// and [`peer_faulted`](Self::peer_faulted) can become true.
    pub fn is_peer_controlled(&self) -> bool {
        self.registration.is_some()
    }

    /// Whether an access to this mapping faulted because the memory behind it was shrunk
    /// (a peer truncated its memfd or the region file): one atomic load, cheap enough for a
    /// control path to poll.
    ///
    /// From the fault on, the whole mapping is private zero-filled memory: reads give zeros (or
    /// what this process wrote there since), writes reach no one, and no access faults again.
    /// The peer is broken: drop it, with a reason such as "peer shrank its shared memory".
    /// Always false for a region that is not [peer-controlled](Self::is_peer_controlled). It
    /// turns true at the first faulting access, not at the truncation itself.
    #[inline]
    pub fn peer_faulted(&self) -> bool {
        self.registration
            .as_ref()
            .is_some_and(Registration::faulted)
    }

    /// After a [peer fault](Self::peer_faulted): grows the file back to the region's length
    /// (zero-filled where it was cut) and maps it again at the same address, so the region is
    /// shared with the file once more and the next peer can be served. For a region whose file
    /// is ours (MEMNIC's host side); the caller keeps every data path out of the region while it
    /// runs (what was in it is gone: lay it out anew). Nothing to do unless it faulted.
    pub fn restore_after_fault(&self) -> Result<()> {
        let (Some(reg), Some(fd)) = (&self.registration, &self.fd) else {
            return Ok(());
        };
        if !reg.faulted() {
            return Ok(());
        }
        let what = || match &self.backing {
            Backing::File(p) => p.display().to_string(),
            _ => "memfd".to_string(),
        };
        let file = File::from(fd.try_clone().map_err(|source| ShmError::Io {
            op: "duplicate the fd of",
            what: what(),
            source,
        })?);
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        if size < self.extent as u64 {
            file.set_len(self.extent as u64)
                .map_err(|source| ShmError::Io {
                    op: "grow back",
                    what: what(),
                    source,
                })?;
        }
        // SAFETY: [base, base + extent) is this Region's own mapping (private zero pages since
        // the fault); mapping the file over it with MAP_FIXED keeps every address valid, and no
        // Rust reference to plain data in it exists (atomics and copies only).
        let p = unsafe {
            libc::mmap(
                self.base.as_ptr().cast(),
                self.extent,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ShmError::Io {
                op: "map again",
                what: what(),
                source: io::Error::last_os_error(),
            });
        }
        // Only now that the file is behind the mapping again: a fault before this point finds
        // the zero pages' state and retries, one after it is a new fault.
        reg.rearm();
        Ok(())
    }

    /// The fd behind the mapping (memfd or file), to pass to a peer.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// Start address, for placement syscalls (mbind) and diagnostics; never dereferenced outside
    /// this crate.
    pub fn addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    #[inline(always)]
    fn check(&self, offset: usize, size: usize, align: usize) -> Result<()> {
        match offset.checked_add(size) {
            Some(end) if end <= self.len && offset.is_multiple_of(align) => Ok(()),
            _ => Err(ShmError::OutOfBounds {
                offset,
                size,
                len: self.len,
            }),
        }
    }

    /// The 32-bit word at `offset` (4-byte aligned) as an atomic, or an error when it is outside
    /// the region. Use this for offsets that came from a peer.
    #[inline(always)]
    pub fn try_u32(&self, offset: usize) -> Result<&AtomicU32> {
        self.check(offset, 4, 4)?;
        // SAFETY: offset..offset+4 is inside the live mapping and 4-aligned (base is page-aligned);
        // an AtomicU32 is valid for any bit pattern and for concurrent writers in other processes.
        Ok(unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) })
    }

    /// The 32-bit word at an `offset` the program computed itself (not read from the peer).
    /// Panics on an out-of-bounds offset, which is a bug in the caller.
    #[inline(always)]
    pub fn u32(&self, offset: usize) -> &AtomicU32 {
        match self.try_u32(offset) {
            Ok(a) => a,
            Err(e) => out_of_bounds(e),
        }
    }

    /// The 64-bit word at `offset` (8-byte aligned); see [`Region::u32`].
    #[inline(always)]
    pub fn u64(&self, offset: usize) -> &AtomicU64 {
        if let Err(e) = self.check(offset, 8, 8) {
            out_of_bounds(e)
        }
        // SAFETY: checked just above: inside the mapping and 8-aligned; any bit pattern is valid.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    /// The 16-bit word at `offset` (2-byte aligned); see [`Region::u32`].
    #[inline(always)]
    pub fn u16(&self, offset: usize) -> &AtomicU16 {
        if let Err(e) = self.check(offset, 2, 2) {
            out_of_bounds(e)
        }
        // SAFETY: checked just above: inside the mapping and 2-aligned; any bit pattern is valid.
        unsafe { AtomicU16::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    /// Copies `dst.len()` bytes from the region at `offset` into private memory.
    ///
    /// If the peer writes the same bytes concurrently, `dst` receives some mix of old and new
    /// bytes; that is the caller's problem to validate, never undefined behaviour in `dst`'s use.
    #[inline(always)]
    pub fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len(), 1)?;
        // SAFETY: the source range is inside the mapping (checked), dst is a distinct private
        // buffer, and u8 has no invalid values, so a racing writer can only change the bytes seen.
        unsafe { copy_bytes(self.base.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// The `N` bytes at `offset` (any alignment), copied out by value: a short fixed-size read
    /// the compiler keeps in registers. [`Region::read_bytes`] into a local array of 9-15 bytes
    /// goes through two overlapping stores to the stack, and a compare that loads across both
    /// waits for them to retire (a failed store forward on every read).
    ///
    /// As with `read_bytes`, a peer writing concurrently only changes which bytes are seen.
    #[inline(always)]
    pub fn read_array<const N: usize>(&self, offset: usize) -> Result<[u8; N]> {
        self.check(offset, N, 1)?;
        // SAFETY: offset..offset+N is inside the mapping (checked); read_unaligned has no
        // alignment requirement, and [u8; N] has no invalid values, so a racing writer can only
        // change the bytes seen.
        Ok(unsafe { std::ptr::read_unaligned(self.base.as_ptr().add(offset).cast::<[u8; N]>()) })
    }

    /// Copies `src` into the region at `offset`.
    #[inline(always)]
    pub fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len(), 1)?;
        // SAFETY: the destination range is inside the mapping (checked) and src is private memory;
        // no Rust reference to the mapping exists that this write could invalidate.
        unsafe { copy_bytes(src.as_ptr(), self.base.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Copies `src` into the region at `offset` with streaming (non-temporal) stores: the
    /// 16-byte-aligned part of the destination goes out through write-combining buffers instead
    /// of being fetched into this core's cache first, the unaligned head and tail with plain
    /// stores. For a line the peer read last and reads next (a small frame handed to another
    /// core), the store then waits for no coherence round trip; for long copies it costs memory
    /// bandwidth instead, so callers measure where it pays.
    ///
    /// Streaming stores are weakly ordered: call [`store_fence`] before the store that tells
    /// the peer the bytes are there (a Release store alone does not order them). Elsewhere
    /// than x86_64 this is [`Region::write_bytes`].
    ///
    /// (Measured for the vhost split ring's enqueue and memif's tx, see their `STREAM_MAX`.)
    #[inline(always)]
    pub fn write_bytes_streaming(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len(), 1)?;
        // SAFETY: the destination range is inside the mapping (checked) and src is private
        // memory; no Rust reference to the mapping exists that this write could invalidate.
        unsafe { stream_bytes(src.as_ptr(), self.base.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.check(offset, len, 1)?;
        // SAFETY: the range is inside the mapping (checked); see write_bytes.
        unsafe { std::ptr::write_bytes(self.base.as_ptr().add(offset), byte, len) };
        Ok(())
    }

    /// Hints the CPU to load the cache line at `offset` for reading. Out-of-range offsets are
    /// ignored (a prefetch never faults, but there is no reason to issue one).
    #[inline(always)]
    pub fn prefetch(&self, offset: usize) {
        #[cfg(target_arch = "x86_64")]
        self.prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T0 }>(offset);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = offset;
    }

    /// Hints the CPU to load the cache line at `offset` into the core's L2 and outer caches but
    /// not L1 (PREFETCHT1): for many lines ahead of their use, which would crowd L1 and its
    /// fill buffers. Out-of-range offsets are ignored.
    #[inline(always)]
    pub fn prefetch_l2(&self, offset: usize) {
        #[cfg(target_arch = "x86_64")]
        self.prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T1 }>(offset);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = offset;
    }

    /// PREFETCH with the cache-level hint `HINT` (`_MM_HINT_*`) for the line at `offset`,
    /// ignored when out of range.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch_hint<const HINT: i32>(&self, offset: usize) {
        if offset < self.len {
            // SAFETY: prefetch has no architectural effect; the address is inside the mapping.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<HINT>(self.base.as_ptr().add(offset).cast());
            }
        }
    }

    /// Hints the CPU to load the cache line at `offset` in exclusive state, ready to be written
    /// (PREFETCHW; a no-op on CPUs without it). Fetching a line for writing up front saves the
    /// second coherence transaction (shared, then upgrade) of a read followed by a write.
    #[inline(always)]
    pub fn prefetch_write(&self, offset: usize) {
        #[cfg(target_arch = "x86_64")]
        if offset < self.len {
            // SAFETY: prefetchw has no architectural effect besides the cache (it never faults,
            // and CPUs without it decode it as a NOP); the address is inside the mapping. Written
            // as asm because `_mm_prefetch::<_MM_HINT_ET0>` lowers to prefetcht0 unless the
            // whole crate is built with the `prfchw` target feature.
            unsafe {
                std::arch::asm!(
                    "prefetchw [{p}]",
                    p = in(reg) self.base.as_ptr().add(offset),
                    options(nostack, preserves_flags, readonly)
                );
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = offset;
    }

    /// Raw pointer for the pool layer of this workspace (same crate family); bounds are the
    /// caller's responsibility. Hidden: not part of the public contract.
    #[doc(hidden)]
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

/// Orders every store before it, streaming ones ([`Region::write_bytes_streaming`]) included,
/// before every store after it (SFENCE on x86_64; a Release fence elsewhere, where nothing
/// streams). Pairs with the Acquire of whoever reads the flag or index stored next.
#[inline(always)]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SFENCE has no effect besides ordering stores; SSE is in the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
}

/// Copies `len` bytes, the 16-byte-aligned part of `dst` with streaming stores (MOVNTDQ), the
/// unaligned head and tail with [`copy_bytes`]; elsewhere than x86_64, [`copy_bytes`]. The
/// streaming stores are weakly ordered ([`store_fence`]).
///
/// # Safety
/// As [`copy_bytes`].
#[inline(always)]
pub(crate) unsafe fn stream_bytes(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        // Fewer than 16 bytes before the first aligned one, and after the last whole 16.
        let head = dst.align_offset(16).min(len);
        let end = head + ((len - head) & !15);
        // SAFETY: the caller's ranges hold `len` bytes; `head <= end <= len`, so every move
        // lies inside them; the streaming stores' destinations (`dst + head + 16k`) are
        // 16-aligned, as MOVNTDQ requires, and their loads are unaligned ones. The head and
        // the tail are each under 16 bytes, as `copy_short` requires.
        unsafe {
            if head > 0 {
                copy_short(src, dst, head);
            }
            let mut k = head;
            // A line's worth a step while one is left (a short frame is one or two steps).
            while k + 64 <= end {
                let (s, d) = (src.add(k), dst.add(k));
                let v0 = _mm_loadu_si128(s.cast::<__m128i>());
                let v1 = _mm_loadu_si128(s.add(16).cast::<__m128i>());
                let v2 = _mm_loadu_si128(s.add(32).cast::<__m128i>());
                let v3 = _mm_loadu_si128(s.add(48).cast::<__m128i>());
                _mm_stream_si128(d.cast::<__m128i>(), v0);
                _mm_stream_si128(d.add(16).cast::<__m128i>(), v1);
                _mm_stream_si128(d.add(32).cast::<__m128i>(), v2);
                _mm_stream_si128(d.add(48).cast::<__m128i>(), v3);
                k += 64;
            }
            while k < end {
                let v = _mm_loadu_si128(src.add(k).cast::<__m128i>());
                _mm_stream_si128(dst.add(k).cast::<__m128i>(), v);
                k += 16;
            }
            if end < len {
                copy_short(src.add(end), dst.add(end), len - end);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as guaranteed by the caller.
    unsafe {
        copy_bytes(src, dst, len)
    };
}

/// Copies `len` bytes. Up to 128 bytes (small frames, a frame's headers, the ends of a streamed
/// copy) take fixed-size moves the compiler inlines; a `memcpy` call costs more than the copy
/// at those sizes. Past [`FORWARD_MIN`] bytes, our own front-to-back loop ([`copy_forward`]).
///
/// # Safety
/// `src` must be valid for `len` bytes of reads, `dst` for `len` bytes of writes, and the two
/// ranges must not overlap.
#[inline(always)]
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    // Up to 128 bytes in straight-line moves that may overlap each other (a memcpy call, or a
    // loop, spent more on getting there than on the moves at these sizes). Longer copies pay
    // one compare before our forward loop, two before memcpy.
    if len > FORWARD_MIN && forward_copies() {
        // SAFETY: as guaranteed by the caller; FORWARD_MIN >= 128.
        unsafe { copy_forward(src, dst, len) };
    } else if len > 128 {
        // SAFETY: as guaranteed by the caller.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    } else if len < 16 {
        // SAFETY: as guaranteed by the caller.
        unsafe { copy_short(src, dst, len) };
    } else if len > 64 {
        // SAFETY: 64 < len: all four moves lie in 0..len of the ranges the caller guarantees.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, 32);
            std::ptr::copy_nonoverlapping(src.add(32), dst.add(32), 32);
            std::ptr::copy_nonoverlapping(src.add(len - 64), dst.add(len - 64), 32);
            std::ptr::copy_nonoverlapping(src.add(len - 32), dst.add(len - 32), 32);
        }
    } else if len >= 32 {
        // SAFETY: 32 <= len: both moves lie in 0..len, as above.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, 32);
            std::ptr::copy_nonoverlapping(src.add(len - 32), dst.add(len - 32), 32);
        }
    } else {
        // SAFETY: 16 <= len: as above.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, 16);
            std::ptr::copy_nonoverlapping(src.add(len - 16), dst.add(len - 16), 16);
        }
    }
}

/// Copies longer than this go front to back in [`copy_forward`], not through `memcpy`, on the
/// CPUs where that was measured to win ([`forward_copies`]).
///
/// glibc's `memcpy` (its AVX-512 variant on the AMD EPYC host of the early sessions) moves more than 512 bytes in a loop that
/// first loads the last 256 bytes, and copies backwards, from the end, when source and
/// destination sit at nearly the same offset in their 4-KiB pages (within 256 bytes: its guard
/// against 4K aliasing), which buffers of equal size in two pools often do (one pair in 16 for
/// 2176-byte mbufs; perf of our memif server at 1518 B: 63% of its samples in `memmove`,
/// about 40% of those in its backward loop and 14% on the first loads of the tail). The long frames we copy come fresh from the peer's
/// core: the receive paths prefetch their first lines and the hardware prefetcher follows a
/// copy that walks forward, so loading the far end first waits on the lines least likely to
/// have arrived, and a backward copy walks against the prefetchers.
///
/// In-process flip in one sitting (B/A of adjacent 1-s windows, p20/p50/p80, B the forward
/// copy in both processes of a pair; Mpps p50 A -> B):
///
/// ```text
///   vhost dequeue, our rxonly <- virtio-user txonly
///     packed 1518 B  slow 1.01/1.06/1.08 (9.90 -> 10.26), 0.97/1.04/1.10, 1.04/1.06/1.09
///                    fast (2 windows) 1.03/1.15 (14.22 -> 15.17)
///     split  1518 B  slow 1.00/1.04/1.07 (10.63 -> 11.04)  fast 1.00/1.02/1.05 (16.11 -> 16.44)
///     packed 1280 B  slow 1.01/1.03/1.05 (10.26 -> 10.45)  fast 1.02/1.03/1.31 (16.69 -> 17.15)
///     packed 1024 B  slow 0.97/0.99/1.01   fast 1.01/1.02/1.03 (a limit of 512; memcpy now)
///   vhost enqueue, our txonly -> virtio-user rxonly
///     packed 1518 B  slow 1.02/1.03/1.04 (8.52 -> 8.77)
///     split  1518 B  slow 1.04/1.06/1.09 (10.43 -> 10.98)  fast 1.03/1.03/1.04 (14.71 -> 15.21)
///   memif copy mode, our server rxonly <- our client txonly
///            1518 B  slow 1.05/1.07/1.08 (3.95 -> 4.24)    fast 1.05/1.06/1.06 (15.62 -> 16.50)
///            1280 B  slow 0.98/0.99/1.00 (5.02 -> 4.93)    fast 1.01/1.03/1.07 (18.14 -> 18.58)
///   memif, the same with a zero-copy client
///            1518 B  slow 0.99/1.00/1.02                   fast 1.01/1.02/1.05 (19.05 -> 19.49)
///   MEMNIC 1518 B, host txonly -> guest rxonly
///                    slow 1.29/1.36/1.46 (3.32 -> 4.49), 1.23/1.31/1.34 (3.44 -> 4.47)
/// ```
///
/// Up to 1024 bytes keep `memcpy`: at 768 B the forward copy won where the whole frame had been
/// prefetched (vhost packed dequeue, slow 1.32/1.36/1.41, fast 1.00/1.06/1.09) but lost where
/// only its first 256 bytes had (memif copy mode, ours <-> ours, slow 0.73/0.74/0.75: 8.2 ->
/// 6.0 Mpps; with a prefetch of the source 512 bytes ahead of the loop still 0.70).
pub(crate) const FORWARD_MIN: usize = 1024;

/// Whether copies past [`FORWARD_MIN`] take [`copy_forward`]: on AMD CPUs, where it won (the
/// table at [`FORWARD_MIN`], the AMD EPYC host); elsewhere `memcpy`, which won on the Intel
/// Xeon host of session 39 (glibc's AVX-512 `memmove` there too). A/B in one sitting there,
/// forward loop / memcpy, Mpps p50 at 1518 B, two alternating runs each: memnic-tester's
/// `memnic` variant 1.98 2.45 / 3.03 2.98 (0.79 0.88 / 1.10 1.08 of `2014-after`); memif our
/// server <- our client 7.75 8.48 / 8.87 8.94, our server <- DPDK's client 7.67 7.41 / 8.04
/// 7.59, DPDK's server <- our client 6.18 6.34 / 6.29 6.49; MEMNIC host -> guest 5.15 5.97 /
/// 6.47 6.81, guest -> host 6.03 6.68 / 6.67 6.44; vhost (our backend, DPDK's virtio-user)
/// split dequeue 7.41 7.69 / 8.02 7.68, split enqueue 12.16 11.76 / 11.01 11.98 (the one
/// mixed cell), packed dequeue 8.05 7.91 / 9.58 8.11, packed enqueue 10.90 11.49 / 11.83
/// 12.02. Decided once per process (CPUID's vendor).
#[inline(always)]
fn forward_copies() -> bool {
    static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMD.get_or_init(cpu_is_amd)
}

/// Whether CPUID says "AuthenticAMD".
fn cpu_is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        let mut vendor = [0u8; 12];
        vendor[..4].copy_from_slice(&id.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&id.edx.to_le_bytes());
        vendor[8..].copy_from_slice(&id.ecx.to_le_bytes());
        &vendor == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Copies `len` bytes (more than 128) front to back: 128 bytes a step, and the last 128 bytes
/// once more, overlapping, for a length that is not a multiple of 128 ([`FORWARD_MIN`] says
/// why). AVX2 where the CPU has it (std's cached flag), else `memcpy`.
///
/// # Safety
/// As [`copy_bytes`], and `len > 128`.
#[inline(always)]
unsafe fn copy_forward(src: *const u8, dst: *mut u8, len: usize) {
    debug_assert!(len > 128);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above); the ranges and length are as
        // copy_forward_avx2 requires (guaranteed by our caller).
        return unsafe { copy_forward_avx2(src, dst, len) };
    }
    // SAFETY: as guaranteed by the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// [`copy_forward`]'s loop: 128-byte moves, which the compiler makes four 32-byte AVX2 loads and
/// stores each (a fixed-size `copy_nonoverlapping` in a function built for AVX2; an unoptimized
/// build calls `memcpy` for each, still fast enough for the tests' probes).
///
/// # Safety
/// The CPU has AVX2; `src` valid for `len` bytes of reads, `dst` for `len` bytes of writes,
/// the ranges disjoint, `len >= 128`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_forward_avx2(src: *const u8, dst: *mut u8, len: usize) {
    const STEP: usize = 128;
    debug_assert!(len >= STEP);
    let mut at = 0;
    while at + STEP <= len {
        // SAFETY: at + STEP <= len (the loop's condition), so the move lies inside the
        // caller's disjoint ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), STEP) };
        at += STEP;
    }
    if at < len {
        // SAFETY: len >= STEP, so the last STEP bytes start at len - STEP >= 0 and end at len.
        unsafe { std::ptr::copy_nonoverlapping(src.add(len - STEP), dst.add(len - STEP), STEP) };
    }
}

/// Copies fewer than 16 bytes in at most two moves that may overlap (a `memcpy` call for the
/// head or tail of a streamed copy cost more than the copy).
///
/// # Safety
/// As [`copy_bytes`], with `len < 16`.
#[inline(always)]
unsafe fn copy_short(src: *const u8, dst: *mut u8, len: usize) {
    debug_assert!(len < 16);
    if len >= 8 {
        // SAFETY: 8 <= len: both moves lie in 0..len of the caller's ranges.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, 8);
            std::ptr::copy_nonoverlapping(src.add(len - 8), dst.add(len - 8), 8);
        }
    } else if len >= 4 {
        // SAFETY: 4 <= len: as above.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, 4);
            std::ptr::copy_nonoverlapping(src.add(len - 4), dst.add(len - 4), 4);
        }
    } else if len >= 2 {
        // SAFETY: 2 <= len: as above.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, 2);
            std::ptr::copy_nonoverlapping(src.add(len - 2), dst.add(len - 2), 2);
        }
    } else if len == 1 {
        // SAFETY: one byte, inside both ranges.
        unsafe { *dst = *src };
    }
}

#[cold]
#[inline(never)]
fn out_of_bounds(e: ShmError) -> ! {
    panic!("memnic-shm: program-computed offset out of range: {e}")
}

/// A new close-on-exec memfd, sealable when the kernel allows it: kernels before 4.16 refuse
/// `MFD_HUGETLB | MFD_ALLOW_SEALING` with EINVAL, and then the memfd is created unsealable.
fn create_memfd(name: &std::ffi::CStr, extra: libc::c_uint) -> io::Result<OwnedFd> {
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | extra;
    loop {
        // SAFETY: memfd_create takes a valid NUL-terminated name and returns a new fd or -1.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        if raw >= 0 {
            // SAFETY: raw is a freshly created fd that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(raw) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) && flags & libc::MFD_ALLOW_SEALING != 0 {
            flags &= !libc::MFD_ALLOW_SEALING;
            continue;
        }
        return Err(e);
    }
}

/// Adds `F_SEAL_SHRINK | F_SEAL_SEAL` to a memfd we created and returns its seals afterwards.
/// A memfd that
/// cannot be sealed (see [`create_memfd`]) stays unsealed: its seals read back without
/// `F_SEAL_SHRINK` and the region gets SIGBUS protection instead.
fn seal_shrink(fd: BorrowedFd<'_>) -> u32 {
    // SAFETY: fcntl(F_ADD_SEALS) on a live descriptor borrowed for the call; no memory
    // arguments. Failure (EPERM: created unsealable) is read back below.
    unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
        )
    };
    seals_of(fd).unwrap_or(0)
}

/// Creates `path` exclusively, or opens the existing file without following a symbolic link and
/// checks, on the descriptor, that it is ours and no more open than `mode`.
fn open_or_create_exclusive(path: &Path, mode: u32) -> Result<File> {
    let shown = || path.display().to_string();
    // A file removed between the failed create and the open is created again; a peer that keeps
    // doing that is met with an error after a few rounds rather than a loop.
    for _ in 0..8 {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
        {
            Ok(file) => return Ok(file),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(ShmError::Io {
                    op: "create",
                    what: shown(),
                    source,
                })
            }
        }
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(ShmError::SymlinkRefused { path: shown() })
            }
            Err(source) => {
                return Err(ShmError::Io {
                    op: "open",
                    what: shown(),
                    source,
                })
            }
        };
        let meta = file.metadata().map_err(|source| ShmError::Io {
            op: "stat",
            what: shown(),
            source,
        })?;
        // SAFETY: geteuid has no arguments and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if meta.uid() != euid {
            return Err(ShmError::ForeignOwner {
                path: shown(),
                owner: meta.uid(),
                euid,
            });
        }
        let found = meta.mode() & 0o7777;
        if found & 0o077 & !mode != 0 {
            return Err(ShmError::ModeTooWide {
                path: shown(),
                found,
                requested: mode & 0o7777,
            });
        }
        return Ok(file);
    }
    Err(ShmError::Io {
        op: "create or open",
        what: shown(),
        source: io::Error::other("the file kept disappearing between create and open"),
    })
}

impl Drop for Region {
    fn drop(&mut self) {
        // Unregister before unmapping: once unmapped, the range may be reused by a mapping that
        // is not ours, whose genuine SIGBUS a stale entry would paper over (sigbus module docs).
        drop(self.registration.take());
        // SAFETY: base/extent describe a mapping this Region created and still owns; atomics
        // handed out borrow &self, so none outlive the unmapping.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.extent) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// The mount table's type is read after the separator, for the mount asked about; FUSE
    /// in each of its names is refused, the kernel's own filesystems are not.
    #[test]
    fn a_file_on_fuse_is_refused_and_files_on_kernel_filesystems_pass() {
        let mounts = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
                      27 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                      61 27 0:52 / /mnt/a\\040-\\040b rw,nosuid master:7 - fuse.sshfs me@h: rw\n\
                      62 27 0:53 / /mnt/c rw - fuseblk /dev/sdb1 rw\n";
        assert_eq!(filesystem_of_mount(mounts, 27), Some("ext4"));
        assert_eq!(filesystem_of_mount(mounts, 61), Some("fuse.sshfs"));
        assert_eq!(filesystem_of_mount(mounts, 62), Some("fuseblk"));
        assert_eq!(filesystem_of_mount(mounts, 2), None);
        for fs in ["fuse", "fuseblk", "fuse.sshfs", "fuseblk.ntfs"] {
            assert!(is_fuse(fs), "{fs}");
        }
        for fs in ["ext4", "xfs", "tmpfs", "hugetlbfs", "overlay", "fusectl"] {
            assert!(!is_fuse(fs), "{fs}");
        }

        // Real files: a memfd, a file beside the test's working directory, /proc.
        let memfd = Region::memfd("peer-file", 4096, false).unwrap();
        Region::check_peer_file(memfd.fd().unwrap(), None).unwrap();
        let disk = tempfile_in_cwd();
        Region::check_peer_file(disk.as_fd(), None).unwrap();
        let proc = File::open("/proc/self/status").unwrap();
        Region::check_peer_file(proc.as_fd(), None).unwrap();
    }

    /// A real FUSE mount served by the test: it answers what opening a file takes (INIT,
    /// LOOKUP, GETATTR, OPEN) and holds FLUSH, the request every close of the file sends, as a
    /// hostile peer serving its own memory file would. The file is refused at once
    /// (`check_peer_file` asks the filesystem nothing), and `dispose` returns at once while its
    /// close waits for the server elsewhere (a plain drop would wait here). Needs root
    /// (CAP_SYS_ADMIN) for the mount.
    #[test]
    fn a_file_on_fuse_is_refused_and_disposed_without_waiting_for_its_server() {
        use std::io::{Read, Write};
        use std::sync::mpsc::channel;
        use std::time::Duration;
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .expect("/dev/fuse (the fuse module)");
        let dir = std::env::temp_dir().join(format!("memnic-fuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        let opts = CString::new(format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            dev.as_raw_fd()
        ))
        .unwrap();
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let r = unsafe {
            libc::mount(
                c"memnic-test".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        assert_eq!(
            r,
            0,
            "mount fuse (root needed): {}",
            io::Error::last_os_error()
        );
        let (flushed, flush_seen) = channel();
        let (answer, go) = channel::<()>();
        let mut reader = dev.try_clone().unwrap();
        let writer = dev.try_clone().unwrap();
        let server = std::thread::spawn(move || {
            let reply = |unique: u64, error: i32, body: &[u8]| {
                let mut b = Vec::with_capacity(16 + body.len());
                b.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
                b.extend_from_slice(&error.to_le_bytes());
                b.extend_from_slice(&unique.to_le_bytes());
                b.extend_from_slice(body);
                let _ = (&writer).write_all(&b);
            };
            // fuse_attr: ino, size, blocks, atime, mtime, ctime; then the 32-bit fields.
            let attr = |ino: u64, mode: u32| {
                let mut a = Vec::new();
                for v in [ino, 1 << 20, 2048, 0, 0, 0] {
                    a.extend_from_slice(&v.to_le_bytes());
                }
                for v in [0u32, 0, 0, mode, 1, 0, 0, 0, 4096, 0] {
                    a.extend_from_slice(&v.to_le_bytes());
                }
                a
            };
            let mut buf = vec![0u8; 1 << 21];
            while let Ok(n) = reader.read(&mut buf) {
                if n < 40 {
                    continue;
                }
                let op = u32::from_le_bytes(buf[4..8].try_into().unwrap());
                let unique = u64::from_le_bytes(buf[8..16].try_into().unwrap());
                let node = u64::from_le_bytes(buf[16..24].try_into().unwrap());
                let mut o = Vec::new();
                match op {
                    26 => {
                        // INIT: protocol 7.31, no flags, max_write 4096.
                        for v in [7u32, 31, 0, 0] {
                            o.extend_from_slice(&v.to_le_bytes());
                        }
                        o.extend_from_slice(&16u16.to_le_bytes());
                        o.extend_from_slice(&12u16.to_le_bytes());
                        for v in [4096u32, 1] {
                            o.extend_from_slice(&v.to_le_bytes());
                        }
                        o.resize(64, 0);
                        reply(unique, 0, &o);
                    }
                    1 => {
                        // LOOKUP: node 2, a regular file.
                        for v in [2u64, 0, 3600, 3600] {
                            o.extend_from_slice(&v.to_le_bytes());
                        }
                        o.extend_from_slice(&[0u8; 8]);
                        o.extend_from_slice(&attr(2, 0o100644));
                        reply(unique, 0, &o);
                    }
                    3 => {
                        o.extend_from_slice(&3600u64.to_le_bytes());
                        o.extend_from_slice(&[0u8; 8]);
                        let mode = if node == 1 { 0o40755 } else { 0o100644 };
                        o.extend_from_slice(&attr(node, mode));
                        reply(unique, 0, &o);
                    }
                    14 => {
                        // OPEN: file handle 7.
                        o.extend_from_slice(&7u64.to_le_bytes());
                        o.extend_from_slice(&[0u8; 8]);
                        reply(unique, 0, &o);
                    }
                    25 => {
                        // FLUSH: held until the test lets it go.
                        let _ = flushed.send(());
                        let _ = go.recv();
                        reply(unique, 0, &[]);
                    }
                    2 | 36 | 42 => {} // FORGET, INTERRUPT, BATCH_FORGET: no reply
                    _ => reply(unique, -libc::ENOSYS, &[]),
                }
            }
        });
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("guest-memory"))
            .unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let verdict = Region::check_peer_file(file.as_fd(), None);
            crate::unix::dispose(file.into());
            tx.send(verdict).unwrap();
        });
        let verdict = rx.recv_timeout(Duration::from_secs(5));
        let flushing = flush_seen.recv_timeout(Duration::from_secs(5));
        let _ = answer.send(());
        // SAFETY: umount2(2) with a NUL-terminated string that outlives the call.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        drop(dev);
        server.join().unwrap();
        let _ = std::fs::remove_dir(&dir);
        match verdict.expect("check and dispose returned at once, FLUSH unanswered") {
            Err(ShmError::PeerServedFile { fs }) => assert_eq!(fs, "fuse"),
            other => panic!("a FUSE file is refused, got {other:?}"),
        }
        flushing.expect("the close went on elsewhere: the server got its FLUSH");
    }

    /// An unlinked file in the working directory (on the disk the build is on).
    fn tempfile_in_cwd() -> File {
        let path = format!("peer-file-{}", std::process::id());
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    /// Every length takes one of copy_bytes' paths (two or four overlapping 32-byte moves, two
    /// 16-byte ones, memcpy, the forward loop with and without its overlapping last step): each
    /// copies exactly its bytes and touches nothing past them.
    #[test]
    fn copy_bytes_copies_exactly_len_bytes_at_every_length() {
        let lens = (0..=260).chain(500..=1100).chain(2040..=2200);
        // SAFETY: `copies_exactly` passes ranges as copy_bytes requires.
        copies_exactly(lens, |s, d, len| unsafe { copy_bytes(s, d, len) });
    }

    /// Runs `copy` from offset 1 of a 2300-byte pattern into offset 1 of a buffer of 0xee for
    /// each length of `lens` (at most 2299): exactly the length's bytes are copied, nothing
    /// before or after them is touched. `copy` gets two distinct allocations, each valid for
    /// the length from its pointer.
    fn copies_exactly(lens: impl Iterator<Item = usize>, copy: impl Fn(*const u8, *mut u8, usize)) {
        let src: Vec<u8> = (0..2300u32).map(|i| (i * 7 + 1 + i / 251) as u8).collect();
        for len in lens {
            let mut dst = vec![0xeeu8; 2300];
            copy(src[1..].as_ptr(), dst[1..].as_mut_ptr(), len);
            assert_eq!(dst[0], 0xee, "len {len}: byte before");
            assert_eq!(&dst[1..1 + len], &src[1..1 + len], "len {len}");
            assert!(
                dst[1 + len..].iter().all(|&b| b == 0xee),
                "len {len}: bytes after"
            );
        }
    }

    /// The forward loop itself (whichever way this CPU's long copies go): exactly its bytes at
    /// every length past 128, with and without its overlapping last step.
    #[test]
    fn the_forward_copy_copies_exactly_len_bytes() {
        let lens = (129..=600).chain(1020..=1100).chain(2040..=2200);
        // SAFETY: `copies_exactly` passes ranges as copy_forward requires; every len > 128.
        copies_exactly(lens, |s, d, len| unsafe { copy_forward(s, d, len) });
    }

    /// Long copies go front to back on AMD CPUs only, as /proc/cpuinfo names the vendor.
    #[test]
    fn long_copies_go_forward_on_amd_cpus_only() {
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            return;
        };
        let vendor = info
            .lines()
            .find_map(|l| l.strip_prefix("vendor_id"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).trim());
        if let Some(vendor) = vendor {
            assert_eq!(forward_copies(), vendor == "AuthenticAMD", "{vendor}");
        }
    }

    /// Streaming writes (the region's and a window's) and plain ones, in turn, at every
    /// alignment and length up to 200 bytes write exactly their bytes (head, streamed body,
    /// tail; each size class of the plain copy), nothing before or after, and read back the
    /// same; out of range is an error.
    #[test]
    fn writes_copy_exactly_their_bytes_at_every_alignment() {
        let r = Region::private(4096, false).unwrap();
        let src: Vec<u8> = (0..256u32).map(|i| (i * 13 + 5) as u8).collect();
        for at in 0..20 {
            for len in 0..=200 {
                r.fill(0, 512, 0xee).unwrap();
                match (at + len) % 3 {
                    0 => r.write_bytes_streaming(64 + at, &src[..len]).unwrap(),
                    1 => {
                        let w = r.slice(64 + at, len).unwrap();
                        w.write_streaming(0, &src[..len]).unwrap();
                    }
                    _ => r.write_bytes(64 + at, &src[..len]).unwrap(),
                }
                store_fence();
                let mut got = vec![0u8; len];
                r.read_bytes(64 + at, &mut got).unwrap();
                assert_eq!(got, &src[..len], "at {at} len {len}: read back");
                let mut back = vec![0u8; 512];
                r.read_bytes(0, &mut back).unwrap();
                let (before, rest) = back.split_at(64 + at);
                assert!(
                    before.iter().all(|&b| b == 0xee),
                    "at {at} len {len}: before"
                );
                assert_eq!(&rest[..len], &src[..len], "at {at} len {len}");
                assert!(
                    rest[len..].iter().all(|&b| b == 0xee),
                    "at {at} len {len}: after"
                );
            }
        }
        assert!(r.write_bytes_streaming(4090, &src[..7]).is_err());
        assert!(r.write_bytes_streaming(usize::MAX - 2, &src[..7]).is_err());
    }

    #[test]
    fn accessors_are_bounds_checked() {
        let r = Region::private(8192, false).unwrap();
        assert!(r.try_u32(8188).is_ok());
        assert!(r.try_u32(8189).is_err(), "misaligned");
        assert!(r.try_u32(8192).is_err());
        assert!(r.try_u32(usize::MAX - 1).is_err(), "overflowing offset");
        let mut buf = [0u8; 16];
        assert!(r.read_bytes(8180, &mut buf).is_err());
        assert!(r.read_bytes(usize::MAX - 4, &mut buf).is_err());
        assert!(r.write_bytes(8176, &buf).is_ok());
        assert!(r.fill(8000, 193, 0).is_err());
        assert!(r.read_array::<12>(8180).is_ok());
        assert!(r.read_array::<12>(8181).is_err());
        assert!(r.read_array::<12>(usize::MAX - 4).is_err());
    }

    /// A fixed-size read at any alignment returns exactly the bytes there.
    #[test]
    fn read_array_returns_the_bytes_at_any_offset() {
        let r = Region::private(4096, false).unwrap();
        let pattern: Vec<u8> = (0..200u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        r.write_bytes(0, &pattern).unwrap();
        for off in 0..64 {
            assert_eq!(r.read_array::<12>(off).unwrap()[..], pattern[off..off + 12]);
            assert_eq!(r.read_array::<10>(off).unwrap()[..], pattern[off..off + 10]);
        }
    }

    #[test]
    fn memfd_is_shared_between_two_mappings() {
        let a = Region::memfd("test", 4096, false).unwrap();
        let fd = a.fd().unwrap().try_clone_to_owned().unwrap();
        let b = Region::from_fd(fd, 4096).unwrap();
        a.u32(64).store(0xdead_beef, Ordering::Release);
        assert_eq!(b.u32(64).load(Ordering::Acquire), 0xdead_beef);
        b.write_bytes(100, b"hello").unwrap();
        let mut out = [0u8; 5];
        a.read_bytes(100, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(Region::from_fd(b.fd().unwrap().try_clone_to_owned().unwrap(), 8192).is_err());
    }

    #[test]
    fn posix_shm_keeps_content_across_opens() {
        let name = format!("memnic-shm-test-{}", std::process::id());
        let a = Region::create_shared(&name, 1 << 16, 0o600).unwrap();
        a.u64(8).store(42, Ordering::Relaxed);
        drop(a);
        let b = Region::create_shared(&name, 1 << 16, 0o600).unwrap();
        assert_eq!(b.u64(8).load(Ordering::Relaxed), 42);
        let c = Region::open_shared(&name, 1 << 16).unwrap();
        assert_eq!(c.len(), 1 << 16);
        assert!(Region::open_shared(&name, 1 << 17).is_err());
        std::fs::remove_file(Region::shm_path(&name)).unwrap();
        assert!(Region::open_shared(&name, 1).is_err());
    }

    #[test]
    fn hugepage_request_falls_back_to_normal_pages() {
        let r = Region::private(3 << 20, true).unwrap();
        assert!(r.len() >= 3 << 20);
        r.u32(r.len() - 4).store(1, Ordering::Relaxed);
        let m = Region::memfd("huge", 1 << 20, true).unwrap();
        assert!(m.len() >= 1 << 20);
    }
}
