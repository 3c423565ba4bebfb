//! `te-bench run --backend rdma` moves bytes over libfabric's shm provider and reports the provider's own
//! ceiling beside the machine's limit (feature `rdma`).
#![cfg(feature = "rdma")]

mod common;

use common::te_bench_json;

#[test]
fn run_over_shm_reports_both_limits() {
    let v = te_bench_json(&[
        "run",
        "--backend",
        "rdma",
        "--provider",
        "shm",
        "--mode",
        "exclusive",
        "--block-bytes",
        "256KiB",
        "--total-bytes",
        "16MiB",
        "--iterations",
        "1",
        "--json",
    ]);
    for key in [
        "gbps",
        "limit_gbps",
        "ratio",
        "provider_limit_gbps",
        "provider_ratio",
        "recompute_blocks",
    ] {
        assert!(v[key].is_number(), "{key} missing in {v}");
    }
    assert_eq!(v["backend"], "rdma");
    assert_eq!(v["provider"], "shm");
    assert_eq!(v["recompute_blocks"], 0);
    assert!(v["gbps"].as_f64().unwrap() > 0.0, "{v}");
}

/// `--provider auto-local` chooses for a peer on this host: here (no efa, no verbs) libfabric's shm.
#[test]
fn auto_local_chooses_shm_on_a_machine_without_a_nic() {
    let v = te_bench_json(&[
        "run",
        "--backend",
        "rdma",
        "--provider",
        "auto-local",
        "--mode",
        "exclusive",
        "--block-bytes",
        "64KiB",
        "--total-bytes",
        "4MiB",
        "--iterations",
        "1",
        "--json",
    ]);
    assert_eq!(v["provider"], "shm", "{v}");
    assert_eq!(v["recompute_blocks"], 0, "{v}");
}

/// libfabric's `shm` names an endpoint's region `/dev/shm/PID:DOMAIN:ENDPOINT` and maps an existing file
/// of that name. A file left by an earlier process with the same PID (one killed, or whose parked
/// endpoints were never closed) made the next process's node fail ("Device or resource busy", seen in
/// CI) or crash with SIGBUS (an empty file). A node now clears its own PID's files before its first
/// endpoint: here te-bench starts as the PID of a shell that has just left such a file.
#[test]
fn a_stale_shm_file_under_the_same_pid_is_cleared_not_mapped() {
    let script = r#": > "/dev/shm/$$:0:0" && exec "$0" run --backend rdma --provider shm --mode exclusive --block-bytes 64KiB --total-bytes 4MiB --iterations 1 --json"#;
    let out = std::process::Command::new("bash")
        .args(["-c", script, env!("CARGO_BIN_EXE_te-bench")])
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "te-bench over shm, beside a stale file of its PID: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or(""),
    )
    .unwrap();
    assert_eq!(v["recompute_blocks"], 0, "{v}");
}
