//! `te-bench serve --backend rdma` and `te-bench connect --backend rdma`: two processes moving KV over
//! libfabric (feature `rdma`). RDMA has no region-on-request handshake, so the server registers one region of
//! the layout it is given and publishes it as `kv`; it prints its endpoint address, which the client passes
//! as `--peer-address`.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use backends::rdma::{Provider, RdmaConfig, RdmaNode, provider_limit_gbps};
use backends::tcp::SocketCopy;
use tokio::runtime::Runtime;
use tokio::sync::broadcast::error::RecvError;
use transfer_engine::{Event, MemoryRegion, Role, TransferRequest};

use crate::args::fmt_size;
use crate::net::{ConnectArgs, ServeArgs};
use crate::report::print_rows;
use crate::run::{ModeArg, RDMA_COLUMNS, layout_for, memcpy_limit, row};

fn runtime() -> anyhow::Result<Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

/// A node on `provider` (in `domain`; libfabric's tcp provider on one host defaults to `lo`).
fn start(engine_id: u32, provider: &str, domain: Option<&str>) -> anyhow::Result<RdmaNode> {
    let mut cfg = RdmaConfig::new(engine_id, Provider::Named(provider.to_string()));
    cfg.domain = domain
        .map(str::to_string)
        .or_else(|| (provider == "tcp").then(|| "lo".to_string()));
    RdmaNode::start(cfg).with_context(|| format!("starting an RDMA node on provider {provider}"))
}

/// Lowercase hex of an endpoint address (written by hand: two short functions, not worth a dependency).
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> anyhow::Result<Vec<u8>> {
    let text = text.trim();
    if !text.len().is_multiple_of(2) || !text.bytes().all(|c| c.is_ascii_hexdigit()) {
        bail!("--peer-address must be the hex string `te-bench serve --backend rdma` printed");
    }
    (0..text.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(&text[i..i + 2], 16)?))
        .collect()
}

/// Serves one KV region over RDMA until `--seconds` pass (or forever), printing a line per session.
pub(crate) fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    let node = start(args.engine_id, &args.provider, args.domain.as_deref())?;
    let layout = layout_for(args.block_bytes, args.total_bytes)?;
    let region = node.kv_region(layout)?;
    node.publish_segment("kv", region)?;
    println!(
        "te-bench serve: engine {} on {} ({}), serving {} of KV (blocks of {}), address {}",
        args.engine_id,
        node.provider().provider,
        node.provider().domain,
        fmt_size(layout.total_bytes()),
        fmt_size(layout.block_bytes),
        hex(node.address())
    );
    let stop = (args.seconds > 0).then(|| Instant::now() + Duration::from_secs(args.seconds));
    rt.block_on(async {
        let mut events = node.subscribe();
        loop {
            let until = stop.map_or(Duration::from_secs(3600), |t| {
                t.saturating_duration_since(Instant::now())
            });
            tokio::select! {
                incoming = node.accept() => {
                    let Ok(s) = incoming else { return Ok(()) };
                    println!(
                        "session {} from engine {}: layers {:?} of {} blocks into region {}",
                        s.session, s.peer.0, s.layers, s.blocks.len(), s.region
                    );
                }
                event = events.recv() => match event {
                    Ok(Event::Completed { session, role: Role::Receiver, stats }) => {
                        println!(
                            "session {session}: {} received, {} blocks delivered, {} to recompute",
                            fmt_size(stats.bytes_received),
                            stats.blocks_delivered,
                            stats.recompute_blocks
                        );
                        if args.verify {
                            println!("session {session}: {}", verify(&node, session).await);
                        }
                    }
                    Ok(Event::Aborted { session, reason, .. }) => {
                        println!("session {session} ended early: {reason}");
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(n)) => eprintln!("(missed {n} events: printing fell behind)"),
                    Err(RecvError::Closed) => return Ok(()),
                },
                () = tokio::time::sleep(until) => return Ok(()),
            }
        }
    })
}

/// Checks a finished session's region against its client's pattern (seeded by the client's engine id).
async fn verify(node: &RdmaNode, session: transfer_engine::SessionId) -> String {
    let received = match node.wait_received(session).await {
        Ok(r) => r,
        Err(e) => return format!("not checked: {e}"),
    };
    if !received.recompute.is_empty() {
        return format!(
            "not checked: {} blocks to recompute",
            received.recompute.len()
        );
    }
    let seed = received.incoming.peer.0;
    match node
        .memory(received.incoming.region)
        .map_err(anyhow::Error::from)
        .and_then(|m| crate::tcp::holds_pattern(&m, seed))
    {
        Ok(true) => format!("verified (engine {seed}'s pattern)"),
        Ok(false) => format!("MISMATCH: the region does not hold engine {seed}'s pattern"),
        Err(e) => format!("not checked: {e}"),
    }
}

/// Pushes KV to a `te-bench serve --backend rdma` and prints the `run --backend rdma` columns.
pub(crate) fn connect(args: &ConnectArgs) -> anyhow::Result<()> {
    let address = unhex(args.peer_address.as_deref().context(
        "--backend rdma needs --peer-address (printed by te-bench serve --backend rdma)",
    )?)?;
    let rt = runtime()?;
    let node = start(args.engine_id, &args.provider, args.domain.as_deref())?;
    let layout = layout_for(args.block_bytes, args.total_bytes)?;
    let bytes = crate::run::kv_len(layout)?;
    let src_memory = MemoryRegion::zeroed(bytes);
    // Each client's own pattern, seeded by its engine id: a `serve --verify` checks it on arrival.
    src_memory.fill_with(|offset, b| crate::tcp::pattern(u64::from(args.engine_id), offset, b))?;
    let src = node.register_kv_region(layout, src_memory.clone())?;
    let info = rt.block_on(node.connect(&address))?;
    let dst = *info
        .segment("kv")
        .context("the server offered no region: is it a `te-bench serve --backend rdma`?")?;
    if dst.layout != Some(layout) {
        bail!(
            "the server serves a region of layout {:?}, not {layout:?}: pass the server's --block-bytes \
             and --total-bytes",
            dst.layout
        );
    }
    let limit_gbps = if args.no_limit {
        0.0
    } else if args.provider == "shm" {
        memcpy_limit(&src_memory.read(0..bytes)?, layout, args.iterations)
    } else {
        SocketCopy::new(layout.total_bytes(), 4 << 20, 1)?.run()?
    };
    let slice_bytes =
        u32::try_from(args.slice_bytes).context("--slice-bytes must fit in 32 bits")?;
    let modes = if args.mode.is_empty() {
        ModeArg::ALL.to_vec()
    } else {
        args.mode.clone()
    };
    let mut rows = Vec::new();
    for mode in modes {
        let mode = mode.with_slice(slice_bytes);
        let retransmits_before = node.stats().engine.retransmits;
        let mut seconds = Vec::new();
        let mut recompute = 0;
        for i in 0..=args.iterations {
            let req = TransferRequest::whole(info.peer, &src, &dst)?.with_mode(mode);
            let out = rt.block_on(node.transfer(req, Duration::from_secs(600)))?;
            if let Some(reason) = out.reason {
                bail!("the server refused the transfer: {reason}");
            }
            recompute += out.recompute.len();
            if i > 0 {
                seconds.push(out.elapsed.as_secs_f64());
            }
        }
        let retransmits = node.stats().engine.retransmits - retransmits_before;
        let mut r = row(
            "rdma",
            layout,
            mode,
            seconds,
            limit_gbps,
            retransmits,
            recompute,
        );
        if !args.no_limit {
            let unit = crate::rdma::unit_bytes(layout, mode);
            let cfg = RdmaConfig::new(args.engine_id, Provider::Named(args.provider.clone()));
            let window = cfg
                .window_units
                .min(usize::try_from(cfg.window_bytes / unit.max(1))?.max(1));
            let provider_limit = provider_limit_gbps(
                &Provider::Named(args.provider.clone()),
                args.domain
                    .as_deref()
                    .or((args.provider == "tcp").then_some("lo")),
                usize::try_from(unit)?,
                window,
                layout.total_bytes(),
                cfg.delivery_complete,
            )?;
            r.provider_ratio = Some(r.gbps / provider_limit);
            r.provider_limit_gbps = Some(provider_limit);
        }
        r.provider = Some(node.provider().provider.clone());
        rows.push(r);
    }
    print_rows(&rows, args.json, &RDMA_COLUMNS)
}
