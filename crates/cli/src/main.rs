//! `memnic`: shared-memory packet I/O tools.
#![forbid(unsafe_code)]

mod tester;
mod testpmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "memnic",
    version,
    about = "Shared-memory packet I/O: MEMNIC, memif, vhost-user"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// memnic-tester: the 2014 MEMNIC PMD benchmark (Mpps per frame size)
    Tester(tester::Args),
    /// testpmd-style forwarding and traffic generation on pinned lcores
    Testpmd(Box<testpmd::Args>),
    /// Side-by-side benchmarks (ours and DPDK's): alternating runs, a table, --json, --svg
    Bench(memnic_bench::Args),
    /// Reads the log of an in-process A/B run (a build with `--features abflip`, testpmd
    /// started with MEMNIC_ABFLIP=K): each B window against the A windows beside it
    AbflipReport {
        /// The log (MEMNIC_ABFLIP_LOG, or /tmp/memnic-abflip-<pid>.log)
        log: std::path::PathBuf,
        /// Windows to leave out at the start (links coming up, tuners settling)
        #[arg(long, default_value_t = 8)]
        skip: usize,
    },
}

fn main() {
    let cli = match Cli::try_parse_from(testpmd::strip_separator(std::env::args())) {
        Ok(c) => c,
        Err(e) => {
            // clap prints help/version to stdout (exit 0) and usage errors to stderr (exit 2).
            let _ = e.print();
            std::process::exit(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let res = match cli.cmd {
        Cmd::Tester(a) => tester::main(a),
        Cmd::Testpmd(a) => testpmd::main(*a),
        Cmd::Bench(a) => std::env::current_exe()
            .map_err(|e| format!("bench: cannot find this program's own path: {e}"))
            .and_then(|exe| memnic_bench::main(a, exe)),
        Cmd::AbflipReport { log, skip } => std::fs::read_to_string(&log)
            .map_err(|e| format!("abflip-report: cannot read {}: {e}", log.display()))
            .and_then(|text| {
                memnic_bench::abflip::report(&text, skip)
                    .map_err(|e| format!("abflip-report: {}: {e}", log.display()))
            })
            .map(|r| println!("{}", memnic_bench::abflip::line(&r))),
    };
    if let Err(msg) = res {
        eprintln!("memnic: {msg}");
        std::process::exit(2);
    }
}
