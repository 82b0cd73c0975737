//! `cargo xtask test [NEXTEST ARGS...]`: the README's test command. It checks that the machine
//! has what the tests need (DPDK 22.11's testpmd and PMDs for the interop tests, QEMU and
//! busybox-static for the real-guest tests, apt's package lists so the guest kernel can be
//! fetched, tcpdump to read captures back, cargo-nextest to run them), installs what is missing
//! (`apt-get` as root; otherwise one sentence naming the packages), then runs
//! `cargo nextest run --workspace` with the arguments given.
//!
//! `cargo xtask deps` does only the first part.
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::{Command, ExitCode};

/// Something the tests need, the Debian packages that provide it, and how to tell it is there.
struct Need {
    what: &'static str,
    packages: &'static [&'static str],
    present: fn() -> bool,
}

const NEEDS: &[Need] = &[
    Need {
        what: "DPDK 22.11's testpmd with the memif, vhost and virtio-user PMDs (interop tests)",
        packages: &[
            "dpdk-dev",
            "librte-net-memif23",
            "librte-net-vhost23",
            "librte-net-virtio23",
        ],
        present: dpdk_present,
    },
    Need {
        what: "QEMU and busybox-static (the real-guest tests)",
        packages: &["qemu-system-x86", "busybox-static"],
        present: qemu_present,
    },
    Need {
        what: "glibc's static libraries (the static memnic binary inside the MEMNIC guest)",
        packages: &["libc6-dev"],
        present: || Path::new("/usr/lib/x86_64-linux-gnu/libc.a").exists(),
    },
    Need {
        what: "tcpdump (reads the pcap and pcapng files back)",
        packages: &["tcpdump"],
        present: || on_path("tcpdump"),
    },
];

/// The guest tests fetch this package's kernel with `apt-get download` (crates/test-support).
const GUEST_KERNEL_PACKAGE: &str = "linux-image-cloud-amd64";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => prepare().and_then(|()| nextest(&args[1..])),
        Some("deps") => prepare(),
        _ => Err(Failure::Usage(
            "usage: cargo xtask test [cargo-nextest arguments...] | cargo xtask deps".into(),
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("xtask: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Failed(code)) => ExitCode::from(code),
    }
}

enum Failure {
    /// One sentence for the user; exit code 2.
    Usage(String),
    /// A step that ran and failed (its own output says why); its exit code.
    Failed(u8),
}

/// Installs what is missing, or says which packages to install when we cannot.
fn prepare() -> Result<(), Failure> {
    let missing: Vec<&Need> = NEEDS.iter().filter(|n| !(n.present)()).collect();
    let lists_missing = !apt_knows(GUEST_KERNEL_PACKAGE);
    if !missing.is_empty() || lists_missing {
        if !is_root() {
            let packages: Vec<&str> = missing.iter().flat_map(|n| n.packages).copied().collect();
            let install = if packages.is_empty() {
                String::new()
            } else {
                format!(" && sudo apt-get install -y {}", packages.join(" "))
            };
            return Err(Failure::Usage(format!(
                "the tests need packages (or apt's package lists, for the guest kernel) this \
                 machine lacks and xtask is not root: run `sudo apt-get update{install}` and try \
                 again"
            )));
        }
        for n in &missing {
            eprintln!("xtask: installing {} ({})", n.what, n.packages.join(" "));
        }
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        if !missing.is_empty() {
            run(Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(missing.iter().flat_map(|n| n.packages))
                .env("DEBIAN_FRONTEND", "noninteractive"))?;
        }
        if let Some(n) = NEEDS.iter().find(|n| !(n.present)()) {
            return Err(Failure::Usage(format!(
                "{} is still missing after installing {}",
                n.what,
                n.packages.join(" ")
            )));
        }
    }
    if !cargo_has("nextest") {
        eprintln!("xtask: installing cargo-nextest from crates.io");
        run(Command::new(cargo()).args(["install", "--locked", "cargo-nextest"]))?;
    }
    Ok(())
}

fn nextest(args: &[String]) -> Result<(), Failure> {
    run(Command::new(cargo())
        .args(["nextest", "run", "--workspace"])
        .args(args))
}

/// Runs `cmd` with our stdio; a failure keeps the command's exit code.
fn run(cmd: &mut Command) -> Result<(), Failure> {
    let what = format!("{cmd:?}");
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => {
            eprintln!("xtask: {what} failed ({s})");
            Err(Failure::Failed(s.code().unwrap_or(1).clamp(1, 255) as u8))
        }
        Err(e) => Err(Failure::Usage(format!("cannot run {what}: {e}"))),
    }
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn dpdk_present() -> bool {
    let pmds = [
        "librte_net_memif.so",
        "librte_net_vhost.so",
        "librte_net_virtio.so",
    ];
    on_path("dpdk-testpmd")
        && pmds.iter().all(|pmd| {
            let dir = Path::new("/usr/lib/x86_64-linux-gnu/dpdk");
            std::fs::read_dir(dir).is_ok_and(|entries| {
                entries
                    .flatten()
                    .any(|pmds_dir| pmds_dir.path().join(pmd).exists())
            })
        })
}

fn qemu_present() -> bool {
    // The initramfs needs busybox's depmod applet, which only busybox-static has.
    on_path("qemu-system-x86_64")
        && Command::new("/bin/busybox")
            .arg("--list")
            .output()
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l == "depmod")
            })
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

fn apt_knows(package: &str) -> bool {
    Command::new("apt-cache")
        .args(["show", package])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn cargo_has(subcommand: &str) -> bool {
    Command::new(cargo())
        .args([subcommand, "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn is_root() -> bool {
    // /proc/self/status: "Uid:\treal\teffective\t...".
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}
