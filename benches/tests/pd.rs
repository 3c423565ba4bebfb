//! `te-bench pd` runs prefill and decode as two processes and reports every figure the issue names, with
//! no block of an old weight version served after the change.

mod common;

use common::te_bench_json;

#[test]
fn pd_reports_ttft_hit_rate_and_no_stale_blocks() {
    check_pd(&[]);
}

/// The same run with the connector over RDMA (libfabric's shm provider between the two processes):
/// the same keys and the same guarantees.
#[cfg(feature = "rdma")]
#[test]
fn pd_over_rdma_shm_reports_the_same_keys() {
    // The RDMA tests' rule: "not run" only where libfabric lists no shm provider.
    let listed = backends::rdma::available_providers()
        .expect("libfabric is linked, so fi_getinfo answers")
        .iter()
        .any(|p| p.provider == "shm");
    if !listed {
        println!("not run: libfabric lists no shm provider here");
        return;
    }
    let v = check_pd(&["--backend", "rdma", "--provider", "shm"]);
    assert_eq!(v["backend"], "rdma");
    assert_eq!(v["provider"], "shm");
}

fn check_pd(backend: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "pd",
        "--requests",
        "12",
        "--layers",
        "4",
        "--max-trace-blocks",
        "2",
        "--compute-us",
        "20",
        "--json",
    ];
    args.extend_from_slice(backend);
    let v = te_bench_json(&args);
    for key in [
        "ttft_ms_engine",
        "ttft_ms_recompute",
        "hit_rate",
        "bytes_loaded",
        "peak_buffer_bytes",
        "stale_blocks_served",
        "streamed_loads",
    ] {
        assert!(v[key].is_number(), "{key} missing in {v}");
    }
    assert_eq!(v["requests"], 12);
    // By default the decode asks as soon as the prefill saved layer 0 (how many loads catch layers still
    // being saved depends on timing; the connector's tests check the streaming itself).
    assert_eq!(v["sequential"], false);
    assert_eq!(v["stale_blocks_served"], 0);
    assert_eq!(v["wrong_blocks"], 0);
    assert_eq!(v["weight_change_at"], 6);
    // The decode loaded what the prefill saved, including after the weight change.
    assert!(v["hit_rate"].as_f64().unwrap() > 0.5, "{v}");
    assert!(v["bytes_loaded"].as_u64().unwrap() > 0);
    assert!(v["loaded_blocks_after_change"].as_u64().unwrap() > 0, "{v}");
    assert!(v["ttft_ms_engine"].as_f64().unwrap() > 0.0);
    v
}
