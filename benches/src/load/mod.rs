//! `te-bench load`: many clients in separate processes against one server. Starts a `te-bench serve
//! --verify` process and `--clients` `te-bench connect` processes at once, each pushing its own byte
//! pattern (seeded by its engine id) into its own served region; the server checks every session's bytes
//! against that client's pattern on arrival. Reports aggregate throughput, the slowest client's time and
//! the server's peak memory, alone and beside each attacker of `--attackers` (see [`attack`]), one run
//! (and one fresh server) per attacker.

mod attack;
mod attacker;
mod data_flood;

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
use attack::{Attack, AttackKind};

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
    /// Runs to make, one per attacker beside the honest clients (`none`: alone), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "none")]
    attackers: Vec<AttackKind>,
    /// A flag for every server this starts (repeatable), e.g.
    /// `--serve-flag=--data-bytes-per-sec-per-peer=200MiB`.
    #[arg(long = "serve-flag", allow_hyphen_values = true)]
    serve_flags: Vec<String>,
    /// Print one JSON object per run instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct LoadRow {
    /// The attacker beside the honest clients (`none`: alone).
    attacker: &'static str,
    clients: u32,
    bytes_per_transfer: u64,
    transfers: u64,
    /// Bytes moved by all clients together over the wall time of the run.
    aggregate_gbps: f64,
    seconds: f64,
    /// Sessions the server found holding their client's pattern, holding other bytes, and not checked
    /// (blocks to recompute, or their region gone).
    verified: u64,
    mismatched: u64,
    not_checked: u64,
    /// The slowest honest client's time, from its start to its exit (connecting included).
    worst_client_s: f64,
    /// Honest clients that failed, and the first one's error.
    failed_clients: u32,
    /// Blocks the honest clients' transfers handed back for recompute (a deadline missed, a session
    /// ended under them).
    recompute_blocks: u64,
    /// This run's aggregate and worst client time against the run without an attacker (when `none` ran
    /// first).
    gbps_vs_alone: Option<f64>,
    worst_vs_alone: Option<f64>,
    /// The server process's peak resident memory.
    server_peak_mib: f64,
    /// What the server allocated for clients' regions (one per client).
    served_mib: f64,
    /// What the attacker did, and the first honest client's error if one failed.
    notes: String,
}

const COLUMNS: &[&str] = &[
    "attacker",
    "clients",
    "bytes_per_transfer",
    "transfers",
    "aggregate_gbps",
    "seconds",
    "worst_client_s",
    "failed_clients",
    "recompute_blocks",
    "gbps_vs_alone",
    "worst_vs_alone",
    "verified",
    "mismatched",
    "not_checked",
    "server_peak_mib",
    "served_mib",
    "notes",
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
    let layout = crate::run::layout_for(256 << 10, args.total_bytes)?;
    if !args.json {
        println!(
            "{} clients x {} transfers of {} into one server, per attacker; *_vs_alone: against the run \
             without one (aim: gbps at least 0.8, worst at most 1.2)",
            args.clients,
            args.iterations + 1,
            fmt_size(layout.total_bytes())
        );
    }
    let mut rows: Vec<LoadRow> = Vec::new();
    for &kind in &args.attackers {
        let mut row = run(args, layout, kind)?;
        if let Some(alone) = rows.iter().find(|r| r.attacker == "none") {
            row.gbps_vs_alone = Some(row.aggregate_gbps / alone.aggregate_gbps);
            row.worst_vs_alone = Some(row.worst_client_s / alone.worst_client_s);
        }
        rows.push(row);
    }
    print_rows(&rows, args.json, COLUMNS)
}

/// What the reader of the server's output counts.
#[derive(Default)]
struct ServerLines {
    verified: AtomicU64,
    mismatched: AtomicU64,
    not_checked: AtomicU64,
    /// Distinct engines a session was accepted from.
    engines: std::sync::Mutex<std::collections::BTreeSet<u32>>,
    /// The first line that reported a session not verified.
    first_unverified: std::sync::Mutex<Option<String>>,
}

/// One run: a fresh server, the attacker, then the honest clients.
fn run(
    args: &LoadArgs,
    layout: transfer_engine::KvLayout,
    kind: AttackKind,
) -> anyhow::Result<LoadRow> {
    let exe = std::env::current_exe()?;
    let served = layout.total_bytes() * u64::from(args.clients);
    // A data flood is served a region of its own beside the clients'.
    let attacker_region = match kind {
        AttackKind::DataFlood => data_flood::region_layout().total_bytes(),
        _ => 0,
    };
    let served_arg = (served + attacker_region).to_string();
    let mut serve_args = vec![
        "--verify",
        "--engine-id",
        "2",
        "--serve-bytes",
        &served_arg,
        "--lanes",
        "2",
    ];
    serve_args.extend(args.serve_flags.iter().map(String::as_str));
    let mut server = ServeProcess::start(&serve_args)?;
    let addr = server.addr;
    let out = server.stdout.take().context("no stdout")?;
    // The server's report lines, read as they come (a full pipe would stall it).
    let lines = Arc::new(ServerLines::default());
    let counts = lines.clone();
    let victims = 100..100 + args.clients;
    let honest = victims.clone();
    std::thread::spawn(move || {
        // The attackers' sessions, learnt from the line that names a session's engine; their later
        // lines (a verdict names only the session) are not honest transfers, so are not counted.
        let mut attackers = std::collections::HashSet::new();
        for line in out.lines().map_while(Result::ok) {
            let session = line
                .strip_prefix("session ")
                .and_then(|rest| rest.split([' ', ':']).next())
                .map(str::to_owned);
            let engine = line
                .split(" from engine ")
                .nth(1)
                .and_then(|e| e.split(':').next())
                .and_then(|e| e.parse::<u32>().ok());
            if engine.is_some_and(|e| !honest.contains(&e)) {
                attackers.extend(session);
                continue;
            }
            if session.is_some_and(|s| attackers.contains(&s)) {
                continue;
            }
            if line.contains(": verified") {
                counts.verified.fetch_add(1, Ordering::Relaxed);
            } else if line.contains("MISMATCH") || line.contains("not checked") {
                let counter = if line.contains("MISMATCH") {
                    &counts.mismatched
                } else {
                    &counts.not_checked
                };
                counter.fetch_add(1, Ordering::Relaxed);
                counts.first_unverified.lock().unwrap().get_or_insert(line);
            } else {
                counts.engines.lock().unwrap().extend(engine);
            }
        }
    });
    // The honest clients still running: a takeover claims only those (a departed client's id is free to
    // claim, and its served region goes with it).
    let running: attack::Running = Arc::new(std::sync::Mutex::new(victims.clone().collect()));
    // Every attacker but a takeover starts first, so the honest clients meet it at its worst; a
    // takeover needs live sessions to take over, so it starts once every client has one.
    let mut attack: Option<Attack> = None;
    if kind != AttackKind::Takeover {
        attack = Some(Attack::start(kind, addr, running.clone())?);
    }
    let start = Instant::now();
    let clients = victims
        .clone()
        .map(|id| {
            Command::new(&exe)
                .args([
                    "connect",
                    "--peer",
                    &addr.to_string(),
                    "--json",
                    "--no-limit",
                ])
                .args(["--engine-id", &id.to_string()])
                .args(["--total-bytes", &args.total_bytes.to_string()])
                .args(["--block-bytes", "256KiB", "--mode", "packetized"])
                .args(["--iterations", &args.iterations.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()
        .context("starting te-bench connect")?;
    // Each client is waited for on its own thread, so its exit time is its own.
    let waits: Vec<_> = victims
        .clone()
        .zip(clients)
        .map(|(id, c)| {
            let running = running.clone();
            std::thread::spawn(move || {
                let done = c.wait_with_output();
                running.lock().unwrap().remove(&id);
                (done, start.elapsed())
            })
        })
        .collect();
    if kind == AttackKind::Takeover {
        let all = args.clients as usize;
        while lines.engines.lock().unwrap().len() < all && start.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        attack = Some(Attack::start(kind, addr, running.clone())?);
    }
    let mut failures = Vec::new();
    let mut recompute_blocks = 0;
    let mut worst = Duration::ZERO;
    for (id, w) in victims.clone().zip(waits) {
        let (done, took) = w
            .join()
            .map_err(|_| anyhow::anyhow!("a waiting thread panicked"))?;
        let done = done?;
        worst = worst.max(took);
        recompute_blocks += String::from_utf8_lossy(&done.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|row| row["recompute_blocks"].as_u64())
            .sum::<u64>();
        if !done.status.success() {
            failures.push(format!(
                "client {id}: {}",
                String::from_utf8_lossy(&done.stderr).trim()
            ));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let attacked = attack.map(Attack::stop).unwrap_or_default();
    // Every client made a warm-up transfer and `iterations` more; wait (a while) for the server to have
    // checked each of them.
    let transfers = u64::from(args.clients) * (args.iterations as u64 + 1);
    let waiting = Instant::now();
    let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let checked_all = || {
        count(&lines.verified) + count(&lines.mismatched) + count(&lines.not_checked) >= transfers
    };
    while !checked_all() && waiting.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let server_peak_mib = peak_mib(server.child.id())?;
    drop(server);
    let (verified, mismatched, not_checked) = (
        count(&lines.verified),
        count(&lines.mismatched),
        count(&lines.not_checked),
    );
    if kind == AttackKind::None && !failures.is_empty() {
        bail!(
            "{} client(s) failed: {}",
            failures.len(),
            failures.join("; ")
        );
    }
    let ok_clients = u64::from(args.clients) - failures.len() as u64;
    let moved = ok_clients * (args.iterations as u64 + 1) * layout.total_bytes();
    let mut notes = attacked;
    if let Some(first) = failures.first() {
        notes = format!("{notes}; {first}");
    }
    if let Some(line) = lines.first_unverified.lock().unwrap().take() {
        notes = format!("{notes}; server: {line}");
    }
    Ok(LoadRow {
        attacker: kind.name(),
        clients: args.clients,
        bytes_per_transfer: layout.total_bytes(),
        transfers,
        aggregate_gbps: moved as f64 / seconds / 1e9,
        seconds,
        worst_client_s: worst.as_secs_f64(),
        failed_clients: failures.len() as u32,
        recompute_blocks,
        gbps_vs_alone: None,
        worst_vs_alone: None,
        verified,
        mismatched,
        not_checked,
        server_peak_mib,
        served_mib: served as f64 / (1 << 20) as f64,
        notes,
    })
}
