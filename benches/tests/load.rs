//! Several client processes against one server process, each moving its own byte pattern, every session
//! checked by the server against its client's pattern on arrival.

mod common;

use common::{te_bench_json, te_bench_json_rows};

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

#[test]
fn honest_clients_beside_each_attacker_all_land_their_bytes() {
    let rows = te_bench_json_rows(&[
        "load",
        "--clients",
        "2",
        "--total-bytes",
        "8MiB",
        "--iterations",
        "3",
        "--attackers",
        "none,flood,lanes,takeover,half-open,data-flood",
        "--json",
    ]);
    let attackers: Vec<&str> = rows.iter().filter_map(|r| r["attacker"].as_str()).collect();
    assert_eq!(
        attackers,
        [
            "none",
            "flood",
            "lanes",
            "takeover",
            "half-open",
            "data-flood"
        ]
    );
    for row in &rows {
        println!("{row}");
        assert_eq!(row["failed_clients"].as_u64(), Some(0), "{row}");
        // No session ever holds other bytes than its client's. Beside a takeover, a session of a
        // client that has just left may go unchecked (the claim frees its region), never lost: the
        // client itself reports no block to recompute.
        assert_eq!(row["mismatched"].as_u64(), Some(0), "{row}");
        assert_eq!(row["recompute_blocks"].as_u64(), Some(0), "{row}");
        let checked =
            row["verified"].as_u64().unwrap_or(0) + row["not_checked"].as_u64().unwrap_or(0);
        assert_eq!(checked, 8, "{row}");
        if row["attacker"] != "takeover" {
            assert_eq!(row["verified"].as_u64(), Some(8), "{row}");
        }
        assert!(
            row["gbps_vs_alone"].is_number() || row["attacker"] == "none",
            "{row}"
        );
    }
    // Each attacker really attacked: the floods wrote frames, the lane taker was refused at its address's
    // limit, the takeover tried the honest ids, the half-open connections were made.
    let notes = |i: usize| rows[i]["notes"].as_str().unwrap_or_default().to_string();
    assert!(!notes(1).starts_with("0 frames"), "{}", notes(1));
    assert!(
        notes(2).contains("the most this node allows one address"),
        "{}",
        notes(2)
    );
    assert!(
        !notes(3).starts_with("0 admitted, 0 refused"),
        "{}",
        notes(3)
    );
    let half_open: u64 = notes(4)
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(half_open >= 100, "{}", notes(4));
    // The data flood wrote Data frames into its own region; its session's verdict is not counted.
    assert!(!notes(5).starts_with("0 frames"), "{}", notes(5));
}
