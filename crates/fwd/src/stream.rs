//! One forwarding stream: rx (port, queue) → tx (port, queue), run by one lcore.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use memnic_ethdev::{MacAddr, Mbuf, PoolCache, RxQueue, TxQueue, MAX_BURST};

use crate::capture::Tap;
use crate::ping::Pinger;
use crate::pkt::{self, HDRS, IP_DST, IP_SRC};
use crate::verify::{Verifier, VerifyCounts};
use crate::{FwdConfig, FwdMode};

/// Which queues a stream connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StreamSpec {
    pub rx_port: u16,
    pub rx_queue: u16,
    pub tx_port: u16,
    pub tx_queue: u16,
}

/// Forwarding counters of one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StreamCounters {
    pub rx: u64,
    pub tx: u64,
    /// Frames the tx queue did not take and the mode dropped.
    pub dropped: u64,
    pub verify: VerifyCounts,
}

impl StreamCounters {
    /// `self - base`, counter by counter.
    pub fn since(&self, base: &StreamCounters) -> StreamCounters {
        let v = &self.verify;
        let b = &base.verify;
        StreamCounters {
            rx: self.rx - base.rx,
            tx: self.tx - base.tx,
            dropped: self.dropped - base.dropped,
            verify: VerifyCounts {
                good: v.good - b.good,
                lost: v.lost.saturating_sub(b.lost),
                corrupted: v.corrupted - b.corrupted,
                duplicated: v.duplicated - b.duplicated,
                reordered: v.reordered - b.reordered,
                unknown_flows: v.unknown_flows - b.unknown_flows,
            },
        }
    }

    pub fn add(&mut self, o: &StreamCounters) {
        self.rx += o.rx;
        self.tx += o.tx;
        self.dropped += o.dropped;
        self.verify.add(&o.verify);
    }
}

/// A stream's counters, published by its lcore after each iteration (single writer, plain
/// stores), read by the control thread.
#[derive(Default)]
#[repr(align(64))]
pub(crate) struct StreamCell {
    v: [AtomicU64; 9],
}

impl StreamCell {
    fn publish(&self, c: &StreamCounters) {
        let vals = [
            c.rx,
            c.tx,
            c.dropped,
            c.verify.good,
            c.verify.lost,
            c.verify.corrupted,
            c.verify.duplicated,
            c.verify.reordered,
            c.verify.unknown_flows,
        ];
        for (a, v) in self.v.iter().zip(vals) {
            // Relaxed: counters are read independently; a reader needs no order between them.
            a.store(v, Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> StreamCounters {
        // Relaxed: pairs with the Relaxed stores in publish().
        let g = |i: usize| self.v[i].load(Relaxed);
        StreamCounters {
            rx: g(0),
            tx: g(1),
            dropped: g(2),
            verify: VerifyCounts {
                good: g(3),
                lost: g(4),
                corrupted: g(5),
                duplicated: g(6),
                reordered: g(7),
                unknown_flows: g(8),
            },
        }
    }
}

/// Generators (txonly, flowgen) drain their rx queue too (testpmd's leave it to the NIC), but
/// once this many polls in a row found nothing they poll it only every [`IDLE_RX_EVERY`]
/// bursts, until a poll finds frames: an idle queue's poll is work the burst loop does for
/// nothing (a vhost dequeue that finds the guest's tx ring empty was 3.8% of our txonly's
/// samples into virtio-user at 64 B). A stream coming back is seldom 64 polls apart and is
/// polled every burst; one that starts again waits at most 7 bursts (224 frames of 32), which
/// an idle ring holds. In-process flip, every burst / this (B/A p20/p50/p80, 64 B, the sender
/// counted): vhost txonly -> virtio-user packed 0.95/1.04/1.16 (3 runs); memif our client ->
/// our server 0.99/1.04/1.08. An earlier cut (every 8th burst after one empty poll): packed
/// 0.94/1.04/1.16, split 0.99/1.03/1.07, memif our server -> our client 0.89/1.03/1.07.
const IDLE_RX_POLLS: u32 = 64;
const IDLE_RX_EVERY: u32 = 8;

/// A stream and everything its lcore needs to run it.
pub struct Stream {
    pub spec: StreamSpec,
    rxq: Box<dyn RxQueue>,
    txq: Box<dyn TxQueue>,
    /// Buffers for generated frames, and the home of freed ones.
    cache: PoolCache,
    /// A private pool's cache for copy-on-write of heads we must not write in place.
    private: PoolCache,
    /// Where a frame that is not one private slice is copied for the generator and verifier.
    scratch: Vec<u8>,
    tx_mac: MacAddr,
    /// This stream's flow id in generated frames, and the session that tells restarts apart.
    flow: u16,
    session: u16,
    seq: u64,
    flow_cursor: u32,
    pkts: Vec<Mbuf>,
    /// Generated frames the tx queue handed back, sent first next time (verify mode).
    pending: Vec<Mbuf>,
    verifier: Verifier,
    /// `ping`: the burst out and the round trips.
    pinger: Pinger,
    /// Empty polls in a row (interrupt mode).
    idle_polls: u32,
    /// Generators: polls of the rx queue in a row that found nothing, and bursts left before
    /// it is polled again.
    rx_empty: u32,
    rx_skip: u32,
    counters: StreamCounters,
    cell: Arc<StreamCell>,
    /// Live capture of the frames received and sent (`--capture`): one branch per burst when
    /// off.
    pub(crate) rx_tap: Option<Tap>,
    pub(crate) tx_tap: Option<Tap>,
}

impl Stream {
    pub(crate) fn new(
        spec: StreamSpec,
        flow: u16,
        rxq: Box<dyn RxQueue>,
        txq: Box<dyn TxQueue>,
        (cache, private): (PoolCache, PoolCache),
        tx_mac: MacAddr,
    ) -> Stream {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Stream {
            spec,
            rxq,
            txq,
            cache,
            private,
            scratch: Vec::new(),
            tx_mac,
            flow,
            session: (nanos ^ std::process::id()) as u16,
            seq: 0,
            flow_cursor: 0,
            pkts: Vec::with_capacity(MAX_BURST),
            pending: Vec::with_capacity(MAX_BURST),
            verifier: Verifier::new(),
            pinger: Pinger::default(),
            idle_polls: 0,
            rx_empty: 0,
            rx_skip: 0,
            counters: StreamCounters::default(),
            cell: Arc::new(StreamCell::default()),
            rx_tap: None,
            tx_tap: None,
        }
    }

    pub(crate) fn cell(&self) -> Arc<StreamCell> {
        self.cell.clone()
    }

    /// One iteration of the mode.
    #[inline]
    pub(crate) fn forward(&mut self, cfg: &FwdConfig) {
        match cfg.mode {
            FwdMode::Io | FwdMode::Mac | FwdMode::MacSwap | FwdMode::RxOnly => {
                let rx_before = self.counters.rx;
                if cfg.mode == FwdMode::RxOnly {
                    self.receive(cfg);
                } else {
                    self.relay(cfg);
                }
                if cfg.rx_interrupt {
                    self.idle_or_sleep(self.counters.rx == rx_before);
                }
            }
            // Also drains (and with --verify checks) what comes back, so a generator can see its
            // own frames returned by a reflector; testpmd's txonly leaves them to the NIC.
            FwdMode::TxOnly | FwdMode::FlowGen => {
                // Receive first: a memif client's first receive also hands the peer its
                // buffers, which must be there before anything comes back.
                if self.rx_skip == 0 {
                    let before = self.counters.rx;
                    self.receive(cfg);
                    if self.counters.rx != before {
                        self.rx_empty = 0;
                    } else {
                        self.rx_empty = self.rx_empty.saturating_add(1);
                        if self.rx_empty >= IDLE_RX_POLLS {
                            self.rx_skip = IDLE_RX_EVERY - 1;
                        }
                    }
                } else {
                    self.rx_skip -= 1;
                }
                self.generate(cfg, cfg.mode == FwdMode::FlowGen);
            }
            FwdMode::Ping => self.ping(cfg),
        }
        self.cell.publish(&self.counters);
    }

    /// Interrupt mode: after a run of empty polls, sleep on the rx queue's interrupt (if the
    /// driver has one) instead of spinning.
    fn idle_or_sleep(&mut self, idle: bool) {
        if !idle {
            self.idle_polls = 0;
            return;
        }
        self.idle_polls += 1;
        if self.idle_polls >= 256 {
            self.idle_polls = 0;
            self.rxq.wait(std::time::Duration::from_millis(100));
        }
    }

    fn relay(&mut self, cfg: &FwdConfig) {
        let n = self.rxq.rx_burst(&mut self.pkts, cfg.burst);
        memnic_ethdev::abflip::count(n);
        if n == 0 {
            return;
        }
        self.counters.rx += n as u64;
        if let Some(tap) = self.rx_tap.as_mut() {
            tap.capture(&self.pkts);
        }
        if matches!(cfg.mode, FwdMode::Mac | FwdMode::MacSwap) {
            let macs =
                (cfg.mode == FwdMode::Mac).then(|| (cfg.peer_mac(self.spec.tx_port), self.tx_mac));
            let before = self.pkts.len();
            let private = &mut self.private;
            self.pkts.retain_mut(|m| {
                // Never write into memory a peer can see or that is not ours: a shared or
                // external first segment is copied into a private buffer first.
                if !m.make_head_private(private) {
                    return false;
                }
                let f = m.as_mut_slice().expect("made private");
                match macs {
                    Some((dst, src)) => pkt::set_macs(f, dst, src),
                    None => pkt::swap_macs(f),
                }
                true
            });
            // Frames no private buffer was left for.
            self.counters.dropped += (before - self.pkts.len()) as u64;
        }
        let sent = offer(&mut *self.txq, self.tx_tap.as_mut(), &mut self.pkts);
        self.counters.tx += sent as u64;
        if !self.pkts.is_empty() {
            self.counters.dropped += self.pkts.len() as u64;
            self.cache.free_all(&mut self.pkts);
        }
    }

    fn receive(&mut self, cfg: &FwdConfig) {
        let n = self.rxq.rx_burst(&mut self.pkts, cfg.burst);
        memnic_ethdev::abflip::count(n);
        if n == 0 {
            return;
        }
        self.counters.rx += n as u64;
        if let Some(tap) = self.rx_tap.as_mut() {
            tap.capture(&self.pkts);
        }
        if cfg.verify {
            for m in &self.pkts {
                match m.frame_slice() {
                    Some(f) => {
                        self.verifier.check(f);
                    }
                    None => {
                        // Peer-visible, external or chained: check a private copy.
                        self.scratch.resize(m.len(), 0);
                        m.copy_out(0, &mut self.scratch);
                        self.verifier.check(&self.scratch);
                    }
                }
            }
            self.counters.verify = self.verifier.counts;
        }
        self.cache.free_all(&mut self.pkts);
    }

    /// Builds a burst of frames (unless some are pending) and sends it. Frames the queue hands
    /// back are retried next time under `verify` (no gaps in the sequence), dropped otherwise.
    pub(crate) fn generate(&mut self, cfg: &FwdConfig, many_flows: bool) {
        if self.pending.is_empty() {
            let mut want = self.burst_left(cfg);
            if cfg.window > 0 {
                let out = self.counters.tx.saturating_sub(self.counters.rx);
                want = want.min(cfg.window.saturating_sub(out) as usize);
            }
            if want == 0 {
                return;
            }
            self.build(cfg, want, many_flows, cfg.verify);
        }
        let sent = offer(&mut *self.txq, self.tx_tap.as_mut(), &mut self.pending);
        self.counters.tx += sent as u64;
        if !cfg.verify && !self.pending.is_empty() {
            self.counters.dropped += self.pending.len() as u64;
            self.cache.free_all(&mut self.pending);
        }
    }

    /// How many frames the next generated burst may have: `--burst`, less what `--tx-count`
    /// has left.
    fn burst_left(&self, cfg: &FwdConfig) -> usize {
        let want = cfg.burst.min(MAX_BURST);
        match cfg.tx_count {
            Some(count) => {
                let left = count.saturating_sub(self.counters.tx);
                want.min(usize::try_from(left).unwrap_or(usize::MAX))
            }
            None => want,
        }
    }

    /// Builds up to `want` frames into `pending` (fewer when the pool runs dry), with the
    /// sequence-numbered payload when `verified`.
    fn build(&mut self, cfg: &FwdConfig, want: usize, many_flows: bool, verified: bool) {
        let len = cfg.txpkts;
        // (None when frames are longer than the buffers: --mbuf-size is checked at start-up.)
        self.cache.alloc_len_up_to(&mut self.pending, want, len);
        let (dst, src) = (cfg.peer_mac(self.spec.tx_port), self.tx_mac);
        // One set of headers for the burst, copied into each frame (DPDK's txonly copies
        // its template likewise); rebuilt per frame only when each goes to another flow.
        let mut hdr = [0u8; HDRS];
        if !many_flows {
            pkt::write_headers(&mut hdr, dst, src, IP_SRC, IP_DST, len);
        }
        for m in self.pending.iter_mut() {
            if many_flows {
                self.flow_cursor = (self.flow_cursor + 1) % cfg.flows.max(1);
                let c = self.flow_cursor;
                let ip_dst = [198, 18, (c >> 8) as u8, c as u8];
                pkt::write_headers(&mut hdr, dst, src, IP_SRC, ip_dst, len);
            }
            if !verified {
                match m.as_mut_slice() {
                    Some(f) => f[..HDRS].copy_from_slice(&hdr),
                    None => {
                        m.copy_in(0, &hdr);
                    }
                }
                continue;
            }
            // A verified frame is written whole: in place in a private buffer; a shared
            // pool's is built in private memory and copied in.
            let (seq, flow, session) = (self.seq, self.flow, self.session);
            self.seq += 1;
            let build = |f: &mut [u8]| {
                f[..HDRS].copy_from_slice(&hdr);
                pkt::write_payload(f, seq, flow, session);
            };
            match m.as_mut_slice() {
                Some(f) => build(f),
                None => {
                    self.scratch.resize(len, 0);
                    build(&mut self.scratch[..len]);
                    m.copy_in(0, &self.scratch[..len]);
                }
            }
        }
    }

    /// `ping`: receives what came back (each of the burst's frames has its round trip
    /// recorded), and once the burst out is back whole (or given up on) sends the next:
    /// `--burst` frames, sequence-numbered and checksummed, each timed from just before the tx
    /// queue was offered it.
    fn ping(&mut self, cfg: &FwdConfig) {
        let n = self.rxq.rx_burst(&mut self.pkts, cfg.burst);
        memnic_ethdev::abflip::count(n);
        if n > 0 {
            let now = Instant::now();
            self.counters.rx += n as u64;
            if let Some(tap) = self.rx_tap.as_mut() {
                tap.capture(&self.pkts);
            }
            for m in &self.pkts {
                let f = match m.frame_slice() {
                    Some(f) => f,
                    None => {
                        self.scratch.resize(m.len(), 0);
                        m.copy_out(0, &mut self.scratch);
                        &self.scratch[..]
                    }
                };
                match self.verifier.check(f) {
                    Some(p) if (p.flow, p.session) == (self.flow, self.session) => {
                        self.pinger.returned(p.seq, now)
                    }
                    _ => self.pinger.rtt.stale += 1,
                }
            }
            self.counters.verify = self.verifier.counts;
            self.cache.free_all(&mut self.pkts);
        }
        self.pinger.settle(Instant::now);
        if self.pinger.idle() {
            // Frames of a burst given up on that the tx queue never took are not sent.
            self.cache.free_all(&mut self.pending);
            let want = self.burst_left(cfg);
            if want == 0 {
                return;
            }
            let first = self.seq;
            self.build(cfg, want, false, true);
            self.pinger.start(first, self.pending.len());
        }
        if self.pending.is_empty() {
            return;
        }
        let next = self.seq - self.pending.len() as u64;
        let at = Instant::now();
        let sent = offer(&mut *self.txq, self.tx_tap.as_mut(), &mut self.pending);
        self.pinger.taken(next..next + sent as u64, at);
        self.counters.tx += sent as u64;
    }

    /// `ping`'s round trips since the stream last started.
    pub(crate) fn round_trips(&self) -> &crate::rtt::RoundTrips {
        &self.pinger.rtt
    }

    /// Forgets the round trips and any burst out (at start: a run's round trips are its own).
    pub(crate) fn reset_pinger(&mut self) {
        self.pinger = Pinger::default();
    }

    /// Frees what the stream still holds (at stop).
    pub(crate) fn drain(&mut self) {
        self.cache.free_all(&mut self.pkts);
        self.cache.free_all(&mut self.pending);
        self.cell.publish(&self.counters);
    }
}

/// Offers `pkts` to `txq`, captured (what the queue takes) when `tap` is on; returns how many
/// the queue took.
#[inline]
fn offer(txq: &mut dyn TxQueue, tap: Option<&mut Tap>, pkts: &mut Vec<Mbuf>) -> usize {
    let sent = match tap {
        None => txq.tx_burst(pkts),
        Some(tap) => {
            tap.hold(pkts);
            let sent = txq.tx_burst(pkts);
            tap.commit(sent);
            sent
        }
    };
    memnic_ethdev::abflip::count(sent);
    sent
}

#[cfg(test)]
mod tests {
    //! Header-writing modes never write into memory a peer can see or that is not ours.

    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::{Arc, Mutex};

    use memnic_ethdev::{ExtPool, Mempool, QueueStats, SegKind};
    use memnic_pktbuf::PoolConfig;
    use memnic_shm::Region;

    use super::*;

    /// Hands out the packets it is given, once.
    struct FeedRx(Vec<Mbuf>);
    impl RxQueue for FeedRx {
        fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, max: usize) -> usize {
            let n = self.0.len().min(max);
            pkts.extend(self.0.drain(..n));
            n
        }
        fn stats(&self) -> QueueStats {
            QueueStats::default()
        }
    }

    /// Counts its polls and hands out what the test puts in it.
    struct CountRx {
        polls: Arc<AtomicU64>,
        feed: Arc<Mutex<Vec<Mbuf>>>,
    }
    impl RxQueue for CountRx {
        fn rx_burst(&mut self, pkts: &mut Vec<Mbuf>, _: usize) -> usize {
            self.polls.fetch_add(1, Relaxed);
            let mut feed = self.feed.lock().unwrap();
            let n = feed.len();
            pkts.append(&mut feed);
            n
        }
        fn stats(&self) -> QueueStats {
            QueueStats::default()
        }
    }

    /// A generator polls its rx queue every burst until 64 polls in a row found nothing, then
    /// every 8th burst; frames that come back are taken within 8 bursts, and polls are every
    /// burst again.
    #[test]
    fn a_generator_polls_an_idle_rx_queue_every_eighth_burst() {
        let p = pool("idle-rx", 256, false);
        let polls = Arc::new(AtomicU64::new(0));
        let feed = Arc::new(Mutex::new(Vec::new()));
        let rx = CountRx {
            polls: polls.clone(),
            feed: feed.clone(),
        };
        let mut s = Stream::new(
            StreamSpec {
                rx_port: 0,
                rx_queue: 0,
                tx_port: 0,
                tx_queue: 0,
            },
            0,
            Box::new(rx),
            // Takes nothing: txonly drops and frees every frame.
            Box::new(DropTx),
            (p.cache(), p.cache()),
            MacAddr([2, 0, 0, 0, 0, 0x33]),
        );
        let cfg = FwdConfig {
            mode: FwdMode::TxOnly,
            ..FwdConfig::default()
        };
        let mut bursts = |n: usize| {
            let before = polls.load(Relaxed);
            for _ in 0..n {
                s.forward(&cfg);
            }
            polls.load(Relaxed) - before
        };
        assert_eq!(bursts(64), 64, "every burst while it may be busy");
        assert_eq!(bursts(64), 8, "every 8th once idle");
        feed.lock().unwrap().push(p.alloc().unwrap());
        let mut waited = 0;
        while !feed.lock().unwrap().is_empty() {
            bursts(1);
            waited += 1;
        }
        assert!(waited <= 8, "a frame that came back waited {waited} bursts");
        assert_eq!(bursts(20), 20, "every burst again after frames came");
        assert_eq!(s.cell().snapshot().rx, 1);
    }

    struct DropTx;
    impl TxQueue for DropTx {
        fn tx_burst(&mut self, _: &mut Vec<Mbuf>) -> usize {
            0
        }
        fn stats(&self) -> QueueStats {
            QueueStats::default()
        }
    }

    /// Keeps what it is sent, for the test to look at.
    struct KeepTx(Arc<Mutex<Vec<Mbuf>>>);
    impl TxQueue for KeepTx {
        fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
            let n = pkts.len();
            self.0.lock().unwrap().append(pkts);
            n
        }
        fn stats(&self) -> QueueStats {
            QueueStats::default()
        }
    }

    fn pool(name: &str, n: u32, shared: bool) -> Mempool {
        let mut c = PoolConfig::new(name, n);
        c.huge = false;
        c.cache_size = 8;
        c.shared = shared;
        Mempool::new(&c).unwrap()
    }

    /// A verified frame of `len` bytes.
    fn frame(seq: u64, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        let (dst, src) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
        pkt::write_headers(&mut f[..HDRS], dst, src, IP_SRC, IP_DST, len);
        pkt::write_payload(&mut f, seq, 0, 0);
        f
    }

    /// A stream from port 0 to port 1 (our MAC 02:..:33) fed `input`; what it sends is kept.
    fn stream(input: Vec<Mbuf>, pool: &Mempool) -> (Stream, Arc<Mutex<Vec<Mbuf>>>) {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let spec = StreamSpec {
            rx_port: 0,
            rx_queue: 0,
            tx_port: 1,
            tx_queue: 0,
        };
        let s = Stream::new(
            spec,
            0,
            Box::new(FeedRx(input)),
            Box::new(KeepTx(sent.clone())),
            (pool.cache(), pool.cache()),
            MacAddr([2, 0, 0, 0, 0, 0x33]),
        );
        (s, sent)
    }

    fn run(mode: FwdMode, input: Vec<Mbuf>, private: &Mempool) -> (Vec<Mbuf>, StreamCounters) {
        let (mut s, sent) = stream(input, private);
        let cfg = FwdConfig {
            mode,
            ..FwdConfig::default()
        };
        s.forward(&cfg);
        let out = std::mem::take(&mut *sent.lock().unwrap());
        (out, s.counters)
    }

    /// A frame of a flow id past the verifier's cap is counted (as corrupted and as an unknown
    /// flow) in what the stream publishes, and appears in the JSON port report.
    #[test]
    fn frames_of_unknown_flows_reach_the_published_counters_and_the_json() {
        let p = pool("unknown-flows", 16, false);
        let mut input = Vec::new();
        for (seq, flow) in [(0u64, 0u16), (0, 5000), (1, 0)] {
            let mut f = frame(seq, 100);
            pkt::write_payload(&mut f, seq, flow, 0);
            let mut m = p.alloc().unwrap();
            assert!(m.set_len(f.len()) && m.copy_in(0, &f));
            input.push(m);
        }
        let (mut s, _sent) = stream(input, &p);
        let cfg = FwdConfig {
            mode: FwdMode::RxOnly,
            verify: true,
            ..FwdConfig::default()
        };
        s.forward(&cfg);
        let c = s.cell().snapshot();
        assert_eq!(c.verify.good, 2, "{c:?}");
        assert_eq!(c.verify.corrupted, 1, "{c:?}");
        assert_eq!(c.verify.unknown_flows, 1, "{c:?}");
        assert_eq!(c.since(&StreamCounters::default()), c);
        let report = crate::report::PortReport {
            verify: Some(c.verify),
            ..Default::default()
        };
        let j = serde_json::to_value(&report).unwrap();
        assert_eq!(j["unknown_flows"], 1, "{j}");
    }

    /// txonly and flowgen frames, in private buffers and in a pool a peer maps (copied in): the
    /// peer's MAC then ours, IPv4 with a valid checksum and the frame's lengths, UDP; flowgen's
    /// destination address walks the flows frame by frame.
    #[test]
    fn generated_frames_carry_whole_headers_in_private_and_shared_pools() {
        use crate::pkt::{ETH_HDR, IP_HDR};
        let ours = MacAddr([2, 0, 0, 0, 0, 0x33]);
        for shared in [false, true] {
            for (mode, flows) in [(FwdMode::TxOnly, 1), (FwdMode::FlowGen, 3)] {
                let p = pool(&format!("gen-{shared}-{flows}"), 64, shared);
                let (mut s, sent) = stream(Vec::new(), &p);
                let cfg = FwdConfig {
                    mode,
                    txpkts: 100,
                    flows,
                    ..FwdConfig::default()
                };
                s.forward(&cfg);
                s.forward(&cfg);
                let out = std::mem::take(&mut *sent.lock().unwrap());
                assert_eq!(out.len(), 2 * cfg.burst, "{mode:?}");
                for (i, m) in out.iter().enumerate() {
                    let what = format!("{mode:?}, shared {shared}, frame {i}");
                    let f = m.to_vec();
                    assert_eq!(f.len(), 100, "{what}");
                    assert_eq!(&f[0..6], &cfg.peer_mac(1).0, "{what}: destination");
                    assert_eq!(&f[6..12], &ours.0, "{what}: source");
                    assert_eq!(&f[12..14], &[8, 0], "{what}: IPv4");
                    let ip = &f[ETH_HDR..ETH_HDR + IP_HDR];
                    assert_eq!(pkt::ip_checksum(ip), 0, "{what}: IP checksum");
                    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 86, "{what}: IP length");
                    let dst = if mode == FwdMode::FlowGen {
                        let c = (i + 1) as u32 % flows;
                        [198, 18, (c >> 8) as u8, c as u8]
                    } else {
                        IP_DST
                    };
                    assert_eq!(&ip[16..20], &dst, "{what}: IP destination");
                    let udp_len = u16::from_be_bytes([f[HDRS - 4], f[HDRS - 3]]);
                    assert_eq!(udp_len, 66, "{what}: UDP length");
                }
            }
        }
    }

    /// With a tx count a generator sends exactly that many frames (its last burst cut short,
    /// verified sequence numbers without a gap), then nothing more however often it runs.
    #[test]
    fn generators_stop_after_their_tx_count() {
        for mode in [FwdMode::TxOnly, FwdMode::FlowGen] {
            let p = pool(&format!("count-{mode:?}"), 128, false);
            let (mut s, sent) = stream(Vec::new(), &p);
            let cfg = FwdConfig {
                mode,
                verify: true,
                tx_count: Some(40),
                ..FwdConfig::default()
            };
            for _ in 0..5 {
                s.forward(&cfg);
            }
            let out = std::mem::take(&mut *sent.lock().unwrap());
            assert_eq!(out.len(), 40, "{mode:?}");
            assert_eq!(s.cell().snapshot().tx, 40, "{mode:?}");
            for (i, m) in out.iter().enumerate() {
                let f = m.to_vec();
                assert_eq!(
                    pkt::read_payload(&f).map(|p| p.seq),
                    Some(i as u64),
                    "{mode:?}"
                );
            }
        }
    }

    #[test]
    fn macswap_and_mac_copy_external_and_shared_heads_instead_of_writing_them() {
        let private = pool("private", 64, false);
        let shared = pool("zc", 8, true);
        for mode in [FwdMode::MacSwap, FwdMode::Mac] {
            // A guest's tx buffers: the frames live in the peer's region.
            let peer = Arc::new(Region::memfd("guest", 1 << 16, false).unwrap());
            let mut ext = ExtPool::new("q0", 8);
            let mut input = Vec::new();
            for seq in 0..4u64 {
                let f = frame(seq, 200);
                let off = seq as usize * 4096;
                peer.write_bytes(off, &f).unwrap();
                input.push(ext.attach(&peer, off, 200, seq).unwrap());
            }
            // And a frame in a pool the peer maps, chained to an external tail.
            let f = frame(4, 300);
            let mut m = shared.alloc().unwrap();
            assert!(m.set_len(100) && m.copy_in(0, &f[..100]));
            peer.write_bytes(60_000, &f[100..]).unwrap();
            m.chain(ext.attach(&peer, 60_000, 200, 99).unwrap())
                .unwrap();
            input.push(m);
            let before: Vec<u8> = {
                let mut v = vec![0u8; 1 << 16];
                peer.read_bytes(0, &mut v).unwrap();
                v
            };
            let shared_before = {
                let mut v = vec![0u8; shared.region().len()];
                shared.region().read_bytes(0, &mut v).unwrap();
                v
            };

            let (out, counters) = run(mode, input, &private);
            assert_eq!((counters.rx, counters.tx, counters.dropped), (5, 5, 0));
            for (seq, m) in out.iter().enumerate() {
                assert_eq!(m.kind(), SegKind::Private, "{mode:?}: head copied");
                let got = m.to_vec();
                let want = frame(seq as u64, if seq == 4 { 300 } else { 200 });
                match mode {
                    FwdMode::MacSwap => {
                        assert_eq!(got[0..6], want[6..12]);
                        assert_eq!(got[6..12], want[0..6]);
                    }
                    _ => assert_eq!(got[6..12], [2, 0, 0, 0, 0, 0x33]),
                }
                assert_eq!(got[12..], want[12..], "payload intact");
                assert!(pkt::read_payload(&got).is_some());
            }
            assert_eq!(out[4].nb_segs(), 2, "the external tail stays zero copy");
            // Nothing of the peer's was written.
            let mut after = vec![0u8; 1 << 16];
            peer.read_bytes(0, &mut after).unwrap();
            assert!(after == before, "{mode:?}: peer memory untouched");
            let mut shared_after = vec![0u8; shared.region().len()];
            shared.region().read_bytes(0, &mut shared_after).unwrap();
            assert!(
                shared_after == shared_before,
                "{mode:?}: shared pool untouched"
            );
            // The copied external heads completed at once; the tail when the packet goes.
            let mut tags = Vec::new();
            ext.reap(&mut tags);
            tags.sort();
            assert_eq!(tags, [0, 1, 2, 3]);
            drop(out);
            ext.reap(&mut tags);
            assert_eq!(tags.last(), Some(&99));
            assert_eq!(ext.outstanding(), 0);
        }
    }

    #[test]
    fn header_rewrite_without_a_private_buffer_drops_and_counts() {
        let private = pool("tiny", 1, false);
        let peer = Arc::new(Region::memfd("guest", 8192, false).unwrap());
        peer.write_bytes(0, &frame(0, 100)).unwrap();
        let mut ext = ExtPool::new("q0", 4);
        let input = vec![
            ext.attach(&peer, 0, 100, 0).unwrap(),
            ext.attach(&peer, 0, 100, 1).unwrap(),
        ];
        let hold = private.alloc().unwrap(); // the pool's only buffer is taken
        let (out, counters) = run(FwdMode::MacSwap, input, &private);
        assert!(out.is_empty());
        assert_eq!((counters.rx, counters.tx, counters.dropped), (2, 0, 2));
        drop(hold);
        let mut tags = Vec::new();
        ext.reap(&mut tags);
        assert_eq!(tags.len(), 2, "dropped frames complete");
    }
}
