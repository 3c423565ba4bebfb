//! `te-bench load`: many clients in separate processes against one server. Starts a `te-bench serve
//! --verify` process and `--clients` `te-bench connect` processes at once, each pushing its own byte
//! pattern (seeded by its engine id) into its own served region; the server checks every session's bytes
//! against that client's pattern on arrival. Reports aggregate throughput and the server's peak memory.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;

use crate::args::{fmt_size, parse_size};
use crate::report::print_rows;
use crate::serve_process::ServeProcess;

/// Arguments of `te-bench load`.
#[derive(Debug, Args)]
pub(crate) struct LoadArgs {
    /// Client processes, each with its own engine id (100, 101, ...) and pattern.
    #[arg(long, default_value_t = 16)]
    clients: u32,
    /// Bytes each client moves per transfer, with a unit.
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    total_bytes: u64,
    /// Transfers each client makes after its warm-up.
    #[arg(long, default_value_t = 3)]
    iterations: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct LoadRow {
    clients: u32,
    bytes_per_transfer: u64,
    transfers: u64,
    /// Bytes moved by all clients together over the wall time of the run.
    aggregate_gbps: f64,
    seconds: f64,
    /// Sessions the server checked against their client's pattern, and how many matched.
    verified: u64,
    mismatched: u64,
    /// The server process's peak resident memory.
    server_peak_mib: f64,
    /// What the server allocated for clients' regions (one per client).
    served_mib: f64,
}

const COLUMNS: &[&str] = &[
    "clients",
    "bytes_per_transfer",
    "transfers",
    "aggregate_gbps",
    "seconds",
    "verified",
    "mismatched",
    "server_peak_mib",
    "served_mib",
];

/// Peak resident memory of process `pid`, in MiB (Linux `VmHWM`).
fn peak_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .context("no VmHWM line")?
        .parse()?;
    Ok(kib / 1024.0)
}

pub(crate) fn main(args: &LoadArgs) -> anyhow::Result<()> {
    if args.clients == 0 {
        bail!("--clients must be at least 1");
    }
    let exe = std::env::current_exe()?;
    let layout = crate::run::layout_for(256 << 10, args.total_bytes)?;
    let served = layout.total_bytes() * u64::from(args.clients);
    let served_arg = served.to_string();
    let mut server = ServeProcess::start(&[
        "--verify",
        "--engine-id",
        "2",
        "--serve-bytes",
        &served_arg,
        "--lanes",
        "2",
    ])?;
    let addr = server.addr;
    let out = server.stdout.take().context("no stdout")?;
    // The server's report lines, read as they come (a full pipe would stall it).
    let checked = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let counts = checked.clone();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if line.contains(": verified") {
                counts.0.fetch_add(1, Ordering::Relaxed);
            } else if line.contains("MISMATCH") || line.contains("not checked") {
                counts.1.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let start = Instant::now();
    let clients = (0..args.clients)
        .map(|i| {
            Command::new(&exe)
                .args([
                    "connect",
                    "--peer",
                    &addr.to_string(),
                    "--json",
                    "--no-limit",
                ])
                .args(["--engine-id", &(100 + i).to_string()])
                .args(["--total-bytes", &args.total_bytes.to_string()])
                .args(["--block-bytes", "256KiB", "--mode", "packetized"])
                .args(["--iterations", &args.iterations.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()
        .context("starting te-bench connect")?;
    let mut failures = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let done = c.wait_with_output()?;
        if !done.status.success() {
            failures.push(format!(
                "client {}: {}",
                100 + i,
                String::from_utf8_lossy(&done.stderr).trim()
            ));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // Every client made a warm-up transfer and `iterations` more; wait (a while) for the server to have
    // checked each of them.
    let transfers = u64::from(args.clients) * (args.iterations as u64 + 1);
    let waiting = Instant::now();
    let checked_all =
        || checked.0.load(Ordering::Relaxed) + checked.1.load(Ordering::Relaxed) >= transfers;
    while !checked_all() && waiting.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let server_peak_mib = peak_mib(server.child.id())?;
    drop(server);
    let (verified, mismatched) = (
        checked.0.load(Ordering::Relaxed),
        checked.1.load(Ordering::Relaxed),
    );
    if !failures.is_empty() {
        bail!(
            "{} client(s) failed: {}",
            failures.len(),
            failures.join("; ")
        );
    }
    let row = LoadRow {
        clients: args.clients,
        bytes_per_transfer: layout.total_bytes(),
        transfers,
        aggregate_gbps: (transfers * layout.total_bytes()) as f64 / seconds / 1e9,
        seconds,
        verified,
        mismatched,
        server_peak_mib,
        served_mib: served as f64 / (1 << 20) as f64,
    };
    if !args.json {
        println!(
            "{} clients x {} transfers of {} into one server",
            args.clients,
            args.iterations + 1,
            fmt_size(layout.total_bytes())
        );
    }
    print_rows(&[row], args.json, COLUMNS)
}
