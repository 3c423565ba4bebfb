//! `te-bench`: runs real transfers, simulations and trace replays, and prints each figure beside the
//! machine's raw limit measured in the same run.
// `deny`, not `forbid`: `in_place.rs` holds te-bench's one `unsafe` (the in-place promise of RDMA runs).
#![deny(unsafe_code)]

mod args;
mod bucket;
mod buffers;
mod cluster_replay;
mod contention;
mod death;
mod disk;
mod gpu;
#[cfg(feature = "rdma")]
mod in_place;
mod load;
mod net;
mod overlap;
mod pd;
mod placement;
mod progress;
#[cfg(feature = "rdma")]
mod rdma;
#[cfg(feature = "rdma")]
mod rdma_net;
mod replay;
mod report;
mod run;
mod serve_process;
mod shm;
mod shm_net;
mod sim;
mod stream;
mod sweep;
mod tcp;
mod verify;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};

/// KV-cache transfer engine bench: real transfers beside the machine's raw limits.
#[derive(Debug, Parser)]
#[command(
    name = "te-bench",
    version,
    about = "KV-cache transfer engine bench: real transfers, simulations and trace replays, each figure \
             beside its raw limit. Run without a command for a guided demonstration (a few seconds).",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Moves KV between two engines and reports throughput beside a plain copy of the same bytes.
    Run(run::RunArgs),
    /// Replays a request trace against a cache policy and reports the prefix hit ratio.
    Replay(replay::ReplayArgs),
    /// Replays a trace over N simulated instances sharing one KV pool through a real Redis index, each
    /// request routed by a policy; reports hit ratios, load balance, bytes moved and index costs.
    Cluster(cluster_replay::ClusterArgs),
    /// Runs one transfer over a simulated faulty fabric (virtual time) and checks what arrived.
    Sim(sim::SimArgs),
    /// Collective latency alone, beside KV under strict priority + cap, and beside KV as plain FIFO.
    Contention(contention::ContentionArgs),
    /// Layer-wise streaming: consumer compute overlapped with KV arrival, per prefetch depth.
    Overlap(overlap::OverlapArgs),
    /// Token-bucket accuracy: achieved rate against the configured one, 100 MB/s to 25 GB/s.
    Bucket {
        /// Print one JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Serves KV transfers (TCP, RDMA or shm) for `te-bench connect` clients in other processes.
    Serve(net::ServeArgs),
    /// Transfers KV to a `te-bench serve` process (TCP, RDMA or shm) and reports throughput like `run`.
    Connect(net::ConnectArgs),
    /// Many `te-bench connect` processes against one `te-bench serve --verify`: throughput and peak memory.
    Load(load::LoadArgs),
    /// Kills a `te-bench serve` process mid-transfer and times the sender's recompute report.
    PeerDeath(death::PeerDeathArgs),
    /// Sweeps block sizes x modes x backends; writes sweep.json and throughput and latency plots.
    Sweep(sweep::SweepArgs),
    /// Prefill and decode in two processes over TCP through the KV connector: TTFT against recompute.
    Pd(pd::PdArgs),
    /// The disk tier: write and read GB/s beside a plain sequential write and read; `--crash-test`.
    Disk(disk::DiskArgs),
    /// GPU copies (feature `cuda`): host to GPU, GPU to host, GPU to GPU beside a plain cuMemcpy.
    Gpu(gpu::GpuArgs),
    /// The receiving process of `run --backend shm` (started by it).
    #[command(hide = true)]
    ShmReceiver(shm::ReceiverArgs),
    /// The receiving process of `gpu --engine shm` (started by it).
    #[command(hide = true)]
    GpuIpcReceiver(gpu::IpcReceiverArgs),
}

fn main() -> anyhow::Result<()> {
    let matches = Cli::command().get_matches();
    check_serve_flags(&matches)?;
    match Cli::from_arg_matches(&matches)?.command {
        Some(command) => run_command(command),
        None => demo(),
    }
}

/// `te-bench serve` flags only its TCP server reads (by their argument ids).
const TCP_ONLY_SERVE_FLAGS: &[&str] = &[
    "listen",
    "serve_bytes",
    "secret",
    "lanes",
    "stall_ms",
    "idle_ms",
    "handshake_ms",
    "connections_per_address",
    "peers_per_address",
    "serve_bytes_per_address",
    "data_bytes_per_sec_per_address",
    "data_bytes_per_sec_per_peer",
];

/// Refuses `te-bench serve` flags the chosen backend would ignore, naming them.
fn check_serve_flags(matches: &ArgMatches) -> anyhow::Result<()> {
    let Some(("serve", serve)) = matches.subcommand() else {
        return Ok(());
    };
    let backend = serve.get_one::<net::NetBackend>("backend").copied();
    if backend == Some(net::NetBackend::Tcp) {
        return Ok(());
    }
    let given: Vec<String> = TCP_ONLY_SERVE_FLAGS
        .iter()
        .filter(|id| serve.value_source(id) == Some(ValueSource::CommandLine))
        .map(|id| format!("--{}", id.replace('_', "-")))
        .collect();
    if given.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{} apply to `te-bench serve --backend tcp` only (this server is {:?})",
        given.join(", "),
        backend.unwrap_or(net::NetBackend::Tcp)
    )
}

fn run_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => run::main(&args),
        Command::Replay(args) => replay::main(&args),
        Command::Cluster(args) => cluster_replay::main(&args),
        Command::Sweep(args) => sweep::main(&args),
        Command::Sim(args) => sim::main(&args),
        Command::Contention(args) => contention::main(&args),
        Command::Overlap(args) => overlap::main(&args),
        Command::Bucket { json } => bucket::main(json),
        Command::Serve(args) if args.backend == net::NetBackend::Rdma => serve_rdma(&args),
        Command::Serve(args) if args.backend == net::NetBackend::Shm => shm_net::serve(&args),
        Command::Serve(args) => net::serve_main(&args),
        Command::Connect(args) if args.backend == net::NetBackend::Rdma => connect_rdma(&args),
        Command::Connect(args) if args.backend == net::NetBackend::Shm => shm_net::connect(&args),
        Command::Connect(args) => net::connect_main(&args),
        Command::PeerDeath(args) => death::main(&args),
        Command::Load(args) => load::main(&args),
        Command::Pd(args) => pd::main(&args),
        Command::Disk(args) => disk::main(&args),
        Command::Gpu(args) => gpu::main(&args),
        Command::ShmReceiver(args) => shm::receiver_main(&args),
        Command::GpuIpcReceiver(args) => gpu::ipc_receiver_main(&args),
    }
}

/// The guided demonstration run when no subcommand is given: a few seconds, each figure beside its limit.
fn demo() -> anyhow::Result<()> {
    println!(
        "te-bench: a guided demonstration (a few seconds). `te-bench --help` lists every subcommand.\n"
    );
    println!(
        "1. Loopback: a 7B model's KV for 512 tokens (32 layers x 32 blocks x 256 KiB = 256 MiB)"
    );
    println!(
        "   moved between two engines in each mode, checksummed, beside a plain memcpy of the same blocks."
    );
    println!(
        "   Warm, as a serving engine is (it touches its KV pool at start-up): one warm-up transfer, then 3."
    );
    println!(
        "   How to read: gbps is their median; limit_gbps a plain copy of the same bytes; ratio = gbps / limit.\n"
    );
    run::main(&run::RunArgs::demo())?;
    println!(
        "\n   The same over TCP (two nodes, real loopback sockets, 2 lanes), beside a plain socket copy"
    );
    println!("   (one warm-up, then 3; read it as the table above).\n");
    dispatch(&[
        "run",
        "--backend",
        "tcp",
        "--mode",
        "exclusive",
        "--mode",
        "packetized",
        "--total-bytes",
        "256MiB",
        "--iterations",
        "3",
    ])?;
    println!(
        "\n2. A faulty fabric (virtual time): 512 MiB over a 100 Gb/s link, clean and with 1% loss;"
    );
    println!(
        "   every block arrives intact or is reported for recompute (corrupt_delivered must be 0)."
    );
    println!(
        "   How to read: one row per run; retransmit_overhead is resent bytes over payload bytes.\n"
    );
    dispatch(&["sim", "--mode", "packetized"])?;
    dispatch(&["sim", "--mode", "packetized", "--loss", "0.01"])?;
    let trace = demo_trace();
    match trace {
        Some(trace) => {
            println!(
                "\n3. Trace replay: {} with a cache of 5% of its distinct blocks;",
                trace.display()
            );
            println!(
                "   hit ratio of LRU (the incumbent), heat (ours) and Belady (the offline optimum, the limit)."
            );
            println!(
                "   How to read: hit_ratio = hit_blocks / blocks; the closer to belady's, the better.\n"
            );
            let capacity = policy::Trace::load(&trace)?.distinct_blocks() / 20;
            dispatch(&[
                "replay",
                "--trace",
                &trace.to_string_lossy(),
                "--capacity-blocks",
                &capacity.to_string(),
            ])?;
        }
        None => println!(
            "\n3. Trace replay skipped: no trace found at data/traces (pass one to `te-bench replay`)."
        ),
    }
    Ok(())
}

/// Runs one subcommand as if typed after `te-bench`.
fn dispatch(args: &[&str]) -> anyhow::Result<()> {
    let cli = Cli::try_parse_from(std::iter::once("te-bench").chain(args.iter().copied()))?;
    match cli.command {
        Some(command) => run_command(command),
        None => Ok(()),
    }
}

/// The conversation trace that ships in the repository (`data/traces/`), found from the working directory,
/// from the binary's place in the build tree, or from where this crate was built.
fn demo_trace() -> Option<std::path::PathBuf> {
    let name = "data/traces/conversation_trace_first6000.jsonl";
    let mut candidates = vec![
        std::path::PathBuf::from(name),
        std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(name),
    ];
    if let Ok(exe) = std::env::current_exe() {
        candidates.extend(exe.ancestors().map(|a| a.join(name)));
    }
    candidates.into_iter().find(|p| p.is_file())
}

#[cfg(feature = "rdma")]
fn serve_rdma(args: &net::ServeArgs) -> anyhow::Result<()> {
    rdma_net::serve(args)
}

#[cfg(feature = "rdma")]
fn connect_rdma(args: &net::ConnectArgs) -> anyhow::Result<()> {
    rdma_net::connect(args)
}

/// Without feature `rdma` there is no RDMA backend: a clear error.
#[cfg(not(feature = "rdma"))]
fn serve_rdma(_: &net::ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("te-bench was built without the RDMA backend: build it with `--features rdma`")
}

/// Without feature `rdma` there is no RDMA backend: a clear error.
#[cfg(not(feature = "rdma"))]
fn connect_rdma(_: &net::ConnectArgs) -> anyhow::Result<()> {
    anyhow::bail!("te-bench was built without the RDMA backend: build it with `--features rdma`")
}
