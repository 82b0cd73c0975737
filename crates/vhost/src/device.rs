//! The device state a frontend configures over the vhost-user socket, and the request handler
//! rust-vmm's `vhost` crate calls for each message (it parses and size-checks the messages and
//! their fds; we check every value in them).
//!
//! A ring runs once it has a size, addresses, a memory table and a kick (SET_VRING_KICK, with
//! or without an fd), until GET_VRING_BASE stops it; with PROTOCOL_FEATURES negotiated it starts
//! disabled until SET_VRING_ENABLE(1). After every message that changes what the data path
//! uses, [`Device::install`] gives each queue its ring (or takes it away) with every queue out
//! of its burst (the port's gate), first reading back where each running ring got to.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::Arc;
use std::time::Duration;

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    Error as VuError, GpuBackend, Result as VuResult, VhostUserBackendReqHandlerMut,
};
use vhost::VhostUserMemoryRegionBase;

use memnic_ethdev::MacAddr;
use memnic_shm::unix::{dispose_from, EventFd};

use crate::mem::{Frontend, MemTable, RegionDesc, MAX_MEM_SLOTS};
use crate::packed::PackedRing;
use crate::port::Shared;
use crate::queue::{settle_leaving, VringConn};
use crate::split::{SplitRing, MAX_QUEUE_SIZE};
use crate::vring::{Ring, RingAddrs, RingError};

/// Device status bit (virtio 1.x §2.1): the device hit an error it cannot recover from.
pub const STATUS_NEEDS_RESET: u8 = 0x40;

/// virtio feature bits (virtio 1.x §6, §5.1.3).
pub mod feature {
    pub const NET_F_MTU: u64 = 1 << 3;
    pub const NET_F_MAC: u64 = 1 << 5;
    pub const NET_F_MRG_RXBUF: u64 = 1 << 15;
    pub const NET_F_STATUS: u64 = 1 << 16;
    pub const NET_F_MQ: u64 = 1 << 22;
    pub const F_ANY_LAYOUT: u64 = 1 << 27;
    pub const F_INDIRECT_DESC: u64 = 1 << 28;
    pub const F_EVENT_IDX: u64 = 1 << 29;
    pub const F_PROTOCOL_FEATURES: u64 = 1 << 30;
    pub const F_VERSION_1: u64 = 1 << 32;
    pub const F_RING_PACKED: u64 = 1 << 34;
    pub const F_IN_ORDER: u64 = 1 << 35;
}
use feature::*;

/// One virtqueue as the frontend set it up.
#[derive(Default)]
struct Vring {
    num: u32,
    addrs: Option<RingAddrs>,
    base: u16,
    call: Option<Arc<EventFd>>,
    kick: Option<Arc<EventFd>>,
    started: bool,
    enabled: bool,
    /// Its queue had it installed at the last `install` (so its position is read back).
    installed: bool,
    /// Port-wide id of the ring while it runs (0: none given yet; see `VringConn::ring_id`).
    ring_id: u64,
}

/// What the frontend configured; lives as long as its connection.
pub struct Device {
    shared: Arc<Shared>,
    /// Who the frontend is (SO_PEERCRED): its mount table, its user's closes (`Frontend`).
    pub frontend: Frontend,
    mac: MacAddr,
    mtu: u16,
    offered: u64,
    acked: u64,
    protocol: u64,
    /// SET_FEATURES has been received on this connection.
    features_set: bool,
    /// The driver's device status (SET_STATUS).
    status: u8,
    /// Rings found broken (all queues) at the last reset: more since means NEEDS_RESET.
    broken_at_reset: u64,
    mem: Option<Arc<MemTable>>,
    vrings: Vec<Vring>,
    /// Why the last ring could not be installed (logged by the port, for tests).
    pub last_error: Option<String>,
}

/// `MEMNIC_VHOST_TRACE=1`: every request on stderr (what DPDK's vhost debug log shows).
pub(crate) fn trace(what: std::fmt::Arguments<'_>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("MEMNIC_VHOST_TRACE").is_some()) {
        eprintln!("vhost: {what}");
    }
}

fn invalid(why: &'static str) -> VuError {
    VuError::InvalidOperation(why)
}

impl Device {
    pub fn new(shared: Arc<Shared>, mac: MacAddr, mtu: u16) -> Device {
        let queues = shared.queues();
        let mut offered = NET_F_MAC
            | NET_F_MTU
            | NET_F_MRG_RXBUF
            | NET_F_STATUS
            | F_ANY_LAYOUT
            | F_INDIRECT_DESC
            | F_EVENT_IDX
            | F_PROTOCOL_FEATURES
            | F_VERSION_1
            | F_RING_PACKED
            | F_IN_ORDER;
        // Zero-copy chains come back in the order they are freed.
        if shared.zero_copy.is_some() {
            offered &= !F_IN_ORDER;
        }
        if queues > 1 {
            offered |= NET_F_MQ;
        }
        Device {
            shared,
            frontend: Frontend::default(),
            mac,
            mtu,
            offered,
            acked: 0,
            protocol: 0,
            features_set: false,
            status: 0,
            broken_at_reset: 0,
            mem: None,
            vrings: (0..2 * queues).map(|_| Vring::default()).collect(),
            last_error: None,
        }
    }

    /// Refuses the request: `why` goes into the reason the port logs when it closes the
    /// connection (every error from a handler closes it).
    fn refuse(&mut self, why: String) -> VuError {
        self.last_error = Some(why);
        VuError::InvalidParam
    }

    fn vring(&mut self, index: u32) -> VuResult<&mut Vring> {
        let n = self.vrings.len();
        if index as usize >= n {
            return Err(self.refuse(format!("ring {index} does not exist (this port has {n})")));
        }
        Ok(&mut self.vrings[index as usize])
    }

    /// [`Device::install`] for a request handler: a ring that has everything it needs but
    /// cannot be set up (its areas outside the memory table) refuses the request if the
    /// request is about it (`touched`: the ring a request names, None for the device's
    /// features or memory table) or it ran until now.
    fn install_or_refuse(&mut self, touched: Option<usize>) -> VuResult<()> {
        let failed = self.install();
        // A ring already waiting for its memory (a region removed under it) keeps waiting:
        // a request about another ring, or about none, is not refused for it.
        match failed
            .into_iter()
            .rev()
            .find(|f| f.was_installed || touched == Some(f.ring))
        {
            Some(f) => Err(self.refuse(f.why)),
            None => Ok(()),
        }
    }

    /// [`Device::install`] after ADD_MEM_REG or REM_MEM_REG, which are not refused for a ring
    /// whose areas are no longer (or not yet again) in the table: the spec says the backend
    /// must unmap a removed region, and QEMU replaces a region that changed with a REM_MEM_REG
    /// then an ADD_MEM_REG while the rings run. Such a ring is taken from its queue (its
    /// position read back) and stays stopped, the guest's chains untouched, until a region
    /// holds its areas again; DPDK's vhost invalidates and re-translates its rings the same
    /// way.
    fn install_after_mem_slot_change(&mut self, what: &str) {
        for f in self.install() {
            trace(format_args!(
                "{what}: {}: the ring waits for its memory",
                f.why
            ));
        }
    }

    /// A kick or call fd: it must be an eventfd (a pipe or a socket could block a reader).
    fn eventfd(
        &mut self,
        index: u8,
        what: &str,
        fd: Option<File>,
    ) -> VuResult<Option<Arc<EventFd>>> {
        let Some(f) = fd else { return Ok(None) };
        if !EventFd::is_eventfd(f.as_fd()) {
            dispose_from(f.into(), self.frontend.sender);
            return Err(self.refuse(format!("ring {index}: the {what} fd is not an eventfd")));
        }
        match EventFd::from_fd(OwnedFd::from(f)) {
            Ok(e) => Ok(Some(Arc::new(e))),
            Err(e) => Err(self.refuse(format!("ring {index}: the {what} fd: {e}"))),
        }
    }

    fn header_len(&self) -> usize {
        if self.acked & (F_VERSION_1 | NET_F_MRG_RXBUF) != 0 {
            12
        } else {
            10
        }
    }

    /// Back to the state of a new connection (RESET_OWNER, RESET_DEVICE, SET_STATUS 0,
    /// disconnect): every ring stopped and taken from its queue, the memory unmapped once no
    /// queue holds it.
    pub fn reset(&mut self) {
        let _drained = self.drain_zero_copy("reset");
        for v in &mut self.vrings {
            let installed = v.installed;
            *v = Vring {
                installed,
                ..Vring::default()
            };
        }
        let old = self.mem.take();
        self.acked = 0;
        self.features_set = false;
        self.status = 0;
        self.broken_at_reset = self.broken_rings();
        // No ring is started now, so none can fail to be set up.
        let _ = self.install();
        self.release(old);
    }

    /// After [`Device::install`] put the queues on the table now in force: lets go of the
    /// memory of the `old` table's regions that it does not share (the queues reload their
    /// rings before they look again).
    fn release(&self, old: Option<Arc<MemTable>>) {
        if let Some(old) = old {
            old.release_regions_not_in(self.mem.as_deref());
        }
    }

    /// Gives each queue its ring as the state now says, with the queues out of their bursts.
    /// A ring with a memory table, addresses and a kick whose areas are not where the table
    /// says memory is gets no ring, and is returned with why (the other rings are installed
    /// all the same).
    pub(crate) fn install(&mut self) -> Vec<NotInstalled> {
        let hdr_len = self.header_len();
        let mrg = self.acked & NET_F_MRG_RXBUF != 0;
        let event_idx = self.acked & F_EVENT_IDX != 0;
        let packed = self.acked & F_RING_PACKED != 0;
        let in_order = self.acked & F_IN_ORDER != 0;
        let mut conns: Vec<Option<VringConn>> = Vec::with_capacity(self.vrings.len());
        let mut failed = Vec::new();
        for (i, v) in self.vrings.iter_mut().enumerate() {
            if !v.started {
                v.ring_id = 0;
            }
            let conn = match (&self.mem, v.addrs, v.started) {
                (Some(mem), Some(addrs), true) => match locate(mem, v, addrs, packed) {
                    Ok(ring) => Some(VringConn {
                        ring_id: *ring_id(&self.shared, &mut v.ring_id),
                        ring,
                        mem: mem.clone(),
                        hdr_len,
                        mrg_rxbuf: mrg,
                        event_idx,
                        in_order,
                        call: v.call.clone(),
                        kick: v.kick.clone(),
                        base: v.base,
                        enabled: v.enabled,
                    }),
                    Err(e) => {
                        failed.push(NotInstalled {
                            ring: i,
                            was_installed: v.installed,
                            why: format!("ring {i}: {e}"),
                        });
                        None
                    }
                },
                _ => None,
            };
            conns.push(conn);
        }
        let shared = self.shared.clone();
        let mut calls = Vec::new();
        // Queues that stay in a burst longer than this are lcores stuck elsewhere (one in a
        // call its frontend jammed gets out when the watchdog empties it): try again.
        while shared
            .gate
            .reset(None, Duration::from_secs(1), || {
                swap(&shared, &mut self.vrings, &mut conns, &mut calls);
                Some(())
            })
            .is_none()
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        // A frontend can jam one of these so that the write blocks: the watchdog empties
        // the ones listed here (see `port::unjam_calls`).
        *shared.calling.lock().unwrap_or_else(|p| p.into_inner()) = calls.clone();
        for call in &calls {
            let _ = call.notify();
        }
        shared
            .calling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let up = self.vrings.iter().any(|v| v.installed && v.enabled);
        // Release pairs with the Acquire in `VhostPort::link`.
        self.shared.link_up.store(up, Release);
        failed
    }
}

/// A ring [`Device::install`] could not set up.
pub(crate) struct NotInstalled {
    ring: usize,
    /// It ran until this install (a ring waiting for its memory did not).
    was_installed: bool,
    why: String,
}

/// A running ring's port-wide id, given the first time it is installed.
fn ring_id<'a>(shared: &Shared, id: &'a mut u64) -> &'a u64 {
    if *id == 0 {
        // Relaxed: a counter; only uniqueness matters.
        *id = shared.next_ring_id.fetch_add(1, Relaxed);
    }
    id
}

/// While a request that stops, disables or remaps rings is served: no chain goes up without
/// a copy (see [`Device::drain_zero_copy`]); dropped when the request is done.
pub(crate) struct Draining(Option<Arc<Shared>>);

impl Drop for Draining {
    fn drop(&mut self) {
        if let Some(shared) = &self.0 {
            for q in 0..shared.queues() {
                // Relaxed: a request the queue reads at its next burst.
                shared.rx_slot(q).zc_draining.store(false, Relaxed);
            }
        }
    }
}

/// Locates a ring's areas in the layout the features chose; a packed ring's position must be
/// one of its slots.
fn locate(mem: &MemTable, v: &Vring, addrs: RingAddrs, packed: bool) -> Result<Ring, RingError> {
    if packed {
        let r = PackedRing::new(mem, v.num, addrs)?;
        r.check_pos(v.base)?;
        Ok(Ring::Packed(r))
    } else {
        SplitRing::new(mem, v.num, addrs).map(Ring::Split)
    }
}

impl Device {
    /// Before a request that stops, disables or remaps the guest's tx rings (GET_VRING_BASE,
    /// SET_VRING_ENABLE 0, a reset or disconnect, SET_STATUS 0, SET_MEM_TABLE, REM_MEM_REG):
    /// with zero copy, asks every rx queue to take no chain uncopied and waits, up to the drain
    /// timeout, until the stack has freed every chain it holds and the queues have returned
    /// them. Chains still held then are abandoned if the ring stops (see `zerocopy`). The
    /// queues go on polling meanwhile; the returned guard lets them take chains uncopied again
    /// once the request is done.
    pub(crate) fn drain_zero_copy(&self, what: &str) -> Draining {
        let shared = &self.shared;
        let Some(zc) = shared.zero_copy else {
            return Draining(None);
        };
        for q in 0..shared.queues() {
            // Relaxed: read by the queue at its next burst; it then publishes `zc_held`.
            shared.rx_slot(q).zc_draining.store(true, Relaxed);
        }
        let held = || {
            (0..shared.queues())
                .map(|q| shared.rx_slot(q).zc_held.load(Relaxed))
                .sum::<u32>()
        };
        let end = std::time::Instant::now() + zc.drain_timeout;
        while held() > 0 && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_micros(200));
        }
        let left = held();
        if left > 0 {
            trace(format_args!(
                "{what}: {left} zero-copy chains still held after {:?}",
                zc.drain_timeout
            ));
        }
        Draining(Some(shared.clone()))
    }
}

impl Device {
    /// SET_VRING_ENABLE before SET_FEATURES, as QEMU 7.2's vhost-net sends it (the port's
    /// control thread reads it, since rust-vmm's handler refuses it then): `None` once
    /// SET_FEATURES was received (the handler takes the message).
    pub fn early_vring_enable(&mut self, index: u32, num: u32) -> Option<VuResult<()>> {
        if self.features_set {
            return None;
        }
        trace(format_args!(
            "set_vring_enable index {index} {num} (before set_features)"
        ));
        Some(match num {
            0 | 1 => self.set_vring_enable(index, num == 1),
            _ => Err(VuError::InvalidParam),
        })
    }

    /// REPLY_ACK was negotiated (SET_PROTOCOL_FEATURES).
    pub fn reply_ack(&self) -> bool {
        self.protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0
    }

    /// Rings the queues found broken, all told. (Relaxed: counters.)
    fn broken_rings(&self) -> u64 {
        (0..self.vrings.len())
            .map(|i| self.shared.slot(i).broken.load(Relaxed))
            .sum()
    }

    /// STATUS was negotiated: SET_STATUS and GET_STATUS are served (by the port's control
    /// thread, which reads them: rust-vmm's handler has no case for them).
    pub fn status_negotiated(&self) -> bool {
        self.protocol & VhostUserProtocolFeatures::STATUS.bits() != 0
    }

    /// SET_STATUS: the driver's device status byte. Status 0 (the driver resets the device: a
    /// guest rebooting or unbinding its driver) clears NEEDS_RESET but keeps the memory table
    /// and the rings' set-up: QEMU sends it *before* the GET_VRING_BASEs that stop the rings,
    /// and on the next start sends only what changed (never the memory table again), so a
    /// reset here would leave the restarted rings without memory. DPDK's vhost also just
    /// records it.
    pub fn set_status(&mut self, status: u64) -> VuResult<()> {
        trace(format_args!("set_status {status:#x}"));
        let Ok(status) = u8::try_from(status) else {
            return Err(self.refuse(format!("device status {status:#x} is not a byte")));
        };
        if status == 0 {
            drop(self.drain_zero_copy("set_status 0"));
            self.broken_at_reset = self.broken_rings();
        }
        self.status = status;
        Ok(())
    }

    /// GET_STATUS: what the driver set, with NEEDS_RESET once a ring broke (the guest wrote
    /// values no ring can follow) since the last reset.
    pub fn status(&self) -> u8 {
        trace(format_args!("get_status"));
        if self.broken_rings() > self.broken_at_reset {
            self.status | STATUS_NEEDS_RESET
        } else {
            self.status
        }
    }
}

/// With every queue parked: reads back where each installed ring got to, then gives each slot
/// its new ring (which goes on from there). A ring taken from its queue that was owed a call
/// leaves its call fd in `calls`, to be notified once the queues run again.
fn swap(
    shared: &Shared,
    vrings: &mut [Vring],
    conns: &mut Vec<Option<VringConn>>,
    calls: &mut Vec<Arc<EventFd>>,
) {
    for (i, (v, conn)) in vrings.iter_mut().zip(conns.drain(..)).enumerate() {
        let slot = shared.slot(i);
        if v.installed {
            // Relaxed: the queue is parked, and the gate orders its last store before this.
            v.base = slot.last_avail.load(Relaxed);
            calls.extend(settle_leaving(slot, conn.as_ref().map(|c| c.ring_id)));
        }
        let conn = conn.map(|mut c| {
            c.base = v.base;
            c
        });
        if conn.is_some() {
            // Until the queue's next burst picks the new ring up, the slot still says where
            // the old ring got to: a read-back before then (the next message's install) must
            // see the new ring's base, not that (nor a stale 0, which would lose a packed ring's
            // wrap counter). Relaxed: the queue is parked (as above).
            slot.last_avail.store(v.base, Relaxed);
        }
        v.installed = conn.is_some();
        *slot.conn.lock().unwrap_or_else(|p| p.into_inner()) = conn;
    }
}

impl VhostUserBackendReqHandlerMut for Device {
    fn set_owner(&mut self) -> VuResult<()> {
        trace(format_args!("set_owner"));
        Ok(())
    }

    fn reset_owner(&mut self) -> VuResult<()> {
        trace(format_args!("reset_owner"));
        self.reset();
        Ok(())
    }

    fn reset_device(&mut self) -> VuResult<()> {
        trace(format_args!("reset_device"));
        self.reset();
        Ok(())
    }

    fn get_features(&mut self) -> VuResult<u64> {
        trace(format_args!("get_features"));
        Ok(self.offered)
    }

    fn set_features(&mut self, features: u64) -> VuResult<()> {
        trace(format_args!("set_features {features:#x}"));
        if features & !self.offered != 0 {
            let extra = features & !self.offered;
            return Err(self.refuse(format!(
                "features {extra:#x} were not offered (offered {:#x})",
                self.offered
            )));
        }
        // A running ring keeps its layout: its position (and the queue's used position) means
        // a slot of that layout, and would be taken over unchecked by the other.
        if (features ^ self.acked) & F_RING_PACKED != 0 {
            if let Some(i) = self.vrings.iter().position(|v| v.started) {
                return Err(self.refuse(format!(
                    "ring {i} runs: the ring layout (RING_PACKED) cannot change until GET_VRING_BASE stops it"
                )));
            }
        }
        self.acked = features;
        self.features_set = true;
        // Without PROTOCOL_FEATURES there is no SET_VRING_ENABLE: rings are enabled at once.
        if features & F_PROTOCOL_FEATURES == 0 {
            for v in &mut self.vrings {
                v.enabled = true;
            }
        }
        self.install_or_refuse(None)
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        trace(format_args!(
            "set_mem_table {:x?}",
            ctx.iter()
                .map(|r| (r.guest_phys_addr, r.memory_size, r.user_addr))
                .collect::<Vec<_>>()
        ));
        let descs: Vec<RegionDesc> = ctx
            .iter()
            .map(|r| RegionDesc {
                guest_phys_addr: r.guest_phys_addr,
                memory_size: r.memory_size,
                userspace_addr: r.user_addr,
                mmap_offset: r.mmap_offset,
            })
            .collect();
        let table = MemTable::new(&descs, files, self.frontend).map_err(|e| {
            self.last_error = Some(e.to_string());
            invalid("memory table refused")
        })?;
        let _drained = self.drain_zero_copy("set_mem_table");
        let old = self.mem.replace(Arc::new(table));
        let installed = self.install_or_refuse(None);
        self.release(old);
        installed?;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        trace(format_args!("set_vring_num index {index} num {num}"));
        // Packed rings need no power of two (SET_FEATURES comes first).
        let packed = self.acked & F_RING_PACKED != 0;
        if num == 0 || num > MAX_QUEUE_SIZE || !(packed || num.is_power_of_two()) {
            return Err(self.refuse(format!(
                "ring {index}: queue size {num} is not {} from 1 to {MAX_QUEUE_SIZE}",
                if packed { "a size" } else { "a power of two" }
            )));
        }
        let v = self.vring(index)?;
        if v.started && v.num != num {
            // Its position (and the queue's used position) is a slot of the old size.
            let old = v.num;
            return Err(self.refuse(format!(
                "ring {index} runs: its size cannot change ({old} to {num}) until GET_VRING_BASE stops it"
            )));
        }
        v.num = num;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> VuResult<()> {
        trace(format_args!("set_vring_addr"));
        self.vring(index)?.addrs = Some(RingAddrs {
            desc: descriptor,
            avail: available,
            used,
        });
        self.install_or_refuse(Some(index as usize))
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VuResult<()> {
        trace(format_args!("set_vring_base index {index} base {base:#x}"));
        let base = if self.acked & F_RING_PACKED != 0 {
            // Packed: the avail index and its wrap counter in bits 0-15; QEMU puts the used
            // index and its wrap counter in bits 16-31. We return every chain in the burst
            // that takes it, so our used position always equals our avail position: the high
            // half is not needed (DPDK's vhost ignores it too). The index is checked against
            // the ring when it is installed.
            base as u16
        } else {
            // A split ring's indices are 16 bits: a larger base is not one of them.
            let Ok(base) = u16::try_from(base) else {
                return Err(self.refuse(format!(
                    "ring {index}: base {base} does not fit a split ring's 16-bit index"
                )));
            };
            base
        };
        self.vring(index)?.base = base;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        trace(format_args!("get_vring_base index {index}"));
        self.vring(index)?;
        let _drained = self.drain_zero_copy("get_vring_base");
        self.vring(index)?.started = false;
        self.install_or_refuse(Some(index as usize))?;
        let packed = self.acked & F_RING_PACKED != 0;
        let v = self.vring(index)?;
        let num = if packed {
            // The used position (the same: see set_vring_base) in the high half, where QEMU
            // reads it back; DPDK's virtio-user reads only the low half.
            v.base as u32 | (v.base as u32) << 16
        } else {
            v.base as u32
        };
        Ok(VhostUserVringState::new(index, num))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        trace(format_args!(
            "set_vring_kick index {index} fd {}",
            fd.is_some()
        ));
        let kick = self.eventfd(index, "kick", fd)?;
        let v = self.vring(index as u32)?;
        v.kick = kick;
        v.started = true;
        self.install_or_refuse(Some(index as usize))
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        trace(format_args!(
            "set_vring_call index {index} fd {}",
            fd.is_some()
        ));
        let call = self.eventfd(index, "call", fd)?;
        self.vring(index as u32)?.call = call;
        self.install_or_refuse(Some(index as usize))
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        trace(format_args!("set_vring_err"));
        if let Some(f) = fd {
            dispose_from(f.into(), self.frontend.sender);
        }
        self.vring(index as u32)?;
        Ok(())
    }

    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        trace(format_args!("get_protocol_features"));
        let mut p = VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::RESET_DEVICE
            | VhostUserProtocolFeatures::STATUS;
        if self.shared.queues() > 1 {
            p |= VhostUserProtocolFeatures::MQ;
        }
        Ok(p)
    }

    fn set_protocol_features(&mut self, features: u64) -> VuResult<()> {
        trace(format_args!("set_protocol_features {features:#x}"));
        let offered = self.get_protocol_features()?.bits();
        if features & !offered != 0 {
            let extra = features & !offered;
            return Err(self.refuse(format!(
                "protocol features {extra:#x} were not offered (offered {offered:#x})"
            )));
        }
        self.protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> VuResult<u64> {
        trace(format_args!("get_queue_num"));
        Ok(self.shared.queues() as u64)
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        trace(format_args!("set_vring_enable index {index} {enable}"));
        self.vring(index)?;
        let _drained = (!enable).then(|| self.drain_zero_copy("set_vring_enable 0"));
        self.vring(index)?.enabled = enable;
        self.install_or_refuse(Some(index as usize))
    }

    fn get_config(
        &mut self,
        offset: u32,
        size: u32,
        _flags: VhostUserConfigFlags,
    ) -> VuResult<Vec<u8>> {
        trace(format_args!("get_config"));
        // struct virtio_net_config: mac[6], status le16 (LINK_UP), max_virtqueue_pairs le16,
        // mtu le16.
        let mut cfg = [0u8; 12];
        cfg[0..6].copy_from_slice(&self.mac.0);
        cfg[6..8].copy_from_slice(&1u16.to_le_bytes());
        cfg[8..10].copy_from_slice(&self.shared.queues().to_le_bytes());
        cfg[10..12].copy_from_slice(&self.mtu.to_le_bytes());
        let end = offset.checked_add(size).ok_or(VuError::InvalidParam)? as usize;
        if end > cfg.len() {
            return Err(VuError::InvalidParam);
        }
        Ok(cfg[offset as usize..end].to_vec())
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> VuResult<()> {
        trace(format_args!("set_config"));
        // The net config space is read-only for the driver.
        Err(invalid("config space is read-only"))
    }

    fn get_inflight_fd(
        &mut self,
        _inflight: &VhostUserInflight,
    ) -> VuResult<(VhostUserInflight, File)> {
        trace(format_args!("get_inflight_fd"));
        Err(invalid("inflight tracking not offered"))
    }

    fn set_inflight_fd(&mut self, _inflight: &VhostUserInflight, file: File) -> VuResult<()> {
        dispose_from(file.into(), self.frontend.sender);
        trace(format_args!("set_inflight_fd"));
        Err(invalid("inflight tracking not offered"))
    }

    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        trace(format_args!("get_max_mem_slots"));
        Ok(MAX_MEM_SLOTS as u64)
    }

    fn add_mem_region(
        &mut self,
        region: &VhostUserSingleMemoryRegion,
        fd: File,
        _postcopy_listening: Option<bool>,
    ) -> VuResult<Option<VhostUserMemoryRegionBase>> {
        trace(format_args!("add_mem_region"));
        let d = RegionDesc {
            guest_phys_addr: region.guest_phys_addr,
            memory_size: region.memory_size,
            userspace_addr: region.user_addr,
            mmap_offset: region.mmap_offset,
        };
        let empty = MemTable::default();
        let cur = self.mem.as_deref().unwrap_or(&empty);
        let table = cur.with(d, fd, self.frontend).map_err(|e| {
            self.last_error = Some(e.to_string());
            invalid("memory region refused")
        })?;
        // Every region of the old table is in the new one.
        self.mem = Some(Arc::new(table));
        self.install_after_mem_slot_change("add_mem_region");
        Ok(None)
    }

    fn remove_mem_region(&mut self, region: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        trace(format_args!("remove_mem_region"));
        let d = RegionDesc {
            guest_phys_addr: region.guest_phys_addr,
            memory_size: region.memory_size,
            userspace_addr: region.user_addr,
            mmap_offset: region.mmap_offset,
        };
        let Some(cur) = &self.mem else {
            return Err(invalid("no memory table"));
        };
        let table = cur.without(&d).map_err(|e| {
            self.last_error = Some(e.to_string());
            invalid("no such memory region")
        })?;
        let _drained = self.drain_zero_copy("remove_mem_region");
        let old = self.mem.replace(Arc::new(table));
        self.install_after_mem_slot_change("remove_mem_region");
        self.release(old);
        Ok(())
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        fd: File,
    ) -> VuResult<Option<File>> {
        trace(format_args!("set_device_state_fd"));
        dispose_from(fd.into(), self.frontend.sender);
        Err(invalid("device state transfer not offered"))
    }

    fn check_device_state(&mut self) -> VuResult<()> {
        trace(format_args!("check_device_state"));
        Err(invalid("device state transfer not offered"))
    }

    fn set_log_base(&mut self, _log: &VhostUserLog, file: File) -> VuResult<()> {
        dispose_from(file.into(), self.frontend.sender);
        trace(format_args!("set_log_base"));
        Err(invalid("dirty logging not offered"))
    }

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> VuResult<()> {
        trace(format_args!("set_gpu_socket"));
        Err(invalid("not a GPU device"))
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> VuResult<File> {
        trace(format_args!("get_shared_object"));
        Err(invalid("shared objects not offered"))
    }

    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        trace(format_args!("get_shmem_config"));
        Err(invalid("shared memory regions not offered"))
    }
}
