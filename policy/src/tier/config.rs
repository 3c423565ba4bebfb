//! Tier manager configuration: capacities, heat weights and the nearest tier's victim order.

use crate::continuation::ContinuationConfig;
use crate::heat::HeatConfig;
#[cfg(doc)]
use crate::tier::TierManager;

/// Blocks each tier may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierCapacities {
    /// GPU HBM.
    pub gpu: usize,
    /// Host DRAM.
    pub host: usize,
    /// Remote memory or SSD.
    pub remote: usize,
}

impl TierCapacities {
    pub(super) fn get(&self, t: usize) -> usize {
        [self.gpu, self.host, self.remote][t]
    }

    /// Blocks all tiers hold together.
    #[must_use]
    pub fn total(&self) -> usize {
        self.gpu + self.host + self.remote
    }
}

/// Tier manager configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct TierConfig {
    /// Capacities per tier.
    pub capacities: TierCapacities,
    /// Heat scoring.
    pub heat: HeatConfig,
    /// Evicted blocks whose heat is remembered, as a multiple of the total capacity.
    pub ghost_factor: f64,
    /// Split each tier into a *recent* segment (blocks one request used) and a *frequent* one (blocks
    /// two or more requests used), and size the recent segment online, ARC-style, from which ghosts come
    /// back (see [`TierManager`]). Off: one heat order per tier.
    pub adaptive_segments: bool,
    /// Victim order of the nearest (GPU) tier; the farther tiers always use heat.
    pub nearest: NearestOrder,
    /// Admission to the tiers below host memory: a host victim moves down only if at least this many
    /// requests used it (one: every victim; two: Dynamo's rule for its disk tier, blocks seen twice),
    /// or if a child of it lives below (dropping it would orphan the child); otherwise it is dropped.
    /// Victims of the nearest tier always move down.
    pub demote_min_sharers: u32,
}

/// How the tier manager picks the nearest tier's victims.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum NearestOrder {
    /// Heat rank (with [`TierConfig::adaptive_segments`]), like the farther tiers.
    #[default]
    Heat,
    /// The conversation-continuation eviction index ([`crate::continuation`]) over the nearest tier's
    /// blocks. Drive the manager with [`TierPolicy::on_request`](transfer_engine::policy::TierPolicy::on_request)
    /// so it sees whole requests (see [`TierManager`]).
    Continuation(ContinuationConfig),
}

impl TierConfig {
    /// The default heat policy over these capacities.
    #[must_use]
    pub fn new(capacities: TierCapacities) -> TierConfig {
        TierConfig {
            capacities,
            heat: HeatConfig::default(),
            ghost_factor: 8.0,
            adaptive_segments: true,
            nearest: NearestOrder::Heat,
            demote_min_sharers: 1,
        }
    }

    /// The same capacities with the continuation order (default settings) on the nearest tier.
    #[must_use]
    pub fn continuation(capacities: TierCapacities) -> TierConfig {
        TierConfig {
            nearest: NearestOrder::Continuation(ContinuationConfig::default()),
            ..TierConfig::new(capacities)
        }
    }
}
