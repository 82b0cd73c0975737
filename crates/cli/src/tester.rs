//! `memnic tester`: prints the memnic-tester table.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use memnic_pmd::Variant;
use memnic_tester::{Direction, Row, TesterConfig, JUMBO, SIZES};

#[derive(clap::Args)]
pub struct Args {
    /// PMD variant to measure: memnic, 2014-after or 2014-before
    #[arg(long, default_value = "memnic", value_parser = parse_variant)]
    variant: Variant,
    /// Run 2014-before, 2014-after and memnic side by side (alternating) and print ratios
    #[arg(long)]
    compare: bool,
    /// Frame sizes, comma-separated (default: 64,128,256,512,1024,1280,1518)
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<u32>,
    /// Add 4088-byte frames (negotiates the frame-size feature)
    #[arg(long)]
    jumbo: bool,
    /// Trials per variant and size; the table shows the median and min–max
    #[arg(long, default_value_t = 5)]
    trials: usize,
    /// Measured time per trial, milliseconds
    #[arg(long, default_value_t = 300)]
    duration_ms: u64,
    /// Warm-up before each trial, milliseconds
    #[arg(long, default_value_t = 100)]
    warmup_ms: u64,
    /// Packets per rx_burst
    #[arg(long, default_value_t = 32)]
    burst: usize,
    /// CPU of the host-emulating thread (default: the first allowed CPU)
    #[arg(long)]
    host_cpu: Option<usize>,
    /// CPU of the PMD thread (default: the next allowed CPU)
    #[arg(long)]
    pmd_cpu: Option<usize>,
    /// What the PMD thread runs: both (rx_burst then tx_burst of what it got: the published
    /// method), rx (receive only) or tx (transmit only), to measure each path alone
    #[arg(long, default_value = "both", value_parser = parse_direction)]
    direction: Direction,
    /// Print rows as JSON instead of a table
    #[arg(long)]
    json: bool,
}

fn parse_direction(s: &str) -> Result<Direction, String> {
    s.parse()
}

fn parse_variant(s: &str) -> Result<Variant, String> {
    s.parse()
}

pub fn main(a: Args) -> Result<(), String> {
    if a.trials == 0 {
        return Err("--trials must be at least 1".into());
    }
    if a.duration_ms == 0 {
        return Err("--duration-ms must be at least 1".into());
    }
    let mut sizes = if a.sizes.is_empty() {
        SIZES.to_vec()
    } else {
        a.sizes.clone()
    };
    if a.jumbo && !sizes.contains(&JUMBO) {
        sizes.push(JUMBO);
    }
    let variants = if a.compare {
        Variant::ALL.to_vec()
    } else {
        vec![a.variant]
    };
    let cfg = TesterConfig {
        variants: variants.clone(),
        sizes,
        trials: a.trials,
        duration: Duration::from_millis(a.duration_ms),
        warmup: Duration::from_millis(a.warmup_ms),
        burst: a.burst,
        host_cpu: a.host_cpu,
        pmd_cpu: a.pmd_cpu,
        direction: a.direction,
    };
    let (host, pmd) = memnic_tester::pick_cpus(&cfg).map_err(|e| e.to_string())?;
    if !a.json {
        println!(
            "memnic-tester: {} × {} trial(s) of {} ms, burst {}, direction {:?}, host emulator on CPU {host}, PMD on CPU {pmd}",
            variants.iter().map(|v| v.name()).collect::<Vec<_>>().join(" / "),
            a.trials,
            a.duration_ms,
            a.burst,
            a.direction
        );
    }
    let total = cfg.variants.len() * cfg.sizes.len() * cfg.trials;
    let mut done = 0;
    let rows = memnic_tester::run(&cfg, |_, _, _| {
        done += 1;
        if !a.json && std::io::stderr().is_terminal() {
            eprint!("\r  {done}/{total} samples ");
            let _ = std::io::stderr().flush();
        }
    })
    .map_err(|e| e.to_string())?;
    if !a.json && std::io::stderr().is_terminal() {
        eprint!("\r{:30}\r", "");
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
    } else if a.compare {
        print_compare(&rows, &cfg.sizes);
    } else {
        print_table(&rows);
    }
    Ok(())
}

fn print_table(rows: &[Row]) {
    println!(
        "{:>6} | {:>22} | {:>22}",
        "size", "rx Mpps (min-max)", "tx Mpps (min-max)"
    );
    println!("{:-<6}-+-{:-<22}-+-{:-<22}", "", "", "");
    for r in rows {
        println!(
            "{:>6} | {:>7.2} ({:>5.2}-{:>5.2}) | {:>7.2} ({:>5.2}-{:>5.2})",
            r.size, r.mpps, r.mpps_min, r.mpps_max, r.tx_mpps, r.tx_mpps_min, r.tx_mpps_max
        );
    }
}

fn print_compare(rows: &[Row], sizes: &[u32]) {
    let get = |v: &str, s: u32| rows.iter().find(|r| r.variant == v && r.size == s);
    println!(
        "{:>6} | {:>20} | {:>20} | {:>20} | {:>8} | {:>8}",
        "size", "2014-before Mpps", "2014-after Mpps", "memnic Mpps", "after/bef", "memnic/af"
    );
    println!(
        "{:-<6}-+-{:-<20}-+-{:-<20}-+-{:-<20}-+-{:-<8}-+-{:-<8}",
        "", "", "", "", "", ""
    );
    let cell = |r: &Row| format!("{:.2} ({:.2}-{:.2})", r.mpps, r.mpps_min, r.mpps_max);
    for &s in sizes {
        let (Some(b), Some(a), Some(m)) = (
            get("2014-before", s),
            get("2014-after", s),
            get("memnic", s),
        ) else {
            continue;
        };
        println!(
            "{:>6} | {:>20} | {:>20} | {:>20} | {:>7.2}x | {:>7.2}x",
            s,
            cell(b),
            cell(a),
            cell(m),
            a.mpps / b.mpps,
            m.mpps / a.mpps
        );
    }
    println!("(rx Mpps: median of trials, min-max in brackets; tx rates are in --json)");
}
