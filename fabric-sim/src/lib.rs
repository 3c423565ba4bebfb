//! A deterministic simulated fabric that drives the transfer-engine state machines, with fault injection.
//!
//! Nodes ([`Node`]: an engine and the host memory behind its regions) talk over one-way [`Link`]s with
//! bandwidth, propagation delay and bounded queues, in virtual time: nothing sleeps, and a run of simulated
//! minutes takes milliseconds. Faults are values ([`FaultRule`]) applied in order on each packet, the first
//! that is not [`Verdict::Pass`] winning: random and bursty (Gilbert-Elliott) loss, bit corruption of
//! payload or header, duplication, reordering, jitter and timed partitions. Partitions, crashes and
//! restarts are also commands on the [`Sim`].
//!
//! One seed reproduces a run exactly: every generator (each link's, each engine's) is derived from it, and
//! every collection whose order matters is ordered. [`seed_from_env`] reads `FABRIC_SEED`.
//!
//! The engines are the same state machines the real backends drive, fed the same encoded bytes: a
//! transmit is sealed with its payload's CRC and read from the region it names, and received frames go
//! through [`transfer_engine::Engine::handle_datagram`]. A node polls its engine only while its link has
//! queue room (backpressure), so a sender never floods its own link into tail drop.
//!
//! [`Scenario`] packages the common case: one KV transfer between two nodes under a [`FaultSpec`],
//! reported as a [`ScenarioReport`] whose `corrupt_delivered` compares every delivered block's bytes with
//! the source's.
//!
//! Traffic shaping: a link's egress queue is FIFO by default or strict priority by traffic class with
//! anti-starvation ([`QueueDiscipline`], [`Sim::set_discipline`]); a [`CollectiveFlow`]
//! ([`Sim::add_collective`]) is a periodic, latency-sensitive flow whose every operation's latency is
//! measured. [`ContentionConfig`] runs a collective beside a KV transfer under each [`Sharing`];
//! [`OverlapConfig`] runs a consumer computing layers while their KV streams in.
#![forbid(unsafe_code)]

mod collective;
mod contention;
mod fault;
mod link;
mod node;
mod overlap;
mod pair;
mod qdisc;
mod scenario;
mod sim;

pub use collective::{CollectiveFlow, CollectiveId, CollectiveOp, CollectiveStats, quantile};
pub use contention::{ContentionConfig, ContentionReport, Sharing};
pub use fault::{CorruptTarget, FaultRule, GilbertElliott, PacketInfo, Verdict, judge};
pub use link::{Link, LinkConfig, LinkStats, Offer};
pub use node::{Node, NodeId};
pub use overlap::{OverlapConfig, OverlapReport, OverlapRun};
pub use qdisc::QueueDiscipline;
pub use scenario::{
    BURST_SLOT, CrashPlan, FaultSpec, Scenario, ScenarioConfig, ScenarioReport, Side, fill_block,
};
pub use sim::{CrossTraffic, Observer, RunEnd, Sim, SimStats};

/// Environment variable holding the seed of a simulated run.
pub const SEED_ENV: &str = "FABRIC_SEED";

/// Why a simulation could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The engine refused the scenario's regions or transfer.
    #[error("engine refused the scenario: {0}")]
    Engine(#[from] transfer_engine::Error),
    /// `FABRIC_SEED` is set but is not a number.
    #[error("{SEED_ENV}={0:?} is not a number: set it to a u64 such as 42, or unset it")]
    BadSeed(String),
    /// The settings describe something the simulation cannot run.
    #[error("invalid simulation settings: {0}")]
    InvalidConfig(String),
    /// A run ended before what it measures happened (an engine hung, or a deadline passed).
    #[error("{0} did not happen in the simulation: an engine hung or a deadline passed")]
    Incomplete(&'static str),
}

/// The seed in `FABRIC_SEED`, or `default` when it is unset.
pub fn seed_from_env(default: u64) -> Result<u64, SimError> {
    match std::env::var(SEED_ENV) {
        Ok(text) => text.trim().parse().map_err(|_| SimError::BadSeed(text)),
        Err(_) => Ok(default),
    }
}

/// Derives an independent 64-bit value from `seed` and `salt` (SplitMix64 finalizer), so every generator
/// in a run is a function of the one seed.
#[must_use]
pub fn mix(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
