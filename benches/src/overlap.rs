//! `te-bench overlap`: a consumer computes layer after layer while their KV streams in: over the simulated
//! fabric in virtual time (`--backend sim`, the default), or in real time over real sockets or the
//! in-process loopback (`--backend tcp|loopback`, see [`crate::stream`]). Reported: serial (transfer all,
//! then compute), pipelined at each prefetch depth, and the bound
//! `max(total transfer, total compute) + one layer of the smaller`.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use fabric_sim::{LinkConfig, OverlapConfig};

use crate::args::parse_size;
use crate::report::print_rows;
use crate::stream::StreamRow;

/// Arguments of `te-bench overlap`. KV is packetized in 64 KiB slices over a link with 5 us of
/// propagation delay each way and a 4 MiB queue; the consumer computes each layer for a fixed time once
/// it has fully arrived.
#[derive(Debug, Args)]
pub(crate) struct OverlapArgs {
    /// Seed of every random choice (the same seed replays the run exactly); defaults to $FABRIC_SEED,
    /// else 1.
    #[arg(long)]
    seed: Option<u64>,
    /// Layers computed (each one's KV transferred).
    #[arg(long, default_value_t = 32)]
    layers: u32,
    /// Where the KV moves: the simulated fabric (virtual time), real TCP sockets on this machine, or the
    /// in-process loopback (both real time).
    #[arg(long, value_enum, default_value = "sim")]
    backend: BackendArg,
    /// Consumer compute per layer, in microseconds [sim: 700; tcp and loopback: the measured transfer
    /// time of one layer, the balanced case].
    #[arg(long)]
    layer_compute_us: Option<u64>,
    /// KV bytes per layer, with a unit (a whole number of blocks).
    #[arg(long, value_parser = parse_size, default_value = "16MiB")]
    layer_bytes: u64,
    /// Bytes per KV block, with a unit.
    #[arg(long, value_parser = parse_size, default_value = "256KiB")]
    block_bytes: u64,
    /// Layers the sender keeps in flight beyond the one the consumer computes; a comma list (0,1,2,3,4)
    /// runs each.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    prefetch_depth: Vec<u32>,
    /// Link bandwidth, in Gbit/s (200 Gbit/s = 25 GB/s).
    #[arg(long, default_value_t = 200.0)]
    link_gbit: f64,
    /// Print one JSON object per depth instead of a table.
    #[arg(long)]
    json: bool,
}

/// Where `te-bench overlap` moves the KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BackendArg {
    /// The simulated fabric, in virtual time.
    Sim,
    /// Two TCP nodes over loopback sockets, in real time.
    Tcp,
    /// The in-process loopback pair, in real time.
    Loopback,
}

/// Columns of the human table.
const COLUMNS: &[&str] = &[
    "backend",
    "layers",
    "prefetch_depth",
    "transfer_ms",
    "compute_ms",
    "serial_ms",
    "pipelined_ms",
    "bound_ms",
    "ratio",
    "vs_serial",
    "stall_ms",
    "intact",
];

/// Measures the transfer once, then the pipelined schedule at each depth.
pub(crate) fn main(args: &OverlapArgs) -> anyhow::Result<()> {
    let seed = match args.seed {
        Some(seed) => seed,
        None => fabric_sim::seed_from_env(1)?,
    };
    if args.layers == 0 || args.layer_bytes == 0 || args.block_bytes == 0 {
        bail!("--layers, --layer-bytes and --block-bytes must be at least 1");
    }
    if !args.layer_bytes.is_multiple_of(args.block_bytes) {
        bail!(
            "--layer-bytes {} is not a whole number of --block-bytes {}",
            args.layer_bytes,
            args.block_bytes
        );
    }
    let real = match args.backend {
        BackendArg::Sim => None,
        BackendArg::Tcp => Some("tcp"),
        BackendArg::Loopback => Some("loopback"),
    };
    if let Some(backend) = real {
        let rows = crate::stream::rows(
            backend,
            args.layers,
            args.layer_bytes,
            args.block_bytes,
            args.layer_compute_us.map(Duration::from_micros),
            &args.prefetch_depth,
        )?;
        if !args.json {
            println!(
                "{backend}: {} layers x {} KiB in real time; each layer computed for {:.0} us",
                args.layers,
                args.layer_bytes >> 10,
                rows.first().map_or(0.0, |r| r.report.layer_compute_us)
            );
        }
        return print_rows(&rows, args.json, COLUMNS);
    }
    let layer_compute_us = args.layer_compute_us.unwrap_or(700);
    if !args.link_gbit.is_finite() || args.link_gbit <= 0.0 {
        bail!("--link-gbit must be a positive number of Gbit/s, such as 200");
    }
    let mut base = OverlapConfig::default();
    base.seed = seed;
    base.layers = args.layers;
    base.layer_bytes = args.layer_bytes;
    base.block_bytes = args.block_bytes;
    base.layer_compute = Duration::from_micros(layer_compute_us);
    base.link = {
        let mut cfg = LinkConfig::default();
        cfg.bandwidth = (args.link_gbit * 1e9 / 8.0) as u64;
        cfg
    };
    let (transfer, intact) = base
        .transfer_time(Instant::now())
        .with_context(|| format!("overlap transfer with seed {seed}"))?;
    let mut rows = Vec::new();
    for &depth in &args.prefetch_depth {
        let mut cfg = base.clone();
        cfg.prefetch_depth = depth;
        let report = cfg
            .report(transfer, intact, Instant::now())
            .with_context(|| format!("overlap at depth {depth} with seed {seed}"))?;
        rows.push(StreamRow {
            backend: "sim",
            report,
        });
    }
    if !args.json {
        println!(
            "{} layers x {} KiB, {} us of compute a layer, {} Gbit/s link (seed {seed})",
            args.layers,
            args.layer_bytes >> 10,
            layer_compute_us,
            args.link_gbit
        );
    }
    print_rows(&rows, args.json, COLUMNS)
}
