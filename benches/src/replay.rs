//! `te-bench replay`: a Mooncake-format trace replayed against a cache policy, scored by prefix hit ratio.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use policy::{PolicyKind, Trace};

use crate::report::print_rows;

/// Arguments of `te-bench replay`.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// Trace file: JSON lines with `timestamp` (ms), `input_length`, `output_length` (tokens) and
    /// `hash_ids` (one id per 512-token prefix block).
    #[arg(long)]
    trace: PathBuf,
    /// Cache capacity in blocks. Omit to run 5%, 10% and 20% of the trace's distinct blocks.
    #[arg(long)]
    capacity_blocks: Vec<usize>,
    /// Policy: lru (the incumbent), s3fifo, lirs, arc, wtinylfu (classic baselines), heat (the heat
    /// scorer and tier manager), continuation (the conversation-continuation index), tier-continuation
    /// (the same index as the tier manager's GPU-tier order), belady (the offline optimum). Repeat or
    /// omit to run them all.
    #[arg(long)]
    policy: Vec<PolicyKind>,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) fn main(args: &ReplayArgs) -> anyhow::Result<()> {
    let trace =
        Trace::load(&args.trace).with_context(|| format!("loading {}", args.trace.display()))?;
    let capacities = if args.capacity_blocks.is_empty() {
        [5, 10, 20]
            .iter()
            .map(|pct| trace.distinct_blocks() * pct / 100)
            .collect()
    } else {
        args.capacity_blocks.clone()
    };
    let policies = if args.policy.is_empty() {
        PolicyKind::ALL.to_vec()
    } else {
        args.policy.clone()
    };
    let mut rows = Vec::new();
    for &capacity in &capacities {
        for &kind in &policies {
            let start = Instant::now();
            let report = policy::replay(&trace, capacity, kind);
            rows.push(report.with_seconds(start.elapsed().as_secs_f64()));
        }
    }
    print_rows(
        &rows,
        args.json,
        &[
            "trace",
            "policy",
            "capacity_blocks",
            "requests",
            "blocks",
            "hit_blocks",
            "hit_ratio",
            "seconds",
        ],
    )
}
