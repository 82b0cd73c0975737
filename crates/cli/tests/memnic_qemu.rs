//! MEMNIC in a real VM: our host side on the host, our guest PMD inside a Linux guest (QEMU
//! 7.2, TCG) that sees the region as the BAR2 of an `ivshmem-plain` PCI device, the way the 2014
//! MEMNIC guests did.
//!
//! The host side (`memnic testpmd`, role=host, CPU 0) creates the 16 MiB region in /dev/shm;
//! QEMU (CPU 1) maps the same file as the device's BAR; the guest's `/init` finds the device
//! (vendor 0x1af4, device 0x1110) and runs a static build of `memnic testpmd` with role=guest
//! on `/sys/bus/pci/devices/<BDF>/resource2`, which the PMD mmaps. Both sides run txonly with
//! --verify: each sends a fixed count of numbered, checksummed frames (`--tx-count`) and checks
//! what it receives from the other, and each ends once it has sent and received that count
//! (`--rx-count`). A guest under TCG is slow, so the test counts and never times: the totals
//! must match exactly, in both directions, with no lost, corrupted, duplicated or reordered
//! frame.
//!
//! Needs `qemu-system-x86`, `busybox-static` and glibc's static libraries (`libc6-dev`), and
//! fetches the guest kernel once (memnic-test-support's `guest` module).

mod common;

use std::time::{Duration, Instant};

use common::{json_of, ShmName};
use memnic_pmd::layout::AREA_SIZE;
use memnic_test_support::guest::{self, Image, Qemu};

/// Frames each side sends: a few dozen trips round each 1024-slot ring.
const COUNT: u64 = 50_000;

/// The guest's `/init` after the helper's prelude: find the ivshmem device, run our guest side
/// on its BAR2, print its JSON report and exit status on the console.
fn init(count: u64, guest_len: u32) -> String {
    guest::init_script(&format!(
        r#"BAR=
for d in /sys/bus/pci/devices/*; do
    [ "$(cat $d/vendor)" = 0x1af4 ] && [ "$(cat $d/device)" = 0x1110 ] && BAR=$d/resource2
done
[ -n "$BAR" ] || result "GUEST-DONE rc=none (no ivshmem device: $(ls /sys/bus/pci/devices))"
echo "GUEST-UP bar=$BAR size=$(stat -c %s $BAR)"
/bin/memnic testpmd -l 0 --vdev memnic0,path=$BAR,role=guest --forward-mode txonly --verify \
    --txpkts {guest_len} --tx-count {count} --rx-count {count} --json > /tmp/out 2> /tmp/err
rc=$?
[ $rc = 0 ] || cat /tmp/err
echo "GUEST-JSON $(grep '^{{' /tmp/out | tail -n 1)"
result "GUEST-DONE rc=$rc"
"#
    ))
}

/// Host sends full-size frames (1518 bytes) up, the guest minimum-size ones (64) down, each
/// `COUNT`; both sides verify every frame, and each got exactly what the other sent.
#[test]
fn poll_guest_in_qemu_exchanges_verified_frames_with_our_host_side_over_ivshmem() {
    let t0 = Instant::now();
    let memnic = guest::static_binary("memnic-cli", "memnic").unwrap_or_else(|e| panic!("{e}"));
    let kernel = guest::kernel().unwrap_or_else(|e| panic!("{e}"));
    let image = Image::new(&kernel, &init(COUNT, 64))
        .modules(&[])
        .file(
            "/bin/memnic",
            &std::fs::read(&memnic).expect("read the static memnic"),
            0o755,
        )
        .build("memnic-ivshmem")
        .unwrap_or_else(|e| panic!("{e}"));
    let prepared = t0.elapsed();

    let shm = ShmName::new("ivshmem");
    let count = COUNT.to_string();
    let host = common::testpmd(
        0,
        &format!("memnic0,path={},role=host", shm.name()),
        "txonly",
        &[
            "--verify",
            "--txpkts",
            "1518",
            "--tx-count",
            &count,
            "--rx-count",
            &count,
            "--json",
        ],
    );
    // QEMU would create a missing file itself: start it only on the host's finished region.
    common::wait_for_memnic_region(&shm.path(), Duration::from_secs(20));

    let t_qemu = Instant::now();
    let mut vm = Qemu::new(&kernel, &image)
        .cpu(1)
        .private_memory()
        .ivshmem("memnic", &shm.path(), (AREA_SIZE >> 20) as u32)
        .spawn();
    vm.wait_for_line("GUEST-UP", Duration::from_secs(60));
    let boot = t_qemu.elapsed();
    vm.wait_for_line("GUEST-DONE", Duration::from_secs(180));
    let run = t_qemu.elapsed();
    let console = vm.output();
    let _ = vm.wait(Duration::from_secs(10));
    let done = console_line(&console, "GUEST-DONE");
    assert_eq!(
        done,
        "GUEST-DONE rc=0",
        "the guest side failed:\n{console}\n----- host so far -----\n{}",
        host.output()
    );
    // The host has sent everything and received everything the guest sent: it ends by itself.
    let h = host.wait(Duration::from_secs(30));
    let said = format!(
        "----- guest console -----\n{console}\n----- host -----\n{}",
        String::from_utf8_lossy(&h.stderr)
    );
    assert!(h.status.success(), "the host side failed: {said}");
    let up = console_line(&console, "GUEST-UP");
    assert!(
        up.contains("/resource2 size=16777216"),
        "the guest's BAR2 is not the 16 MiB region: {up}"
    );
    let gj: serde_json::Value = serde_json::from_str(
        console_line(&console, "GUEST-JSON")
            .trim_start_matches("GUEST-JSON")
            .trim(),
    )
    .unwrap_or_else(|e| panic!("no JSON report from the guest ({e}): {said}"));
    let hj = json_of(&h);
    common::assert_exchanged_exactly(
        &hj["ports"][0],
        &gj["ports"][0],
        COUNT,
        &format!("host {hj}\nguest {gj}\n{said}"),
    );

    eprintln!("{up}");
    for (who, j) in [("host", &hj), ("guest", &gj)] {
        let p = &j["ports"][0];
        eprintln!(
            "{who}: tx={} rx={} good={} lost={} corrupted={} duplicated={} reordered={}",
            p["tx_packets"],
            p["rx_packets"],
            p["good"],
            p["lost"],
            p["corrupted"],
            p["duplicated"],
            p["reordered"]
        );
    }
    eprintln!(
        "static build and initramfs {prepared:.1?}; QEMU start to GUEST-UP (boot) {boot:.1?}; \
         to GUEST-DONE {run:.1?}; whole test {:.1?}",
        t0.elapsed()
    );
}

fn console_line<'a>(console: &'a str, tag: &str) -> &'a str {
    console
        .lines()
        .find(|l| l.contains(tag))
        .map_or("", |l| l.trim())
}
