//! `te-bench peer-death`: how long a sender takes to report recompute when its peer process dies
//! mid-transfer. Each run starts a real `te-bench serve` process, pushes KV to it, kills it (SIGKILL) once
//! the first blocks are acknowledged, and times the kill to the sender's report.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use backends::tcp::{BlockingNode, TcpConfig};
use clap::Args;
use serde::Serialize;
use transfer_engine::TransferRequest;

use crate::args::parse_size;
use crate::report::print_rows;
use crate::run::layout_for;
use crate::serve_process::ServeProcess;

/// Arguments of `te-bench peer-death`.
#[derive(Debug, Args)]
pub(crate) struct PeerDeathArgs {
    /// Runs (each with a fresh server process); the median is reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Bytes of the transfer that is cut short, with a unit.
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    total_bytes: u64,
    /// The transfer's own deadline (the report must come long before it), in seconds.
    #[arg(long, default_value_t = 30)]
    deadline_s: u64,
    /// Print one JSON object per run and one for the median instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct DeathRow {
    run: String,
    /// Milliseconds from the kill to the sender's recompute report.
    report_ms: f64,
    /// Blocks handed back for recompute.
    recompute_blocks: usize,
    /// The node's setting: how long a peer may be gone before its sessions end.
    unreachable_after_ms: f64,
    deadline_ms: f64,
    /// The reason the report gave.
    reason: String,
}

const COLUMNS: &[&str] = &[
    "run",
    "report_ms",
    "recompute_blocks",
    "unreachable_after_ms",
    "deadline_ms",
    "reason",
];

fn one_run(args: &PeerDeathArgs, run: usize) -> anyhow::Result<DeathRow> {
    let layout = layout_for(256 << 10, args.total_bytes)?;
    let serve_bytes = layout.total_bytes().to_string();
    let mut server = ServeProcess::start(&["--engine-id", "2", "--serve-bytes", &serve_bytes])?;
    let addr = server.addr;
    let mut cfg = TcpConfig::with_engine_id(1);
    cfg.listen = None;
    let unreachable_after = cfg.liveness.unreachable_after;
    let node = BlockingNode::start(cfg)?;
    let src = node.kv_region(layout)?;
    let info = node.connect(addr, Some(layout))?;
    let dst = *info
        .segment("served")
        .context("the server offered no region")?;
    let deadline = Duration::from_secs(args.deadline_s);
    let req = TransferRequest::whole(info.peer, &src, &dst)?.with_deadline(deadline);
    let session = node.node().submit(req)?;
    let started = Instant::now();
    while node.node().stats().engine.bytes_acked == 0 {
        if started.elapsed() > Duration::from_secs(30) {
            bail!("nothing was acknowledged within 30 s");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    server.child.kill().context("killing the server")?;
    let killed = Instant::now();
    let out = node.block_on(node.node().wait(session, deadline * 2))?;
    let report = killed.elapsed();
    let reason = out.reason.unwrap_or_default();
    if out.recompute.is_empty() {
        bail!("the transfer finished before the server died: use a larger --total-bytes");
    }
    Ok(DeathRow {
        run: run.to_string(),
        report_ms: report.as_secs_f64() * 1e3,
        recompute_blocks: out.recompute.len(),
        unreachable_after_ms: unreachable_after.as_secs_f64() * 1e3,
        deadline_ms: deadline.as_secs_f64() * 1e3,
        reason,
    })
}

/// Runs `--runs` deaths and prints each and the median.
pub(crate) fn main(args: &PeerDeathArgs) -> anyhow::Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let mut rows = (1..=args.runs)
        .map(|i| one_run(args, i))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut ms: Vec<f64> = rows.iter().map(|r| r.report_ms).collect();
    ms.sort_by(f64::total_cmp);
    let mut blocks: Vec<usize> = rows.iter().map(|r| r.recompute_blocks).collect();
    blocks.sort_unstable();
    rows.push(DeathRow {
        run: "median".into(),
        report_ms: ms[ms.len() / 2],
        recompute_blocks: blocks[blocks.len() / 2],
        unreachable_after_ms: rows[0].unreachable_after_ms,
        deadline_ms: rows[0].deadline_ms,
        reason: rows[0].reason.clone(),
    });
    print_rows(&rows, args.json, COLUMNS)
}
