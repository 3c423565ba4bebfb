//! Roles and configuration.

use crate::disk::DiskConfig;
use std::time::Duration;

use backends::tcp::Secret;
use policy::Namespace;
use transfer_engine::{
    BlockPlacement, ChunkSplit, Dtype, KvHeads, KvKind, KvLayout, ShapingConfig, TrafficClass,
};

use crate::control::ControlIdentity;
use crate::error::ConnectorError;
use crate::keys::{ExtraKeyLayout, VllmHasher, root_hash};
use crate::tp::TpRank;

/// What an instance does with KV (vLLM's `kv_role`: `kv_producer`, `kv_consumer`, `kv_both`). Not the
/// engine's [`transfer_engine::Role`], which says which end of one session (sender or receiver) an event
/// concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvRole {
    /// Saves KV (a prefill instance); never loads.
    Producer,
    /// Loads KV (a decode instance); never saves.
    Consumer,
    /// Both.
    Both,
}

impl KvRole {
    /// Whether this role saves.
    #[must_use]
    pub fn saves(self) -> bool {
        matches!(self, KvRole::Producer | KvRole::Both)
    }

    /// Whether this role loads.
    #[must_use]
    pub fn loads(self) -> bool {
        matches!(self, KvRole::Consumer | KvRole::Both)
    }

    /// The role's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            KvRole::Producer => "producer",
            KvRole::Consumer => "consumer",
            KvRole::Both => "both",
        }
    }
}

/// A connector's settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectorConfig {
    /// Producer, consumer or both.
    pub role: KvRole,
    /// Model id, weight version, block size (tokens) and dtype; keys live inside it.
    pub namespace: Namespace,
    /// `PYTHONHASHSEED` of the vLLM processes whose keys must match (`None`: unset, vLLM ≥ 0.29).
    pub python_hash_seed: Option<String>,
    /// Extra-key shape of the vLLM release in use.
    pub extra_key_layout: ExtraKeyLayout,
    /// Transformer layers of the KV cache.
    pub layers: u32,
    /// Bytes of one block of one layer (K and V together), of this rank's heads.
    pub block_bytes: u64,
    /// The heads a block holds on this rank and their arrangement ([`KvHeads::UNSTATED`]: bytes only).
    /// The KV caches registered must state the same; the tier store keeps blocks in this arrangement, so
    /// KV of one arrangement never reaches caches of another.
    pub heads: KvHeads,
    /// This worker's tensor-parallel rank ([`TpRank::SINGLE`] without tensor parallelism).
    pub tp: TpRank,
    /// Blocks the local tier store keeps in host memory (producers; 0 for a consumer).
    pub store_blocks: u32,
    /// Rank the store's blocks with the tier manager's ARC-style segments instead of plain heat order
    /// (see [`crate::TierStore::with_memory`]; off by default: a block just saved then stays loadable).
    pub store_segments: bool,
    /// Layers a load may run ahead of the consumer's compute.
    pub prefetch_depth: u32,
    /// Loads run between the engine's steps instead of inside its forward pass: the scheduler half says
    /// a load is asynchronous, the request waits until [`crate::KvWorker::get_finished`] reports its
    /// load over (all layers, or its missing blocks handed back), and `wait_for_layer_load` does not wait
    /// for it. Off by default: layers stream while the forward pass computes.
    pub async_loads: bool,
    /// Traffic class of loads a consumer waits on.
    pub class: TrafficClass,
    /// Traffic shaping of this connector's engine: the KV bandwidth cap (link rate and KV share of it,
    /// per-class rates). `None` leaves the engine's default (KV unshaped).
    pub shaping: Option<ShapingConfig>,
    /// Time a load may take before its missing blocks are handed back for recompute (and a control
    /// call to a producer before it fails).
    pub load_timeout: Duration,
    /// Time the scheduler half gives each producer to answer a lookup: every candidate is asked at once,
    /// and one that has not answered by then counts as holding nothing, so a slow peer costs the lookup
    /// this much at most, never the sum of every peer's time.
    pub lookup_timeout: Duration,
    /// How long a producer holds the blocks saved for a decode ([`crate::KvScheduler::hold_for_decode`])
    /// when no load of them comes: its store never drops a held block (a disk tier may take it) while
    /// another can go. Zero holds nothing.
    pub hold_timeout: Duration,
    /// A disk tier below the store's host memory (producers; `None`: host memory only). Host victims the
    /// tier manager admits ([`ConnectorConfig::disk_min_sharers`]) are written there, lookups and loads
    /// cover it, and a restarted producer serves what it recovered. One directory per worker.
    pub disk: Option<DiskConfig>,
    /// Requests that must have used a host victim for it to be demoted to disk rather than dropped
    /// (see [`policy::TierConfig::demote_min_sharers`]).
    pub disk_min_sharers: u32,
    /// Keep KV events of the store (blocks entering and leaving host memory and disk, for a serving
    /// engine's event stream: [`crate::KvWorker::take_kv_events`]); the scheduler half then sends each
    /// saved block's tokens to the workers. Off by default.
    pub kv_events: bool,
    /// The shared secret of the control channel and of a TCP node the connector starts (its lanes'
    /// HMAC handshake): with it, a producer answers only consumers that prove they hold it, and sends
    /// only to engines that do. `None`: neither is authenticated (run on a network only the serving
    /// cluster reaches). Its `Debug` never prints the bytes.
    pub secret: Option<Secret>,
}

impl ConnectorConfig {
    /// The namespace lanes and control connections check: the model, block size and dtype (weight
    /// versions are told apart by the keys, so a rolling update serves two at once).
    #[must_use]
    pub fn lane_namespace(&self) -> Namespace {
        Namespace {
            weight_version: 0,
            ..self.namespace.clone()
        }
    }

    /// What this connector says of itself on the control channel, receiving loads on `engines`.
    pub(crate) fn control_identity(&self, engines: Vec<u32>) -> ControlIdentity {
        ControlIdentity {
            secret: self.secret.clone(),
            ns: self.lane_namespace().id().0,
            engines,
        }
    }

    /// Defaults for `role` in `namespace`: 32 layers, 64 KiB blocks, a 1024-block store, prefetch 2.
    #[must_use]
    pub fn new(role: KvRole, namespace: Namespace) -> ConnectorConfig {
        ConnectorConfig {
            role,
            namespace,
            python_hash_seed: None,
            extra_key_layout: ExtraKeyLayout::Tagged,
            layers: 32,
            block_bytes: 64 << 10,
            heads: KvHeads::UNSTATED,
            tp: TpRank::SINGLE,
            store_blocks: if role.saves() { 1024 } else { 0 },
            store_segments: false,
            prefetch_depth: 2,
            secret: None,
            async_loads: false,
            class: TrafficClass::UrgentKv,
            shaping: None,
            load_timeout: Duration::from_secs(10),
            lookup_timeout: Duration::from_secs(1),
            hold_timeout: Duration::from_secs(60),
            disk: None,
            disk_min_sharers: 1,
            kv_events: false,
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConnectorError> {
        if self.namespace.block_size == 0 {
            return Err(ConnectorError::Config(
                "namespace.block_size must be at least 1 token".into(),
            ));
        }
        if self.role.saves() && self.store_blocks == 0 {
            return Err(ConnectorError::Config(
                "a producer needs store_blocks > 0 (the host-memory tier it saves into)".into(),
            ));
        }
        if self.disk.is_some() && !self.role.saves() {
            return Err(ConnectorError::Config(
                "a disk tier belongs to a producer's store (this role saves nothing)".into(),
            ));
        }
        if self.load_timeout.is_zero() {
            return Err(ConnectorError::Config(
                "load_timeout must be above zero (a load given no time is never waited for)".into(),
            ));
        }
        if self.disk_min_sharers == 0 {
            return Err(ConnectorError::Config(
                "disk_min_sharers must be at least 1 (a block no request used is never worth a disk write)"
                    .into(),
            ));
        }
        if self.lookup_timeout.is_zero() {
            return Err(ConnectorError::Config(
                "lookup_timeout must be above zero (a lookup nobody can answer finds nothing)"
                    .into(),
            ));
        }
        self.tp.validate()?;
        self.kv_layout(1)?;
        Ok(())
    }

    /// Whether this rank's KV is MLA (the same on every rank).
    #[must_use]
    pub fn is_mla(&self) -> bool {
        self.heads.kind == KvKind::Mla
    }

    /// The layer-major KV layout of a pool of `blocks` blocks with these dimensions and heads (K/V apart
    /// keeps K in a block's first half, V in its second).
    pub fn kv_layout(&self, blocks: u32) -> Result<KvLayout, ConnectorError> {
        let dense = KvLayout::new(
            self.layers,
            blocks,
            self.block_bytes,
            self.namespace.block_size,
            self.namespace.dtype,
        )?;
        let split = (self.heads.kind == KvKind::KvApart).then_some(ChunkSplit {
            first_len: self.block_bytes / 2,
            second_offset: self.block_bytes / 2,
        });
        Ok(KvLayout::placed(
            self.layers,
            blocks,
            self.block_bytes,
            self.namespace.block_size,
            self.namespace.dtype,
            self.heads,
            BlockPlacement {
                split,
                ..dense.placement
            },
        )?)
    }

    /// Checks that KV caches of `layout` hold the KV these settings describe: layers, tokens and bytes
    /// per block, dtype and heads (pool size and placement are the caches' own). The error names both
    /// values.
    pub fn check_caches(&self, layout: &KvLayout) -> Result<(), ConnectorError> {
        let ours = self.kv_layout(layout.blocks_per_layer)?;
        if layout.heads != ours.heads {
            return Err(ConnectorError::Config(format!(
                "the KV caches hold {:?} but the connector is configured for {:?}",
                layout.heads, ours.heads
            )));
        }
        Ok(ours.check_compatible(layout)?)
    }

    /// The block hasher these settings imply.
    #[must_use]
    pub fn hasher(&self) -> VllmHasher {
        VllmHasher::new(
            root_hash(self.python_hash_seed.as_deref()),
            self.namespace.block_size as usize,
        )
    }
}

/// A namespace for `model` at `weight_version` with `block_size`-token blocks of bf16.
#[must_use]
pub fn namespace(model: &str, weight_version: u64, block_size: u32) -> Namespace {
    Namespace {
        model: model.into(),
        weight_version,
        block_size,
        dtype: Dtype::Bf16,
    }
}
