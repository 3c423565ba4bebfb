//! `te-bench contention`: a periodic collective beside a bulk KV transfer on one simulated link (virtual
//! time). Collective latency alone, beside KV under strict priority with the engine's KV cap, and beside
//! KV in one plain FIFO queue; KV goodput in each.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use fabric_sim::{
    CollectiveFlow, ContentionConfig, ContentionReport, LinkConfig, QueueDiscipline, Sharing,
};
use serde::Serialize;

use crate::args::parse_size;
use crate::report::print_rows;

/// Arguments of `te-bench contention`. The KV transfer is 32 layers of 256 KiB blocks, packetized in
/// 64 KiB slices; the link has 5 us of propagation delay each way and a 4 MiB queue (per class under
/// strict priority); acknowledgements travel back on a link of the same speed.
#[derive(Debug, Args)]
pub(crate) struct ContentionArgs {
    /// Seed of every random choice (the same seed replays the run exactly); defaults to $FABRIC_SEED,
    /// else 1.
    #[arg(long)]
    seed: Option<u64>,
    /// Link bandwidth, in Gbit/s (200 Gbit/s = 25 GB/s).
    #[arg(long, default_value_t = 200.0)]
    link_gbit: f64,
    /// KV bytes moved, with a unit (a multiple of 8 MiB: 32 layers x 256 KiB blocks).
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    kv_bytes: u64,
    /// Bytes of one collective operation (an all-reduce message), with a unit.
    #[arg(long, value_parser = parse_size, default_value = "256KiB")]
    collective_bytes: u64,
    /// Time between two collective operations, in microseconds.
    #[arg(long, default_value_t = 500)]
    collective_period_us: u64,
    /// Bytes per collective packet, with a unit.
    #[arg(long, value_parser = parse_size, default_value = "64KiB")]
    collective_packet_bytes: u64,
    /// Collective operations measured alone (beside KV, every operation issued while KV moves).
    #[arg(long, default_value_t = 200)]
    ops_alone: u64,
    /// The engine's KV cap as a share of the link, from 0 (exclusive) to 1, where KV is capped.
    #[arg(long, default_value_t = 0.4)]
    kv_share: f64,
    /// Segment size of the strict-priority link, in bytes: a collective packet waits for at most one
    /// segment of KV already on the wire.
    #[arg(long, value_parser = parse_size, default_value = "4KiB")]
    mtu: u64,
    /// Longest a lower class waits under strict priority before it gets one frame, in microseconds.
    #[arg(long, default_value_t = 5000)]
    max_starvation_us: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Columns of the human table.
const COLUMNS: &[&str] = &[
    "sharing",
    "collective_ops",
    "collective_p50_us",
    "collective_p99_us",
    "collective_max_us",
    "p99_inflation",
    "kv_gbps",
    "kv_link_share",
    "kv_ms",
    "kv_intact",
];

/// One row of the table: a run and its p99 over the collective's p99 alone.
#[derive(Debug, Serialize)]
struct Row {
    #[serde(flatten)]
    run: ContentionReport,
    p99_inflation: f64,
}

/// The JSON summary: the headline figures, then every run.
#[derive(Debug, Serialize)]
struct Summary {
    seed: u64,
    link_gbit: f64,
    kv_bytes: u64,
    collective_bytes: u64,
    collective_period_us: u64,
    kv_share: f64,
    collective_p50_us_alone: f64,
    collective_p99_us_alone: f64,
    collective_p50_us_priority: f64,
    collective_p99_us_priority: f64,
    collective_p50_us_fifo: f64,
    collective_p99_us_fifo: f64,
    p99_inflation_priority: f64,
    p99_inflation_fifo: f64,
    kv_gbps_priority: f64,
    kv_gbps_fifo: f64,
    runs: Vec<Row>,
}

/// Runs the collective alone and beside KV in every sharing, and prints the figures.
pub(crate) fn main(args: &ContentionArgs) -> anyhow::Result<()> {
    let seed = match args.seed {
        Some(seed) => seed,
        None => fabric_sim::seed_from_env(1)?,
    };
    let cfg = config(args, seed)?;
    let mut rows = Vec::new();
    for sharing in Sharing::ALL {
        let run = cfg
            .run(sharing, Instant::now())
            .with_context(|| format!("contention ({}) with seed {seed}", sharing.name()))?;
        rows.push(run);
    }
    let alone_p99 = rows[0].collective_p99_us;
    let rows: Vec<Row> = rows
        .into_iter()
        .map(|run| Row {
            p99_inflation: run.collective_p99_us / alone_p99,
            run,
        })
        .collect();
    let find = |name: &str| {
        rows.iter()
            .find(|r| r.run.sharing == name)
            .expect("every sharing ran")
    };
    let (alone, priority, fifo) = (find("alone"), find("priority"), find("fifo"));
    let summary = Summary {
        seed,
        link_gbit: args.link_gbit,
        kv_bytes: args.kv_bytes,
        collective_bytes: args.collective_bytes,
        collective_period_us: args.collective_period_us,
        kv_share: args.kv_share,
        collective_p50_us_alone: alone.run.collective_p50_us,
        collective_p99_us_alone: alone.run.collective_p99_us,
        collective_p50_us_priority: priority.run.collective_p50_us,
        collective_p99_us_priority: priority.run.collective_p99_us,
        collective_p50_us_fifo: fifo.run.collective_p50_us,
        collective_p99_us_fifo: fifo.run.collective_p99_us,
        p99_inflation_priority: priority.p99_inflation,
        p99_inflation_fifo: fifo.p99_inflation,
        kv_gbps_priority: priority.run.kv_gbps,
        kv_gbps_fifo: fifo.run.kv_gbps,
        runs: Vec::new(),
    };
    if args.json {
        let summary = Summary {
            runs: rows,
            ..summary
        };
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    println!(
        "collective: {} every {} us over a {} Gbit/s link; KV: {} MiB, capped at {:.0}% of the link where \
         capped (seed {seed})",
        crate::args::fmt_size(args.collective_bytes),
        args.collective_period_us,
        args.link_gbit,
        args.kv_bytes >> 20,
        args.kv_share * 100.0
    );
    print_rows(&rows, false, COLUMNS)?;
    println!(
        "collective p99 inflation: {:.3}x with priority + cap, {:.3}x with FIFO; KV {:.2} GB/s with \
         priority + cap, {:.2} GB/s with FIFO",
        summary.p99_inflation_priority,
        summary.p99_inflation_fifo,
        summary.kv_gbps_priority,
        summary.kv_gbps_fifo
    );
    Ok(())
}

/// The simulation settings the flags describe.
fn config(args: &ContentionArgs, seed: u64) -> anyhow::Result<ContentionConfig> {
    let layers = 32u32;
    let block_bytes = 256u64 << 10;
    let per_block_row = u64::from(layers) * block_bytes;
    if args.kv_bytes == 0 || !args.kv_bytes.is_multiple_of(per_block_row) {
        bail!(
            "--kv-bytes must be a positive multiple of 8 MiB (32 layers x 256 KiB blocks), such as 1GiB"
        );
    }
    if !(args.kv_share > 0.0 && args.kv_share <= 1.0) {
        bail!("--kv-share {} must be in (0, 1]", args.kv_share);
    }
    if !args.link_gbit.is_finite() || args.link_gbit <= 0.0 {
        bail!("--link-gbit must be a positive number of Gbit/s, such as 200");
    }
    if args.collective_bytes == 0
        || args.collective_packet_bytes == 0
        || args.collective_period_us == 0
    {
        bail!(
            "--collective-bytes, --collective-packet-bytes and --collective-period-us must be positive"
        );
    }
    let mtu = u32::try_from(args.mtu).ok().filter(|m| *m > 0);
    let Some(mtu) = mtu else {
        bail!("--mtu must be between 1 byte and 4 GiB");
    };
    Ok({
        let mut cfg = ContentionConfig::default();
        cfg.seed = seed;
        cfg.link = {
            let mut cfg = LinkConfig::default();
            cfg.bandwidth = (args.link_gbit * 1e9 / 8.0) as u64;
            cfg
        };
        cfg.collective = CollectiveFlow {
            op_bytes: args.collective_bytes,
            packet_bytes: args.collective_packet_bytes,
            period: Duration::from_micros(args.collective_period_us),
            start: Duration::ZERO,
            ops: args.ops_alone.max(1),
        };
        cfg.layers = layers;
        cfg.blocks = (args.kv_bytes / per_block_row) as u32;
        cfg.block_bytes = block_bytes;
        cfg.kv_share = args.kv_share;
        cfg.priority = QueueDiscipline::Priority {
            mtu,
            max_starvation: Duration::from_micros(args.max_starvation_us),
        };
        cfg
    })
}
