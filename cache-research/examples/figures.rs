//! Prints the hit-ratio figure table (Markdown) for every policy on the shared traces at 5%, 10% and
//! 20% of each trace's distinct blocks, with each policy's replay cost per request.
//!
//! Run from the workspace root: `cargo run --release -p cache-research --example figures [TRACE...]`.

use std::path::PathBuf;
use std::time::Instant;

use cache_research::{PolicyKind, replay};
use policy::Trace;

fn main() -> Result<(), policy::PolicyError> {
    let data = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/traces"));
    let mut files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        files = vec![
            "conversation_trace_first6000.jsonl".into(),
            "synthetic_trace.jsonl".into(),
        ];
    }
    let names: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
    println!("| trace | capacity | blocks | {} |", names.join(" | "));
    println!("|{}", " --- |".repeat(3 + names.len()));
    let mut costs = Vec::new();
    for file in files {
        let trace = Trace::load(data.join(&file))?;
        let distinct = trace.distinct_blocks();
        for pct in [5, 10, 20] {
            let cap = distinct * pct / 100;
            let mut cells = Vec::new();
            let mut ns = Vec::new();
            for kind in PolicyKind::ALL {
                // Benchmark harness: wall time is measured here, outside the library.
                #[allow(clippy::disallowed_methods)]
                let start = Instant::now();
                let r = replay(&trace, cap, kind);
                let per_request = start.elapsed().as_secs_f64() * 1e9 / r.requests.max(1) as f64;
                cells.push(format!("{:.3}", r.hit_ratio));
                ns.push(format!("{per_request:.0}"));
            }
            println!("| {file} | {pct}% | {cap} | {} |", cells.join(" | "));
            costs.push(format!("| {file} | {pct}% | {} |", ns.join(" | ")));
        }
    }
    println!();
    println!("Replay cost, ns per request:");
    println!();
    println!("| trace | capacity | {} |", names.join(" | "));
    println!("|{}", " --- |".repeat(2 + names.len()));
    for row in costs {
        println!("{row}");
    }
    Ok(())
}
