//! Pluggable policy: which mode a transfer uses, which traffic class it rides in, where a block should
//! live and which to evict. The core ships trivial defaults; the `policy` crate has the real ones.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{NamespaceId, TransferMode};

/// Traffic classes, highest priority first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TrafficClass {
    /// Tensor-parallel collectives and control: always first.
    Collective,
    /// KV a consumer is blocked on.
    UrgentKv,
    /// Prefetch and offload.
    BulkKv,
}

impl TrafficClass {
    /// Every class, highest priority first.
    pub const ALL: [TrafficClass; 3] = [
        TrafficClass::Collective,
        TrafficClass::UrgentKv,
        TrafficClass::BulkKv,
    ];

    /// Index in [`TrafficClass::ALL`].
    #[must_use]
    pub fn index(self) -> usize {
        match self {
            TrafficClass::Collective => 0,
            TrafficClass::UrgentKv => 1,
            TrafficClass::BulkKv => 2,
        }
    }
}

/// What a policy may look at when deciding how a transfer travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferShape {
    /// Total bytes.
    pub bytes: u64,
    /// Bytes per block.
    pub block_bytes: u64,
    /// Blocks per layer.
    pub blocks: u32,
    /// Layers.
    pub layers: u32,
}

/// Chooses a transfer's wire mode.
pub trait ModePolicy: Send {
    /// The mode for a transfer of this shape.
    fn choose_mode(&self, shape: &TransferShape) -> TransferMode;
}

/// Chooses a transfer's traffic class.
pub trait ClassPolicy: Send {
    /// The class for a transfer of this shape.
    fn choose_class(&self, shape: &TransferShape) -> TrafficClass;
}

/// Always the same mode.
#[derive(Debug, Clone, Copy)]
pub struct FixedMode(pub TransferMode);

impl ModePolicy for FixedMode {
    fn choose_mode(&self, _: &TransferShape) -> TransferMode {
        self.0
    }
}

/// Always the same class.
#[derive(Debug, Clone, Copy)]
pub struct FixedClass(pub TrafficClass);

impl ClassPolicy for FixedClass {
    fn choose_class(&self, _: &TransferShape) -> TrafficClass {
        self.0
    }
}

/// A memory tier, nearest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// GPU HBM.
    Gpu,
    /// Host DRAM.
    Host,
    /// Remote memory or SSD.
    Remote,
}

/// A block's identity for tiering: a content key (see the `policy` crate's chained hashes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockKey(pub u64);

/// A move the engine should carry out: `to == None` evicts the block from `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierMove {
    /// The block.
    pub key: BlockKey,
    /// Where it is now.
    pub from: Tier,
    /// Where it goes, or `None` to drop it.
    pub to: Option<Tier>,
}

/// A whole request, for policies that reason about requests rather than single blocks
/// ([`TierPolicy::on_request`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestInfo<'a> {
    /// The request's id (the `request` the block-level calls would carry).
    pub id: u64,
    /// The namespace of all its blocks.
    pub ns: NamespaceId,
    /// Its block keys in prefix order (each block's parent is the one before it).
    pub keys: &'a [BlockKey],
    /// Whether the last block is partial (the prompt does not fill it; the next turn rewrites it).
    pub partial_last: bool,
    /// Output length in tokens, if known when the call is made.
    pub output_tokens: Option<u64>,
}

/// Decides where blocks live. `now` is time since an epoch of the caller's choosing.
pub trait TierPolicy {
    /// A new block of namespace `ns` was stored (at the nearest tier); returns the moves that keep
    /// capacities.
    fn on_insert(
        &mut self,
        ns: NamespaceId,
        key: BlockKey,
        parent: Option<BlockKey>,
        request: u64,
        now: Duration,
    ) -> Vec<TierMove>;
    /// A stored block was used by `request`; returns promotions and the demotions they cause.
    fn on_access(&mut self, key: BlockKey, request: u64, now: Duration) -> Vec<TierMove>;
    /// Where the block lives, if anywhere.
    fn tier_of(&self, key: BlockKey) -> Option<Tier>;
    /// A whole request used `request.keys` (stored at the nearest tier when new); returns the moves.
    ///
    /// The default calls [`TierPolicy::on_access`] for each resident key and
    /// [`TierPolicy::on_insert`] (parent: the key before it) for each new one, in order. Policies that
    /// want the request as a unit (settle capacities once for it, or use its partial last block or
    /// output length) override it. Callers use either this or the block-level calls for a request.
    fn on_request(&mut self, request: &RequestInfo<'_>, now: Duration) -> Vec<TierMove> {
        let mut moves = Vec::new();
        let mut parent = None;
        for &key in request.keys {
            if self.tier_of(key).is_some() {
                moves.extend(self.on_access(key, request.id, now));
            } else {
                moves.extend(self.on_insert(request.ns, key, parent, request.id, now));
            }
            parent = Some(key);
        }
        moves
    }
}

/// The trivial default: every block stays on the GPU tier forever, nothing moves.
#[derive(Debug, Default)]
pub struct NoTiering {
    blocks: BTreeMap<BlockKey, Tier>,
}

impl TierPolicy for NoTiering {
    fn on_insert(
        &mut self,
        _: NamespaceId,
        key: BlockKey,
        _: Option<BlockKey>,
        _: u64,
        _: Duration,
    ) -> Vec<TierMove> {
        self.blocks.insert(key, Tier::Gpu);
        Vec::new()
    }

    fn on_access(&mut self, _: BlockKey, _: u64, _: Duration) -> Vec<TierMove> {
        Vec::new()
    }

    fn tier_of(&self, key: BlockKey) -> Option<Tier> {
        self.blocks.get(&key).copied()
    }
}
