//! Token-bucket accuracy: `transfer_engine::TokenBucket` driven with a hand-stepped clock at 100 MB/s to
//! 25 GB/s; achieved rate over configured.

use std::time::{Duration, Instant};

use serde::Serialize;
use transfer_engine::{DEFAULT_CELL_BYTES, TokenBucket};

use crate::report::print_rows;

/// Configured rates, bytes per second.
const RATES: [u64; 4] = [100_000_000, 1_000_000_000, 10_000_000_000, 25_000_000_000];

/// Unit sizes sent through the bucket: a small slice, the default slice, a 1 MiB exclusive block.
const UNITS: [u64; 3] = [4096, 64 << 10, 1 << 20];

/// Columns of the human table.
const COLUMNS: &[&str] = &[
    "rate_mb_s",
    "unit_bytes",
    "achieved_mb_s",
    "ratio",
    "error_pct",
];

/// One rate and unit.
#[derive(Debug, Serialize)]
struct Row {
    rate_mb_s: f64,
    unit_bytes: u64,
    achieved_mb_s: f64,
    ratio: f64,
    error_pct: f64,
}

/// Sends `unit` bytes whenever the bucket allows, after its initial burst, for at least 0.5 s of virtual
/// time and 1,000 units; returns the sustained rate in bytes per second.
fn achieved(rate: u64, unit: u64) -> anyhow::Result<f64> {
    let burst = 16 * unit.max(DEFAULT_CELL_BYTES);
    let mut bucket = TokenBucket::new(rate, burst, DEFAULT_CELL_BYTES)?;
    let mut now = Instant::now();
    while bucket.ready_at(now).is_none() {
        bucket.charge(now, unit);
    }
    let seconds = 0.5f64.max(1000.0 * unit as f64 / rate as f64);
    let start = now;
    let end = start + Duration::from_secs_f64(seconds);
    let mut sent = 0u64;
    while now < end {
        match bucket.ready_at(now) {
            None => {
                bucket.charge(now, unit);
                sent += unit;
            }
            Some(at) => now = at,
        }
    }
    Ok(sent as f64 / (now - start).as_secs_f64())
}

/// Prints achieved over configured rate for each rate and unit; with `json`, one JSON object.
pub(crate) fn main(json: bool) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for rate in RATES {
        for unit in UNITS {
            let got = achieved(rate, unit)?;
            rows.push(Row {
                rate_mb_s: rate as f64 / 1e6,
                unit_bytes: unit,
                achieved_mb_s: got / 1e6,
                ratio: got / rate as f64,
                error_pct: (got / rate as f64 - 1.0) * 100.0,
            });
        }
    }
    let worst = rows.iter().map(|r| r.error_pct.abs()).fold(0.0, f64::max);
    if json {
        let out = serde_json::json!({ "bucket_max_error_pct": worst, "rows": rows });
        println!("{out}");
        return Ok(());
    }
    print_rows(&rows, false, COLUMNS)?;
    println!("worst error: {worst:.3}% (aim: within 2%)");
    Ok(())
}
