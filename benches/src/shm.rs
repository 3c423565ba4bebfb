//! `te-bench run --backend shm`: a sender in this process and a receiver in a child process
//! (`te-bench shm-receiver`), on one host, beside a plain memcpy of the same blocks measured here in the
//! same run. The source lies in the sender's shared memory (granted to the receiver, which copies each
//! unit out of it), or with `--private` in private memory (copied by cross-memory attach). The child checks every transfer (CRC-32C of its whole pool against the source's) and
//! reports the CPU seconds it spent receiving; this process reports its own.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use backends::shm::{ShmConfig, ShmNode};
use clap::Args;
use transfer_engine::{KvLayout, MemoryRegion, TransferMode, TransferRequest};

use crate::buffers::{fill, kv_len, placed_memcpy_limit};

/// Arguments of the hidden `te-bench shm-receiver` (started by `run --backend shm`).
#[derive(Debug, Args)]
pub(crate) struct ReceiverArgs {
    /// Where to listen.
    #[arg(long)]
    socket: PathBuf,
    #[arg(long)]
    layers: u32,
    #[arg(long)]
    blocks: u32,
    #[arg(long)]
    block_bytes: u64,
    /// Turn the receiver's checksums off (they stay on unless the sender turns them off too).
    #[arg(long)]
    no_checksum: bool,
}

/// A finished shm run.
pub(crate) struct ShmRun {
    pub(crate) seconds: Vec<f64>,
    pub(crate) limit_gbps: f64,
    pub(crate) retransmits: u64,
    pub(crate) recompute_blocks: usize,
    /// Median CPU seconds per GiB moved, this process (the sender) and the child (the receiver).
    pub(crate) cpu_s_per_gib: (f64, f64),
}

/// This process's CPU time (user and system, every thread), in seconds.
pub(crate) fn cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| {
        let t = |v: nix::sys::time::TimeVal| v.tv_sec() as f64 + v.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    })
}

/// A runtime for the shm nodes' async calls (their work runs on their own threads).
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?)
}

/// The sender's source holding `kv`: shared memory of `node` (granted to the receiver: one plain copy out
/// of its mapping), or with `private` private memory (copied by cross-memory attach).
pub(crate) fn source_memory(
    node: &ShmNode,
    kv: Vec<u8>,
    private: bool,
) -> anyhow::Result<MemoryRegion> {
    if private {
        return Ok(MemoryRegion::from_vec(kv));
    }
    let shared = node.shared_memory(kv.len())?;
    shared.copy_from(0, &kv)?;
    Ok(shared)
}

/// The receiver child; killed when dropped, and its socket file (which a killed node leaves behind)
/// removed.
struct Receiver {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    socket: std::path::PathBuf,
}

impl Receiver {
    fn next_line(&mut self) -> anyhow::Result<String> {
        match self.lines.next() {
            Some(line) => Ok(line?),
            None => bail!("the shm receiver exited: {:?}", self.child.try_wait()),
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Runs `iterations` transfers (after one warm-up) of `layout` in `mode` to a child process.
pub(crate) fn run_shm(
    layout: KvLayout,
    mode: TransferMode,
    iterations: usize,
    checksum: bool,
    private: bool,
) -> anyhow::Result<ShmRun> {
    let socket = std::env::temp_dir().join(format!("te-bench-shm-{}.sock", std::process::id()));
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["shm-receiver", "--socket"])
        .arg(&socket)
        .args(["--layers", &layout.layers.to_string()])
        .args(["--blocks", &layout.blocks_per_layer.to_string()])
        .args(["--block-bytes", &layout.block_bytes.to_string()]);
    if !checksum {
        cmd.arg("--no-checksum");
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .context("starting te-bench shm-receiver")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut receiver = Receiver {
        child,
        lines: BufReader::new(stdout).lines(),
        socket: socket.clone(),
    };
    let ready = receiver.next_line()?;
    if ready != "LISTENING" {
        bail!("the shm receiver said {ready:?}");
    }
    let mut kv = vec![0u8; kv_len(layout)?];
    fill(&mut kv);
    let want = transfer_engine::crc32c(&kv);
    let limit_gbps = placed_memcpy_limit(&kv, (layout, layout), iterations);
    let mut cfg = ShmConfig::new(1, None);
    cfg.checksum = checksum;
    let node = ShmNode::start(cfg)?;
    let src = node.register_kv_region(layout, source_memory(&node, kv, private)?)?;
    let rt = runtime()?;
    let peer = rt.block_on(node.connect(&socket))?;
    let dst = *peer.segment("kv").context("the receiver offers no kv")?;
    let gib = layout.kv_bytes() as f64 / f64::from(1u32 << 30);
    let (mut seconds, mut cpu_sender, mut cpu_receiver) = (Vec::new(), Vec::new(), Vec::new());
    let mut recompute_blocks = 0;
    for i in 0..=iterations {
        let req = TransferRequest::whole(peer.peer, &src, &dst)?.with_mode(mode);
        let cpu = cpu_seconds();
        let out = rt.block_on(node.transfer(req, Duration::from_secs(600)))?;
        let cpu = cpu_seconds() - cpu;
        recompute_blocks += out.recompute.len();
        let line = receiver.next_line()?;
        let mut words = line.split_whitespace();
        let (Some("RECEIVED"), Some(crc), Some(cpu_child), Some(lost)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            bail!("the shm receiver said {line:?}");
        };
        if out.recompute.is_empty() && lost == "0" && crc != format!("{want:08x}") {
            bail!("transfer {i}: the receiver's pool has CRC {crc}, the source {want:08x}");
        }
        if i > 0 {
            seconds.push(out.elapsed.as_secs_f64());
            cpu_sender.push(cpu / gib);
            cpu_receiver.push(cpu_child.parse::<f64>()? / gib);
        }
    }
    let retransmits = node.stats().engine.retransmits;
    node.shutdown();
    Ok(ShmRun {
        seconds,
        limit_gbps,
        retransmits,
        recompute_blocks,
        cpu_s_per_gib: (
            crate::report::quantile(&mut cpu_sender, 0.5),
            crate::report::quantile(&mut cpu_receiver, 0.5),
        ),
    })
}

/// The child: listens, and for every session received prints `RECEIVED <crc of the pool> <CPU seconds
/// since the last report, before this check> <blocks to recompute>`.
pub(crate) fn receiver_main(args: &ReceiverArgs) -> anyhow::Result<()> {
    let layout = KvLayout::new(
        args.layers,
        args.blocks,
        args.block_bytes,
        16,
        transfer_engine::Dtype::Bf16,
    )?;
    // Each row measures the path it names: granted shared memory by its mapping (`shm`), private memory
    // by cross-memory attach (`shm-cma`); a serving node would measure and keep the faster.
    let mut cfg = ShmConfig::new(2, Some(args.socket.clone()));
    cfg.checksum = !args.no_checksum;
    cfg.copy_path = backends::shm::CopyPath::Mapping;
    let node = ShmNode::start(cfg)?;
    let pool = MemoryRegion::zeroed(kv_len(layout)?);
    pool.fill_with(|_, b| b.fill(0))?;
    let dst = node.register_kv_region(layout, pool.clone())?;
    node.publish_segment("kv", dst)?;
    println!("LISTENING");
    let rt = runtime()?;
    let mut mark = cpu_seconds();
    loop {
        let incoming = rt.block_on(node.next_incoming())?;
        let got = rt.block_on(node.wait_received(incoming.session))?;
        let cpu = cpu_seconds() - mark;
        let crc = pool.crc32c(0..pool.len())?;
        println!("RECEIVED {crc:08x} {cpu:.4} {}", got.recompute.len());
        mark = cpu_seconds();
    }
}
