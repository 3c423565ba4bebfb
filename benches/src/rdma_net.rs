//! `te-bench serve --backend rdma` and `te-bench connect --backend rdma`: two processes moving KV over
//! libfabric (feature `rdma`). RDMA has no region-on-request handshake, so the server registers one region of
//! the layout it is given and publishes it as `kv`; it prints its endpoint address (`rdma:<provider>:<hex>`,
//! as the discovery registry stores it), which the client passes as `--peer-address`.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use backends::rdma::RdmaNode;
use backends::{IncomingSession, PeerAddress, Transport};
use tokio::sync::broadcast;
use transfer_engine::{Event, MemoryRegion, RegionId, TransferRequest};

use crate::args::fmt_size;
use crate::net::{ConnectArgs, ServeArgs, ServedNode, connect_modes, measure_modes, serve_events};
use crate::rdma::{node_config, provider_ceiling, raw_limit, runtime};
use crate::report::print_rows;
use crate::run::{RDMA_COLUMNS, layout_for};

/// A node on `provider` (in `domain`, as [`node_config`] defaults it).
fn start(engine_id: u32, provider: &str, domain: Option<&str>) -> anyhow::Result<RdmaNode> {
    RdmaNode::start(node_config(engine_id, provider, domain))
        .with_context(|| format!("starting an RDMA node on provider {provider}"))
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
        Transport::address(&node).context("an RDMA node always has an address")?
    );
    let stop = (args.seconds > 0).then(|| Instant::now() + Duration::from_secs(args.seconds));
    rt.block_on(serve_events(&node, args.verify, stop))
}

impl ServedNode for RdmaNode {
    fn subscribe(&self) -> broadcast::Receiver<Event> {
        RdmaNode::subscribe(self)
    }
    async fn next_incoming(&self) -> Option<IncomingSession> {
        RdmaNode::next_incoming(self).await.ok()
    }
    fn memory(&self, id: RegionId) -> anyhow::Result<MemoryRegion> {
        Ok(RdmaNode::memory(self, id)?)
    }
    fn layout(&self, id: RegionId) -> Option<transfer_engine::KvLayout> {
        self.region_layout(id).ok().flatten()
    }
}

/// Pushes KV to a `te-bench serve --backend rdma` and prints the `run --backend rdma` columns.
pub(crate) fn connect(args: &ConnectArgs) -> anyhow::Result<()> {
    let text = args.peer_address.as_deref().context(
        "--backend rdma needs --peer-address (printed by te-bench serve --backend rdma)",
    )?;
    let address: PeerAddress = text.parse()?;
    let PeerAddress::Rdma { provider, .. } = &address else {
        bail!("{address} is not an RDMA endpoint address (rdma:<provider>:<hex>)");
    };
    let rt = runtime()?;
    let node = start(args.engine_id, &args.provider, args.domain.as_deref())?;
    let layout = layout_for(args.block_bytes, args.total_bytes)?;
    let bytes = crate::buffers::kv_len(layout)?;
    let src_memory = MemoryRegion::zeroed(bytes);
    // Each client's own pattern, seeded by its engine id: a `serve --verify` checks it on arrival.
    src_memory.fill_with(|offset, b| crate::tcp::pattern(u64::from(args.engine_id), offset, b))?;
    let src = node.register_kv_region(layout, src_memory.clone())?;
    if let Some(provider) = provider
        .as_ref()
        .filter(|p| **p != node.provider().provider)
    {
        bail!(
            "the server is on provider {provider}, this client on {}: pass the server's --provider",
            node.provider().provider
        );
    }
    let info = rt.block_on(Transport::connect(&node, &address))?;
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
    } else {
        raw_limit(&args.provider, &src_memory, layout, args.iterations)?
    };
    let mut rows = measure_modes(
        args,
        "rdma",
        layout,
        limit_gbps,
        |mode| {
            let req = TransferRequest::whole(info.peer, &src, &dst)?.with_mode(mode);
            Ok(rt.block_on(node.transfer(req, Duration::from_secs(600)))?)
        },
        || node.stats().engine.retransmits,
    )?;
    let cfg = node_config(args.engine_id, &args.provider, args.domain.as_deref());
    for (r, mode) in rows.iter_mut().zip(connect_modes(args)?) {
        let provider_limit = if args.no_limit {
            None
        } else {
            Some(provider_ceiling(&cfg, layout, mode)?)
        };
        r.set_provider(node.provider().provider.clone(), provider_limit);
    }
    print_rows(&rows, args.json, &RDMA_COLUMNS)
}
