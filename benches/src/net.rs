//! `te-bench serve` and `te-bench connect`: two processes moving KV over TCP as a deployment would.
//!
//! The server listens and allocates, for each client, a KV region of the layout the client asks for in
//! the handshake (up to `--serve-bytes`, reused for repeat layouts). The client pushes its KV there and
//! prints the same keys as `te-bench run`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use backends::tcp::{BlockingNode, TcpConfig, socket_copy_gbps};
use clap::{Args, ValueEnum};
use serde::Serialize;
use transfer_engine::{Dtype, Event, KvLayout, Role, TransferMode, TransferRequest};

use crate::args::{fmt_size, parse_size};
use crate::report::{print_rows, quantile};

/// Arguments of `te-bench serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on, e.g. 127.0.0.1:7400 (a non-loopback address needs --secret).
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// This server's engine id; every client needs a different one.
    #[arg(long, default_value_t = 2)]
    engine_id: u32,
    /// Most bytes of KV regions allocated for clients, with a unit: 512MiB, 4GiB.
    #[arg(long, value_parser = parse_size, default_value = "4GiB")]
    serve_bytes: u64,
    /// Shared secret; clients must present the same one (HMAC-SHA256 challenge in both directions).
    #[arg(long)]
    secret: Option<String>,
    /// Most lanes (TCP connections) per client.
    #[arg(long, default_value_t = 2)]
    lanes: usize,
    /// Stop after this many seconds; 0 serves until killed.
    #[arg(long, default_value_t = 0)]
    seconds: u64,
}

/// Wire mode of `te-bench connect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum NetMode {
    /// Whole blocks as single units.
    Exclusive,
    /// Blocks cut into slices (see --slice-bytes).
    Packetized,
    /// Large contiguous runs exclusive, the rest packetized.
    Auto,
}

/// Arguments of `te-bench connect`.
#[derive(Debug, Args)]
pub(crate) struct ConnectArgs {
    /// Address of a `te-bench serve`, e.g. 127.0.0.1:7400.
    #[arg(long)]
    peer: SocketAddr,
    /// Bytes per transfer, with a unit (layers x blocks x block bytes; rounded down to whole blocks).
    #[arg(long, value_parser = parse_size, default_value = "512MiB")]
    total_bytes: u64,
    /// Bytes per KV block, with a unit: 64KiB, 1MiB, 4MiB.
    #[arg(long, value_parser = parse_size, default_value = "256KiB")]
    block_bytes: u64,
    /// Wire mode; repeat or omit to run every mode.
    #[arg(long, value_enum)]
    mode: Vec<NetMode>,
    /// Slice size of packetized and auto modes, in bytes (with a unit).
    #[arg(long, value_parser = parse_size, default_value = "64KiB")]
    slice_bytes: u64,
    /// Measured transfers per mode (after one warm-up); throughput is their median.
    #[arg(long, default_value_t = 5)]
    iterations: usize,
    /// This client's engine id; must differ from the server's.
    #[arg(long, default_value_t = 1)]
    engine_id: u32,
    /// Shared secret, as configured on the server.
    #[arg(long)]
    secret: Option<String>,
    /// Most lanes (TCP connections) to the server.
    #[arg(long, default_value_t = 2)]
    lanes: usize,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// One result row: the keys of `te-bench run`.
#[derive(Debug, Serialize)]
struct NetRow {
    backend: &'static str,
    mode: &'static str,
    block_bytes: u64,
    block: String,
    bytes: u64,
    iterations: usize,
    seconds: f64,
    gbps: f64,
    limit_gbps: f64,
    ratio: f64,
    p50_ms: f64,
    p99_ms: f64,
    retransmits: u64,
    recompute_blocks: usize,
}

/// Serves until killed (or `--seconds`): accepts clients, gives each the region it asks for, and prints a
/// line per finished session.
pub(crate) fn serve_main(args: &ServeArgs) -> anyhow::Result<()> {
    let cfg = TcpConfig {
        listen: Some(args.listen),
        secret: args.secret.as_ref().map(|s| s.as_bytes().to_vec()),
        serve_bytes: args.serve_bytes,
        max_lanes_per_peer: args.lanes.max(1),
        ..TcpConfig::with_engine_id(args.engine_id)
    };
    let node = BlockingNode::start(cfg).context("starting the server")?;
    let addr = node.node().local_addr().context("no listener")?;
    println!(
        "te-bench serve: engine {} listening on {addr}, serving up to {} of KV regions",
        args.engine_id,
        fmt_size(args.serve_bytes)
    );
    let stop = (args.seconds > 0).then(|| Instant::now() + Duration::from_secs(args.seconds));
    loop {
        std::thread::sleep(Duration::from_millis(200));
        for event in node.node().take_events() {
            match event {
                Event::Completed {
                    session,
                    role: Role::Receiver,
                    stats,
                } => println!(
                    "session {session}: {} received, {} blocks delivered, {} to recompute",
                    fmt_size(stats.bytes_received),
                    stats.blocks_delivered,
                    stats.recompute_blocks
                ),
                Event::Refused { session, reason } => {
                    println!("session {session} refused: {reason}")
                }
                _ => {}
            }
        }
        for line in node.node().log() {
            if line.contains("refused") {
                eprintln!("{line}");
            }
        }
        if stop.is_some_and(|t| Instant::now() >= t) {
            return Ok(());
        }
    }
}

/// Pushes KV to a `te-bench serve` and prints throughput beside a local socket-copy limit.
pub(crate) fn connect_main(args: &ConnectArgs) -> anyhow::Result<()> {
    let layout = layout_for(args.block_bytes, args.total_bytes)?;
    let slice_bytes =
        u32::try_from(args.slice_bytes).context("--slice-bytes must fit in 32 bits")?;
    let cfg = TcpConfig {
        listen: None,
        secret: args.secret.as_ref().map(|s| s.as_bytes().to_vec()),
        max_lanes_per_peer: args.lanes.max(1),
        ..TcpConfig::with_engine_id(args.engine_id)
    };
    let node = BlockingNode::start(cfg)?;
    let src = node.register_kv_region(layout)?;
    node.node().region(src.id)?.fill_with(|offset, bytes| {
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ offset as u64;
        for chunk in bytes.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
    });
    let info = node
        .connect(args.peer, Some(layout))
        .with_context(|| format!("connecting to {}", args.peer))?;
    let dst = *info
        .segment("served")
        .context("the server offered no region: is it a `te-bench serve`?")?;
    // The raw limit: a plain tokio socket copy of the same bytes over loopback on this machine.
    let limit_gbps = node.block_on(socket_copy_gbps(
        layout.total_bytes(),
        4 << 20,
        args.lanes.max(1),
    ))?;
    let modes = if args.mode.is_empty() {
        vec![NetMode::Exclusive, NetMode::Packetized, NetMode::Auto]
    } else {
        args.mode.clone()
    };
    let mut rows = Vec::new();
    for mode in modes {
        let mode = match mode {
            NetMode::Exclusive => TransferMode::Exclusive,
            NetMode::Packetized => TransferMode::Packetized { slice_bytes },
            NetMode::Auto => TransferMode::Auto {
                slice_bytes,
                exclusive_min_bytes: transfer_engine::DEFAULT_EXCLUSIVE_MIN_BYTES,
            },
        };
        let retransmits_before = node.node().stats().engine.retransmits;
        let mut seconds = Vec::new();
        let mut recompute = 0;
        for i in 0..=args.iterations {
            let req = TransferRequest::whole(info.peer, &src, &dst)?.with_mode(mode);
            let out = node.transfer(req, Duration::from_secs(600))?;
            if let Some(reason) = out.refused {
                bail!("the server refused the transfer: {reason}");
            }
            recompute += out.recompute.len();
            if i > 0 {
                seconds.push(out.elapsed.as_secs_f64());
            }
        }
        let bytes = layout.total_bytes();
        let median = quantile(&mut seconds, 0.5);
        let gbps = bytes as f64 / median / 1e9;
        rows.push(NetRow {
            backend: "tcp",
            mode: mode.name(),
            block_bytes: layout.block_bytes,
            block: fmt_size(layout.block_bytes),
            bytes,
            iterations: args.iterations,
            seconds: median,
            gbps,
            limit_gbps,
            ratio: gbps / limit_gbps,
            p50_ms: median * 1e3,
            p99_ms: quantile(&mut seconds, 0.99) * 1e3,
            retransmits: node.node().stats().engine.retransmits - retransmits_before,
            recompute_blocks: recompute,
        });
    }
    let columns = [
        "backend",
        "mode",
        "block",
        "bytes",
        "gbps",
        "limit_gbps",
        "ratio",
        "p50_ms",
        "p99_ms",
        "recompute_blocks",
    ];
    print_rows(&rows, args.json, &columns)
}

/// A layout of whole blocks close to `total` bytes: up to 32 layers, as many blocks per layer as fit
/// (the same rule as `te-bench run`).
fn layout_for(block_bytes: u64, total: u64) -> anyhow::Result<KvLayout> {
    if block_bytes == 0 || total < block_bytes {
        bail!(
            "--total-bytes ({total}) must hold at least one block of --block-bytes ({block_bytes})"
        );
    }
    let blocks = total / block_bytes;
    let layers = (1..=blocks.min(32))
        .rev()
        .find(|l| blocks.is_multiple_of(*l))
        .unwrap_or(1);
    Ok(KvLayout::new(
        layers as u32,
        u32::try_from(blocks / layers).context("too many blocks")?,
        block_bytes,
        16,
        Dtype::Bf16,
    )?)
}
