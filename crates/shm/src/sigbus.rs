//! SIGBUS protection for mappings a peer controls.
//!
//! A peer that shrinks the file behind one of our mappings (`ftruncate` on its memfd, on the
//! MEMNIC region file) makes our next access past the new end raise SIGBUS, which by default
//! kills the whole process. Wayland compositors meet the same threat from client shm pools with
//! the technique used here:
//!
//! * one process-wide SIGBUS handler, installed on the first registration;
//! * a fixed-size registry of peer mappings (start, extent, state), lock-free, so the handler
//!   can search it without allocating or locking;
//! * on a fault (`BUS_ADRERR`) inside a registered mapping the handler maps private anonymous
//!   zero pages over the **whole** mapping (`MAP_FIXED`), marks it faulted and returns: the
//!   access is retried and sees zeros. The mapping is cut off from the peer from then on;
//!   [`Region::peer_faulted`](crate::Region::peer_faulted) tells the driver to drop that peer.
//! * any other SIGBUS (outside registered mappings, or not an address error) goes to the
//!   handler that was installed before ours, or gets the default action (death by SIGBUS).
//!
//! # Races, and why they are harmless
//!
//! * **Registration vs. a fault.** A slot's start and extent are published with a seqlock:
//!   the writer makes `seq` odd, writes, makes it even again (Release); the handler reads `seq`
//!   (Acquire), the fields, then `seq` again and ignores the slot if it was odd or changed. A
//!   slot being written at the moment of a fault cannot be the faulting mapping's slot: the
//!   mapping is registered before its `Region` is returned, so every access to it comes after
//!   its registration (program order, or the synchronisation that sent the `Region` to another
//!   thread). A torn read of some other slot is rejected by the sequence check, so it can never
//!   make an unrelated address look registered.
//! * **Unregistration vs. a fault.** `Region::drop` unregisters *before* it unmaps. While it
//!   runs nothing else can touch the mapping (drop has the region to itself: every accessor
//!   borrows it), so no fault of ours can be in flight. Unregistering first means that once the
//!   address range is unmapped and perhaps reused by an unrelated mapping, no stale entry can
//!   make the handler paper over that mapping's genuine SIGBUS.
//! * **A fault vs. the slot being reused.** The faulting thread is inside an access to a live
//!   `Region` (it holds a borrow), so that region cannot be dropped, and its slot cannot be
//!   freed or reused, until the handler has returned. The `MAP_FIXED` therefore always lands on
//!   the mapping it was meant for. (Code that keeps a raw pointer from
//!   [`Region::as_mut_ptr`](crate::Region::as_mut_ptr) past the region's life is already
//!   undefined behaviour, with or without this module.)
//! * **Several threads fault on one mapping at once.** The first to move the slot's state from
//!   `INTACT` to `REPLACING` maps the zero pages and then publishes `REPLACED`; the others wait
//!   for `REPLACED` and return, so their accesses are retried on the new pages. A fault that
//!   finds `REPLACED` already happened before the replacement (anonymous memory never raises
//!   `BUS_ADRERR`) and is simply retried. Writes made to the zero pages are never clobbered by a
//!   second replacement.
//!
//! Limits: the previous handler is called with its own flags honoured only as far as
//! `SA_SIGINFO` goes (its `sa_mask` and `SA_RESETHAND` are not emulated); a handler that some
//! other code installs after ours replaces ours, and this module does not fight it.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{fence, AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::{Result, ShmError};

/// The most bytes one peer (a memif connection, a vhost-user frontend) may have us map, all
/// its regions together, checked before mapping: a peer could otherwise take most of the
/// process's address space with sparse files (terabytes each), after which our own
/// allocations fail. 16 TiB is past any guest or buffer area seen in practice; the user
/// address space is 128 TiB.
pub const MAX_PEER_BYTES: u64 = 16 << 40;

/// How many peer-controlled mappings can be protected at once. Creating one more fails with
/// [`ShmError::TooManyPeerMappings`]. Honest peers need few (DPDK's zero-copy memif client
/// sends region 0 and one region per memseg list; its copy-mode regions are sealed memfds,
/// which need none), but a memif client may add 256 regions, each of a file it can shrink:
/// room for 32 such connections at once, all interfaces of the process together. A few words
/// a slot; the handler searches only up to the highest slot ever taken.
pub const MAX_PEER_MAPPINGS: usize = 8192;

/// The mapping is the peer's memory, as mapped.
const INTACT: u8 = 0;
/// A handler is mapping zero pages over it right now.
const REPLACING: u8 = 1;
/// It is private zero-filled memory now; the peer is broken.
const REPLACED: u8 = 2;
/// The zero pages could not be mapped; the process is about to die of the SIGBUS.
const FAILED: u8 = 3;

struct Slot {
    /// Owned by a live [`Registration`]; only register/unregister touch it.
    taken: AtomicBool,
    /// Seqlock over `start` and `extent`: odd while they are being written.
    seq: AtomicUsize,
    start: AtomicUsize,
    /// Bytes from `start` (whole pages of the mapping); 0 in a free slot.
    extent: AtomicUsize,
    /// INTACT, REPLACING, REPLACED or FAILED.
    state: AtomicU8,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            taken: AtomicBool::new(false),
            seq: AtomicUsize::new(0),
            start: AtomicUsize::new(0),
            extent: AtomicUsize::new(0),
            state: AtomicU8::new(INTACT),
        }
    }

    /// Writes `start` and `extent` under the seqlock. Only the slot's owner calls this.
    fn publish(&self, start: usize, extent: usize) {
        // Relaxed: only the owner writes `seq`, so it reads its own last store.
        let seq = self.seq.load(Ordering::Relaxed);
        // Relaxed, then the Release fence below: a reader that sees a field written after the
        // fence also sees this odd value (pairs with the reader's Acquire fence in `find`).
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        // Relaxed: ordered for readers by the fence above and the Release store below.
        self.start.store(start, Ordering::Relaxed);
        self.extent.store(extent, Ordering::Relaxed);
        // Release: pairs with the Acquire load of `seq` in `find`; a reader that sees this even
        // value sees the fields written above.
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }
}

static SLOTS: [Slot; MAX_PEER_MAPPINGS] = [const { Slot::new() }; MAX_PEER_MAPPINGS];

/// One past the highest slot ever taken: the handler searches no further.
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// The SIGBUS action that was installed before ours, written once by `install` before
/// `PREV_READY` is set.
struct PrevAction(UnsafeCell<MaybeUninit<libc::sigaction>>);

// SAFETY: the cell is written exactly once, inside `INSTALLED.get_or_init`, before the Release
// store of PREV_READY; it is only read after an Acquire load of PREV_READY returned true, so
// no read can race the write.
unsafe impl Sync for PrevAction {}

static PREV: PrevAction = PrevAction(UnsafeCell::new(MaybeUninit::uninit()));
static PREV_READY: AtomicBool = AtomicBool::new(false);

/// The outcome of installing the handler: Ok, or the errno of the failed `sigaction`.
static INSTALLED: OnceLock<std::result::Result<(), i32>> = OnceLock::new();

/// A registered peer mapping. Dropping it unregisters the mapping; the owner must do so
/// before unmapping (see the module docs).
#[derive(Debug)]
pub(crate) struct Registration {
    slot: usize,
}

impl Registration {
    /// Whether a fault inside the mapping was caught, so it is zero pages now.
    #[inline]
    pub(crate) fn faulted(&self) -> bool {
        // Acquire: pairs with the handler's Release store of REPLACED (or FAILED); a caller
        // that sees it also sees the zero pages in place.
        SLOTS[self.slot].state.load(Ordering::Acquire) != INTACT
    }
}

impl Registration {
    /// The mapping holds the peer's memory again (`Region::restore_after_fault` mapped it back
    /// over the zero pages): the next fault is handled anew.
    pub(crate) fn rearm(&self) {
        // Release: pairs with the handler's Acquire CAS from INTACT; a fault that sees INTACT
        // comes after the remapping that preceded this store.
        SLOTS[self.slot].state.store(INTACT, Ordering::Release);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let s = &SLOTS[self.slot];
        s.publish(0, 0);
        // Release: pairs with the Acquire CAS in `register`; the next owner's writes to this
        // slot come after ours.
        s.taken.store(false, Ordering::Release);
    }
}

/// Registers the mapping `[start, start + extent)` (page-aligned start, whole pages) so that a
/// SIGBUS inside it is survived. Installs the process-wide handler on first use.
pub(crate) fn register(start: usize, extent: usize) -> Result<Registration> {
    install()?;
    for (i, s) in SLOTS.iter().enumerate() {
        // Acquire: pairs with the Release store of `taken = false` in Registration::drop.
        if s.taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        // Relaxed: published to the handler by the Release store of `seq` in `publish`, and
        // to this thread's later `faulted` calls by program order.
        s.state.store(INTACT, Ordering::Relaxed);
        s.publish(start, extent);
        // Release: pairs with the handler's Acquire load of HIGH, so a fault in this mapping
        // searches this slot.
        HIGH.fetch_max(i + 1, Ordering::Release);
        return Ok(Registration { slot: i });
    }
    Err(ShmError::TooManyPeerMappings {
        max: MAX_PEER_MAPPINGS,
    })
}

fn install() -> Result<()> {
    let outcome = INSTALLED.get_or_init(|| {
        // SAFETY: sigaction is plain data; all-zero is a valid (empty) value, filled in below.
        let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
        ours.sa_sigaction = on_sigbus as extern "C" fn(_, _, _) as libc::sighandler_t;
        // SA_NODEFER: SIGBUS stays deliverable inside the handler, so the re-raise of a fault
        // that is not ours takes effect at once. SA_ONSTACK: use the thread's alternate signal
        // stack where there is one (Rust's std sets one up per thread).
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK;
        // SAFETY: sa_mask is a live sigset_t inside `ours`.
        unsafe { libc::sigemptyset(&mut ours.sa_mask) };
        // SAFETY: PREV is written only here, once (get_or_init runs this closure at most once),
        // and read only after PREV_READY is set below.
        let prev = unsafe { (*PREV.0.get()).as_mut_ptr() };
        // SAFETY: `ours` is a valid action and `prev` points at room for one; exchanging in
        // one call means no other handler installed meanwhile can be lost.
        if unsafe { libc::sigaction(libc::SIGBUS, &ours, prev) } != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        // Release: pairs with the Acquire load in `chain`; the handler reads PREV only after.
        PREV_READY.store(true, Ordering::Release);
        Ok(())
    });
    outcome.map_err(|errno| ShmError::Io {
        op: "install",
        what: "the SIGBUS handler that protects peer mappings".into(),
        source: std::io::Error::from_raw_os_error(errno),
    })
}

/// The registered slot, start and extent containing `addr`, if any. Async-signal-safe.
fn find(addr: usize) -> Option<(&'static Slot, usize, usize)> {
    // Acquire: pairs with the Release fetch_max in `register`.
    let high = HIGH.load(Ordering::Acquire);
    for s in SLOTS.iter().take(high) {
        // Acquire: pairs with the Release store of the even `seq` in `publish`.
        let before = s.seq.load(Ordering::Acquire);
        if before & 1 != 0 {
            continue; // being written: not the faulting mapping (module docs)
        }
        // Relaxed: validated by the sequence check below.
        let start = s.start.load(Ordering::Relaxed);
        let extent = s.extent.load(Ordering::Relaxed);
        // Acquire fence: pairs with the Release fence in `publish`; if the fields came from a
        // newer write, the re-read below sees a newer `seq`.
        fence(Ordering::Acquire);
        if s.seq.load(Ordering::Relaxed) != before {
            continue;
        }
        if extent != 0 && addr.wrapping_sub(start) < extent {
            return Some((s, start, extent));
        }
    }
    None
}

/// Replaces the mapping with zero pages (or waits for another thread doing so). Returns whether
/// the faulting access can be retried. Async-signal-safe.
fn replace(s: &Slot, start: usize, extent: usize) -> bool {
    // Acquire on failure: pairs with the Release store of REPLACED/FAILED by another handler.
    match s
        .state
        .compare_exchange(INTACT, REPLACING, Ordering::Acquire, Ordering::Acquire)
    {
        Ok(_) => {
            // SAFETY: [start, start + extent) is exactly a live mapping of a Region that the
            // faulting thread is accessing (so it cannot be unmapped meanwhile; module docs).
            // Replacing its pages with private zero pages keeps every address valid; no Rust
            // reference to plain data in it exists (Region hands out atomics and copies only).
            let p = unsafe {
                libc::mmap(
                    start as *mut c_void,
                    extent,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            let ok = p as usize == start;
            // Release: pairs with the Acquire loads in `faulted` and of waiting handlers: the
            // zero pages are in place for whoever sees REPLACED.
            s.state
                .store(if ok { REPLACED } else { FAILED }, Ordering::Release);
            ok
        }
        Err(REPLACING) => loop {
            // Acquire: pairs with the Release store just above, made by the replacing thread.
            match s.state.load(Ordering::Acquire) {
                REPLACING => std::hint::spin_loop(),
                state => break state == REPLACED,
            }
        },
        Err(state) => state == REPLACED,
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: __errno_location returns this thread's errno slot; the handler may call mmap or
    // sigaction, which set errno, so the interrupted code's value is saved and restored.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo_t for a handler installed with SA_SIGINFO.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    let handled = code == libc::BUS_ADRERR
        && match find(addr) {
            Some((s, start, extent)) => replace(s, start, extent),
            None => false,
        };
    if !handled {
        chain(sig, info, ctx, code);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Hands a SIGBUS that is not ours to the previous action. Async-signal-safe.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void, code: libc::c_int) {
    // Acquire: pairs with the Release store in `install`; PREV is written before.
    let prev = if PREV_READY.load(Ordering::Acquire) {
        // SAFETY: PREV was initialised before PREV_READY was set and is never written again.
        Some(unsafe { (*PREV.0.get()).assume_init_ref() })
    } else {
        None // the instant between installing and recording: treat as the default action
    };
    let (handler, flags) = prev.map_or((libc::SIG_DFL, 0), |p| (p.sa_sigaction, p.sa_flags));
    match handler {
        libc::SIG_DFL => default_action(sig, code),
        // A fault the kernel raised cannot be ignored (it would re-fault forever; the kernel
        // forces the default action on such a signal anyway); one sent by kill() can.
        libc::SIG_IGN if code > 0 => default_action(sig, code),
        libc::SIG_IGN => {}
        f if flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous action was installed with SA_SIGINFO, so `f` is a
            // three-argument signal handler; it gets the arguments the kernel gave us.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(f) };
            f(sig, info, ctx);
        }
        f => {
            // SAFETY: installed without SA_SIGINFO, so `f` is a one-argument signal handler.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(f) };
            f(sig);
        }
    }
}

/// Dies of `sig` with the default action: for a fault the kernel raised, by returning so the
/// access faults again with the default disposition (the core then shows the faulting
/// instruction); for a signal sent by a process, by raising it again.
fn default_action(sig: libc::c_int, code: libc::c_int) {
    // SAFETY: sigaction is plain data; all-zero is SIG_DFL with an empty mask and no flags.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `dfl` is a valid action; sigaction is async-signal-safe.
    unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
    if code <= 0 {
        // SAFETY: raise is async-signal-safe; SIGBUS is not blocked here (SA_NODEFER).
        unsafe { libc::raise(sig) };
    }
}
