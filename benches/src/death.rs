//! `te-bench peer-death`: how long a sender takes to report recompute when its peer process dies
//! mid-transfer. Each run starts a real `te-bench serve` process, pushes KV to it, kills it (SIGKILL) once
//! the first blocks are acknowledged, and times the kill to the sender's report.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use backends::tcp::{BlockingNode, TcpConfig};
use clap::Args;
use serde::Serialize;
use transfer_engine::TransferRequest;

use crate::args::parse_size;
use crate::report::print_rows;
use crate::run::layout_for;

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

/// Kills the server when dropped, so a failed run leaves no process behind. Its output stays open (it
/// prints a line per session; a closed pipe would end it early).
struct Server {
    child: Child,
    _stdout: BufReader<std::process::ChildStdout>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `te-bench serve` on a free loopback port and returns it with its address.
fn start_server(serve_bytes: u64) -> anyhow::Result<(Server, SocketAddr)> {
    let exe = std::env::current_exe().context("finding te-bench's own path")?;
    let mut child = Command::new(exe)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--engine-id",
            "2",
            "--serve-bytes",
            &serve_bytes.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting te-bench serve")?;
    let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?);
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    let server = Server {
        child,
        _stdout: stdout,
    };
    let addr = line
        .split_whitespace()
        .skip_while(|w| *w != "on")
        .nth(1)
        .map(|a| a.trim_end_matches(','))
        .context("te-bench serve did not say where it listens")?
        .parse()
        .with_context(|| format!("reading the server's address from {line:?}"))?;
    Ok((server, addr))
}

fn one_run(args: &PeerDeathArgs, run: usize) -> anyhow::Result<DeathRow> {
    let layout = layout_for(256 << 10, args.total_bytes)?;
    let (mut server, addr) = start_server(layout.total_bytes())?;
    let cfg = TcpConfig {
        listen: None,
        ..TcpConfig::with_engine_id(1)
    };
    let unreachable_after = cfg.unreachable_after;
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
