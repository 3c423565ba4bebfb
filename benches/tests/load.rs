//! Several client processes against one server process, each moving its own byte pattern, every session
//! checked by the server against its client's pattern on arrival.

mod common;

use common::te_bench_json;

#[test]
fn concurrent_client_processes_each_land_their_own_bytes() {
    let row = te_bench_json(&[
        "load",
        "--clients",
        "4",
        "--total-bytes",
        "16MiB",
        "--iterations",
        "1",
        "--json",
    ]);
    println!("{row}");
    assert_eq!(row["transfers"].as_u64(), Some(8));
    assert_eq!(row["verified"].as_u64(), Some(8), "{row}");
    assert_eq!(row["mismatched"].as_u64(), Some(0), "{row}");
    // The server holds the clients' regions (4 x 16 MiB) and not much more.
    let peak = row["server_peak_mib"].as_f64().unwrap_or(f64::MAX);
    assert!(peak < 64.0 + 256.0, "server peak {peak} MiB");
}
