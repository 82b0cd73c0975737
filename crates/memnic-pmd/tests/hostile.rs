//! A hostile peer: while a host and a guest run traffic both ways, a third thread with its own
//! mapping of the same `/dev/shm` file scribbles random values over the header words (valid,
//! reset, request, framesz, features) and over the status and len words of both rings.
//!
//! Required: no panic, no out-of-bounds access (the process survives), bad slots counted as
//! errors. Then the scribbler stops, the guest resets, and traffic must flow again with every
//! payload intact and in order.

use memnic_test_support as common;

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use common::{Sender, ShmName, DOWN, UP};
use memnic_ethdev::{Mempool, PoolCache, Port, RxQueue, TxQueue};
use memnic_pktbuf::Mbuf;
use memnic_pmd::layout::*;
use memnic_pmd::{GuestConfig, GuestPort, HostConfig, HostPort, Variant};
use memnic_shm::Region;
use rand::Rng;

/// Frames each side must receive intact after the recovery reset.
const AFTER: u64 = 20_000;
const DEADLINE: Duration = Duration::from_secs(60);

/// Sets `flag` if the thread that owns it unwinds, so the other threads stop too.
struct AbortOnPanic<'a>(&'a AtomicBool);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Relaxed);
        }
    }
}

#[derive(Default)]
struct Shared {
    /// Threads stop (normal end).
    stop: AtomicBool,
    /// A thread panicked: everyone stops.
    abort: AtomicBool,
    /// Set after the recovery reset: from now on every frame must be intact and in order.
    strict: AtomicBool,
    host_loops: AtomicU64,
    /// Intact frames received (host: from the guest; guest: from the host).
    host_good: AtomicU64,
    guest_good: AtomicU64,
    host_strict: AtomicU64,
    guest_strict: AtomicU64,
}

impl Shared {
    fn running(&self) -> bool {
        !self.stop.load(Relaxed) && !self.abort.load(Relaxed)
    }
}

/// A receiver that tolerates anything until `strict`, then demands intact, consecutive frames.
struct Checker {
    seed: u64,
    salt: u64,
    buf: Vec<Mbuf>,
    cache: PoolCache,
    good: u64,
    bad: u64,
    strict_good: u64,
    expect: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Report {
    good: u64,
    bad: u64,
    strict_good: u64,
}

impl Checker {
    fn new(pool: &Mempool, seed: u64, salt: u64) -> Checker {
        Checker {
            seed,
            salt,
            buf: Vec::with_capacity(64),
            cache: pool.cache(),
            good: 0,
            bad: 0,
            strict_good: 0,
            expect: 0,
        }
    }

    fn poll(&mut self, rxq: &mut dyn RxQueue, strict: bool) {
        rxq.rx_burst(&mut self.buf, 32);
        for m in self.buf.drain(..) {
            let r = common::check(&m.to_vec()).and_then(|seq| {
                let want = common::frame_len(
                    self.seed,
                    self.salt,
                    seq,
                    common::MIN_FRAME,
                    common::MAX_FRAME,
                );
                if m.len() == want {
                    Ok(seq)
                } else {
                    Err(format!(
                        "seq {seq}: {} bytes, the stream sent {want}",
                        m.len()
                    ))
                }
            });
            match r {
                Ok(seq) if strict => {
                    // The first frame after the reset may follow frames dropped during it.
                    assert!(
                        self.strict_good == 0 || seq == self.expect,
                        "stream {:#x} after the reset: seq {seq}, expected {}",
                        self.salt,
                        self.expect
                    );
                    self.expect = seq + 1;
                    self.strict_good += 1;
                    self.good += 1;
                }
                Ok(_) => self.good += 1,
                Err(e) if strict => panic!("stream {:#x} after the reset: {e}", self.salt),
                Err(_) => self.bad += 1,
            }
            self.cache.free(m);
        }
    }

    fn report(&self) -> Report {
        Report {
            good: self.good,
            bad: self.bad,
            strict_good: self.strict_good,
        }
    }
}

fn host_loop(
    sh: &Shared,
    mut rxq: Box<dyn RxQueue>,
    mut txq: Box<dyn TxQueue>,
    pool: &Mempool,
    seed: u64,
) -> (Report, Box<dyn RxQueue>, Box<dyn TxQueue>) {
    let _abort = AbortOnPanic(&sh.abort);
    let mut tx = Sender::new(pool, seed, UP, u64::MAX);
    let mut rx = Checker::new(pool, seed, DOWN);
    while sh.running() {
        // Acquire pairs with the Release store of `strict` after the guest's reset returned.
        let strict = sh.strict.load(Acquire);
        rx.poll(&mut *rxq, strict);
        tx.poll(&mut *txq);
        sh.host_good.store(rx.good, Relaxed);
        sh.host_strict.store(rx.strict_good, Relaxed);
        sh.host_loops.fetch_add(1, Release);
    }
    (rx.report(), rxq, txq)
}

fn guest_loop(
    sh: &Shared,
    mut rxq: Box<dyn RxQueue>,
    mut txq: Box<dyn TxQueue>,
    pool: &Mempool,
    seed: u64,
) -> (Report, Box<dyn RxQueue>, Box<dyn TxQueue>) {
    let _abort = AbortOnPanic(&sh.abort);
    let mut tx = Sender::new(pool, seed, DOWN, u64::MAX);
    let mut rx = Checker::new(pool, seed, UP);
    while sh.running() {
        let strict = sh.strict.load(Acquire);
        rx.poll(&mut *rxq, strict);
        tx.poll(&mut *txq);
        sh.guest_good.store(rx.good, Relaxed);
        sh.guest_strict.store(rx.strict_good, Relaxed);
    }
    (rx.report(), rxq, txq)
}

/// Random writes over the header words and the status/len words of both rings until `until`.
fn scribble(sh: &Shared, region: &Region, until: Instant) -> u64 {
    let _abort = AbortOnPanic(&sh.abort);
    let mut rng = rand::rng();
    let mut n = 0u64;
    while sh.running() && Instant::now() < until {
        for _ in 0..8 {
            let any: u32 = rng.random();
            match rng.random_range(0..100) {
                // Header words (magic, version and MAC are left alone).
                0..=3 => region
                    .u32(HDR_VALID)
                    .store([0, 1, 2, any][rng.random_range(0..4)], Relaxed),
                4..=5 => region
                    .u32(HDR_RESET)
                    .store([0, 1, any][rng.random_range(0..3)], Relaxed),
                6..=7 => region
                    .u32(HDR_REQUEST)
                    .store([0, FEAT_FRAME_SIZE, any][rng.random_range(0..3)], Relaxed),
                8..=9 => region.u32(HDR_FRAMESZ).store(
                    [
                        0,
                        1518,
                        1519,
                        4088,
                        4089,
                        rng.random_range(1518..=4088),
                        any,
                    ][rng.random_range(0..7)],
                    Relaxed,
                ),
                10 => region.u32(HDR_FEATURES).store(any, Relaxed),
                // Slot words of either ring.
                _ => {
                    let dir = if rng.random() { Dir::Up } else { Dir::Down };
                    let off = slot_off(dir, rng.random_range(0..NR_PACKET));
                    if rng.random() {
                        let v =
                            [PKT_ST_FREE, PKT_ST_USED, PKT_ST_FILLED, any][rng.random_range(0..4)];
                        region.u32(off + SLOT_STATUS).store(v, Relaxed);
                    } else {
                        let v = [0, 1519, 4088, 4089, rng.random_range(1..=1518), any]
                            [rng.random_range(0..6)];
                        region.u32(off + SLOT_LEN).store(v, Relaxed);
                    }
                }
            }
            n += 1;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    n
}

/// Waits for `cond`, bounded by `deadline` and by the other threads' health.
fn wait_for(sh: &Shared, deadline: Instant, what: &str, mut cond: impl FnMut() -> bool) {
    while !cond() {
        assert!(!sh.abort.load(Relaxed), "a worker thread panicked ({what})");
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn run(variant: Variant, chaos: Duration) {
    let _serial = common::serial();
    let deadline = Instant::now() + DEADLINE;
    let shm = ShmName::new("hostile");
    let seed = common::seed();
    let mut host = HostPort::create("host0", &HostConfig::new(shm.name())).unwrap();
    let host_pool = common::pool("host", 4096, 4088);
    let guest_pool = common::pool("guest", 4096, 4088);
    let hrx = host.take_rx_queue(0, &host_pool).unwrap();
    let htx = host.take_tx_queue(0, &host_pool).unwrap();
    // The hostile peer's own mapping of the file.
    let evil = Region::open_shared(shm.name(), AREA_SIZE).unwrap();
    let sh = Shared::default();
    let (host_rep, guest_rep, scribbles, guest) = std::thread::scope(|s| {
        let _abort = AbortOnPanic(&sh.abort);
        let h = s.spawn(|| host_loop(&sh, hrx, htx, &host_pool, seed));
        let mut cfg = GuestConfig::new(shm.name());
        cfg.variant = variant;
        cfg.reset_timeout = Duration::from_secs(20);
        let mut guest = GuestPort::attach("guest0", &cfg).expect("attach");
        let grx = guest.take_rx_queue(0, &guest_pool).unwrap();
        let gtx = guest.take_tx_queue(0, &guest_pool).unwrap();
        let g = s.spawn(|| guest_loop(&sh, grx, gtx, &guest_pool, seed));
        wait_for(&sh, deadline, "traffic before the chaos", || {
            sh.host_good.load(Relaxed) >= 1000 && sh.guest_good.load(Relaxed) >= 1000
        });

        let until = Instant::now() + chaos;
        let (shr, evil) = (&sh, &evil);
        let scribbles = s.spawn(move || scribble(shr, evil, until)).join().unwrap();

        // Let the host finish whatever reset the scribbler left behind: `reset` reads 0 (only the
        // host clears it now) for a good number of host polls in a row.
        let region = host.region().clone();
        let mut quiet_since = None;
        wait_for(&sh, deadline, "the header to settle", || {
            let loops = sh.host_loops.load(Acquire);
            if region.u32(HDR_RESET).load(Acquire) != 0 {
                quiet_since = None;
                return false;
            }
            let since = *quiet_since.get_or_insert(loops);
            loops - since >= 200
        });

        // Recovery: the guest resets while both sides keep polling.
        let framesz = guest.reset().expect("reset after the chaos");
        assert_eq!(framesz, 1518);
        sh.strict.store(true, Release);
        wait_for(&sh, deadline, "intact traffic after the reset", || {
            sh.host_strict.load(Relaxed) >= AFTER && sh.guest_strict.load(Relaxed) >= AFTER
        });
        sh.stop.store(true, Relaxed);
        let (hr, _hrx, _htx) = h.join().expect("host thread");
        let (gr, _grx, _gtx) = g.join().expect("guest thread");
        (hr, gr, scribbles, guest)
    });
    let (hrs, hts) = host.queue_stats();
    let (grs, gts) = guest.queue_stats();
    eprintln!(
        "{variant:?}: {scribbles} scribbles; host rx {:?} tx {:?} frames {host_rep:?}; \
         guest rx {:?} tx {:?} frames {guest_rep:?}; host resets {}",
        hrs[0],
        hts[0],
        grs[0],
        gts[0],
        host.resets()
    );
    // During the chaos a scribbled FILLED can hand over a slot the producer is still writing:
    // such frames are delivered and only the payload check notices. Not an error of the driver.
    eprintln!(
        "frames that failed the payload check during the chaos: host {} (of {}), guest {} (of {})",
        host_rep.bad,
        host_rep.good + host_rep.bad,
        guest_rep.bad,
        guest_rep.good + guest_rep.bad
    );
    assert!(scribbles > 0);
    assert!(
        hrs[0].errors + grs[0].errors > 0,
        "bad slots must be counted as errors on at least one side"
    );
    assert!(host_rep.strict_good >= AFTER && guest_rep.strict_good >= AFTER);
    assert_eq!(
        region_word(&host, HDR_MAGIC),
        MAGIC,
        "nobody but the host writes the magic"
    );
    assert_eq!(region_word(&host, HDR_VALID), 1);
    assert_eq!(region_word(&host, HDR_RESET), 0);
}

fn region_word(host: &HostPort, off: usize) -> u32 {
    host.region().u32(off).load(Relaxed)
}

#[test]
fn poll_hostile_scribbler_memnic() {
    run(Variant::Memnic, Duration::from_secs(2));
}

#[test]
fn poll_hostile_scribbler_2014_after() {
    run(Variant::After2014, Duration::from_secs(1));
}

#[test]
fn poll_hostile_scribbler_2014_before() {
    run(Variant::Before2014, Duration::from_secs(1));
}

/// A guest that asks for a reset again as soon as each is served (a `reset = 1` loop on its own
/// mapping) gets at most one sweep of the rings per `RESET_INTERVAL` out of the host's rx lcore,
/// which polls without pause, instead of one at every poll; and the resets are still served.
#[test]
fn poll_a_guest_asking_for_resets_in_a_loop_gets_one_sweep_per_interval() {
    let _serial = common::serial();
    let shm = ShmName::new("reset-loop");
    let mut host = HostPort::create("h", &HostConfig::new(shm.name())).unwrap();
    let pool = common::pool("reset-loop", 256, 2048);
    let mut rxq = host.take_rx_queue(0, &pool).unwrap();
    let guest = Region::open_shared(shm.name(), AREA_SIZE).unwrap();
    let stop = AtomicBool::new(false);
    const RUN: Duration = Duration::from_millis(500);
    let polls = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Relaxed) {
                // Acquire pairs with the host's Release store of reset = 0 (serve_reset); the
                // Release store of 1 is the guest's request (reset_requested's Acquire).
                if guest.u32(HDR_RESET).load(Acquire) == 0 {
                    guest.u32(HDR_RESET).store(1, Release);
                }
                std::hint::spin_loop();
            }
        });
        let mut got = Vec::new();
        let mut polls = 0u64;
        let end = Instant::now() + RUN;
        while Instant::now() < end {
            rxq.rx_burst(&mut got, 32);
            polls += 1;
        }
        stop.store(true, Relaxed);
        polls
    });
    let resets = host.resets();
    let most = (RUN.as_nanos() / memnic_pmd::RESET_INTERVAL.as_nanos()) as u64 + 1;
    eprintln!("{resets} resets served in {polls} polls over {RUN:?} (at most {most})");
    assert!(
        resets <= most,
        "{resets} sweeps in {RUN:?}: more than one per interval"
    );
    assert!(
        resets >= most / 10,
        "only {resets} of the guest's resets served"
    );
}
