//! One transfer over a simulated link that loses, corrupts and reorders frames, in virtual time: every
//! block arrives intact or is reported for recompute by the deadline. The seed comes from `FABRIC_SEED`
//! (default 7) and is printed, so any run replays exactly.
//!
//! `cargo run -p fabric-sim --example lossy_link` (`FABRIC_SEED=42 cargo run ...` for another run).

use std::time::{Duration, Instant};

use fabric_sim::{FaultSpec, Scenario, ScenarioConfig, seed_from_env};
use transfer_engine::TransferMode;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seed = seed_from_env(7)?;
    let mut cfg = ScenarioConfig::default();
    cfg.seed = seed;
    cfg.mode = TransferMode::packetized();
    cfg.faults = {
        let mut cfg = FaultSpec::default();
        cfg.loss = 0.05;
        cfg.corrupt = 0.01;
        cfg.reorder = 0.05;
        cfg.reorder_hold = Duration::from_micros(200);
        cfg
    };
    // An example is a driver: it reads the clock once and passes it in.
    #[allow(clippy::disallowed_methods)]
    let report = Scenario::new(cfg).run(Instant::now())?;
    println!(
        "FABRIC_SEED={seed}: {} of {} blocks delivered, {} to recompute, {} retransmits, {} corrupt delivered",
        report.blocks_delivered,
        report.blocks_total,
        report.blocks_recompute,
        report.retransmits,
        report.corrupt_delivered
    );
    report.check_invariants()?;
    Ok(())
}
