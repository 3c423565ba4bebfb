//! `te-bench gpu --engine shm`: GPU regions moved between two processes on one host by the same-host
//! backend through CUDA IPC (the receiver opens the sender's allocation and makes one device copy per
//! unit): GPU to GPU, GPU to host, and host (the sender's shared memory) to GPU, each block exclusive,
//! every transfer checked by the receiving child (CRC-32C of its whole destination against the
//! source's), beside a plain `cuMemcpy` of the same route and bytes in this process in the same run (for
//! GPU to GPU on one device that is what `cuMemcpyPeer` does).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use backends::cuda::{DeviceMemory, Gpu};
use backends::shm::{ShmConfig, ShmNode};
use serde::Serialize;
use transfer_engine::{MemoryRegion, TransferMode, TransferRequest};

use super::{GpuArgs, IpcReceiverArgs, fill_pattern};
use crate::report::{print_rows, quantile};
use crate::shm::runtime;

const COLUMNS: &[&str] = &[
    "backend",
    "route",
    "block_bytes",
    "engine_gb_s",
    "cumemcpy_gb_s",
    "ratio",
    "verified_bytes",
];

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
    /// Bytes the receiver checked against the source after every timed run.
    verified_bytes: u64,
    retransmits: u64,
}

/// The receiving child; killed when dropped.
struct ReceiverChild {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl ReceiverChild {
    fn start(args: &IpcReceiverArgs) -> anyhow::Result<Self> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["gpu-ipc-receiver", "--socket"])
            .arg(&args.socket)
            .args(["--bytes", &args.bytes.to_string()])
            .args(["--block", &args.block.to_string()])
            .args(["--device", &args.device.to_string()]);
        if args.gpu {
            cmd.arg("--gpu");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .context("starting te-bench gpu-ipc-receiver")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut me = Self {
            child,
            lines: BufReader::new(stdout).lines(),
        };
        let ready = me.next_line()?;
        ensure!(ready == "LISTENING", "the receiver said {ready:?}");
        Ok(me)
    }

    fn next_line(&mut self) -> anyhow::Result<String> {
        match self.lines.next() {
            Some(line) => Ok(line?),
            None => bail!("the receiver exited: {:?}", self.child.try_wait()),
        }
    }
}

impl Drop for ReceiverChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs every route and block size.
pub(super) fn main(args: &GpuArgs) -> anyhow::Result<()> {
    let gpu = Gpu::open(args.device)?;
    let len = usize::try_from(args.bytes)?;
    let pattern = MemoryRegion::zeroed(len);
    fill_pattern(&pattern)?;
    let want = pattern.crc32c(0..len)?;
    let mut rows = Vec::new();
    for &block in &args.blocks {
        let layout = crate::run::layout_for(block, args.bytes)?;
        let bytes = usize::try_from(layout.total_bytes())?;
        ensure!(
            bytes == len,
            "--bytes must be a multiple of every block size"
        );
        for (route, src_gpu, dst_gpu) in [
            ("GPU to GPU", true, true),
            ("GPU to host", true, false),
            ("host to GPU", false, true),
        ] {
            let what = || format!("shm, {route}, {block}-byte blocks");
            let socket = std::env::temp_dir().join(format!(
                "te-bench-gpu-ipc-{}-{block}.sock",
                std::process::id()
            ));
            let mut child = ReceiverChild::start(&IpcReceiverArgs {
                socket: socket.clone(),
                bytes: args.bytes,
                block,
                device: args.device,
                gpu: dst_gpu,
            })
            .with_context(what)?;
            let node = ShmNode::start(ShmConfig::new(1, None))?;
            let src = if src_gpu {
                let memory = DeviceMemory::alloc(&gpu, len)?.into_region();
                gpu.plain_copy(&pattern, 0, &memory, 0, len)?;
                memory
            } else {
                let memory = node.shared_memory(len)?;
                pattern.with_views(0..len, &memory, 0..len, |from, to| to.copy_from_slice(from))?;
                memory
            };
            // The plain copy of the same route in this process, into memory of the receiver's kind.
            let local_dst = if dst_gpu {
                DeviceMemory::alloc(&gpu, len)?.into_region()
            } else {
                MemoryRegion::zeroed(len)
            };
            let s = node.register_kv_region(layout, src.clone())?;
            let rt = runtime()?;
            let peer = rt.block_on(node.connect(&socket)).with_context(what)?;
            let d = *peer.segment("kv").context("the receiver offers no kv")?;
            let (mut engine_s, mut plain_s, mut verified) = (Vec::new(), Vec::new(), 0u64);
            for i in 0..=args.repeats {
                let req =
                    TransferRequest::whole(peer.peer, &s, &d)?.with_mode(TransferMode::Exclusive);
                let start = Instant::now();
                let out = rt.block_on(node.transfer(req, Duration::from_secs(300)))?;
                let seconds = start.elapsed().as_secs_f64();
                ensure!(
                    out.recompute.is_empty(),
                    "{}: {} blocks came back for recompute ({:?})",
                    what(),
                    out.recompute.len(),
                    node.log().last()
                );
                let line = child.next_line()?;
                ensure!(
                    line == format!("RECEIVED {want:08x}"),
                    "{}: the receiver said {line:?}, the source's CRC is {want:08x}",
                    what()
                );
                if i == 0 {
                    continue; // the first transfer opens the grant and links: untimed
                }
                engine_s.push(seconds);
                verified += bytes as u64;
                let start = Instant::now();
                gpu.plain_copy(&src, 0, &local_dst, 0, bytes)?;
                plain_s.push(start.elapsed().as_secs_f64());
            }
            let retransmits = node.stats().engine.retransmits;
            node.shutdown();
            let engine_gb_s = bytes as f64 / quantile(&mut engine_s, 0.5) / 1e9;
            let cumemcpy_gb_s = bytes as f64 / quantile(&mut plain_s, 0.5) / 1e9;
            rows.push(Row {
                gpu: gpu.name().to_owned(),
                backend: "shm",
                route,
                block_bytes: block,
                bytes: bytes as u64,
                engine_gb_s,
                cumemcpy_gb_s,
                ratio: engine_gb_s / cumemcpy_gb_s,
                verified_bytes: verified,
                retransmits,
            });
        }
    }
    print_rows(&rows, args.json, COLUMNS)
}

/// The child: a destination of `--bytes` (GPU memory with `--gpu`, else host memory) published as `kv`;
/// after every session received it prints `RECEIVED <CRC-32C of the destination>` and clears it.
pub(super) fn receiver_main(args: &IpcReceiverArgs) -> anyhow::Result<()> {
    let gpu = Gpu::open(args.device)?;
    let layout = crate::run::layout_for(args.block, args.bytes)?;
    let len = usize::try_from(layout.total_bytes())?;
    let node = ShmNode::start(ShmConfig::new(2, Some(args.socket.clone())))?;
    let dst = if args.gpu {
        DeviceMemory::alloc(&gpu, len)?.into_region()
    } else {
        MemoryRegion::zeroed(len)
    };
    let check = MemoryRegion::zeroed(len);
    let handle = node.register_kv_region(layout, dst.clone())?;
    node.publish_segment("kv", handle)?;
    println!("LISTENING");
    let rt = runtime()?;
    loop {
        let incoming = rt.block_on(node.next_incoming())?;
        let got = rt.block_on(node.wait_received(incoming.session))?;
        let crc = if args.gpu {
            gpu.plain_copy(&dst, 0, &check, 0, len)?;
            check.crc32c(0..len)?
        } else {
            dst.crc32c(0..len)?
        };
        // Cleared before the report: the next session may start as soon as the sender reads it.
        if args.gpu {
            gpu.zero(&dst, 0..len)?;
        } else {
            dst.fill_with(|_, b| b.fill(0))?;
        }
        if got.recompute.is_empty() {
            println!("RECEIVED {crc:08x}");
        } else {
            println!("LOST {}", got.recompute.len());
        }
    }
}
