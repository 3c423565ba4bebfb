//! `te-bench gpu --engine loopback|tcp`: GPU regions moved by the transfer engine itself (sessions,
//! checksums, acknowledgements): host to GPU, GPU to host and GPU to GPU, each block size sent exclusive
//! (one unit a block), every byte checked after every run, beside a plain `cuMemcpy` of the same route and
//! bytes measured in the same run. Loopback places GPU units through the `GpuMover`; TCP stages them
//! through each lane's pinned buffers on both ends.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use backends::cuda::{DeviceMemory, Gpu, PinnedHostMemory};
use backends::loopback::{CONSUMER, LoopbackPair};
use backends::tcp::{BlockingNode, TcpConfig};
use serde::Serialize;
use transfer_engine::{
    KvLayout, MemoryRegion, PeerId, RegionHandle, TransferMode, TransferRequest,
};

use super::{GpuArgs, fill_pattern};
use crate::report::{print_rows, quantile};

const COLUMNS: &[&str] = &[
    "backend",
    "route",
    "block_bytes",
    "engine_gb_s",
    "cumemcpy_gb_s",
    "ratio",
    "verified_bytes",
];

const LIMIT: Duration = Duration::from_secs(300);

#[derive(Debug, Serialize)]
struct Row {
    gpu: String,
    backend: &'static str,
    route: &'static str,
    block_bytes: u64,
    bytes: u64,
    engine_gb_s: f64,
    cumemcpy_gb_s: f64,
    ratio: f64,
    /// Bytes compared with the source after every timed engine run.
    verified_bytes: u64,
}

/// Two ends of one backend with a source and a destination region registered.
enum Ends {
    Loopback(LoopbackPair),
    Tcp {
        sender: BlockingNode,
        _receiver: BlockingNode,
        peer: PeerId,
    },
}

impl Ends {
    fn new(
        backend: &str,
        layout: KvLayout,
        src: &MemoryRegion,
        dst: &MemoryRegion,
    ) -> anyhow::Result<(Self, RegionHandle, RegionHandle)> {
        match backend {
            "loopback" => {
                let pair = LoopbackPair::with_defaults();
                let s = pair.producer().register_kv_region(layout, src.clone())?;
                let d = pair.consumer().register_kv_region(layout, dst.clone())?;
                Ok((Ends::Loopback(pair), s, d))
            }
            "tcp" => {
                let receiver = BlockingNode::start(TcpConfig::with_engine_id(2))?;
                let sender = BlockingNode::start_beside(&receiver, {
                    let mut cfg = TcpConfig::with_engine_id(1);
                    cfg.listen = None;
                    cfg
                })?;
                let s = sender.node().register_kv_region(layout, src.clone())?;
                let d = receiver.node().register_kv_region(layout, dst.clone())?;
                let addr = receiver
                    .node()
                    .local_addr()
                    .ok_or_else(|| anyhow::anyhow!("the receiver has no listener"))?;
                let peer = sender.connect(addr, None)?.peer;
                Ok((
                    Ends::Tcp {
                        sender,
                        _receiver: receiver,
                        peer,
                    },
                    s,
                    d,
                ))
            }
            other => bail!("--engine takes loopback, tcp or shm, not {other:?}"),
        }
    }

    /// Moves every block exclusive; returns the seconds it took.
    fn transfer(&self, src: &RegionHandle, dst: &RegionHandle) -> anyhow::Result<f64> {
        let peer = match self {
            Ends::Loopback(_) => CONSUMER,
            Ends::Tcp { peer, .. } => *peer,
        };
        let req = TransferRequest::whole(peer, src, dst)?.with_mode(TransferMode::Exclusive);
        let start = Instant::now();
        let out = match self {
            Ends::Loopback(pair) => pair.transfer(req, LIMIT)?,
            Ends::Tcp { sender, .. } => sender.transfer(req, LIMIT)?,
        };
        let seconds = start.elapsed().as_secs_f64();
        if let Some(reason) = out.reason {
            bail!("the receiver refused the transfer: {reason}");
        }
        ensure!(
            out.recompute.is_empty(),
            "{} blocks came back for recompute",
            out.recompute.len()
        );
        Ok(seconds)
    }
}

/// Runs every route and block size on `args.engine`'s backend.
pub(super) fn main(args: &GpuArgs, backend: &str) -> anyhow::Result<()> {
    if !matches!(backend, "loopback" | "tcp") {
        bail!("--engine takes loopback, tcp or shm, not {backend:?}");
    }
    let gpu = Gpu::open(args.device)?;
    let len = usize::try_from(args.bytes)?;
    let pattern = MemoryRegion::zeroed(len);
    fill_pattern(&pattern)?;
    let pinned = PinnedHostMemory::alloc(&gpu, len)?.into_region();
    let dev_a = DeviceMemory::alloc(&gpu, len)?.into_region();
    let dev_b = DeviceMemory::alloc(&gpu, len)?.into_region();
    let check = MemoryRegion::zeroed(len);
    let mut rows = Vec::new();
    for &block in &args.blocks {
        let layout = crate::run::layout_for(block, args.bytes)?;
        let bytes = usize::try_from(layout.total_bytes())?;
        let routes: [(&'static str, &MemoryRegion, &MemoryRegion); 3] = [
            ("host to GPU", &pinned, &dev_a),
            ("GPU to host", &dev_a, &pinned),
            ("GPU to GPU", &dev_a, &dev_b),
        ];
        for (route, src, dst) in routes {
            // The source holds the pattern: host memory directly, GPU memory by a plain copy of it.
            let what = || format!("{backend}, {route}, {block}-byte blocks");
            copy(&gpu, &pattern, src, len)?;
            let (ends, s, d) = Ends::new(backend, layout, src, dst).with_context(what)?;
            // One untimed transfer first: lanes, staging buffers and copy engines are made on first use.
            ends.transfer(&s, &d).with_context(what)?;
            let (mut engine_s, mut plain_s, mut verified) = (Vec::new(), Vec::new(), 0u64);
            for _ in 0..args.repeats {
                clear(&gpu, dst, len)?;
                engine_s.push(ends.transfer(&s, &d).with_context(what)?);
                copy(&gpu, dst, &check, bytes)?;
                ensure!(
                    same(&check, &pattern, bytes)?,
                    "{}: the destination differs from the source",
                    what()
                );
                verified += bytes as u64;
                let start = Instant::now();
                gpu.plain_copy(src, 0, dst, 0, bytes)?;
                plain_s.push(start.elapsed().as_secs_f64());
            }
            drop(ends);
            let engine_gb_s = bytes as f64 / quantile(&mut engine_s, 0.5) / 1e9;
            let cumemcpy_gb_s = bytes as f64 / quantile(&mut plain_s, 0.5) / 1e9;
            rows.push(Row {
                gpu: gpu.name().to_owned(),
                backend: if backend == "tcp" { "tcp" } else { "loopback" },
                route,
                block_bytes: block,
                bytes: bytes as u64,
                engine_gb_s,
                cumemcpy_gb_s,
                ratio: engine_gb_s / cumemcpy_gb_s,
                verified_bytes: verified,
            });
        }
    }
    print_rows(&rows, args.json, COLUMNS)
}

/// Copies the first `len` bytes of `src` to `dst`, host or GPU on either side.
fn copy(gpu: &Gpu, src: &MemoryRegion, dst: &MemoryRegion, len: usize) -> anyhow::Result<()> {
    if src.kind().is_host() && dst.kind().is_host() {
        src.with_views(0..len, dst, 0..len, |from, to| to.copy_from_slice(from))?;
    } else {
        gpu.plain_copy(src, 0, dst, 0, len)?;
    }
    Ok(())
}

/// Whether the first `len` bytes of two host regions are equal (views taken in order of address).
fn same(a: &MemoryRegion, b: &MemoryRegion, len: usize) -> anyhow::Result<bool> {
    let (first, second) = if a.address() < b.address() {
        (a, b)
    } else {
        (b, a)
    };
    let x = first.read(0..len)?;
    let y = second.read(0..len)?;
    Ok(x[..] == y[..])
}

/// Zeroes `len` bytes of `region`, host or GPU.
fn clear(gpu: &Gpu, region: &MemoryRegion, len: usize) -> anyhow::Result<()> {
    if region.kind().is_host() {
        region.fill_with(|_, b| b.fill(0))?;
    } else {
        gpu.zero(region, 0..len)?;
    }
    Ok(())
}
