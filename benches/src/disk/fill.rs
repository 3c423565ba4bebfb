//! `te-bench disk --fill`: writes into a tier until its file system (or the process's file size limit)
//! is full, then reads everything back: writes that failed are counted and their blocks are not served;
//! every block written is served intact.

use std::path::Path;
use std::time::Duration;

use connector::disk::{BlockFormat, DiskConfig, DiskTier, Got, Put};
use serde::Serialize;
use transfer_engine::{Dtype, MemoryRegion};

use crate::report::print_rows;

const FORMAT: BlockFormat = BlockFormat {
    layers: 1,
    layer_bytes: 1 << 20,
    tokens_per_block: 16,
    dtype: Dtype::Bf16,
};
const BLOCKS: u64 = 64;

/// Columns of the human table.
const COLUMNS: &[&str] = &[
    "blocks",
    "written",
    "disk_full",
    "write_errors",
    "served",
    "missing",
    "corrupt_served",
];

#[derive(Debug, Serialize)]
struct Row {
    blocks: u64,
    written: u64,
    disk_full: u64,
    write_errors: u64,
    served: u64,
    missing: u64,
    corrupt_served: u64,
    last_error: String,
}

pub(super) fn main(dir: &Path, json: bool) -> anyhow::Result<()> {
    let tier = DiskTier::open(DiskConfig::new(dir, BLOCKS * FORMAT.record_bytes()), FORMAT)?;
    let len = FORMAT.block_bytes() as usize;
    let src = MemoryRegion::zeroed(len);
    for i in 0..BLOCKS {
        src.copy_from(0, &block(i, len))?;
        loop {
            match tier.put(super::key(i), None, &src, &[(0, len)])? {
                Put::QueueFull => std::thread::sleep(Duration::from_micros(100)),
                Put::Queued => break,
                other => anyhow::bail!("block {i}: {other:?}"),
            }
        }
    }
    tier.flush();
    let stats = tier.stats();
    let mut row = Row {
        blocks: BLOCKS,
        written: stats.written,
        disk_full: stats.disk_full,
        write_errors: stats.write_errors,
        served: 0,
        missing: 0,
        corrupt_served: 0,
        last_error: tier.last_error().unwrap_or_default(),
    };
    let dst = MemoryRegion::zeroed(len);
    for i in 0..BLOCKS {
        match tier.get(&super::key(i), &dst, &[(0, len)])? {
            Got::Served if dst.read(0..len)?[..] == block(i, len)[..] => row.served += 1,
            Got::Served => row.corrupt_served += 1,
            Got::Missing | Got::Corrupt => row.missing += 1,
        }
    }
    print_rows(&[&row], json, COLUMNS)?;
    if !json && !row.last_error.is_empty() {
        println!("last write error: {}", row.last_error);
    }
    Ok(())
}

fn block(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|b| (b as u64 ^ i.wrapping_mul(0x9E37)) as u8)
        .collect()
}
