//! The mutable state a connector keeps for each half: the scheduler's tracked requests and pending step
//! metadata, the worker's KV caches, running loads, failed blocks and finished requests.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use transfer_engine::{KvLayout, MemoryRegion};

use crate::data_plane::PlaneSession;
use crate::error::ConnectorError;
use crate::keys::{BlockHash, ScopedKey};
use crate::request::{ConnectorMetadata, KvTransferParams};

/// A request the scheduler half follows until it finishes.
#[derive(Debug, Clone)]
pub(crate) struct Tracked {
    pub(crate) keys: Vec<ScopedKey>,
    pub(crate) computed_blocks: usize,
    pub(crate) matched_blocks: usize,
    /// Of the matched blocks, how many only the producer's disk tier holds.
    pub(crate) disk_blocks: usize,
    pub(crate) local: bool,
    pub(crate) producer: Option<KvTransferParams>,
    /// Its load is asynchronous and not planned yet ([`crate::ConnectorConfig::async_loads`]).
    pub(crate) load_async: bool,
    /// The blocks a saving role still has to save, once they are computed.
    pub(crate) save: Option<SavePlan>,
    /// Its saves are held for a decode ([`crate::KvScheduler::hold_for_decode`]).
    pub(crate) hold: bool,
    /// The tokens of its full blocks, for the KV events of its saves ([`crate::ConnectorConfig::kv_events`];
    /// empty otherwise).
    pub(crate) tokens: Vec<u32>,
    /// The engine's own hashes of its blocks when they are not the keys (for the events).
    pub(crate) engine_hashes: Vec<BlockHash>,
}

/// A saving role's plan for one request: its block table and how far it was saved. Blocks are saved
/// in the step that computes them (see [`crate::KvScheduler::record_step`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct SavePlan {
    /// The request's block table, as far as the engine allocated it.
    pub(crate) blocks: Vec<u32>,
    /// Leading blocks already planned for saving.
    pub(crate) saved: usize,
    /// Tokens computed by the end of the current step, if the engine said (`None`: the whole prompt in
    /// one step).
    pub(crate) computed_tokens: Option<usize>,
}

/// The scheduler half's state.
#[derive(Debug, Default)]
pub(crate) struct SchedulerState {
    pub(crate) requests: BTreeMap<String, Tracked>,
    pub(crate) pending: ConnectorMetadata,
}

/// A load the worker half started and waits on layer by layer.
#[derive(Debug)]
pub(crate) struct ActiveLoad {
    pub(crate) request: String,
    pub(crate) session: PlaneSession,
    pub(crate) blocks: Vec<u32>,
    pub(crate) started: Instant,
}

/// The worker half's state.
#[derive(Debug, Default)]
pub(crate) struct WorkerState {
    pub(crate) kv: Option<(MemoryRegion, KvLayout)>,
    pub(crate) meta: ConnectorMetadata,
    pub(crate) loads: Vec<ActiveLoad>,
    pub(crate) failed: BTreeSet<u32>,
    pub(crate) finished_sending: Vec<String>,
    pub(crate) finished_receiving: Vec<String>,
    pub(crate) load_errors: Vec<ConnectorError>,
}
