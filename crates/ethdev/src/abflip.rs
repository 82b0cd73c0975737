//! In-process A/B: one process runs both variants of a change, switching between them every
//! quarter second, and logs the frames each window moved, so every window of the variant under
//! test (B) is compared with the windows of the other (A) just before and after it, which share
//! the machine's state. On a shared, noisy machine (swings of 10-25% from run to run, windows of
//! one cell from 9 to 19 Mpps) alternating whole runs could not separate 5% effects; this could.
//! `memnic abflip-report LOG` reads the log.
//!
//! A developer's tool, compiled in only with the `abflip` feature (`cargo build --release -p
//! memnic-cli --features abflip`); without it every function here is empty and the data path is
//! unchanged. To measure a change:
//!
//! 1. Put both variants in the code, the new one behind `abflip::variant(1)` (a second change
//!    under test can be variant 2, and so on; one runs at a time):
//!    `if memnic_ethdev::abflip::variant(1) { new() } else { old() }`.
//! 2. Run the pair as usual, the side whose frames are counted (the receiver for an rx change,
//!    the sender for a tx change) with `MEMNIC_ABFLIP=1` in its environment; `testpmd` counts
//!    the frames its forwarding streams receive and send (in `io` or `macswap` forwarding each
//!    frame twice: the rate logged is rx + tx, the ratios hold). `MEMNIC_ABFLIP_MS` sets the
//!    window (250 ms by default), `MEMNIC_ABFLIP_LOG` the log (`/tmp/memnic-abflip-<pid>.log`,
//!    emptied at the start).
//! 3. `memnic abflip-report LOG`: the B/A ratios' p20/p50/p80 and each variant's median rate.
//!
//! The count is one relaxed load and store per burst (not an atomic add: a locked instruction
//! per burst would itself be measured), so it counts right with one forwarding lcore in the
//! process; with several, windows undercount alike and the ratios still hold roughly.

#[cfg(feature = "abflip")]
mod on {
    use std::io::Write;
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
    use std::time::{Duration, Instant};

    /// Whether the current window runs variant B.
    static B: AtomicBool = AtomicBool::new(false);
    /// The variant under test (0: none, so `variant` is always false).
    static UNDER_TEST: AtomicU32 = AtomicU32::new(0);
    /// Frames counted so far, on a line of its own (the lcore writes it every burst; `B` and
    /// `UNDER_TEST` are read every burst and written four times a second).
    static FRAMES: Frames = Frames(AtomicU64::new(0));
    static STARTED: std::sync::Once = std::sync::Once::new();

    #[repr(align(64))]
    struct Frames(AtomicU64);

    /// Windows written to the log at a time.
    const LINES_PER_WRITE: usize = 8;

    pub fn start() {
        STARTED.call_once(|| {
            let Ok(k) = std::env::var("MEMNIC_ABFLIP") else {
                return;
            };
            let Some(k) = k.parse::<u32>().ok().filter(|&k| k > 0) else {
                eprintln!("abflip: MEMNIC_ABFLIP={k:?} is not a variant (1, 2, ...): not flipping");
                return;
            };
            let ms = match std::env::var("MEMNIC_ABFLIP_MS") {
                Err(_) => 250,
                Ok(v) => match v.parse::<u64>().ok().filter(|&ms| ms > 0) {
                    Some(ms) => ms,
                    None => {
                        eprintln!(
                            "abflip: MEMNIC_ABFLIP_MS={v:?} is not milliseconds: not flipping"
                        );
                        return;
                    }
                },
            };
            let log = std::env::var("MEMNIC_ABFLIP_LOG")
                .unwrap_or_else(|_| format!("/tmp/memnic-abflip-{}.log", std::process::id()));
            if let Err(e) = std::fs::write(&log, "") {
                eprintln!("abflip: cannot write {log}: {e}: not flipping");
                return;
            }
            // Relaxed: set before the flipping thread starts and before any B window; a burst
            // that reads the old 0 runs variant A, as it would anyway.
            UNDER_TEST.store(k, Relaxed);
            eprintln!("abflip: variant {k} against the rest, {ms}-ms windows, logged to {log}");
            std::thread::spawn(move || flip(Duration::from_millis(ms), &log));
        });
    }

    /// Flips the variant every `window` and appends each window's rate to `log` ("A 20.412",
    /// "B 20.760": variant and Mpps).
    fn flip(window: Duration, log: &str) {
        let mut lines = String::new();
        // Relaxed, all of them: a counter and a switch, nothing published with them; a burst
        // that reads the switch late runs the old variant for microseconds of the window.
        let mut from = (Instant::now(), FRAMES.0.load(Relaxed));
        loop {
            std::thread::sleep(window);
            let to = (Instant::now(), FRAMES.0.load(Relaxed));
            let b = B.load(Relaxed);
            B.store(!b, Relaxed);
            let secs = (to.0 - from.0).as_secs_f64();
            let mpps = to.1.wrapping_sub(from.1) as f64 / secs / 1e6;
            lines.push_str(&format!("{} {mpps:.3}\n", if b { 'B' } else { 'A' }));
            // The next window starts with the switch (the frames of the old variant's last
            // burst land in it: a burst is microseconds of a quarter second).
            from = (Instant::now(), FRAMES.0.load(Relaxed));
            // An even number, so a write that fails stops the flipping on variant A.
            if lines.lines().count() >= LINES_PER_WRITE {
                let written = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .and_then(|mut f| f.write_all(lines.as_bytes()));
                if let Err(e) = written {
                    eprintln!("abflip: cannot write {log}: {e}");
                    return;
                }
                lines.clear();
            }
        }
    }

    #[inline(always)]
    pub fn variant(k: u32) -> bool {
        // Relaxed: see `flip`.
        B.load(Relaxed) && UNDER_TEST.load(Relaxed) == k
    }

    #[inline(always)]
    pub fn count(frames: usize) {
        if frames != 0 {
            // Relaxed, and not an atomic add: one writer (see the module's note on lcores).
            FRAMES
                .0
                .store(FRAMES.0.load(Relaxed).wrapping_add(frames as u64), Relaxed);
        }
    }
}

#[cfg(not(feature = "abflip"))]
mod on {
    #[inline(always)]
    pub fn start() {}

    #[inline(always)]
    pub fn variant(_k: u32) -> bool {
        false
    }

    #[inline(always)]
    pub fn count(_frames: usize) {}
}

/// Starts the flipping thread if `MEMNIC_ABFLIP` names a variant (once per process; testpmd
/// calls it once its ports are set up, before forwarding starts: `memnic abflip-report`
/// leaves out the first windows).
pub fn start() {
    on::start()
}

/// Whether variant `k` runs now: `k` is the variant under test and the window is a B one.
#[inline(always)]
pub fn variant(k: u32) -> bool {
    on::variant(k)
}

/// Counts `frames` moved by this process's forwarding (one call per burst).
#[inline(always)]
pub fn count(frames: usize) {
    on::count(frames)
}

#[cfg(all(test, feature = "abflip"))]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// With MEMNIC_ABFLIP=1 the variant flips every window, variant 2 never runs, and each
    /// window's rate is logged under the variant that ran.
    #[test]
    fn the_variant_under_test_alternates_and_each_window_is_logged() {
        let log = std::env::temp_dir().join(format!("abflip-test-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        std::env::set_var("MEMNIC_ABFLIP", "1");
        std::env::set_var("MEMNIC_ABFLIP_MS", "20");
        std::env::set_var("MEMNIC_ABFLIP_LOG", &log);
        start();
        let (mut seen_a, mut seen_b) = (false, false);
        let end = Instant::now() + Duration::from_millis(600);
        while Instant::now() < end {
            assert!(!variant(2), "only the variant named runs");
            if variant(1) {
                seen_b = true;
            } else {
                seen_a = true;
            }
            count(1);
        }
        assert!(seen_a && seen_b);
        let text = std::fs::read_to_string(&log).expect("the log");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() >= 8, "{text}");
        for (i, l) in lines.iter().enumerate() {
            let (v, rate) = l.split_once(' ').expect("variant and rate");
            assert_eq!(v, if i % 2 == 0 { "A" } else { "B" }, "{text}");
            assert!(rate.parse::<f64>().expect("a rate") > 0.0, "{text}");
        }
        let _ = std::fs::remove_file(&log);
    }
}
