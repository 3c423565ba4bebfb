//! `te-bench serve --backend shm` and `te-bench connect --backend shm`: two processes on one host moving
//! KV through the same-host backend, started by hand (`run --backend shm` starts its own receiver). The
//! server listens on `--socket`, registers one region of the layout it is given and publishes it as
//! `kv`; the client pushes its pattern there from shared memory (granted to the server, which copies each
//! unit out of its mapping) or, with `--private`, from private memory (cross-memory attach).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use backends::IncomingSession;
use backends::shm::{ShmConfig, ShmNode};
use tokio::sync::broadcast;
use transfer_engine::{Event, MemoryRegion, RegionId, TransferRequest};

use crate::args::fmt_size;
use crate::net::{ConnectArgs, ServeArgs, ServedNode, measure_modes, serve_events};
use crate::run::{SHM_COLUMNS, layout_for};
use crate::shm::{cpu_seconds, runtime, source_memory};

/// Serves one KV region on `--socket` until `--seconds` pass (or forever), printing a line per session.
pub(crate) fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    let mut cfg = ShmConfig::new(args.engine_id, Some(args.socket.clone()));
    cfg.checksum = !args.no_checksum;
    let node =
        ShmNode::start(cfg).with_context(|| format!("listening on {}", args.socket.display()))?;
    let layout = layout_for(args.block_bytes, args.total_bytes)?;
    let region = node.kv_region(layout)?;
    node.publish_segment("kv", region)?;
    println!(
        "te-bench serve: engine {} on shm, socket {}, serving {} of KV (blocks of {})",
        args.engine_id,
        args.socket.display(),
        fmt_size(layout.total_bytes()),
        fmt_size(layout.block_bytes),
    );
    let stop = (args.seconds > 0).then(|| Instant::now() + Duration::from_secs(args.seconds));
    let node = std::sync::Arc::new(node);
    let watched = std::sync::Arc::downgrade(&node);
    // The node's log as it grows: links made and lost, the copy path each peer got, refusals.
    std::thread::spawn(move || {
        let mut seen = 0;
        while let Some(node) = watched.upgrade() {
            let (lines, newest) = node.log_after(seen);
            for line in lines {
                println!("te-bench serve: {line}");
            }
            seen = newest;
            drop(node);
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    rt.block_on(serve_events(node.as_ref(), args.verify, stop))
}

impl ServedNode for ShmNode {
    fn subscribe(&self) -> broadcast::Receiver<Event> {
        ShmNode::subscribe(self)
    }
    async fn next_incoming(&self) -> Option<IncomingSession> {
        ShmNode::next_incoming(self).await.ok()
    }
    fn memory(&self, id: RegionId) -> anyhow::Result<MemoryRegion> {
        Ok(ShmNode::memory(self, id)?)
    }
    fn layout(&self, id: RegionId) -> Option<transfer_engine::KvLayout> {
        self.region_layout(id).ok().flatten()
    }
}

/// Pushes KV to a `te-bench serve --backend shm` and prints the `run --backend shm` columns (the
/// receiver's CPU time is the server's own, so that column is absent here).
pub(crate) fn connect(args: &ConnectArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    let mut cfg = ShmConfig::new(args.engine_id, None);
    cfg.checksum = !args.no_checksum;
    let node = ShmNode::start(cfg)?;
    let layout = layout_for(args.block_bytes, args.total_bytes)?;
    let mut kv = vec![0u8; crate::buffers::kv_len(layout)?];
    // Each client's own pattern, seeded by its engine id: a `serve --verify` checks it on arrival.
    for (i, shard) in kv.chunks_mut(transfer_engine::SHARD_BYTES).enumerate() {
        crate::tcp::pattern(
            u64::from(args.engine_id),
            i * transfer_engine::SHARD_BYTES,
            shard,
        );
    }
    let limit_gbps = if args.no_limit {
        0.0
    } else {
        crate::buffers::placed_memcpy_limit(&kv, (layout, layout), args.iterations)
    };
    let src = node.register_kv_region(layout, source_memory(&node, kv, args.private)?)?;
    let info = rt
        .block_on(node.connect(&args.socket))
        .with_context(|| format!("connecting to {}", args.socket.display()))?;
    let dst = *info
        .segment("kv")
        .context("the server offered no region: is it a `te-bench serve --backend shm`?")?;
    if dst.layout != Some(layout) {
        bail!(
            "the server serves a region of layout {:?}, not {layout:?}: pass the server's --block-bytes \
             and --total-bytes",
            dst.layout
        );
    }
    let gib = layout.kv_bytes() as f64 / f64::from(1u32 << 30);
    let mut cpu_per_gib = Vec::new();
    let mut rows = measure_modes(
        args,
        if args.private { "shm-cma" } else { "shm" },
        layout,
        limit_gbps,
        |mode| {
            let req = TransferRequest::whole(info.peer, &src, &dst)?.with_mode(mode);
            let cpu = cpu_seconds();
            let out = rt.block_on(node.transfer(req, Duration::from_secs(600)))?;
            cpu_per_gib.push((cpu_seconds() - cpu) / gib);
            Ok(out)
        },
        || node.stats().engine.retransmits,
    )?;
    // Each mode ran one warm-up and `--iterations` measured transfers, in order.
    for (r, cpu) in rows
        .iter_mut()
        .zip(cpu_per_gib.chunks_mut(args.iterations + 1))
    {
        r.checksum = Some(!args.no_checksum);
        r.sender_cpu_s_per_gib = Some(crate::report::quantile(&mut cpu[1..], 0.5));
    }
    crate::report::print_rows(&rows, args.json, &SHM_COLUMNS)
}
