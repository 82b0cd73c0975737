//! `--interleave`: the pairs of a cell (one size, one case) side by side, each in turn
//! forwarding for one window while the others wait at their prompts.
//!
//! This machine flips between two states every few seconds; runs of 6-10 s, one pair after
//! another, each mix the states in their own proportion, so two pairs' medians can differ by
//! the states they met. Here every pair is started once and kept connected at its testpmd
//! prompts (DPDK's and ours take the same commands). A turn gives each pair, in alternating
//! order, `start` on both sides, a warm-up, two reads of the measured counter
//! (`show port stats all`, stamped by the bench's clock as the answer arrives) a window apart,
//! and `stop` on both sides; the limit probe takes its window in the same turn. The windows of
//! one turn lie seconds apart, so their ratios compare pairs in one state, and the table's
//! ratios are the quantiles of those per-turn ratios.
//!
//! A stopped testpmd waits: DPDK's lcores block on their launch pipe, ours are joined, and both
//! main threads read their prompt. So a pair at rest takes no CPU from the pair that runs.

use std::time::Duration;

use crate::parse::Counter;
use crate::plan::{Case, Plan, Run};
use crate::proc::{Proc, Seen};
use crate::runs::{self, Ctx, Pair, START_LIMIT, STOP_LIMIT, TRAFFIC_LIMIT};
use crate::stats::{self, Stamp};

/// Forwarding between a pair's two counter reads.
pub const WINDOW: Duration = Duration::from_secs(1);
/// From `start` to the first read: the sender's first bursts, the rings filling.
const WARMUP: Duration = Duration::from_millis(250);
/// How long a testpmd may take to answer at its prompt (DPDK's main lcore shares its CPU with
/// the forwarding one, so an answer waits for a time slice).
const ANSWER_LIMIT: Duration = Duration::from_secs(10);
/// Between reads while waiting for a pair's first frames.
const FIRST_FRAMES_POLL: Duration = Duration::from_millis(250);

/// One window of one variant.
pub struct Window {
    /// Its middle, by the bench's clock (seconds).
    pub at: f64,
    pub mpps: f64,
}

/// A pair at its prompts.
struct Live {
    first: Proc,
    second: Proc,
    measured_first: bool,
    counter: Counter,
}

impl Live {
    fn start(ctx: &Ctx, pair: Pair) -> Result<Live, String> {
        let first = pair.first.spawn(ctx)?;
        first.wait_for("answer at its prompt", START_LIMIT, |s| s.ready)?;
        let second = pair.second.spawn(ctx)?;
        second.wait_for("answer at its prompt", START_LIMIT, |s| s.ready)?;
        Ok(Live {
            first,
            second,
            measured_first: pair.measured_first,
            counter: pair.counter,
        })
    }

    /// The measured counter now, as the answer to `show port stats all` arrived.
    fn read(&mut self) -> Result<Stamp, String> {
        let counter = self.counter;
        let stamped = move |s: &Seen| match counter {
            Counter::Rx => s.rx.len(),
            Counter::Tx => s.tx.len(),
        };
        let p = self.measured_mut();
        let before = p.seen(stamped);
        p.send("show port stats all")?;
        p.wait_for("answer show port stats all", ANSWER_LIMIT, |s| {
            stamped(s) > before
        })?;
        Ok(p.stamps(counter)[before])
    }

    fn measured(&self) -> &Proc {
        if self.measured_first {
            &self.first
        } else {
            &self.second
        }
    }

    fn measured_mut(&mut self) -> &mut Proc {
        if self.measured_first {
            &mut self.first
        } else {
            &mut self.second
        }
    }

    fn forward(&mut self) -> Result<(), String> {
        self.first.send("start")?;
        self.second.send("start")
    }

    /// `stop` on both sides, and their `Done.`: the lcores have let go of the CPUs.
    fn rest(&mut self) -> Result<(), String> {
        let done = (stops(&self.first), stops(&self.second));
        self.second.send("stop")?;
        self.first.send("stop")?;
        self.second
            .wait_for("stop forwarding", STOP_LIMIT, |s| s.stops > done.1)?;
        self.first
            .wait_for("stop forwarding", STOP_LIMIT, |s| s.stops > done.0)
    }

    /// Forwards until the measured counter moves (the link may come up after `start`).
    fn first_frames(&mut self) -> Result<(), String> {
        self.forward()?;
        let t0 = std::time::Instant::now();
        let c0 = self.read()?.count;
        while self.read()?.count == c0 {
            if t0.elapsed() > TRAFFIC_LIMIT {
                return Err(format!(
                    "{} counted no frames within {} s of start",
                    self.measured().name,
                    TRAFFIC_LIMIT.as_secs()
                ));
            }
            std::thread::sleep(FIRST_FRAMES_POLL);
        }
        self.rest()
    }

    /// One turn: its middle and the frames per second over [`WINDOW`].
    fn turn(&mut self) -> Result<(f64, f64), String> {
        self.forward()?;
        std::thread::sleep(WARMUP);
        let a = self.read()?;
        std::thread::sleep(WINDOW);
        let b = self.read()?;
        self.rest()?;
        if b.count < a.count {
            return Err(format!(
                "{}'s counter went back from {} to {}: the pair reconnected",
                self.measured().name,
                a.count,
                b.count
            ));
        }
        let rate = (b.count - a.count) as f64 / (b.secs - a.secs).max(1e-3);
        Ok(((a.secs + b.secs) / 2.0, rate))
    }

    fn stop(self) {
        self.second.stop(STOP_LIMIT);
        self.first.stop(STOP_LIMIT);
    }
}

fn stops(p: &Proc) -> usize {
    p.seen(|s| s.stops)
}

/// Every variant of `case` at `size`, `plan.rounds * plan.seconds` turns: each variant's
/// windows, the k-th of each from turn k. `tick` is called after each window.
pub fn cell(
    ctx: &Ctx,
    plan: &Plan,
    case: Case,
    size: u32,
    tick: &dyn Fn(),
) -> Result<Vec<Vec<Window>>, String> {
    ctx.remove_files();
    let result = run_cell(ctx, plan, (case, size), tick);
    ctx.remove_files();
    result
}

fn run_cell(
    ctx: &Ctx,
    plan: &Plan,
    (case, size): (Case, u32),
    tick: &dyn Fn(),
) -> Result<Vec<Vec<Window>>, String> {
    // Dropped on an error: each process is killed (`Proc`'s drop).
    let mut live: Vec<Option<Live>> = Vec::new();
    for (slot, v) in plan.variants.iter().enumerate() {
        live.push(match runs::pair(ctx, plan, case, v.run, size, slot)? {
            Some(pair) => Some(Live::start(ctx, pair)?),
            None => None,
        });
    }
    for l in live.iter_mut().flatten() {
        l.first_frames()?;
    }
    let mut rates: Vec<Vec<Window>> = (0..plan.variants.len()).map(|_| Vec::new()).collect();
    for turn in 0..plan.rounds * plan.seconds as usize {
        for vi in stats::order(plan.variants.len(), turn) {
            let (at, rate) = match (&mut live[vi], plan.variants[vi].run) {
                (Some(l), _) => l.turn()?,
                (None, Run::Limit { copies, shape, .. }) => {
                    let start = ctx.clock.elapsed().as_secs_f64();
                    let r = crate::limit::window(
                        plan.cpus,
                        copies,
                        shape,
                        size as usize,
                        WARMUP,
                        WINDOW,
                    )?;
                    (start + (WARMUP + WINDOW / 2).as_secs_f64(), r)
                }
                (None, run) => return Err(format!("{run:?} cannot be interleaved")),
            };
            rates[vi].push(Window {
                at,
                mpps: rate / 1e6,
            });
            tick();
        }
    }
    for l in live.into_iter().flatten() {
        l.stop();
    }
    Ok(rates)
}
