//! `te-bench run --backend rdma` moves bytes over libfabric's shm provider and reports the provider's own
//! ceiling beside the machine's limit (feature `rdma`).
#![cfg(feature = "rdma")]

use std::process::Command;

#[test]
fn run_over_shm_reports_both_limits() {
    let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args([
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
        ])
        .output()
        .expect("running te-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
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
