//! Ablation of the continuation policy: hit ratio with each ingredient removed, on the shared traces at
//! 5%, 10% and 20% of each trace's distinct blocks, and the peak metadata of the full policy.
//!
//! Run from the workspace root: `cargo run --release -p cache-research --example ablation`.

use std::path::PathBuf;

use cache_research::replay::replay_continuation;
use policy::Trace;
use policy::continuation::{Continuation, ContinuationConfig, Metadata};
use transfer_engine::policy::BlockKey;

fn variants() -> Vec<(&'static str, ContinuationConfig)> {
    let full = ContinuationConfig::default();
    let mut no_output = full;
    no_output.use_output = false;
    let mut no_classes = full;
    no_classes.survival.classes = false;
    let mut no_tails = full;
    no_tails.tails_first = false;
    let mut no_boost = full;
    no_boost.shared_boost = 1.0;
    let mut bare = no_classes;
    bare.tails_first = false;
    bare.shared_boost = 1.0;
    vec![
        ("full (default)", full),
        ("without output length", no_output),
        ("without classes (one distribution)", no_classes),
        ("without tails first", no_tails),
        ("without shared-prefix boost", no_boost),
        ("age only (none of the three)", bare),
    ]
}

/// The largest metadata seen after any request's eviction.
fn peak_metadata(trace: &Trace, capacity: usize) -> Metadata {
    let mut cache = Continuation::new(capacity, ContinuationConfig::default());
    let mut peak = Metadata::default();
    for req in trace.requests() {
        let _hit = req
            .hash_ids
            .iter()
            .take_while(|id| cache.contains(BlockKey(**id)));
        cache.on_request(req);
        cache.evict_to_capacity();
        let m = cache.metadata();
        peak.blocks = peak.blocks.max(m.blocks);
        peak.groups = peak.groups.max(m.groups);
        peak.group_keys = peak.group_keys.max(m.group_keys);
        peak.requests = peak.requests.max(m.requests);
        peak.seen = peak.seen.max(m.seen);
    }
    peak
}

fn main() -> Result<(), policy::PolicyError> {
    let data = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/traces"));
    let files = [
        "conversation_trace_first6000.jsonl",
        "synthetic_trace.jsonl",
    ];
    let traces = files
        .iter()
        .map(|f| Trace::load(data.join(f)))
        .collect::<Result<Vec<_>, _>>()?;
    println!("| variant | conv 5% | conv 10% | conv 20% | synth 5% | synth 10% | synth 20% |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (name, cfg) in variants() {
        let mut cells = Vec::new();
        for trace in &traces {
            for pct in [5, 10, 20] {
                let cap = trace.distinct_blocks() * pct / 100;
                let hits = replay_continuation(trace, cap, cfg);
                cells.push(format!("{:.3}", hits as f64 / trace.total_blocks() as f64));
            }
        }
        println!("| {name} | {} |", cells.join(" | "));
    }
    println!();
    println!("| trace | capacity | blocks | groups | group keys | requests | seen keys |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (file, trace) in files.iter().zip(&traces) {
        for pct in [5, 10, 20] {
            let cap = trace.distinct_blocks() * pct / 100;
            let m = peak_metadata(trace, cap);
            println!(
                "| {file} | {cap} | {} | {} | {} | {} | {} |",
                m.blocks, m.groups, m.group_keys, m.requests, m.seen
            );
        }
    }
    Ok(())
}
