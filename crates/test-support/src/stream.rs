//! One payload stream over a queue: the sender retries what `tx_burst` hands back, the receiver
//! checks every frame (flow, checksum, length schedule, order).

use memnic_ethdev::{Mbuf, RxQueue, TxQueue};
use memnic_pktbuf::{Mempool, PoolCache};

use crate::payload::{check_flow, fill, frame_len, write_frame, MAX_FRAME, MIN_FRAME};

/// Sends frames `0..total` of one stream, retrying what `tx_burst` hands back.
pub struct Sender {
    pub seed: u64,
    pub flow: u64,
    pub next: u64,
    pub total: u64,
    pub min: usize,
    pub max: usize,
    pub burst: usize,
    pub pending: Vec<Mbuf>,
    pub cache: PoolCache,
    /// Frames taken by tx_burst and their bytes.
    pub taken: u64,
    pub taken_bytes: u64,
}

impl Sender {
    pub fn new(pool: &Mempool, seed: u64, flow: u64, total: u64) -> Sender {
        Sender {
            seed,
            flow,
            next: 0,
            total,
            min: MIN_FRAME,
            max: MAX_FRAME,
            burst: 32,
            pending: Vec::with_capacity(64),
            cache: pool.cache(),
            taken: 0,
            taken_bytes: 0,
        }
    }

    pub fn sizes(mut self, min: usize, max: usize) -> Sender {
        self.min = min;
        self.max = max;
        self
    }

    /// Tops the burst up to `burst` frames and offers it once. Returns how many were taken.
    pub fn poll(&mut self, txq: &mut dyn TxQueue) -> usize {
        while self.pending.len() < self.burst && self.next < self.total {
            let len = frame_len(self.seed, self.flow, self.next, self.min, self.max);
            let mut m = self.cache.alloc().expect("sender pool exhausted");
            assert!(m.set_len(len), "pool buffer too small for {len} bytes");
            match m.as_mut_slice() {
                Some(f) => fill(f, self.next, self.flow),
                None => write_frame(&mut m, self.next, self.flow, len),
            }
            self.pending.push(m);
            self.next += 1;
        }
        let before: u64 = self.pending.iter().map(|m| m.len() as u64).sum();
        let n = txq.tx_burst(&mut self.pending);
        let after: u64 = self.pending.iter().map(|m| m.len() as u64).sum();
        self.taken += n as u64;
        self.taken_bytes += before - after;
        n
    }

    /// Everything generated and taken.
    pub fn done(&self) -> bool {
        self.next == self.total && self.pending.is_empty()
    }
}

/// Receives one stream and checks every frame.
pub struct Receiver {
    pub seed: u64,
    pub flow: u64,
    pub min: usize,
    pub max: usize,
    /// The next sequence number expected.
    pub expect: u64,
    pub count: u64,
    pub bytes: u64,
    /// Sequence numbers skipped (only when gaps are allowed).
    pub lost: u64,
    pub allow_gaps: bool,
    pub buf: Vec<Mbuf>,
    pub cache: PoolCache,
}

impl Receiver {
    pub fn new(pool: &Mempool, seed: u64, flow: u64) -> Receiver {
        Receiver {
            seed,
            flow,
            min: MIN_FRAME,
            max: MAX_FRAME,
            expect: 0,
            count: 0,
            bytes: 0,
            lost: 0,
            allow_gaps: false,
            buf: Vec::with_capacity(64),
            cache: pool.cache(),
        }
    }

    pub fn sizes(mut self, min: usize, max: usize) -> Receiver {
        self.min = min;
        self.max = max;
        self
    }

    pub fn gaps(mut self) -> Receiver {
        self.allow_gaps = true;
        self
    }

    /// One rx_burst; every frame is checked (panics on the first bad one).
    pub fn poll(&mut self, rxq: &mut dyn RxQueue) -> usize {
        let n = rxq.rx_burst(&mut self.buf, 32);
        assert_eq!(
            n,
            self.buf.len(),
            "rx_burst returned {n} but appended {}",
            self.buf.len()
        );
        for m in self.buf.drain(..) {
            let copy;
            let data = match m.frame_slice() {
                Some(s) => s,
                None => {
                    copy = m.to_vec();
                    &copy
                }
            };
            if let Err(e) = Self::accept(
                data,
                self.seed,
                self.flow,
                self.min,
                self.max,
                self.allow_gaps,
                &mut self.expect,
                &mut self.lost,
            ) {
                panic!(
                    "stream {:#x}: after {} good frames: {e}",
                    self.flow, self.count
                );
            }
            self.count += 1;
            self.bytes += m.len() as u64;
            self.cache.free(m);
        }
        n
    }

    #[allow(clippy::too_many_arguments)]
    fn accept(
        data: &[u8],
        seed: u64,
        flow: u64,
        min: usize,
        max: usize,
        allow_gaps: bool,
        expect: &mut u64,
        lost: &mut u64,
    ) -> Result<(), String> {
        let seq = check_flow(data, flow)?;
        if seq != *expect {
            if !allow_gaps {
                return Err(if seq < *expect {
                    format!("seq {seq} again or out of order (expected {})", *expect)
                } else {
                    format!("seq {} to {} lost (got {seq})", *expect, seq - 1)
                });
            }
            if seq < *expect {
                return Err(format!(
                    "seq {seq} duplicated or out of order (expected at least {})",
                    *expect
                ));
            }
            *lost += seq - *expect;
        }
        let want = frame_len(seed, flow, seq, min, max);
        if data.len() != want {
            return Err(format!(
                "seq {seq}: {} bytes, the stream sent {want}",
                data.len()
            ));
        }
        *expect = seq + 1;
        Ok(())
    }
}

/// Polls `rx` (and `tx` with empty bursts) on a helper thread while `f` runs: a MEMNIC host
/// serving the reset of a guest that attaches in `f`.
pub fn with_polling_host<R>(
    rx: &mut dyn RxQueue,
    tx: Option<&mut dyn TxQueue>,
    f: impl FnOnce() -> R,
) -> R {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut tx = tx;
            let mut v = Vec::new();
            let mut idle = Vec::new();
            // Relaxed: a stop flag; nothing is published with it.
            while !stop.load(Relaxed) {
                rx.rx_burst(&mut v, 32);
                assert!(v.is_empty(), "nothing is sent during an attach");
                if let Some(t) = tx.as_mut() {
                    t.tx_burst(&mut idle);
                }
                std::thread::yield_now();
            }
        });
        let r = f();
        stop.store(true, Relaxed);
        r
    })
}
