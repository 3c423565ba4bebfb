//! The disk tier from outside: killed mid-write again and again, filled past a file size limit, and
//! measured (each field `te-bench disk --json` promises is there).

mod common;

use std::process::Command;

use common::te_bench_json;

#[test]
fn a_tier_killed_mid_write_serves_every_block_written_and_no_other() {
    for seed in ["11", "12"] {
        let row = te_bench_json(&[
            "disk",
            "--crash-test",
            "--crashes",
            "15",
            "--seed",
            seed,
            "--json",
        ]);
        println!("{row}");
        assert_eq!(row["crashes"].as_u64(), Some(15), "seed {seed}: {row}");
        assert_eq!(
            row["corrupt_served"].as_u64(),
            Some(0),
            "seed {seed}: {row}"
        );
        assert_eq!(row["missing"].as_u64(), Some(0), "seed {seed}: {row}");
        assert!(
            row["blocks_written"].as_u64() > Some(0),
            "seed {seed}: {row}"
        );
        assert!(
            row["blocks_recovered"].as_u64() > Some(0),
            "seed {seed}: {row}"
        );
    }
}

#[test]
fn a_full_disk_fails_writes_with_a_count_and_the_tier_serves_what_was_written() {
    // A 16 MiB file size limit (SIGXFSZ ignored, so a write past it fails with EFBIG) under a 64-block
    // tier of 1 MiB blocks.
    let dir = std::env::temp_dir().join(format!("kv-disk-full-{}", std::process::id()));
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"trap '' XFSZ; ulimit -f 16384; exec "$0" disk --fill --dir "$1" --json"#)
        .arg(env!("CARGO_BIN_EXE_te-bench"))
        .arg(&dir)
        .output()
        .expect("running bash");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    println!("{row}");
    let n = |f: &str| row[f].as_u64().unwrap_or(u64::MAX);
    assert!(n("written") > 0 && n("written") < 16, "{row}");
    assert_eq!(n("disk_full"), 64 - n("written"), "{row}");
    assert_eq!(n("served"), n("written"), "{row}");
    assert_eq!(n("missing"), n("disk_full"), "{row}");
    assert_eq!(n("corrupt_served"), 0, "{row}");
    assert!(
        row["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("File too large")),
        "{row}"
    );
}

#[test]
fn te_bench_disk_prints_throughput_beside_the_plain_file_limits() {
    let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args([
            "disk",
            "--bytes",
            "8MiB",
            "--block-sizes",
            "256KiB,4MiB",
            "--json",
        ])
        .output()
        .expect("running te-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let not_run = stdout.lines().filter(|l| l.starts_with("not run")).count();
    assert_eq!(rows.len() + not_run, 4, "{stdout}");
    for row in &rows {
        for f in [
            "write_gbps",
            "read_gbps",
            "write_limit_gbps",
            "read_limit_gbps",
        ] {
            let v = row[f].as_f64().unwrap_or(-1.0);
            assert!(v.is_finite() && v > 0.0, "{f}: {row}");
        }
        assert!(
            ["buffered", "direct"].contains(&row["io"].as_str().unwrap_or("")),
            "{row}"
        );
    }
}
