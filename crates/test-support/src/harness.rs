//! A test `main` for binaries whose tests start a copy of themselves as a peer (`harness =
//! false` in Cargo.toml). In a child, [`ENV_CHILD`] names the role to run and nothing else runs;
//! otherwise the tests run under libtest-mimic, which speaks libtest's command line (so
//! `cargo test`, `cargo nextest` and filters work) and lists only the real tests.

use libtest_mimic::{Arguments, Trial};

/// Names the child role a re-executed test binary runs.
pub const ENV_CHILD: &str = "MEMNIC_TEST_CHILD";

/// The child role of this process, if it is one.
pub fn child_name() -> Option<String> {
    std::env::var(ENV_CHILD).ok()
}

/// Runs child role `$MEMNIC_TEST_CHILD` from `children` and exits (status 0 when it returns, the
/// panic's status when it panics), or else runs `tests` as the binary's test suite.
pub fn harness(tests: &[(&'static str, fn())], children: &[(&'static str, fn())]) -> ! {
    if let Some(name) = child_name() {
        let Some((_, role)) = children.iter().find(|(n, _)| *n == name) else {
            eprintln!("no child role {name:?} in this test binary");
            std::process::exit(2);
        };
        role();
        std::process::exit(0);
    }
    let args = Arguments::from_args();
    let trials = tests
        .iter()
        .map(|&(name, f)| {
            Trial::test(name, move || {
                std::panic::catch_unwind(f).map_err(|p| {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panicked".into());
                    msg.into()
                })
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}
