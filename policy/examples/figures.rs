//! Prints the hit-ratio figure table (Markdown) for LRU, heat and Belady on the shared traces at 5%,
//! 10% and 20% of each trace's distinct blocks.
//!
//! Run from the workspace root: `cargo run --release -p policy --example figures [TRACE...]`.

use std::path::PathBuf;
use std::time::Instant;

use policy::{PolicyKind, Trace, replay};

fn main() -> Result<(), policy::PolicyError> {
    let data = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data"));
    let mut files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        files = vec![
            "conversation_trace_first6000.jsonl".into(),
            "synthetic_trace.jsonl".into(),
        ];
    }
    println!(
        "| trace | capacity | blocks | lru | heat | belady | heat gap closed | lru s | heat s | belady s | command |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for file in files {
        let trace = Trace::load(data.join(&file))?;
        let distinct = trace.distinct_blocks();
        for pct in [5, 10, 20] {
            let cap = distinct * pct / 100;
            let mut ratios = Vec::new();
            let mut secs = Vec::new();
            for kind in PolicyKind::ALL {
                // Benchmark harness: wall time is measured here, outside the library.
                #[allow(clippy::disallowed_methods)]
                let start = Instant::now();
                let r = replay(&trace, cap, kind);
                secs.push(start.elapsed().as_secs_f64());
                ratios.push(r.hit_ratio);
            }
            let closed = (ratios[1] - ratios[0]) / (ratios[2] - ratios[0]);
            println!(
                "| {file} | {pct}% | {cap} | {:.3} | {:.3} | {:.3} | {:.0}% | {:.2} | {:.2} | {:.2} | \
                 `te-bench replay --trace ../shared/data/{file} --capacity-blocks {cap} --policy lru\\|heat\\|belady --json` |",
                ratios[0],
                ratios[1],
                ratios[2],
                closed * 100.0,
                secs[0],
                secs[1],
                secs[2],
            );
        }
    }
    Ok(())
}
