//! `te-bench run`: real transfers between two engines, beside the raw limit of the same bytes.

use std::time::Duration;

use anyhow::{Context, bail};
use backends::loopback::{CONSUMER, LoopbackPair};
use clap::{Args, ValueEnum};
use transfer_engine::{Dtype, KvLayout, MemoryRegion, TransferMode, TransferRequest};

use crate::args::{fmt_size, parse_size};
use crate::buffers::{fill, kv_len, placed_memcpy_limit};
use crate::placement::{LayoutArg, check_blocks};
use crate::report::{print_rows, quantile};

mod row;

pub(crate) use row::{RDMA_COLUMNS, RUN_COLUMNS, RunRow, SHM_COLUMNS};

/// Which backend carries the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    /// Two engines in one process; the limit is a plain memcpy of the same blocks.
    Loopback,
    /// Two TCP nodes over real loopback sockets; the limit is a plain socket copy of the same bytes.
    Tcp,
    /// Two libfabric nodes (feature `rdma`) on `--provider`; limits: the provider's own write loop, and
    /// memcpy (`shm`) or the plain socket copy (`tcp`).
    Rdma,
    /// Same host, two processes (this one sends, a child receives): each unit copied once by
    /// cross-memory attach; the limit is a memcpy of the same blocks here.
    Shm,
}

impl Backend {
    /// Every backend.
    pub(crate) const ALL: [Backend; 2] = [Backend::Loopback, Backend::Tcp];
}

/// Wire mode to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ModeArg {
    /// Whole blocks as single units.
    Exclusive,
    /// Blocks cut into slices (see --slice-bytes).
    Packetized,
    /// Large contiguous runs exclusive, the rest packetized.
    Auto,
}

impl ModeArg {
    /// Every mode.
    pub(crate) const ALL: [ModeArg; 3] = [ModeArg::Exclusive, ModeArg::Packetized, ModeArg::Auto];

    /// The engine's mode, with `slice_bytes` slices where the mode has slices.
    pub(crate) fn with_slice(self, slice_bytes: u32) -> TransferMode {
        match self {
            ModeArg::Exclusive => TransferMode::Exclusive,
            ModeArg::Packetized => TransferMode::Packetized { slice_bytes },
            ModeArg::Auto => TransferMode::Auto {
                slice_bytes,
                exclusive_min_bytes: transfer_engine::DEFAULT_EXCLUSIVE_MIN_BYTES,
            },
        }
    }
}

/// Arguments of `te-bench run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Backend carrying the bytes.
    #[arg(long, value_enum, default_value = "loopback")]
    backend: Backend,
    /// Wire mode; repeat or omit to run every mode.
    #[arg(long, value_enum)]
    mode: Vec<ModeArg>,
    /// Physical KV layout of both sides (`--backend loopback` and `tcp`); repeat to compare layouts in
    /// one run (default: layer-major).
    #[arg(long, value_enum)]
    layout: Vec<LayoutArg>,
    /// Rounds per mode: each runs every `--layout` in turn (`--iterations` transfers each), so layouts
    /// are compared over the same seconds of the machine; rows give the median round, and
    /// `vs_first_layout` the median of each round's throughput over the first layout's.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Bytes per KV block (one layer's K and V of one block), with a unit: 4KiB, 256KiB, 4MiB.
    #[arg(long, value_parser = parse_size, default_value = "256KiB")]
    block_bytes: u64,
    /// Bytes per transfer (layers x blocks x block bytes; rounded down to whole blocks).
    #[arg(long, value_parser = parse_size, default_value = "512MiB")]
    total_bytes: u64,
    /// Slice size of packetized and auto modes, in bytes.
    #[arg(long, value_parser = parse_size, default_value = "64KiB")]
    slice_bytes: u64,
    /// Measured transfers per mode (after one warm-up); throughput is their median.
    #[arg(long, default_value_t = 5)]
    iterations: usize,
    /// libfabric provider of `--backend rdma`: tcp, shm, verbs, efa, a full name such as "tcp;ofi_rxm",
    /// auto (efa, then verbs, then tcp) or auto-local (shm before tcp: every peer on this host).
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// libfabric domain of `--backend rdma` (a NIC, or `lo`; the tcp provider defaults to `lo`).
    #[arg(long)]
    domain: Option<String>,
    /// `--backend rdma` only: register host regions as they are (zero-copy), under te-bench's promise,
    /// instead of through host mirrors (the default, where no safe view can race with a NIC).
    #[arg(long)]
    in_place: bool,
    /// `--backend tcp` only: both nodes send and receive every payload through their lanes' staging
    /// buffers (host buffers here), the path GPU regions take, instead of in place.
    #[arg(long)]
    staged: bool,
    /// `--backend shm` only: no CRC-32C on either end (a torn read goes unnoticed).
    #[arg(long)]
    no_checksum: bool,
    /// `--backend shm` only: the source in private memory, copied by cross-memory attach
    /// (`process_vm_readv`), instead of in shared memory granted to the receiver (backend `shm-cma`).
    #[arg(long)]
    private: bool,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

impl RunArgs {
    /// The demonstration's settings: a 7B-sized request's KV in every mode.
    pub(crate) fn demo() -> Self {
        Self {
            backend: Backend::Loopback,
            mode: Vec::new(),
            layout: Vec::new(),
            rounds: 1,
            block_bytes: 256 << 10,
            total_bytes: 256 << 20,
            slice_bytes: 64 << 10,
            iterations: 3,
            provider: "tcp".into(),
            domain: None,
            in_place: false,
            staged: false,
            no_checksum: false,
            private: false,
            json: false,
        }
    }
}

/// One shm row: transfers to a child process, beside a memcpy of the same blocks.
fn shm_row(
    layout: KvLayout,
    mode: TransferMode,
    iterations: usize,
    checksum: bool,
    private: bool,
) -> anyhow::Result<RunRow> {
    let run = crate::shm::run_shm(layout, mode, iterations, checksum, private)?;
    let mut r = row(
        if private { "shm-cma" } else { "shm" },
        layout,
        mode,
        run.seconds,
        run.limit_gbps,
        run.retransmits,
        run.recompute_blocks,
    );
    r.checksum = Some(checksum);
    r.sender_cpu_s_per_gib = Some(run.cpu_s_per_gib.0);
    r.receiver_cpu_s_per_gib = Some(run.cpu_s_per_gib.1);
    Ok(r)
}

pub(crate) fn main(args: &RunArgs) -> anyhow::Result<()> {
    if args.staged && args.backend != Backend::Tcp {
        bail!("--staged applies to --backend tcp only");
    }
    if (args.no_checksum || args.private) && args.backend != Backend::Shm {
        bail!("--no-checksum and --private apply to --backend shm only");
    }
    let layout = layout_for(args.block_bytes, args.total_bytes)?;
    let slice_bytes =
        u32::try_from(args.slice_bytes).context("--slice-bytes must fit in 32 bits")?;
    let modes = if args.mode.is_empty() {
        ModeArg::ALL.to_vec()
    } else {
        args.mode.clone()
    };
    let layouts = if args.layout.is_empty() {
        vec![LayoutArg::LayerMajor]
    } else {
        args.layout.clone()
    };
    if matches!(args.backend, Backend::Rdma | Backend::Shm) && layouts != [LayoutArg::LayerMajor] {
        bail!("--layout applies to --backend loopback and tcp only");
    }
    let rounds = args.rounds.max(1);
    let mut rows = Vec::new();
    let progress = crate::progress::bar((modes.len() * layouts.len() * rounds) as u64, args.json);
    for &mode in &modes {
        let mode = mode.with_slice(slice_bytes);
        // runs[layout][round]
        let mut runs: Vec<Vec<RunRow>> = vec![Vec::new(); layouts.len()];
        for _ in 0..rounds {
            for (runs, &placed) in runs.iter_mut().zip(&layouts) {
                progress.set_message(format!(
                    "{:?} {} {}",
                    args.backend,
                    mode.name(),
                    placed.name()
                ));
                let (src, dst) = placed.place(layout)?;
                let mut row = match args.backend {
                    Backend::Rdma => measure_rdma(args, layout, mode)?,
                    Backend::Shm => shm_row(
                        layout,
                        mode,
                        args.iterations,
                        !args.no_checksum,
                        args.private,
                    )?,
                    Backend::Tcp => tcp_row((src, dst), mode, args.iterations, args.staged)?,
                    Backend::Loopback => run_loopback((src, dst), mode, args.iterations)?,
                };
                row.layout = placed.name();
                runs.push(row);
                progress.inc(1);
            }
        }
        rows.extend(median_rounds(runs));
    }
    progress.finish_and_clear();
    let mut columns: Vec<&str> = match args.backend {
        Backend::Rdma => RDMA_COLUMNS.to_vec(),
        Backend::Shm => SHM_COLUMNS.to_vec(),
        _ => RUN_COLUMNS.to_vec(),
    };
    if layouts.len() > 1 {
        columns.push("vs_first_layout");
    }
    print_rows(&rows, args.json, &columns)
}

/// One row per layout from its rounds (`runs[layout][round]`): the round of median throughput, and,
/// beside several layouts, the median of each round's throughput over the first layout's.
fn median_rounds(runs: Vec<Vec<RunRow>>) -> Vec<RunRow> {
    let first: Vec<f64> = runs[0].iter().map(|r| r.gbps).collect();
    let several = runs.len() > 1;
    runs.into_iter()
        .map(|mut rounds| {
            let mut ratios: Vec<f64> = rounds.iter().zip(&first).map(|(r, f)| r.gbps / f).collect();
            let recompute = rounds.iter().map(|r| r.recompute_blocks).sum();
            let retransmits = rounds.iter().map(|r| r.retransmits).sum();
            rounds.sort_by(|a, b| a.gbps.total_cmp(&b.gbps));
            let mut row = rounds.swap_remove(rounds.len() / 2);
            (row.recompute_blocks, row.retransmits) = (recompute, retransmits);
            row.vs_first_layout = several.then(|| quantile(&mut ratios, 0.5));
            row
        })
        .collect()
}

/// One RDMA row: the transfers and both limits.
#[cfg(feature = "rdma")]
fn measure_rdma(args: &RunArgs, layout: KvLayout, mode: TransferMode) -> anyhow::Result<RunRow> {
    let run = crate::rdma::run_rdma(
        layout,
        mode,
        args.iterations,
        &args.provider,
        args.domain.as_deref(),
        args.in_place,
    )?;
    let mut r = row(
        "rdma",
        layout,
        mode,
        run.seconds,
        run.limit_gbps,
        run.retransmits,
        run.recompute_blocks,
    );
    r.set_provider(run.provider, Some(run.provider_limit_gbps));
    r.host_memory = Some(if args.in_place {
        "in_place"
    } else {
        "mirrored"
    });
    Ok(r)
}

/// Without feature `rdma` there is no RDMA backend to run: a clear error.
#[cfg(not(feature = "rdma"))]
fn measure_rdma(_: &RunArgs, _: KvLayout, _: TransferMode) -> anyhow::Result<RunRow> {
    bail!("te-bench was built without the RDMA backend: build it with `--features rdma`")
}

/// Measures `iterations` transfers of `layout` in `mode` over `backend`, beside the backend's raw limit.
pub(crate) fn measure(
    backend: Backend,
    layout: KvLayout,
    mode: TransferMode,
    iterations: usize,
) -> anyhow::Result<RunRow> {
    match backend {
        Backend::Rdma => {
            bail!("RDMA runs need a provider: use `te-bench run --backend rdma --provider P`")
        }
        Backend::Shm => shm_row(layout, mode, iterations, true, false),
        Backend::Loopback => run_loopback((layout, layout), mode, iterations),
        Backend::Tcp => tcp_row((layout, layout), mode, iterations, false),
    }
}

/// A TCP run's row from `layouts.0` into `layouts.1`; `staged`: every payload through the lanes'
/// staging buffers (backend `tcp-staged`).
fn tcp_row(
    layouts: (KvLayout, KvLayout),
    mode: TransferMode,
    iterations: usize,
    staged: bool,
) -> anyhow::Result<RunRow> {
    let run = crate::tcp::run_tcp(layouts, mode, iterations, staged)?;
    Ok(row(
        if staged { "tcp-staged" } else { "tcp" },
        layouts.0,
        mode,
        run.seconds,
        run.limit_gbps,
        run.retransmits,
        run.recompute_blocks,
    ))
}

/// A result row from measured transfer times and the limit measured beside them.
pub(crate) fn row(
    backend: &'static str,
    layout: KvLayout,
    mode: TransferMode,
    mut seconds: Vec<f64>,
    limit_gbps: f64,
    retransmits: u64,
    recompute_blocks: usize,
) -> RunRow {
    let bytes = layout.kv_bytes();
    let median = quantile(&mut seconds, 0.5);
    let gbps = bytes as f64 / median / 1e9;
    RunRow {
        backend,
        mode: mode.name(),
        layout: LayoutArg::LayerMajor.name(),
        block_bytes: layout.block_bytes,
        block: fmt_size(layout.block_bytes),
        bytes,
        iterations: seconds.len(),
        seconds: median,
        gbps,
        limit_gbps,
        ratio: gbps / limit_gbps,
        p50_ms: median * 1e3,
        p99_ms: quantile(&mut seconds, 0.99) * 1e3,
        retransmits,
        recompute_blocks,
        vs_first_layout: None,
        provider: None,
        provider_limit_gbps: None,
        provider_ratio: None,
        host_memory: None,
        checksum: None,
        sender_cpu_s_per_gib: None,
        receiver_cpu_s_per_gib: None,
    }
}

/// A layout of whole blocks close to `total` bytes: up to 32 layers, as many blocks per layer as fit.
pub(crate) fn layout_for(block_bytes: u64, total: u64) -> anyhow::Result<KvLayout> {
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

/// A loopback run's row from `layouts.0` into `layouts.1`.
fn run_loopback(
    layouts: (KvLayout, KvLayout),
    mode: TransferMode,
    iterations: usize,
) -> anyhow::Result<RunRow> {
    let (layout, dst_layout) = layouts;
    let pair = LoopbackPair::with_defaults();
    // Caller-owned memory on both ends, registered as it is.
    let mut kv = vec![0u8; usize::try_from(layout.total_bytes())?];
    fill(&mut kv);
    let dst_memory = MemoryRegion::zeroed(kv_len(dst_layout)?);
    dst_memory.fill_with(|_, b| b.fill(0))?; // touched now, as the memcpy limit's buffers are
    let limit = placed_memcpy_limit(&kv, layouts, iterations);
    let src_memory = MemoryRegion::from_vec(kv);
    let src = pair
        .producer()
        .register_kv_region(layout, src_memory.clone())?;
    let dst = pair
        .consumer()
        .register_kv_region(dst_layout, dst_memory.clone())?;
    let mut seconds = Vec::new();
    let mut recompute = 0;
    for i in 0..=iterations {
        let req = TransferRequest::whole(CONSUMER, &src, &dst)?.with_mode(mode);
        let out = pair.transfer(req, Duration::from_secs(600))?;
        recompute += out.recompute.len();
        if i > 0 {
            seconds.push(out.elapsed.as_secs_f64());
        }
    }
    check_blocks(&src_memory, &layout, &dst_memory, &dst_layout)?;
    let retransmits = pair.producer().stats().retransmits;
    Ok(row(
        "loopback",
        layout,
        mode,
        seconds,
        limit,
        retransmits,
        recompute,
    ))
}
