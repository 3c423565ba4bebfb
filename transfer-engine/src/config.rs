//! Engine settings, and what the session state machines need from the engine while they run. Sessions
//! depend on this module, not on the engine, so the engine sits above them.

use std::collections::VecDeque;
use std::time::Duration;

use rand_chacha::ChaCha8Rng;

use crate::{Backoff, Event, RegionId, RetransmitBudget, TrafficClass, TransferMode};

/// Engine settings. Time and randomness come from outside: `rng_seed` seeds every random choice.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// This engine's id; session ids start with it, so engines that talk must have distinct ids.
    pub engine_id: u32,
    /// Seed of the generator behind access keys and retransmit jitter.
    pub rng_seed: u64,
    /// Retransmit timing.
    pub backoff: Backoff,
    /// Retransmits of one unit before it is given up (its blocks go to recompute).
    pub max_retries: u32,
    /// Default time a session has before undelivered blocks are handed back for recompute.
    pub deadline: Duration,
    /// Most unacknowledged payload bytes per session (at least one unit is always allowed).
    pub window_bytes: u64,
    /// The engine-wide retransmit budget.
    pub retransmit_budget: RetransmitBudget,
    /// Mode used when a request names none (through the default mode policy).
    pub default_mode: TransferMode,
    /// Class used when a request names none (through the default class policy).
    pub default_class: TrafficClass,
    /// Packetized slices sent for the first time go out back to back in one data frame, a coalesced
    /// frame of following slices of one block, up to this many payload bytes (at most
    /// [`crate::MAX_COALESCED_SLICES`] slices and [`crate::wire::MAX_PAYLOAD`] bytes, and within the
    /// session's window). Each slice is still acknowledged, resent (alone) and given up on its own; the
    /// frame's CRC covers them all. It spares per-frame work where a frame costs more than its bytes (a
    /// TCP lane). Exclusive units always go alone. A value below two slices (the default is 0) sends one
    /// slice a frame.
    pub coalesce_bytes: u32,
    /// Most sessions one peer may have open towards this engine at once; more opens are refused (each
    /// holds receiver state proportional to its plan).
    pub max_incoming_per_peer: usize,
}

impl EngineConfig {
    /// The defaults, for engine `engine_id`.
    #[must_use]
    pub fn with_engine_id(engine_id: u32) -> Self {
        Self {
            engine_id,
            ..Self::default()
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            engine_id: 1,
            rng_seed: 0,
            backoff: Backoff::default(),
            max_retries: 8,
            deadline: Duration::from_secs(10),
            window_bytes: 64 << 20,
            retransmit_budget: RetransmitBudget::default(),
            default_mode: TransferMode::auto(),
            default_class: TrafficClass::BulkKv,
            max_incoming_per_peer: 256,
            coalesce_bytes: 0,
        }
    }
}

/// Where the payload of a received data frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Copy the payload to `offset..offset + len` of local region `region`, then call
    /// [`crate::Engine::handle_data`] with its CRC.
    Write {
        /// Local region.
        region: RegionId,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// Do not place it (a unit it carries already verified: a late duplicate must never overwrite it);
    /// still call [`crate::Engine::handle_data`] so the verified units are acknowledged again.
    Discard,
}

/// What sessions need from the engine while they run.
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a EngineConfig,
    pub(crate) rng: &'a mut ChaCha8Rng,
    pub(crate) budget: &'a mut RetransmitBudget,
    pub(crate) events: &'a mut VecDeque<Event>,
}
