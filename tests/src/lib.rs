//! Cross-crate integration and fault-injection tests live in `tests/`; this library holds what they share:
//! the scenario settings of the fault-tolerance suite and a runner that names the seed in every failure.
#![forbid(unsafe_code)]

pub mod config_doc;

use std::time::{Duration, Instant};

use fabric_sim::{Scenario, ScenarioConfig, ScenarioReport};
use transfer_engine::TransferMode;

/// The three wire modes, sized for the suite's small KV (16 KiB blocks): packetized cuts 4 KiB slices; auto
/// sends contiguous runs of at least 32 KiB exclusive and slices the rest.
#[must_use]
pub fn modes() -> [TransferMode; 3] {
    [
        TransferMode::Exclusive,
        TransferMode::Packetized { slice_bytes: 4096 },
        TransferMode::Auto {
            slice_bytes: 4096,
            exclusive_min_bytes: 32 << 10,
        },
    ]
}

/// The seed of a test: `FABRIC_SEED` when set, else `default`.
///
/// # Panics
/// If `FABRIC_SEED` is set to something that is not a number.
#[must_use]
pub fn seed(default: u64) -> u64 {
    fabric_sim::seed_from_env(default).unwrap_or_else(|e| panic!("{e}"))
}

/// A scenario of 4 layers x 8 blocks x 16 KiB in `mode` with `seed`, a clean 100 Gb/s link and a 1 s
/// deadline; tests add faults.
#[must_use]
pub fn scenario(seed: u64, mode: TransferMode) -> ScenarioConfig {
    let mut cfg = ScenarioConfig::default();
    cfg.seed = seed;
    cfg.mode = mode;
    cfg
}

/// Runs a scenario. Prints the seed and the report to stderr (shown when the test fails) so any failure
/// replays with `FABRIC_SEED=<seed>`.
///
/// # Panics
/// If the engine refuses the scenario's setup.
#[must_use]
pub fn run(cfg: &ScenarioConfig) -> ScenarioReport {
    let report = Scenario::new(cfg.clone())
        .run(Instant::now())
        .unwrap_or_else(|e| panic!("seed {}: scenario setup failed: {e}", cfg.seed));
    eprintln!(
        "FABRIC_SEED={} mode={} report={report:?}",
        cfg.seed, report.mode
    );
    report
}

/// Runs a scenario and checks the invariants every run must keep (no corrupt or duplicate delivery,
/// every block delivered or reported for recompute by the deadline, no session left alive).
///
/// # Panics
/// If an invariant is broken; the message names the seed.
#[must_use]
pub fn run_checked(cfg: &ScenarioConfig) -> ScenarioReport {
    let report = run(cfg);
    if let Err(e) = report.check_invariants() {
        panic!("{e}");
    }
    report
}

/// Milliseconds, for scenario timings.
#[must_use]
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
