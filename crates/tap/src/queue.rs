//! The queues: rx reads frames into pool buffers, tx writes frames out of them.

use std::io::IoSliceMut;
use std::sync::Arc;
use std::time::Duration;

use memnic_ethdev::{Mbuf, PoolCache, QueueStats, RxQueue, StatsCell, TxQueue, MAX_BURST};
use memnic_shm::tap::{Failure, Tap};

/// Longest frame a port passes (a 9000-byte MTU, an Ethernet header and a VLAN tag), as
/// vhost's. A longer one the kernel sends (an interface MTU above 9000) is counted as an rx
/// drop; a longer one to send is a tx error.
pub const MAX_FRAME: usize = 9018;

/// Most buffers one received frame may take (so the pool's buffers must hold at least
/// `MAX_FRAME / MAX_RX_SEGS` bytes).
pub const MAX_RX_SEGS: usize = 32;

/// The receive half of a queue pair.
pub struct TapRxQueue {
    tap: Arc<Tap>,
    cache: PoolCache,
    /// Empty buffers at their full length, `segs` of them when ready: the next frame is read
    /// across them, and those it fills are taken as its segments.
    spare: Vec<Mbuf>,
    /// Buffers a read offers: together more than `MAX_FRAME` bytes, so a read that fills them
    /// all was a frame too long (the kernel cut it).
    segs: usize,
    /// Data room of one buffer.
    room: usize,
    /// The interface was deleted: nothing more will come.
    gone: bool,
    stats: QueueStats,
    cell: Arc<StatsCell>,
}

impl TapRxQueue {
    pub(crate) fn new(
        tap: Arc<Tap>,
        cache: PoolCache,
        room: usize,
        segs: usize,
        cell: Arc<StatsCell>,
    ) -> TapRxQueue {
        debug_assert!(segs * room > MAX_FRAME && segs <= MAX_RX_SEGS);
        TapRxQueue {
            tap,
            cache,
            spare: Vec::with_capacity(segs),
            segs,
            room,
            gone: false,
            stats: QueueStats::default(),
            cell,
        }
    }

    /// Tops the spare buffers up to `segs`; false when the pool has too few.
    #[inline]
    fn refill(&mut self) -> bool {
        while self.spare.len() < self.segs {
            let Some(mut m) = self.cache.alloc() else {
                return false;
            };
            let full = m.capacity();
            m.set_len(full);
            self.spare.push(m);
        }
        true
    }

    /// Reads one frame across the spare buffers (`readv`).
    #[inline]
    fn read_frame(&mut self) -> std::io::Result<usize> {
        let mut bufs = self.spare.iter_mut();
        let mut iov: [IoSliceMut<'_>; MAX_RX_SEGS] = std::array::from_fn(|_| {
            // Spares are private (the port refuses shared pools), so each has a slice.
            IoSliceMut::new(
                bufs.next()
                    .and_then(|m| m.as_mut_slice())
                    .unwrap_or(&mut []),
            )
        });
        self.tap.read_vectored(&mut iov[..self.segs])
    }

    /// The first spare buffers holding a `len`-byte frame, as one packet.
    #[inline]
    fn take_frame(&mut self, len: usize) -> Mbuf {
        let n = len.div_ceil(self.room);
        let mut segs = self.spare.drain(..n);
        let mut head = segs.next().expect("a frame takes at least one buffer");
        head.set_len(len.min(self.room));
        let mut left = len - head.len();
        for mut s in segs {
            let here = left.min(self.room);
            s.set_len(here);
            left -= here;
            // Cannot fail (at most MAX_RX_SEGS segments, MAX_FRAME bytes); a refused segment
            // would go back to its pool on drop.
            let _ = head.chain(s);
        }
        head
    }
}

impl RxQueue for TapRxQueue {
    fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
        if self.gone {
            return 0;
        }
        let mut got = 0;
        for _ in 0..max.min(MAX_BURST) {
            if !self.refill() {
                self.stats.nombuf += 1;
                break;
            }
            match self.read_frame() {
                Ok(0) => self.stats.errors += 1,
                // Too long (segs * room > MAX_FRAME, so one the kernel cut lands here too).
                Ok(len) if len > MAX_FRAME => self.stats.drops += 1,
                Ok(len) => {
                    let m = self.take_frame(len);
                    pkts.push(m);
                    got += 1;
                    self.stats.packets += 1;
                    self.stats.bytes += len as u64;
                }
                Err(e) => {
                    match Failure::of(&e) {
                        Failure::WouldBlock => {}
                        Failure::Gone => {
                            self.gone = true;
                            self.stats.errors += 1;
                        }
                        Failure::Down | Failure::Other => self.stats.errors += 1,
                    }
                    break;
                }
            }
        }
        self.cell.publish(&self.stats);
        got
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Sleeps until the kernel has a frame for this queue or `timeout` passes.
    fn wait(&mut self, timeout: Duration) -> bool {
        if self.gone {
            std::thread::sleep(timeout);
        } else if self.tap.wait_readable(Some(timeout)).is_err() {
            // poll() itself failed (it does not for a live descriptor): do not spin.
            std::thread::sleep(timeout);
        }
        true
    }
}

/// The transmit half of a queue pair.
pub struct TapTxQueue {
    tap: Arc<Tap>,
    cache: PoolCache,
    /// Where a chain, or a buffer not in private memory, is gathered before its write.
    scratch: Box<[u8]>,
    gone: bool,
    stats: QueueStats,
    cell: Arc<StatsCell>,
}

impl TapTxQueue {
    pub(crate) fn new(tap: Arc<Tap>, cache: PoolCache, cell: Arc<StatsCell>) -> TapTxQueue {
        TapTxQueue {
            tap,
            cache,
            scratch: vec![0; MAX_FRAME].into_boxed_slice(),
            gone: false,
            stats: QueueStats::default(),
            cell,
        }
    }

    /// Writes one frame: a lone private segment straight from its buffer, anything else
    /// gathered into the scratch buffer first.
    #[inline]
    fn write(&mut self, m: &Mbuf) -> std::io::Result<usize> {
        if m.nb_segs() == 1 {
            if let Some(s) = m.as_slice() {
                return self.tap.write(s);
            }
        }
        let buf = &mut self.scratch[..m.len()];
        m.copy_out(0, buf);
        self.tap.write(buf)
    }
}

impl TxQueue for TapTxQueue {
    fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        if self.gone {
            return 0;
        }
        let n = pkts.len().min(MAX_BURST);
        let mut taken = 0;
        while taken < n {
            let m = &pkts[taken];
            let len = m.len();
            if len > MAX_FRAME {
                self.stats.errors += 1;
                taken += 1;
                continue;
            }
            match self.write(m) {
                Ok(w) if w == len => {
                    self.stats.packets += 1;
                    self.stats.bytes += len as u64;
                }
                Ok(_) => self.stats.errors += 1,
                Err(e) => match Failure::of(&e) {
                    // No room now: the rest stays with the caller.
                    Failure::WouldBlock => break,
                    // The interface is down: the frame is dropped, as a NIC without link drops.
                    Failure::Down => self.stats.drops += 1,
                    Failure::Other => self.stats.errors += 1,
                    // Deleted: this frame is lost, and the queue takes no more.
                    Failure::Gone => {
                        self.gone = true;
                        self.stats.errors += 1;
                        taken += 1;
                        break;
                    }
                },
            }
            taken += 1;
        }
        self.cache.free_front(pkts, taken);
        self.cell.publish(&self.stats);
        taken
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }
}
