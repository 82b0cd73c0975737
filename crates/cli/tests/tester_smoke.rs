//! The memnic tester end to end: it runs, prints a table, and `--json` rows carry the fields
//! scripts read. Bad input gets one sentence and exit code 2. Polling test: serial group.

mod common;

use common::memnic;

#[test]
fn poll_tester_json_rows_for_every_variant_and_size() {
    let out = memnic(&[
        "tester",
        "--compare",
        "--sizes",
        "64,1518",
        "--jumbo",
        "--trials",
        "2",
        "--duration-ms",
        "40",
        "--warmup-ms",
        "10",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    let rows = rows.as_array().expect("an array of rows");
    assert_eq!(rows.len(), 9, "3 variants x 3 sizes");
    for v in ["2014-before", "2014-after", "memnic"] {
        for s in [64, 1518, 4088] {
            let r = rows
                .iter()
                .find(|r| r["variant"] == v && r["size"] == s)
                .unwrap_or_else(|| panic!("row {v} {s} missing"));
            let mpps = r["mpps"].as_f64().unwrap();
            assert!(mpps > 0.0, "{v} {s}: no packets moved");
            assert!(
                r["mpps_min"].as_f64().unwrap() <= mpps && mpps <= r["mpps_max"].as_f64().unwrap()
            );
            assert!(
                r["tx_mpps"].as_f64().unwrap() > 0.0,
                "{v} {s}: nothing transmitted"
            );
            assert_eq!(r["trials"], 2);
        }
    }
}

#[test]
fn poll_tester_table_and_directions() {
    let out = memnic(&[
        "tester",
        "--sizes",
        "128",
        "--trials",
        "1",
        "--duration-ms",
        "30",
        "--warmup-ms",
        "10",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("size") && text.contains("rx Mpps"), "{text}");
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("128 |")),
        "{text}"
    );
    for (dir, field) in [("rx", "tx_mpps"), ("tx", "mpps")] {
        let out = memnic(&[
            "tester",
            "--direction",
            dir,
            "--sizes",
            "64",
            "--trials",
            "1",
            "--duration-ms",
            "30",
            "--json",
        ]);
        assert!(out.status.success());
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // Receive-only transmits nothing and transmit-only receives nothing.
        assert_eq!(rows[0][field].as_f64().unwrap(), 0.0, "{dir}");
    }
}

#[test]
fn bad_tester_input_is_one_sentence() {
    for (args, needle) in [
        (
            &["tester", "--variant", "fast"][..],
            "unknown variant 'fast'",
        ),
        (
            &["tester", "--sizes", "9000"][..],
            "frame size 9000 is outside 60..=4088",
        ),
        (&["tester", "--burst", "0"][..], "burst size 0 is outside"),
        (
            &["tester", "--trials", "0"][..],
            "--trials must be at least 1",
        ),
        (
            &["tester", "--host-cpu", "4000"][..],
            "CPU 4000 is not available",
        ),
        (
            &["tester", "--host-cpu", "0", "--pmd-cpu", "0"][..],
            "must differ",
        ),
        (
            &["tester", "--direction", "up"][..],
            "unknown direction 'up'",
        ),
    ] {
        let out = memnic(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "{args:?}: {err}"
        );
    }
}
