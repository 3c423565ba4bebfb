//! `te-bench disk`: the disk tier's write and read throughput beside a plain sequential write and read of
//! the same bytes to the same file system, with buffered and direct I/O; and (`--crash-test`) the tier
//! killed mid-write, again and again, then reopened and checked.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use connector::ScopedKey;
use connector::disk::{BlockFormat, DiskConfig, DiskIo, DiskTier, Got, PageBuf, Put};
use serde::Serialize;
use transfer_engine::{Dtype, MemoryRegion, NamespaceId};

use crate::args::{fmt_size, parse_size};
use crate::report::print_rows;

mod crash;
mod fill;

/// Arguments of `te-bench disk`.
#[derive(Debug, Args)]
pub(crate) struct DiskArgs {
    /// Block sizes (whole blocks, every layer), e.g. 256KiB,4MiB.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "256KiB,4MiB")]
    block_sizes: Vec<u64>,
    /// Bytes written and read per block size and I/O mode.
    #[arg(long, value_parser = parse_size, default_value = "512MiB")]
    bytes: u64,
    /// I/O modes to measure.
    #[arg(long, value_delimiter = ',', default_value = "buffered,direct")]
    io: Vec<IoArg>,
    /// Directory on the file system to measure (a scratch directory is made inside and removed).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Kill a writing child process at random moments, reopen the tier after each, and check it.
    #[arg(long)]
    crash_test: bool,
    /// Crashes in `--crash-test`.
    #[arg(long, default_value_t = 20)]
    crashes: u32,
    /// Seed of `--crash-test`'s kill times and keys.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write into a tier until its file system (or the file size limit, `ulimit -f`) is full, then read
    /// everything back: how a full disk is handled.
    #[arg(long)]
    fill: bool,
    /// The writing child of `--crash-test` (started by it).
    #[arg(long, hide = true)]
    crash_child: Option<PathBuf>,
}

/// An I/O mode on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum IoArg {
    Buffered,
    Direct,
}

impl From<IoArg> for DiskIo {
    fn from(a: IoArg) -> DiskIo {
        match a {
            IoArg::Buffered => DiskIo::Buffered,
            IoArg::Direct => DiskIo::Direct,
        }
    }
}

/// Columns of the human table.
const COLUMNS: &[&str] = &[
    "io",
    "block_bytes",
    "write_gbps",
    "write_limit_gbps",
    "write_ratio",
    "read_gbps",
    "read_limit_gbps",
    "read_ratio",
];

/// One block size and I/O mode.
#[derive(Debug, Serialize)]
struct Row {
    io: &'static str,
    block_bytes: u64,
    bytes: u64,
    write_gbps: f64,
    write_limit_gbps: f64,
    write_ratio: f64,
    read_gbps: f64,
    read_limit_gbps: f64,
    read_ratio: f64,
    /// Puts that found the write-back queue full and were retried.
    queue_full_retries: u64,
}

pub(crate) fn main(args: &DiskArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.crash_child {
        return crash::child(dir, args.seed);
    }
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = base.join(format!("te-bench-disk-{}", std::process::id()));
    let result = if args.crash_test {
        crash::main(&scratch, args.crashes, args.seed, args.json)
    } else if args.fill {
        fill::main(&scratch, args.json)
    } else {
        measure(args, &scratch)
    };
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn measure(args: &DiskArgs, scratch: &Path) -> anyhow::Result<()> {
    if !args.json {
        println!(
            "Disk tier against a plain sequential write and read of the same bytes on the same file system \
             ({} per row). Writes end with an fsync, reads start with the files dropped from the page cache, \
             so both sides measure the device. ratio = tier / plain.",
            fmt_size(args.bytes)
        );
    }
    let mut rows = Vec::new();
    for &io in &args.io {
        for &block in &args.block_sizes {
            match row(io.into(), block, args.bytes, scratch) {
                Ok(r) => rows.push(r),
                Err(e) if io == IoArg::Direct && is_direct_unsupported(&e) => {
                    println!("not run: direct I/O at {}: {e:#}", scratch.display());
                }
                Err(e) => return Err(e),
            }
        }
    }
    print_rows(&rows, args.json, COLUMNS)
}

fn is_direct_unsupported(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<connector::disk::DiskError>(),
            Some(connector::disk::DiskError::DirectUnsupported(_))
        )
    })
}

/// The format of `te-bench disk`'s blocks: one layer of `block` bytes (the tier stores whole blocks).
fn format(block: u64) -> BlockFormat {
    BlockFormat {
        layers: 1,
        layer_bytes: block,
        tokens_per_block: 16,
        dtype: Dtype::Bf16,
    }
}

fn key(i: u64) -> ScopedKey {
    let mut hash = [0u8; 32];
    hash[..8].copy_from_slice(&i.to_le_bytes());
    ScopedKey {
        ns: NamespaceId(1),
        hash: connector::BlockHash(hash),
    }
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn row(io: DiskIo, block: u64, bytes: u64, scratch: &Path) -> anyhow::Result<Row> {
    let blocks = (bytes / block).max(1);
    let bytes = blocks * block;
    let dir = scratch.join(format!("{}-{block}", io.name()));
    std::fs::create_dir_all(&dir)?;
    // 16 distinct source blocks, cycled: the bytes differ from block to block.
    let src = MemoryRegion::from_vec(
        (0..16 * block)
            .map(|i| (i * 131 + i / 4093) as u8)
            .collect(),
    );
    let fmt = format(block);
    let mut cfg = DiskConfig::new(&dir, blocks * fmt.record_bytes());
    cfg.io = io;
    let tier = DiskTier::open(cfg, fmt).context("opening the disk tier")?;

    let mut retries = 0;
    let started = Instant::now();
    for i in 0..blocks {
        let at = ((i % 16) * block) as usize;
        loop {
            match tier.put(key(i), None, &src, &[(at, block as usize)])? {
                Put::Queued => break,
                Put::QueueFull => {
                    retries += 1;
                    std::thread::sleep(Duration::from_micros(50));
                }
                other => anyhow::bail!("block {i}: {other:?}"),
            }
        }
    }
    tier.sync()?;
    let write = started.elapsed();
    let stats = tier.stats();
    anyhow::ensure!(
        stats.write_errors + stats.disk_full == 0,
        "writes failed: {}",
        tier.last_error().unwrap_or_default()
    );
    drop_cache(tier.file_path())?;

    let batch = 64.min(blocks) as usize;
    let dst = MemoryRegion::zeroed(batch * block as usize);
    let pieces: Vec<[(usize, usize); 1]> = (0..batch)
        .map(|b| [(b * block as usize, block as usize)])
        .collect();
    let started = Instant::now();
    let (mut i, mut last) = (0, 0);
    while i < blocks {
        let n = (blocks - i).min(batch as u64) as usize;
        let wanted: Vec<_> = (0..n)
            .map(|b| (key(i + b as u64), &pieces[b][..]))
            .collect();
        for (b, got) in tier.get_many(&wanted, &dst).into_iter().enumerate() {
            anyhow::ensure!(got? == Got::Served, "block {} was not served", i + b as u64);
        }
        last = i;
        i += n as u64;
    }
    let read = started.elapsed();
    // The last batch read, byte for byte.
    let len = block as usize;
    for k in last..blocks {
        let b = (k - last) as usize;
        let want = ((k % 16) * block) as usize;
        anyhow::ensure!(
            dst.read(b * len..(b + 1) * len)?[..] == src.read(want..want + len)?[..],
            "block {k} read back differs from the one written"
        );
    }
    drop(tier);

    let (write_limit, read_limit) = plain(io, block, blocks, &dir, &src)?;
    std::fs::remove_dir_all(&dir)?;
    let (w, r) = (gbps(bytes, write), gbps(bytes, read));
    let (wl, rl) = (gbps(bytes, write_limit), gbps(bytes, read_limit));
    Ok(Row {
        io: io.name(),
        block_bytes: block,
        bytes,
        write_gbps: w,
        write_limit_gbps: wl,
        write_ratio: w / wl,
        read_gbps: r,
        read_limit_gbps: rl,
        read_ratio: r / rl,
        queue_full_retries: retries,
    })
}

/// A plain sequential write (then fsync) and read of `blocks` blocks of `block` bytes, in one file in
/// `dir`, from and into one page-aligned buffer, with the same I/O mode.
fn plain(
    io: DiskIo,
    block: u64,
    blocks: u64,
    dir: &Path,
    src: &MemoryRegion,
) -> anyhow::Result<(Duration, Duration)> {
    let path = dir.join("plain");
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create(true).truncate(true);
    if io == DiskIo::Direct {
        opts.custom_flags(nix::fcntl::OFlag::O_DIRECT.bits());
    }
    let file = opts
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut buf = PageBuf::new(block as usize);
    let len = block as usize;
    let started = Instant::now();
    for i in 0..blocks {
        let at = ((i % 16) * block) as usize;
        buf.bytes_mut()[..len].copy_from_slice(&src.read(at..at + len)?);
        file.write_all_at(&buf.bytes()[..len], i * block)?;
    }
    file.sync_data()?;
    let write = started.elapsed();
    drop_cache(&path)?;
    let started = Instant::now();
    for i in 0..blocks {
        file.read_exact_at(&mut buf.bytes_mut()[..len], i * block)?;
    }
    let read = started.elapsed();
    drop(file);
    std::fs::remove_file(&path)?;
    Ok((write, read))
}

/// Drops `path`'s pages from the page cache (after an fsync, so none is dirty).
fn drop_cache(path: &Path) -> anyhow::Result<()> {
    let f = File::open(path)?;
    f.sync_all()?;
    nix::fcntl::posix_fadvise(
        f.as_fd(),
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .with_context(|| format!("dropping {} from the page cache", path.display()))?;
    Ok(())
}
