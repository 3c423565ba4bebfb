//! Several client processes against one server process, each moving its own byte pattern, every session
//! checked by the server against its client's pattern on arrival.

use std::process::Command;

#[test]
fn concurrent_client_processes_each_land_their_own_bytes() {
    let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args([
            "load",
            "--clients",
            "4",
            "--total-bytes",
            "16MiB",
            "--iterations",
            "1",
            "--json",
        ])
        .output()
        .expect("running te-bench load");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "te-bench load failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("one JSON object");
    println!("{row}");
    assert_eq!(row["transfers"].as_u64(), Some(8));
    assert_eq!(row["verified"].as_u64(), Some(8), "{row}");
    assert_eq!(row["mismatched"].as_u64(), Some(0), "{row}");
    // The server holds the clients' regions (4 x 16 MiB) and not much more.
    let peak = row["server_peak_mib"].as_f64().unwrap_or(f64::MAX);
    assert!(peak < 64.0 + 256.0, "server peak {peak} MiB");
}
