//! `te-bench run --backend tcp` moves bytes between two TCP nodes and reports them beside the socket copy;
//! `--layout` moves them between strided layouts on either backend.

mod common;

use common::te_bench_json;

#[test]
fn run_over_tcp_reports_throughput_beside_the_socket_copy() {
    let v = te_bench_json(&[
        "run",
        "--backend",
        "tcp",
        "--mode",
        "packetized",
        "--block-bytes",
        "256KiB",
        "--total-bytes",
        "16MiB",
        "--iterations",
        "1",
        "--json",
    ]);
    for key in ["gbps", "limit_gbps"] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    let ratio = v["gbps"].as_f64().unwrap() / v["limit_gbps"].as_f64().unwrap();
    assert!((v["ratio"].as_f64().unwrap() - ratio).abs() < 1e-9, "{v}");
    assert_eq!(v["backend"], "tcp");
    assert_eq!(v["recompute_blocks"], 0);
}

#[test]
fn run_moves_and_checks_blocks_between_strided_layouts() {
    for backend in ["loopback", "tcp"] {
        for layout in ["block-major", "kv-apart", "layer-to-block"] {
            // te-bench checks every block on arrival and fails the run if one differs.
            let v = te_bench_json(&[
                "run",
                "--backend",
                backend,
                "--mode",
                "auto",
                "--layout",
                layout,
                "--block-bytes",
                "64KiB",
                "--total-bytes",
                "8MiB",
                "--iterations",
                "1",
                "--json",
            ]);
            assert_eq!(v["layout"], layout, "{v}");
            assert_eq!(v["backend"], backend, "{v}");
            assert_eq!(v["recompute_blocks"], 0, "{v}");
            assert!(v["gbps"].as_f64().is_some_and(|x| x > 0.0), "{v}");
        }
    }
}
