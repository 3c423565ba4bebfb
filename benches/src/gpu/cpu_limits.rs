//! `te-bench gpu --cpu-limits`: what the host's CPU does per second over pinned and over pageable memory,
//! block by block: a CRC-32C pass, and the copy-and-checksum pass the staged routes make into and out of
//! that memory. The checksummed GPU routes can go no faster than these passes, so their figures are read
//! beside them.

use std::time::Instant;

use anyhow::Context;
use backends::cuda::{Gpu, PinnedHostMemory};
use serde::Serialize;
use transfer_engine::MemoryRegion;

use super::{GpuArgs, fill_pattern};
use crate::report::{print_rows, quantile};

const COLUMNS: &[&str] = &["memory", "pass", "block_bytes", "gb_s"];

/// One pass over one memory kind at one block size.
#[derive(Debug, Serialize)]
struct Row {
    memory: &'static str,
    pass: &'static str,
    block_bytes: u64,
    bytes: u64,
    gb_s: f64,
    /// CRC-32C of all the bytes the pass checksummed, so the work cannot be optimised away.
    crc_xor: u32,
}

/// Times `pass` over every `block` of `len` bytes, `repeats` times; the median in GB/s and the XOR of
/// every CRC it returned.
fn measure(
    len: usize,
    block: usize,
    repeats: usize,
    mut pass: impl FnMut(usize, usize) -> u32,
) -> (f64, u32) {
    let mut seconds = Vec::with_capacity(repeats);
    let mut crc_xor = 0;
    for _ in 0..repeats {
        let start = Instant::now();
        for at in (0..len).step_by(block) {
            crc_xor ^= pass(at, (at + block).min(len));
        }
        seconds.push(start.elapsed().as_secs_f64());
    }
    (len as f64 / quantile(&mut seconds, 0.5) / 1e9, crc_xor)
}

/// Runs the CPU passes over pinned and pageable memory.
pub(super) fn main(args: &GpuArgs) -> anyhow::Result<()> {
    let gpu = Gpu::open(args.device).context("te-bench gpu --cpu-limits needs a CUDA GPU")?;
    let len = usize::try_from(args.bytes)?;
    let pageable = MemoryRegion::zeroed(len);
    fill_pattern(&pageable)?;
    let other = MemoryRegion::zeroed(len);
    other.fill_with(|_, b| b.fill(1))?;
    let pinned = PinnedHostMemory::alloc(&gpu, len)?.into_region();
    fill_pattern(&pinned)?;
    let mut rows = Vec::new();
    for &block in &args.blocks {
        let block = usize::try_from(block)?;
        for (memory, region) in [("pageable", &pageable), ("pinned", &pinned)] {
            let view = region.read(0..len)?;
            let (gb_s, crc_xor) = measure(len, block, args.repeats, |a, b| {
                transfer_engine::crc32c(&view[a..b])
            });
            drop(view);
            rows.push(row(memory, "crc32c", block, len, gb_s, crc_xor));
            // Into this memory from pageable memory (a staged host-to-GPU block's CPU pass).
            let (gb_s, crc_xor) = {
                let (from, mut to) = (other.read(0..len)?, region.write(0..len)?);
                measure(len, block, args.repeats, |a, b| {
                    transfer_engine::copy_and_crc32c(&mut to[a..b], &from[a..b])
                })
            };
            rows.push(row(memory, "copy_and_crc32c in", block, len, gb_s, crc_xor));
            // Out of this memory into pageable memory (a staged GPU-to-host block's CPU pass).
            let (gb_s, crc_xor) = {
                let (from, mut to) = (region.read(0..len)?, other.write(0..len)?);
                measure(len, block, args.repeats, |a, b| {
                    transfer_engine::copy_and_crc32c(&mut to[a..b], &from[a..b])
                })
            };
            rows.push(row(
                memory,
                "copy_and_crc32c out",
                block,
                len,
                gb_s,
                crc_xor,
            ));
        }
    }
    print_rows(&rows, args.json, COLUMNS)?;
    if !args.json {
        println!(
            "Read: the CPU's rate for each pass over {} MiB; a checksummed GPU route through that memory \
             is bounded by it.",
            len >> 20
        );
    }
    Ok(())
}

fn row(
    memory: &'static str,
    pass: &'static str,
    block: usize,
    len: usize,
    gb_s: f64,
    crc_xor: u32,
) -> Row {
    Row {
        memory,
        pass,
        block_bytes: block as u64,
        bytes: len as u64,
        gb_s,
        crc_xor,
    }
}
