//! `te-bench run --backend rdma --provider P`: two libfabric nodes in this process, beside two limits
//! measured in the same run: the provider's own ceiling (a plain loop of `fi_writedata`s of the size the
//! engine's data frames have, with the same window and no engine) and the machine's raw limit (memcpy for `shm`, the plain socket
//! copy for `tcp`).

use std::time::Duration;

use anyhow::{Context, bail};
use backends::rdma::{Provider, RdmaConfig, RdmaNode, provider_limit_gbps};
use benches::SocketCopy;
use transfer_engine::{
    KvLayout, MAX_COALESCED_SLICES, MemoryRegion, TransferMode, TransferRequest,
};

/// What an RDMA run measured.
pub(crate) struct RdmaRun {
    /// Seconds of each measured transfer (submit until the sender learned every block was applied).
    pub(crate) seconds: Vec<f64>,
    /// The machine's raw limit: memcpy of the same blocks (`shm`) or the plain socket copy (otherwise).
    pub(crate) limit_gbps: f64,
    /// The provider's own ceiling for units of this transfer's size.
    pub(crate) provider_limit_gbps: f64,
    /// The provider libfabric chose (for example `tcp;ofi_rxm` or `shm`).
    pub(crate) provider: String,
    /// Slices sent again, over every transfer.
    pub(crate) retransmits: u64,
    /// Blocks handed back for recompute, over every transfer.
    pub(crate) recompute_blocks: usize,
}

/// Runs one warm-up and `iterations` measured transfers of a whole `layout` in `mode` between two nodes on
/// `provider` (in `domain`, if named; host regions in place or mirrored), checks the destination is byte-identical to the source, and measures
/// both limits.
pub(crate) fn run_rdma(
    layout: KvLayout,
    mode: TransferMode,
    iterations: usize,
    provider: &str,
    domain: Option<&str>,
    in_place: bool,
) -> anyhow::Result<RdmaRun> {
    let rt = runtime()?;
    let config = |id| {
        let mut cfg = node_config(id, provider, domain);
        if in_place {
            cfg.host_memory = crate::in_place::host_memory_in_place();
        }
        cfg
    };
    let producer = RdmaNode::start(config(1))?;
    let consumer = RdmaNode::start(config(2))?;
    let bytes = crate::buffers::kv_len(layout)?;
    let mut kv = vec![0u8; bytes];
    crate::buffers::fill(&mut kv);
    let src_memory = MemoryRegion::from_vec(kv);
    let dst_memory = MemoryRegion::zeroed(bytes);
    dst_memory.fill_with(|_, b| b.fill(0))?;
    let src = producer.register_kv_region(layout, src_memory.clone())?;
    let dst = consumer.register_kv_region(layout, dst_memory.clone())?;
    consumer.publish_segment("kv", dst)?;
    let peer = rt.block_on(producer.connect(consumer.address()))?;
    let dst = *peer
        .segment("kv")
        .context("the consumer offered no region")?;

    let provider_limit = provider_ceiling(&config(1), layout, mode)?;
    let limit_gbps = raw_limit(provider, &src_memory, layout, iterations)?;

    let mut seconds = Vec::with_capacity(iterations);
    let mut recompute_blocks = 0;
    for i in 0..=iterations {
        let req = TransferRequest::whole(peer.peer, &src, &dst)?
            .with_mode(mode)
            .with_deadline(Duration::from_secs(120));
        let out = rt.block_on(producer.transfer(req, Duration::from_secs(300)))?;
        if let Some(reason) = &out.reason {
            bail!("the transfer was refused: {reason}");
        }
        rt.block_on(consumer.wait_received(out.session))?;
        recompute_blocks += out.recompute.len();
        if i > 0 {
            seconds.push(out.elapsed.as_secs_f64());
        }
    }
    if recompute_blocks == 0
        && *src_memory.read(0..src_memory.len())? != *dst_memory.read(0..dst_memory.len())?
    {
        bail!(
            "destination differs from source after the transfer: this is a bug, please report it"
        );
    }
    Ok(RdmaRun {
        seconds,
        limit_gbps,
        provider_limit_gbps: provider_limit,
        provider: producer.provider().provider.clone(),
        retransmits: producer.stats().engine.retransmits,
        recompute_blocks,
    })
}

/// The runtime the RDMA commands drive their nodes' async calls on.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

/// A node's settings on `provider` (in `domain`; libfabric's tcp provider on this machine's loopback needs
/// the `lo` domain, so it is the default there).
pub(crate) fn node_config(engine_id: u32, provider: &str, domain: Option<&str>) -> RdmaConfig {
    let mut cfg = RdmaConfig::new(engine_id, Provider::parse(provider));
    cfg.domain = domain
        .map(str::to_string)
        .or_else(|| (provider == "tcp").then(|| "lo".to_string()));
    cfg
}

/// The provider's own ceiling for a transfer of `layout` in `mode` by a node of `cfg`: a plain loop of its
/// writes of the size of the engine's data frames, with the node's window.
pub(crate) fn provider_ceiling(
    cfg: &RdmaConfig,
    layout: KvLayout,
    mode: TransferMode,
) -> anyhow::Result<f64> {
    let unit = frame_bytes(layout, mode, cfg.engine.coalesce_bytes);
    let window = cfg
        .window_units
        .min(usize::try_from(cfg.window_bytes / unit.max(1))?.max(1));
    Ok(provider_limit_gbps(
        &cfg.provider,
        cfg.domain.as_deref(),
        usize::try_from(unit)?,
        window,
        layout.total_bytes(),
        cfg.delivery_complete,
    )?)
}

/// The machine's raw limit for `src`'s bytes: memcpy for `shm`, the plain socket copy otherwise.
pub(crate) fn raw_limit(
    provider: &str,
    src: &MemoryRegion,
    layout: KvLayout,
    iterations: usize,
) -> anyhow::Result<f64> {
    if provider == "shm" {
        Ok(crate::buffers::placed_memcpy_limit(
            &src.read(0..src.len())?,
            (layout, layout),
            iterations,
        ))
    } else {
        Ok(SocketCopy::new(layout.total_bytes(), 4 << 20, 1)?.run()?)
    }
}

/// The payload of (most of) the data frames a plan of `layout` in `mode` is sent in: whole blocks
/// (exclusive, and auto for blocks of its threshold or more), otherwise slices, coalesced up to
/// `coalesce_bytes` within a block (see `EngineConfig::coalesce_bytes`). The provider's own loop is
/// measured with writes of this size.
fn frame_bytes(layout: KvLayout, mode: TransferMode, coalesce_bytes: u32) -> u64 {
    match mode {
        TransferMode::Exclusive => layout.block_bytes,
        TransferMode::Auto {
            exclusive_min_bytes,
            ..
        } if layout.block_bytes >= exclusive_min_bytes => layout.block_bytes,
        TransferMode::Packetized { slice_bytes } | TransferMode::Auto { slice_bytes, .. } => {
            let slice = u64::from(slice_bytes).min(layout.block_bytes).max(1);
            let per_frame =
                (u64::from(coalesce_bytes) / slice).clamp(1, MAX_COALESCED_SLICES as u64);
            (slice * per_frame).min(layout.block_bytes)
        }
    }
}
