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
