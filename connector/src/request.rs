//! What the scheduler side hands the worker side and the serving engine: a request, its blocks to load or
//! save in a step, and a producer's transfer parameters.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::keys::{BlockHash, RequestExtras, ScopedKey};
use crate::tp::TpRank;

/// A request as the scheduler sees it.
#[derive(Debug, Clone, Copy)]
pub struct KvRequest<'a> {
    /// The serving engine's request id.
    pub id: &'a str,
    /// The prompt's token ids.
    pub tokens: &'a [u32],
    /// LoRA, multimodal items and cache salt.
    pub extras: &'a RequestExtras,
    /// The serving engine's own block hashes, used as they are instead of hashing `tokens`.
    pub external_keys: Option<&'a [BlockHash]>,
    /// Where this request's KV waits (what the producer's [`crate::KvConnector::request_finished`] returned,
    /// carried by the serving engine's proxy); `None`: the consumer's default producer.
    pub transfer_params: Option<&'a KvTransferParams>,
}

/// What a producer hands back when a request finishes, for the proxy to pass to the consumer that
/// decodes it (vLLM's `kv_transfer_params`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvTransferParams {
    /// The control address of the producer's scheduler rank (rank 0).
    pub producer: SocketAddr,
    /// Every producer rank's control address, in rank order, under tensor parallelism (empty: one rank,
    /// at `producer`). A consumer's rank *i* loads from rank *i*.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<SocketAddr>,
}

impl KvTransferParams {
    /// Parameters naming one producer rank.
    #[must_use]
    pub fn single(producer: SocketAddr) -> KvTransferParams {
        KvTransferParams {
            producer,
            ranks: Vec::new(),
        }
    }

    /// The control address consumer rank `tp` loads from (see [`crate::TpRank`]).
    #[must_use]
    pub fn control_for(&self, tp: TpRank) -> SocketAddr {
        crate::tp::rank_control(&self.ranks, tp).unwrap_or(self.producer)
    }
}

/// Blocks of one request to load or save in this step: `keys[i]` goes to or comes from block `blocks[i]`
/// of the worker's KV caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSpec {
    /// The request id.
    pub request: String,
    /// The blocks' keys, in prompt order.
    pub keys: Vec<ScopedKey>,
    /// The worker's block ids, paired with `keys`.
    pub blocks: Vec<u32>,
    /// Load from this instance's own tier store (a `both` connector's lower tier) rather than a producer.
    pub local: bool,
    /// The producer to load from (`None`: the default one).
    pub producer: Option<KvTransferParams>,
}

/// What the workers need for one step (vLLM's `KVConnectorMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectorMetadata {
    /// Loads to start (consumer).
    pub loads: Vec<BlockSpec>,
    /// Saves to make, layer by layer (producer).
    pub saves: Vec<BlockSpec>,
}

/// A stable 64-bit id for a request id (the tier manager counts sharers by it).
pub(crate) fn request_number(id: &str) -> u64 {
    // FNV-1a: stable across processes, unlike std's randomly seeded hasher.
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
