//! `te-bench run --backend tcp` moves bytes between two TCP nodes and reports them beside the socket copy.

use std::process::Command;

#[test]
fn run_over_tcp_reports_throughput_beside_the_socket_copy() {
    let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args([
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
    for key in ["gbps", "limit_gbps"] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    let ratio = v["gbps"].as_f64().unwrap() / v["limit_gbps"].as_f64().unwrap();
    assert!((v["ratio"].as_f64().unwrap() - ratio).abs() < 1e-9, "{v}");
    assert_eq!(v["backend"], "tcp");
    assert_eq!(v["recompute_blocks"], 0);
}
