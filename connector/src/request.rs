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
    /// Where this request's KV waits (what the producer's [`crate::KvScheduler::request_finished`] returned,
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
    /// A save for a decode to load (see [`crate::KvScheduler::hold_for_decode`]): the store keeps the
    /// blocks from being dropped until a load of them completes or
    /// [`crate::ConnectorConfig::hold_timeout`] passes.
    pub hold: bool,
    /// A save's origin for KV events ([`crate::ConnectorConfig::kv_events`]; empty otherwise): the
    /// blocks' tokens, block after block.
    pub tokens: Vec<u32>,
    /// The serving engine's own hashes of the blocks, for the events, when they are not the keys'
    /// (see [`crate::KvScheduler::set_engine_hashes`]; empty otherwise).
    pub engine_hashes: Vec<BlockHash>,
    /// The hash of the block before the first key, as the engine knows it (`None`: the prompt's first
    /// block, or no events).
    pub parent: Option<BlockHash>,
}

/// What the workers need for one step (vLLM's `KVConnectorMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectorMetadata {
    /// Loads to start (consumer).
    pub loads: Vec<BlockSpec>,
    /// Saves to make, layer by layer (producer).
    pub saves: Vec<BlockSpec>,
    /// Requests the engine preempted since the last step: their blocks are being given to others, so
    /// nothing more of a load of theirs may land (see [`crate::KvWorker::handle_preemptions`]).
    pub preempted: Vec<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A stable 64-bit id for a request id (the tier manager counts sharers by it).
pub(crate) fn request_number(id: &str) -> u64 {
    // FNV-1a: stable across processes, unlike std's randomly seeded hasher.
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A [`BlockSpec`] as it travels between processes, its keys (in one namespace) in the frame's key part.
#[derive(Serialize, Deserialize)]
struct SpecOnWire {
    request: String,
    ns: u64,
    /// How many of the frame's keys are this spec's (they follow the previous spec's).
    keys: usize,
    /// How many of the frame's keys after those are the engine's own hashes of the blocks.
    #[serde(default, skip_serializing_if = "is_zero")]
    engine_hashes: usize,
    blocks: Vec<u32>,
    local: bool,
    producer: Option<KvTransferParams>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    hold: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tokens: Vec<u32>,
    /// Whether the frame's next key (after the engine's hashes) is [`BlockSpec::parent`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    parent: bool,
}

/// [`ConnectorMetadata`] as it travels between processes: a control frame's head (see
/// [`crate::control::frame`]) whose key part holds every spec's keys in turn.
#[derive(Serialize, Deserialize)]
struct MetadataOnWire {
    loads: Vec<SpecOnWire>,
    saves: Vec<SpecOnWire>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    preempted: Vec<String>,
}

impl SpecOnWire {
    fn from(s: &BlockSpec, hashes: &mut Vec<BlockHash>) -> Self {
        hashes.extend(s.keys.iter().map(|k| k.hash));
        hashes.extend_from_slice(&s.engine_hashes);
        hashes.extend(s.parent);
        SpecOnWire {
            request: s.request.clone(),
            ns: s.keys.first().map_or(0, |k| k.ns.0),
            keys: s.keys.len(),
            engine_hashes: s.engine_hashes.len(),
            blocks: s.blocks.clone(),
            local: s.local,
            producer: s.producer.clone(),
            hold: s.hold,
            tokens: s.tokens.clone(),
            parent: s.parent.is_some(),
        }
    }

    fn into_spec(self, hashes: &mut std::vec::IntoIter<BlockHash>) -> Result<BlockSpec, String> {
        let mine: Vec<BlockHash> = hashes.by_ref().take(self.keys).collect();
        let engine_hashes: Vec<BlockHash> = hashes.by_ref().take(self.engine_hashes).collect();
        let parent = if self.parent { hashes.next() } else { None };
        if mine.len() < self.keys
            || engine_hashes.len() < self.engine_hashes
            || self.parent != parent.is_some()
        {
            return Err(format!(
                "request {:?} names {} keys, the frame holds fewer",
                self.request, self.keys
            ));
        }
        Ok(BlockSpec {
            keys: crate::control::scoped_keys(self.ns, mine),
            request: self.request,
            blocks: self.blocks,
            local: self.local,
            producer: self.producer,
            hold: self.hold,
            tokens: self.tokens,
            engine_hashes,
            parent,
        })
    }
}

impl ConnectorMetadata {
    /// The metadata as bytes, for a serving engine that hands it from its scheduler process to its
    /// workers (vLLM pickles it): a control frame, the keys raw.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut hashes = Vec::new();
        let wire = MetadataOnWire {
            loads: self
                .loads
                .iter()
                .map(|s| SpecOnWire::from(s, &mut hashes))
                .collect(),
            saves: self
                .saves
                .iter()
                .map(|s| SpecOnWire::from(s, &mut hashes))
                .collect(),
            preempted: self.preempted.clone(),
        };
        crate::control::frame::encode(&wire, &hashes)
    }

    /// Metadata from [`ConnectorMetadata::to_bytes`]; the error says what is malformed.
    pub fn from_bytes(bytes: &[u8]) -> Result<ConnectorMetadata, crate::ConnectorError> {
        let bad = |e: String| crate::ConnectorError::Blocks(format!("connector metadata: {e}"));
        let frame = crate::control::frame::decode(bytes).map_err(|e| bad(e.to_string()))?;
        let wire: MetadataOnWire = frame.head().map_err(bad)?;
        let mut hashes = frame.keys.into_iter();
        let mut specs = |v: Vec<SpecOnWire>| -> Result<Vec<BlockSpec>, crate::ConnectorError> {
            v.into_iter()
                .map(|s| s.into_spec(&mut hashes).map_err(bad))
                .collect()
        };
        let meta = ConnectorMetadata {
            loads: specs(wire.loads)?,
            saves: specs(wire.saves)?,
            preempted: wire.preempted,
        };
        if hashes.next().is_some() {
            return Err(bad("the frame holds keys no request names".into()));
        }
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::NamespaceId;

    #[test]
    fn metadata_survives_its_bytes_and_refuses_garbage() {
        let key = |b: u8| ScopedKey {
            ns: NamespaceId(42),
            hash: BlockHash([b; 32]),
        };
        let params = KvTransferParams {
            producer: "10.0.0.1:7000".parse().unwrap(),
            ranks: vec![
                "10.0.0.1:7000".parse().unwrap(),
                "10.0.0.1:7001".parse().unwrap(),
            ],
        };
        let meta = ConnectorMetadata {
            loads: vec![BlockSpec {
                request: "r1".into(),
                keys: vec![key(1), key(2)],
                blocks: vec![7, 3],
                local: false,
                producer: Some(params),
                hold: false,
                tokens: Vec::new(),
                engine_hashes: Vec::new(),
                parent: None,
            }],
            saves: vec![BlockSpec {
                request: "r2".into(),
                keys: vec![key(9)],
                blocks: vec![0],
                local: true,
                producer: None,
                hold: true,
                tokens: vec![5, 6, 7],
                engine_hashes: vec![BlockHash([4; 32])],
                parent: Some(BlockHash([3; 32])),
            }],
            preempted: vec!["r3".into()],
        };
        let bytes = meta.to_bytes();
        assert_eq!(ConnectorMetadata::from_bytes(&bytes).unwrap(), meta);
        // Five hashes of 32 bytes (three keys, an engine's hash, a parent) travel raw, not as hex digits.
        assert!(bytes.len() < 520, "{} bytes", bytes.len());
        assert!(ConnectorMetadata::from_bytes(b"{\"loads\":[]}").is_err());
        for cut in 0..bytes.len() {
            assert!(ConnectorMetadata::from_bytes(&bytes[..cut]).is_err());
        }
        let fewer = crate::control::frame::encode(
            &serde_json::json!({"loads": [], "saves": [{"request": "r", "ns": 1, "keys": 2,
                "blocks": [0, 1], "local": false, "producer": null}]}),
            &[BlockHash([1; 32])],
        );
        assert!(ConnectorMetadata::from_bytes(&fewer).is_err());
    }
}
