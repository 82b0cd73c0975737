//! memnic-tester, the method of the 2014 "MEMNIC PMD performance improvement" series:
//! one thread pinned to one CPU plays the host by flipping slot flags (`up`: FREE → FILLED with
//! `len` set; `down`: FILLED → FREE); another thread pinned to another CPU runs the guest PMD's
//! `rx_burst`, then `tx_burst` of what it received. Throughput is what the PMD receives (and
//! transmits) per second.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memnic_ethdev::MAX_BURST;
use memnic_pktbuf::{Mempool, PoolConfig, DEFAULT_HEADROOM};
use memnic_pmd::host::{reset_requested, serve_reset};
use memnic_pmd::layout::{next, slot_off, Dir, AREA_SIZE, MAX_FRAME_LEN, SLOT_LEN};
use memnic_pmd::{slot, GuestConfig, GuestPort, Variant};
use memnic_shm::{cpu, Region};

/// Frame sizes of the published table.
pub const SIZES: [u32; 7] = [64, 128, 256, 512, 1024, 1280, 1518];
/// The jumbo size, run only with the frame-size feature.
pub const JUMBO: u32 = 4088;

#[derive(Debug, thiserror::Error)]
pub enum TesterError {
    #[error("the tester needs two CPUs (one for the host emulator, one for the PMD); this process may use {0:?}")]
    NotEnoughCpus(Vec<usize>),
    #[error("CPU {0} is not available to this process (allowed: {1:?})")]
    CpuNotAllowed(usize, Vec<usize>),
    #[error("host CPU and PMD CPU must differ (both are {0})")]
    SameCpu(usize),
    #[error("frame size {0} is outside 60..=4088")]
    BadSize(u32),
    #[error("burst size {0} is outside 1..={MAX_BURST}")]
    BadBurst(usize),
    #[error("{0}")]
    Setup(String),
    #[error("the PMD thread did not run at all during the {0:?} trial: the CPUs are overloaded")]
    Starved(Duration),
}

/// What to run.
#[derive(Debug, Clone)]
pub struct TesterConfig {
    pub variants: Vec<Variant>,
    pub sizes: Vec<u32>,
    pub trials: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub burst: usize,
    pub host_cpu: Option<usize>,
    pub pmd_cpu: Option<usize>,
    pub direction: Direction,
}

/// What the PMD thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    /// `rx_burst`, then `tx_burst` of what it received (the published method).
    #[default]
    Both,
    /// `rx_burst` only; buffers are freed.
    Rx,
    /// `tx_burst` only, of freshly allocated frames.
    Tx,
}

impl std::str::FromStr for Direction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "both" => Ok(Direction::Both),
            "rx" => Ok(Direction::Rx),
            "tx" => Ok(Direction::Tx),
            _ => Err(format!("unknown direction '{s}' (expected both, rx or tx)")),
        }
    }
}

impl Default for TesterConfig {
    fn default() -> Self {
        TesterConfig {
            variants: vec![Variant::Memnic],
            sizes: SIZES.to_vec(),
            trials: 5,
            duration: Duration::from_millis(300),
            warmup: Duration::from_millis(100),
            burst: 32,
            host_cpu: None,
            pmd_cpu: None,
            direction: Direction::Both,
        }
    }
}

/// One measurement: one variant, one size, one trial.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Sample {
    pub rx_mpps: f64,
    pub tx_mpps: f64,
}

/// Several trials of one variant at one size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub variant: &'static str,
    pub size: u32,
    /// Median receive rate over the trials, Mpps.
    pub mpps: f64,
    pub mpps_min: f64,
    pub mpps_max: f64,
    pub tx_mpps: f64,
    pub tx_mpps_min: f64,
    pub tx_mpps_max: f64,
    pub trials: usize,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Row {
    fn from_samples(variant: Variant, size: u32, s: &[Sample]) -> Row {
        let mut rx: Vec<f64> = s.iter().map(|x| x.rx_mpps).collect();
        let mut tx: Vec<f64> = s.iter().map(|x| x.tx_mpps).collect();
        let mpps = median(&mut rx);
        let tx_mpps = median(&mut tx);
        Row {
            variant: variant.name(),
            size,
            mpps,
            mpps_min: rx.first().copied().unwrap_or(0.0),
            mpps_max: rx.last().copied().unwrap_or(0.0),
            tx_mpps,
            tx_mpps_min: tx.first().copied().unwrap_or(0.0),
            tx_mpps_max: tx.last().copied().unwrap_or(0.0),
            trials: s.len(),
        }
    }
}

/// Picks (host CPU, PMD CPU).
pub fn pick_cpus(cfg: &TesterConfig) -> Result<(usize, usize), TesterError> {
    let allowed = cpu::allowed_cpus();
    for c in [cfg.host_cpu, cfg.pmd_cpu].into_iter().flatten() {
        if !allowed.contains(&c) {
            return Err(TesterError::CpuNotAllowed(c, allowed));
        }
    }
    let pick = |avoid: Option<usize>| allowed.iter().copied().find(|c| Some(*c) != avoid);
    let host = match cfg.host_cpu {
        Some(c) => c,
        None => pick(cfg.pmd_cpu).ok_or_else(|| TesterError::NotEnoughCpus(allowed.clone()))?,
    };
    let pmd = match cfg.pmd_cpu {
        Some(c) => c,
        None => pick(Some(host)).ok_or_else(|| TesterError::NotEnoughCpus(allowed.clone()))?,
    };
    if host == pmd {
        return Err(TesterError::SameCpu(host));
    }
    Ok((host, pmd))
}

/// Runs every (trial, size, variant), alternating variants inside each trial so that machine
/// noise hits them alike; returns one row per (variant, size), in the order of `cfg.sizes` then
/// `cfg.variants`. `progress` is called after each sample.
pub fn run(
    cfg: &TesterConfig,
    mut progress: impl FnMut(Variant, u32, &Sample),
) -> Result<Vec<Row>, TesterError> {
    if !(1..=MAX_BURST).contains(&cfg.burst) {
        return Err(TesterError::BadBurst(cfg.burst));
    }
    for &s in &cfg.sizes {
        if !(60..=JUMBO).contains(&s) {
            return Err(TesterError::BadSize(s));
        }
    }
    let cpus = pick_cpus(cfg)?;
    let pool = pool_for(&cfg.sizes)?;
    let mut samples: Vec<Vec<Vec<Sample>>> =
        vec![vec![Vec::new(); cfg.variants.len()]; cfg.sizes.len()];
    for _ in 0..cfg.trials {
        for (si, &size) in cfg.sizes.iter().enumerate() {
            for (vi, &variant) in cfg.variants.iter().enumerate() {
                let s = run_once(variant, size, cfg, cpus, &pool)?;
                progress(variant, size, &s);
                samples[si][vi].push(s);
            }
        }
    }
    let mut rows = Vec::new();
    for (si, &size) in cfg.sizes.iter().enumerate() {
        for (vi, &variant) in cfg.variants.iter().enumerate() {
            rows.push(Row::from_samples(variant, size, &samples[si][vi]));
        }
    }
    Ok(rows)
}

/// The buffers [`run_once`] needs for frames of `sizes`.
pub fn pool_for(sizes: &[u32]) -> Result<Mempool, TesterError> {
    let mut pcfg = PoolConfig::new("tester", 8192);
    if sizes.iter().any(|&s| s > MAX_FRAME_LEN) {
        pcfg.buf_size = JUMBO + DEFAULT_HEADROOM;
    }
    Mempool::new(&pcfg).map_err(|e| TesterError::Setup(e.to_string()))
}

/// The host emulator: serves resets, turns `up` slots FREE → FILLED (len = `size`) and `down`
/// slots FILLED → FREE, as fast as it can, until `stop`. It prefetches nothing: reaching ahead
/// pulls the very lines the PMD is about to touch into this core, and the measurement would then
/// be of the emulator's interference rather than of the PMD.
fn emulate_host(region: &Region, size: u32, stop: &AtomicBool) {
    let (mut up, mut down) = (0usize, 0usize);
    // Relaxed: a plain flag; nothing is published with it.
    while !stop.load(Relaxed) {
        if reset_requested(region) {
            serve_reset(region, true);
            (up, down) = (0, 0);
        }
        for _ in 0..32 {
            let off = slot_off(Dir::Up, up);
            if !slot::claim_single(region.u32(off)) {
                break;
            }
            // Relaxed: published by the Release in `publish` (P1).
            region.u32(off + SLOT_LEN).store(size, Relaxed);
            slot::publish(region.u32(off));
            up = next(up);
        }
        for _ in 0..32 {
            let off = slot_off(Dir::Down, down);
            if !slot::is_filled(region.u32(off)) {
                break;
            }
            slot::release(region.u32(off));
            down = next(down);
        }
    }
}

/// One measurement of one variant at one size.
pub fn run_once(
    variant: Variant,
    size: u32,
    cfg: &TesterConfig,
    (host_cpu, pmd_cpu): (usize, usize),
    pool: &Mempool,
) -> Result<Sample, TesterError> {
    let region =
        Arc::new(Region::private(AREA_SIZE, true).map_err(|e| TesterError::Setup(e.to_string()))?);
    memnic_pmd::host::init_region(&region, true).map_err(|e| TesterError::Setup(e.to_string()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let host = {
        let (region, stop) = (region.clone(), stop.clone());
        std::thread::Builder::new()
            .name("tester-host".into())
            .spawn(move || {
                let pinned = cpu::pin_current_thread(host_cpu);
                emulate_host(&region, size, &stop);
                pinned
            })
            .map_err(|e| TesterError::Setup(e.to_string()))?
    };
    let mut gcfg = GuestConfig::new("tester");
    gcfg.variant = variant;
    gcfg.framesz = (size > MAX_FRAME_LEN).then_some(size);
    let result = (|| {
        let mut port = GuestPort::on_region("tester0", region.clone(), &gcfg)
            .map_err(|e| TesterError::Setup(e.to_string()))?;
        let (mut rxq, mut txq) = port
            .take_queue_pair(pool)
            .map_err(|e| TesterError::Setup(e.to_string()))?;
        let phase = Arc::new(AtomicU32::new(0));
        let burst = cfg.burst;
        let direction = cfg.direction;
        let pmd = {
            let (phase, pool) = (phase.clone(), pool.clone());
            std::thread::Builder::new()
                .name("tester-pmd".into())
                .spawn(move || {
                    cpu::pin_current_thread(pmd_cpu)?;
                    let mut cache = pool.cache();
                    let mut pkts = Vec::with_capacity(MAX_BURST);
                    let mut marks = Vec::with_capacity(2);
                    let mut seen = 0;
                    loop {
                        // Relaxed: the phase only tells when to read the local counters.
                        let p = phase.load(Relaxed);
                        if p != seen {
                            marks.push((Instant::now(), rxq.stats().packets, txq.stats().packets));
                            seen = p;
                            if p == 2 {
                                break;
                            }
                        }
                        match direction {
                            Direction::Rx => {
                                rxq.burst(&mut pkts, burst);
                                cache.free_all(&mut pkts);
                            }
                            Direction::Tx => {
                                let want = burst - pkts.len();
                                cache.alloc_up_to(&mut pkts, want);
                                for m in pkts.iter_mut() {
                                    m.set_len(size as usize);
                                }
                                txq.burst(&mut pkts);
                            }
                            Direction::Both => {
                                if rxq.burst(&mut pkts, burst) > 0 {
                                    txq.burst(&mut pkts);
                                    cache.free_all(&mut pkts);
                                }
                            }
                        }
                    }
                    Ok::<_, memnic_shm::ShmError>(marks)
                })
                .map_err(|e| TesterError::Setup(e.to_string()))?
        };
        std::thread::sleep(cfg.warmup);
        phase.store(1, Relaxed);
        std::thread::sleep(cfg.duration);
        phase.store(2, Relaxed);
        let marks = pmd
            .join()
            .map_err(|_| TesterError::Setup("the PMD thread panicked".into()))?
            .map_err(|e| TesterError::Setup(e.to_string()))?;
        sample_of(&marks, cfg.duration)
    })();
    stop.store(true, Relaxed);
    host.join()
        .map_err(|_| TesterError::Setup("the host emulator panicked".into()))?
        .map_err(|e| TesterError::Setup(e.to_string()))?;
    result
}

/// The rates between the PMD thread's marks at the trial's start and end: (time, rx packets,
/// tx packets). A thread that was not scheduled for the whole trial saw only its end.
fn sample_of(marks: &[(Instant, u64, u64)], duration: Duration) -> Result<Sample, TesterError> {
    let [(t0, rx0, tx0), (t1, rx1, tx1)] = marks[..] else {
        return Err(TesterError::Starved(duration));
    };
    let secs = (t1 - t0).as_secs_f64();
    Ok(Sample {
        rx_mpps: (rx1 - rx0) as f64 / secs / 1e6,
        tx_mpps: (tx1 - tx0) as f64 / secs / 1e6,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn a_trial_the_pmd_thread_slept_through_is_starved() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(500);
        let s = sample_of(&[(t0, 0, 10), (t1, 1_000_000, 2_000_010)], Duration::ZERO).unwrap();
        assert!(
            (s.rx_mpps - 2.0).abs() < 1e-9 && (s.tx_mpps - 4.0).abs() < 1e-9,
            "{s:?}"
        );
        // It saw the phase go from warm-up straight to stop: one mark, no rate.
        assert!(matches!(
            sample_of(&[(t1, 5, 5)], Duration::from_secs(2)),
            Err(TesterError::Starved(_))
        ));
    }

    #[test]
    fn bad_config_is_refused() {
        let cfg = TesterConfig {
            burst: 0,
            ..Default::default()
        };
        assert!(matches!(
            run(&cfg, |_, _, _| {}),
            Err(TesterError::BadBurst(0))
        ));
        let cfg = TesterConfig {
            sizes: vec![5000],
            ..Default::default()
        };
        assert!(matches!(
            run(&cfg, |_, _, _| {}),
            Err(TesterError::BadSize(5000))
        ));
        let cfg = TesterConfig {
            host_cpu: Some(4096),
            ..Default::default()
        };
        assert!(matches!(
            run(&cfg, |_, _, _| {}),
            Err(TesterError::CpuNotAllowed(4096, _))
        ));
    }
}
