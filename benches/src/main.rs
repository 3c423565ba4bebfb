//! `te-bench`: runs real transfers, simulations and trace replays, and prints each figure beside the
//! machine's raw limit measured in the same run.

mod args;
mod progress;
mod replay;
mod report;
mod run;
mod sim;
mod sweep;

use clap::{Parser, Subcommand};

/// KV-cache transfer engine bench: real transfers beside the machine's raw limits.
#[derive(Debug, Parser)]
#[command(name = "te-bench", version, about, long_about = None)]
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
    /// Runs one transfer over a simulated faulty fabric (virtual time) and checks what arrived.
    Sim(sim::SimArgs),
    /// Sweeps block sizes x modes x backends; writes sweep.json and throughput and latency plots.
    Sweep(sweep::SweepArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Run(args)) => run::main(&args),
        Some(Command::Replay(args)) => replay::main(&args),
        Some(Command::Sweep(args)) => sweep::main(&args),
        Some(Command::Sim(args)) => sim::main(&args),
        None => demo(),
    }
}

/// The guided demonstration run when no subcommand is given.
fn demo() -> anyhow::Result<()> {
    println!(
        "te-bench demonstration: a 7B-model-sized KV transfer (32 layers x 64 blocks x 256 KiB = 512 MiB,"
    );
    println!(
        "1,024 tokens) between two engines over the loopback backend, in each mode, beside memcpy."
    );
    println!("Run `te-bench --help` for every subcommand.\n");
    run::main(&run::RunArgs::demo())
}
