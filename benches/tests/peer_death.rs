//! A real `te-bench serve` process killed mid-transfer: the sender reports recompute because the peer is
//! unreachable (its lanes gone, redialing refused), long before the transfer's own deadline.

use std::process::Command;

#[test]
fn killing_a_real_server_mid_transfer_is_reported_promptly_as_unreachable() {
    let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args([
            "peer-death",
            "--runs",
            "1",
            "--total-bytes",
            "256MiB",
            "--json",
        ])
        .output()
        .expect("running te-bench peer-death");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "te-bench peer-death failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: serde_json::Value = stdout
        .lines()
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .expect("one JSON object per run");
    println!("{run}");
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("is unreachable"), "{reason}");
    assert!(run["recompute_blocks"].as_u64().unwrap_or(0) > 0);
    // Prompt means the unreachable path, not the deadline: far below the 30 s the transfer was given.
    let (report, deadline) = (run["report_ms"].as_f64(), run["deadline_ms"].as_f64());
    assert!(
        matches!((report, deadline), (Some(r), Some(d)) if r < d / 3.0),
        "{report:?} ms against a deadline of {deadline:?} ms"
    );
}
