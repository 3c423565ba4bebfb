//! `te-bench replay`: a Mooncake-format trace replayed against a cache policy, scored by prefix hit ratio.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use cache_research::PolicyKind;
use clap::Args;
use policy::Trace;

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
    /// Replay host memory with a disk tier below it instead (the connector's store): disk sizes, in
    /// percent of the trace's distinct blocks (e.g. 50). Each runs beside host memory alone.
    #[arg(long, value_delimiter = ',')]
    disk_pct: Vec<usize>,
    /// Host memory with `--disk-pct`, in percent of the trace's distinct blocks.
    #[arg(long, default_value_t = 5)]
    host_pct: usize,
    /// Admission rules to run with `--disk-pct`: requests that must have used a host victim for it to
    /// go to disk.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    admission: Vec<u32>,
}

pub(crate) fn main(args: &ReplayArgs) -> anyhow::Result<()> {
    let trace =
        Trace::load(&args.trace).with_context(|| format!("loading {}", args.trace.display()))?;
    if !args.disk_pct.is_empty() {
        return host_and_disk(args, &trace);
    }
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
            let report = cache_research::replay(&trace, capacity, kind);
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

/// `--disk-pct`: host memory alone, then with each disk size and admission rule.
fn host_and_disk(args: &ReplayArgs, trace: &Trace) -> anyhow::Result<()> {
    let pct = |p: usize| trace.distinct_blocks() * p / 100;
    let host = pct(args.host_pct);
    let mut rows = vec![cache_research::replay_host_disk(trace, host, 0, 1)?];
    for &disk in &args.disk_pct {
        for &admission in &args.admission {
            rows.push(cache_research::replay_host_disk(
                trace,
                host,
                pct(disk),
                admission,
            )?);
        }
    }
    if !args.json {
        println!(
            "Host memory ({}% of the distinct blocks) alone, then with a disk tier below it; hits by where \
             the block was. admission = requests that must have used a host victim for it to go to disk.",
            args.host_pct
        );
    }
    print_rows(
        &rows,
        args.json,
        &[
            "trace",
            "host_blocks",
            "disk_blocks",
            "demote_min_sharers",
            "hit_ratio",
            "host_hit_ratio",
            "disk_hit_ratio",
            "disk_writes",
            "hits_per_write",
        ],
    )
}
