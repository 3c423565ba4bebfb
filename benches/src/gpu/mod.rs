//! `te-bench gpu`: moves bytes host to GPU, GPU to host and GPU to GPU through the `cuda` copy engine at
//! each block size, verifies every byte and every block's CRC-32C, and prints GB/s beside a plain
//! `cuMemcpy` of the same bytes measured in the same run (feature `cuda`; needs a GPU and its driver).
//! With `--tcp`: TCP sends staged through double buffers beside sends from plain host memory. With
//! `--engine loopback|tcp`: the same routes through the transfer engine's sessions on that backend; with
//! `--engine shm`, between two processes through the same-host backend's CUDA IPC path. With
//! `--cpu-limits`: the CPU's checksum passes over pinned and pageable memory, which bound the checksummed
//! routes.

#[cfg(feature = "cuda")]
mod copies;
#[cfg(feature = "cuda")]
mod cpu_limits;
#[cfg(feature = "cuda")]
mod engine;
#[cfg(feature = "cuda")]
mod ipc;
mod staging;

use clap::Args;

use transfer_engine::MemoryRegion;

use crate::args::parse_size;

/// Arguments of `te-bench gpu`.
#[derive(Debug, Args)]
pub(crate) struct GpuArgs {
    /// Bytes moved in each direction.
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    bytes: u64,
    /// Block sizes of the copy engine (with `--tcp`: staging unit sizes), comma separated.
    #[arg(long, value_parser = parse_size, value_delimiter = ',', default_value = "256KiB,4MiB")]
    blocks: Vec<u64>,
    /// Which host memory the host side uses: pinned, pageable or both.
    #[arg(long, default_value = "both", value_parser = ["pinned", "pageable", "both"])]
    host: String,
    /// Timed runs of each move (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Measure TCP sends (loopback) staged through double buffers against sends from plain host memory,
    /// instead of GPU copies; runs without a GPU (the pinned, GPU-sourced row needs one).
    #[arg(long)]
    tcp: bool,
    /// Move the bytes through the transfer engine on this backend (`loopback`, `tcp`, or `shm`: to a
    /// child process through CUDA IPC; GPU regions registered on both ends, each block one exclusive
    /// unit) instead of the bare copy engine.
    #[arg(long)]
    engine: Option<String>,
    /// Measure the CPU's checksum and copy-and-checksum passes over pinned and pageable memory at each
    /// block size (the bound of every checksummed GPU route) instead of GPU copies.
    #[arg(long, conflicts_with_all = ["tcp", "engine"])]
    cpu_limits: bool,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `te-bench gpu`.
pub(crate) fn main(args: &GpuArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.repeats > 0, "--repeats must be at least 1");
    anyhow::ensure!(args.bytes > 0, "--bytes must be more than 0");
    anyhow::ensure!(
        !args.blocks.is_empty() && args.blocks.iter().all(|b| *b > 0),
        "block sizes must be more than 0"
    );
    if args.tcp {
        return staging::main(args);
    }
    copies_main(args)
}

#[cfg(feature = "cuda")]
fn copies_main(args: &GpuArgs) -> anyhow::Result<()> {
    if args.cpu_limits {
        return cpu_limits::main(args);
    }
    match args.engine.as_deref() {
        Some("shm") => ipc::main(args),
        Some(backend) => engine::main(args, backend),
        None => copies::main(args),
    }
}

#[cfg(not(feature = "cuda"))]
fn copies_main(_: &GpuArgs) -> anyhow::Result<()> {
    anyhow::bail!("te-bench was built without GPU support: build it with `--features cuda`")
}

/// Arguments of the hidden `te-bench gpu-ipc-receiver` (started by `gpu --engine shm`).
#[derive(Debug, Args)]
pub(crate) struct IpcReceiverArgs {
    /// Where to listen.
    #[arg(long)]
    pub(crate) socket: std::path::PathBuf,
    /// Bytes of the destination.
    #[arg(long)]
    pub(crate) bytes: u64,
    /// Block size (the layout is `run`'s for these bytes).
    #[arg(long)]
    pub(crate) block: u64,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub(crate) device: u32,
    /// The destination is GPU memory (else host memory).
    #[arg(long)]
    pub(crate) gpu: bool,
}

/// Runs `te-bench gpu-ipc-receiver`.
pub(crate) fn ipc_receiver_main(args: &IpcReceiverArgs) -> anyhow::Result<()> {
    #[cfg(feature = "cuda")]
    return ipc::receiver_main(args);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = args;
        anyhow::bail!("te-bench was built without GPU support: build it with `--features cuda`")
    }
}

/// A deterministic pattern that differs in every 8-byte word.
pub(super) fn fill_pattern(region: &MemoryRegion) -> anyhow::Result<()> {
    region.fill_with(|offset, bytes| {
        for (i, word) in bytes.chunks_mut(8).enumerate() {
            let mut x = (offset / 8 + i) as u64 ^ 0x9E37_79B9_7F4A_7C15;
            x = (x ^ (x >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
        }
    })?;
    Ok(())
}
