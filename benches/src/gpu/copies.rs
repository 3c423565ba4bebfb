//! GPU copies through the `cuda` copy engine beside a plain `cuMemcpy` of the same bytes.

use std::time::Instant;

use anyhow::{Context, ensure};
use backends::cuda::{BlockCopied, CopyEngine, DeviceMemory, Gpu, PinnedHostMemory};
use serde::Serialize;
use transfer_engine::{MemoryRegion, SHARD_BYTES};

use super::{GpuArgs, fill_pattern};
use crate::report::{print_rows, quantile};

const COLUMNS: &[&str] = &[
    "direction",
    "host",
    "block_bytes",
    "engine_gb_s",
    "cumemcpy_gb_s",
    "ratio",
    "verified_bytes",
    "verified_blocks",
];

/// One direction, host memory kind and block size.
#[derive(Debug, Serialize)]
struct Row {
    gpu: String,
    direction: &'static str,
    host: &'static str,
    block_bytes: u64,
    bytes: u64,
    engine_gb_s: f64,
    cumemcpy_gb_s: f64,
    ratio: f64,
    /// Bytes compared with the source after every timed engine run.
    verified_bytes: u64,
    /// Blocks whose reported CRC-32C matched the source's (0 for GPU to GPU, not checksummed).
    verified_blocks: u64,
}

/// Whether two host regions hold the same bytes, compared shard by shard.
fn same_bytes(a: &MemoryRegion, b: &MemoryRegion) -> anyhow::Result<bool> {
    let mut at = 0;
    while at < a.len() {
        let end = (at + SHARD_BYTES).min(a.len());
        if a.read(at..end)?[..] != b.read(at..end)?[..] {
            return Ok(false);
        }
        at = end;
    }
    Ok(true)
}

/// CRC-32C of each `block` of `region`.
fn block_crcs(region: &MemoryRegion, block: usize) -> anyhow::Result<Vec<u32>> {
    (0..region.len())
        .step_by(block)
        .map(|at| Ok(region.crc32c(at..(at + block).min(region.len()))?))
        .collect()
}

fn gb_s(bytes: usize, seconds: &mut [f64]) -> f64 {
    bytes as f64 / quantile(seconds, 0.5) / 1e9
}

struct Setup {
    gpu: Gpu,
    len: usize,
    dev_a: MemoryRegion,
    dev_b: MemoryRegion,
    check: MemoryRegion,
}

impl Setup {
    /// Times `engine.copy(src → dst)` and a plain `cuMemcpy` of the same bytes, `repeats` times each;
    /// before every engine run `prepare` clears the destination, after it `verify` compares all bytes.
    #[allow(clippy::too_many_arguments)]
    fn measure(
        &self,
        engine: &mut CopyEngine,
        src: &MemoryRegion,
        dst: &MemoryRegion,
        expected_crcs: Option<&[u32]>,
        repeats: usize,
        prepare: &dyn Fn() -> anyhow::Result<()>,
        verify: &dyn Fn() -> anyhow::Result<bool>,
    ) -> anyhow::Result<(f64, f64, u64, u64)> {
        let (mut engine_s, mut plain_s) = (Vec::new(), Vec::new());
        let (mut bytes_ok, mut blocks_ok) = (0u64, 0u64);
        for _ in 0..repeats {
            prepare()?;
            let mut blocks: Vec<BlockCopied> = Vec::new();
            let start = Instant::now();
            engine.copy(src, 0..self.len, dst, 0, |b| blocks.push(b))?;
            engine_s.push(start.elapsed().as_secs_f64());
            ensure!(verify()?, "bytes differ after the engine's copy");
            bytes_ok += self.len as u64;
            if let Some(expected) = expected_crcs {
                ensure!(blocks.len() == expected.len(), "block count differs");
                for (b, want) in blocks.iter().zip(expected) {
                    ensure!(
                        b.crc32c == Some(*want),
                        "CRC-32C of block at {} differs",
                        b.offset
                    );
                }
                blocks_ok += blocks.len() as u64;
            }
            let start = Instant::now();
            self.gpu.plain_copy(src, 0, dst, 0, self.len)?;
            plain_s.push(start.elapsed().as_secs_f64());
        }
        Ok((
            gb_s(self.len, &mut engine_s),
            gb_s(self.len, &mut plain_s),
            bytes_ok,
            blocks_ok,
        ))
    }
}

/// Runs the GPU copy benchmark.
pub(super) fn main(args: &GpuArgs) -> anyhow::Result<()> {
    let gpu = Gpu::open(args.device).context("te-bench gpu needs a CUDA GPU")?;
    let len = usize::try_from(args.bytes)?;
    let pinned = PinnedHostMemory::alloc(&gpu, len)?.into_region();
    fill_pattern(&pinned)?;
    let mut hosts: Vec<(&'static str, MemoryRegion)> = Vec::new();
    if args.host != "pageable" {
        hosts.push(("pinned", pinned.clone()));
    }
    if args.host != "pinned" {
        let pageable = MemoryRegion::zeroed(len);
        fill_pattern(&pageable)?;
        hosts.push(("pageable", pageable));
    }
    let setup = Setup {
        dev_a: DeviceMemory::alloc(&gpu, len)?.into_region(),
        dev_b: DeviceMemory::alloc(&gpu, len)?.into_region(),
        check: PinnedHostMemory::alloc(&gpu, len)?.into_region(),
        gpu: gpu.clone(),
        len,
    };
    let (dev_a, dev_b, check) = (&setup.dev_a, &setup.dev_b, &setup.check);
    let readback = |dev: &MemoryRegion| -> anyhow::Result<bool> {
        check.fill_with(|_, b| b.fill(0xEE))?;
        gpu.plain_copy(dev, 0, check, 0, len)?;
        same_bytes(check, &pinned)
    };
    let mut rows = Vec::new();
    let mut row = |direction, host, block: u64, m: (f64, f64, u64, u64)| {
        rows.push(Row {
            gpu: gpu.name().to_string(),
            direction,
            host,
            block_bytes: block,
            bytes: len as u64,
            engine_gb_s: m.0,
            cumemcpy_gb_s: m.1,
            ratio: m.0 / m.1,
            verified_bytes: m.2,
            verified_blocks: m.3,
        });
    };
    for &block in &args.blocks {
        let mut engine = CopyEngine::new(&gpu, usize::try_from(block)?)?;
        let crcs = block_crcs(&pinned, usize::try_from(block)?)?;
        for (host, src) in &hosts {
            let zero_a = || Ok(gpu.zero(dev_a, 0..len)?);
            let m = setup.measure(
                &mut engine,
                src,
                dev_a,
                Some(&crcs),
                args.repeats,
                &zero_a,
                &|| readback(dev_a),
            )?;
            row("h2d", *host, block, m);
        }
        // dev_a now holds the pattern (the last plain copy wrote the same bytes).
        for (host, _) in &hosts {
            let dst = if *host == "pinned" {
                PinnedHostMemory::alloc(&gpu, len)?.into_region()
            } else {
                MemoryRegion::zeroed(len)
            };
            let clear = || Ok(dst.fill_with(|_, b| b.fill(0xEE))?);
            let m = setup.measure(
                &mut engine,
                dev_a,
                &dst,
                Some(&crcs),
                args.repeats,
                &clear,
                &|| same_bytes(&dst, &pinned),
            )?;
            row("d2h", *host, block, m);
        }
        let zero_b = || Ok(gpu.zero(dev_b, 0..len)?);
        let m = setup.measure(
            &mut engine,
            dev_a,
            dev_b,
            None,
            args.repeats,
            &zero_b,
            &|| readback(dev_b),
        )?;
        row("d2d", "-", block, m);
    }
    print_rows(&rows, args.json, COLUMNS)
}
