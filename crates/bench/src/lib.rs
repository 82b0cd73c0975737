//! `memnic bench`: one command for the side-by-side benchmarks (memif and vhost-user against
//! DPDK, MEMNIC testpmd pairs, memnic-tester's variants).
//!
//! The method is the one this machine taught (`peers/dpdk.md` §9, DEVELOPERS.md): it flips
//! between a fast and a slow state every few seconds, so one median over a mix of states hides
//! a 2x difference or invents one. Runs alternate the variants (A B, B A, ...) over many rounds;
//! each run's receiver prints its counters every stats period and the bench stamps every line
//! with its own clock as it arrives (DPDK's stats thread prints late when it shares a CPU, and
//! its memif server may crash at exit: its figures are read before it goes); consecutive lines
//! make ~2-s windows, and the table compares the same quantile of the window rates (p80: the fast
//! state, p20: the slow one) and says how far the machine swung.
#![forbid(unsafe_code)]

pub mod abflip;
pub mod date;
mod interleave;
pub mod limit;
pub mod parse;
mod ping;
pub mod plan;
mod proc;
pub mod report;
mod runs;
pub mod stats;
pub mod svg;

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

pub use plan::Args;

/// Runs `memnic bench`; `ours` is the memnic binary the pairs run (this process's own).
pub fn main(args: Args, ours: std::path::PathBuf) -> Result<(), String> {
    if let plan::Bench::Ping(a) = args.bench {
        return ping::main(a, ours);
    }
    let plan = plan::plan(args, &memnic_shm::cpu::allowed_cpus())?;
    let ctx = runs::Ctx::new(&plan, ours)?;
    let bar = progress(&plan);
    let mut res = report::Results::new(&plan);
    let mut turn = 0;
    if plan.interleave {
        for (ci, &case) in plan.cases.iter().enumerate() {
            for (si, &size) in plan.sizes.iter().enumerate() {
                bar.set_message(format!(
                    "{size} B{}, the pairs in turn",
                    match case.label() {
                        l if l.is_empty() => l,
                        l => format!(" {l}"),
                    }
                ));
                let cell =
                    interleave::cell(&ctx, &plan, case, size, &|| bar.inc(1)).map_err(|e| {
                        bar.finish_and_clear();
                        format!("{} {size} B, interleaved: {e}", plan.bench)
                    })?;
                for (vi, windows) in cell.into_iter().enumerate() {
                    for w in windows {
                        res.at[ci][si][vi].push(w.at);
                        res.windows[ci][si][vi].push(w.mpps);
                    }
                }
            }
        }
    }
    for round in (1..=plan.rounds).filter(|_| !plan.interleave) {
        for (ci, &case) in plan.cases.iter().enumerate() {
            for (si, &size) in plan.sizes.iter().enumerate() {
                for vi in stats::order(plan.variants.len(), turn) {
                    let v = &plan.variants[vi];
                    bar.set_message(format!(
                        "round {round}/{}: {}{} {size} B",
                        plan.rounds,
                        v.label,
                        match case.label() {
                            l if l.is_empty() => l,
                            l => format!(" {l}"),
                        }
                    ));
                    let w = runs::run(&ctx, &plan, case, v.run, size).map_err(|e| {
                        bar.finish_and_clear();
                        format!("{} {size} B, {}: {e}", plan.bench, v.label)
                    })?;
                    res.windows[ci][si][vi].extend(w);
                    bar.inc(1);
                }
                turn += 1;
            }
        }
    }
    bar.finish_and_clear();
    let rows = report::rows(&plan, &res);
    let swings = report::swings(&plan, &res);
    let date = date::today();
    if plan.json {
        println!("{}", report::json(&plan, &rows, &swings, &date));
        if std::io::stderr().is_terminal() {
            eprint!("{}", report::swing_lines(&swings));
        }
    } else {
        print!("{}", report::table(&plan, &rows, &swings));
    }
    if let Some(path) = &plan.svg {
        let text = svg::render(&report::chart(&plan, &rows, &swings, &date));
        std::fs::write(path, text)
            .map_err(|e| format!("--svg: cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// A bar on stderr, hidden with --quiet or when stderr is not a terminal.
fn progress(plan: &plan::Plan) -> ProgressBar {
    if plan.quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(plan.runs() as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {pos}/{len} runs, ~{eta} left: {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}
