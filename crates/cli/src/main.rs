//! `memnic`: shared-memory packet I/O tools.
#![forbid(unsafe_code)]

mod tester;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "memnic", version, about = "Shared-memory packet I/O: MEMNIC, memif, vhost-user")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// memnic-tester: the 2014 MEMNIC PMD benchmark (Mpps per frame size)
    Tester(tester::Args),
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap prints help/version to stdout (exit 0) and usage errors to stderr (exit 2).
            let _ = e.print();
            std::process::exit(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let res = match cli.cmd {
        Cmd::Tester(a) => tester::main(a),
    };
    if let Err(msg) = res {
        eprintln!("memnic: {msg}");
        std::process::exit(2);
    }
}
