//! `te-bench sim`: one KV transfer through the simulated fabric under the faults given, in virtual time.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use fabric_sim::{FaultSpec, Scenario, ScenarioConfig};
use transfer_engine::TransferMode;

use crate::args::parse_size;
use crate::report::print_rows;

/// Wire mode of the simulated transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SimMode {
    /// Whole blocks as single units.
    Exclusive,
    /// Blocks cut into 64 KiB slices.
    Packetized,
    /// Contiguous runs of at least 1 MiB exclusive (up to 64 MiB a unit), the rest in 64 KiB slices.
    Auto,
}

impl SimMode {
    fn mode(self) -> TransferMode {
        match self {
            SimMode::Exclusive => TransferMode::Exclusive,
            SimMode::Packetized => TransferMode::packetized(),
            SimMode::Auto => TransferMode::auto(),
        }
    }
}

/// Arguments of `te-bench sim`. Probabilities are per packet (one frame is one packet in the simulator),
/// from 0 to 1. The link is 100 Gb/s with 5 us of propagation delay each way and a 4 MiB queue; faults
/// apply to both directions; the session deadline is 1 s of virtual time.
#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    /// Seed of every random choice in the run (the same seed replays the run exactly); defaults to
    /// $FABRIC_SEED, else 1.
    #[arg(long)]
    seed: Option<u64>,
    /// Random loss: probability that a packet is lost.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Bursty loss (Gilbert-Elliott) as ENTER,EXIT: per-packet probabilities of entering and leaving the
    /// bad state, where every packet is lost; mean loss ENTER/(ENTER+EXIT), mean burst 1/EXIT packets.
    #[arg(long, value_parser = parse_pair)]
    burst_loss: Option<(f64, f64)>,
    /// Corruption: probability that one bit of a packet (payload or header) is flipped.
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// Duplication: probability that a packet arrives twice (the copy up to 50 us later).
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Reordering: probability that a packet is held back by up to 50 us and overtaken.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Jitter: every packet is delayed by a uniform 0..N microseconds.
    #[arg(long, default_value_t = 0)]
    jitter_us: u64,
    /// Partition as START:END, in milliseconds of virtual time since the transfer started: both
    /// directions are cut from START until END (an END beyond the run, or none as in `5:`, never heals).
    #[arg(long, value_parser = parse_partition)]
    partition_ms: Option<(u64, Option<u64>)>,
    /// Layers transferred.
    #[arg(long, default_value_t = 32)]
    layers: u32,
    /// Blocks per layer transferred.
    #[arg(long, default_value_t = 64)]
    blocks: u32,
    /// Bytes per KV block, with a unit: 16KiB, 256KiB, 4MiB.
    #[arg(long, value_parser = parse_size, default_value = "256KiB")]
    block_bytes: u64,
    /// Wire mode.
    #[arg(long, value_enum, default_value = "packetized")]
    mode: SimMode,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Columns of the human table.
const COLUMNS: &[&str] = &[
    "seed",
    "mode",
    "blocks_total",
    "blocks_delivered",
    "blocks_recompute",
    "corrupt_delivered",
    "retransmits",
    "retransmit_overhead",
    "virtual_ms",
    "goodput_gbps",
    "finished",
];

/// Runs the scenario and prints its report.
pub(crate) fn main(args: &SimArgs) -> anyhow::Result<()> {
    let seed = match args.seed {
        Some(seed) => seed,
        None => fabric_sim::seed_from_env(1)?,
    };
    for (name, p) in [
        ("--loss", args.loss),
        ("--corrupt", args.corrupt),
        ("--duplicate", args.duplicate),
        ("--reorder", args.reorder),
    ] {
        if !(0.0..=1.0).contains(&p) {
            bail!("{name} {p} is not a probability: give a value from 0 to 1");
        }
    }
    if args.layers == 0 || args.blocks == 0 || args.block_bytes == 0 {
        bail!("--layers, --blocks and --block-bytes must be at least 1");
    }
    let mut faults = FaultSpec::default();
    faults.loss = args.loss;
    faults.burst_loss = args.burst_loss;
    faults.corrupt = args.corrupt;
    faults.duplicate = args.duplicate;
    faults.reorder = args.reorder;
    faults.jitter = Duration::from_micros(args.jitter_us);
    faults.partition = args
        .partition_ms
        .map(|(start, end)| (Duration::from_millis(start), end.map(Duration::from_millis)));
    let mut cfg = ScenarioConfig::default();
    cfg.seed = seed;
    cfg.layers = args.layers;
    cfg.blocks = args.blocks;
    cfg.block_bytes = args.block_bytes;
    cfg.mode = args.mode.mode();
    cfg.faults = faults;
    let report = Scenario::new(cfg)
        .run(Instant::now())
        .with_context(|| format!("simulation with seed {seed}"))?;
    print_rows(&[report], args.json, COLUMNS)
}

/// Parses `ENTER,EXIT`.
fn parse_pair(text: &str) -> Result<(f64, f64), String> {
    let err = || format!("'{text}' is not ENTER,EXIT such as 0.03,0.07 (two probabilities)");
    let (a, b) = text.split_once(',').ok_or_else(err)?;
    let a: f64 = a.trim().parse().map_err(|_| err())?;
    let b: f64 = b.trim().parse().map_err(|_| err())?;
    if !(0.0..=1.0).contains(&a) || !(0.0..=1.0).contains(&b) || a + b <= 0.0 {
        return Err(err());
    }
    Ok((a, b))
}

/// Parses `START:END` (milliseconds; END may be empty for a partition that never heals).
fn parse_partition(text: &str) -> Result<(u64, Option<u64>), String> {
    let err = || format!("'{text}' is not START:END in milliseconds, such as 5:20 or 5:");
    let (a, b) = text.split_once(':').ok_or_else(err)?;
    let start: u64 = a.trim().parse().map_err(|_| err())?;
    let end = match b.trim() {
        "" => None,
        b => Some(b.parse::<u64>().map_err(|_| err())?),
    };
    if end.is_some_and(|e| e <= start) {
        return Err(format!("partition {text}: END must be after START"));
    }
    Ok((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_and_partitions_parse() {
        assert_eq!(parse_pair("0.03,0.07"), Ok((0.03, 0.07)));
        assert!(parse_pair("0.03").is_err());
        assert!(parse_pair("2,0.1").is_err());
        assert_eq!(parse_partition("5:20"), Ok((5, Some(20))));
        assert_eq!(parse_partition("5:"), Ok((5, None)));
        assert!(parse_partition("20:5").is_err());
    }
}
