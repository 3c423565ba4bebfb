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
    /// A save for a decode to load (see [`crate::KvConnector::hold_for_decode`]): the store keeps the
    /// blocks from being dropped until a load of them completes or
    /// [`crate::ConnectorConfig::hold_timeout`] passes.
    pub hold: bool,
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

/// A [`BlockSpec`] as it travels between processes: keys in hex, in one namespace.
#[derive(Serialize, Deserialize)]
struct SpecOnWire {
    request: String,
    ns: u64,
    keys: Vec<String>,
    blocks: Vec<u32>,
    local: bool,
    producer: Option<KvTransferParams>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    hold: bool,
}

/// [`ConnectorMetadata`] as it travels between processes.
#[derive(Serialize, Deserialize)]
struct MetadataOnWire {
    loads: Vec<SpecOnWire>,
    saves: Vec<SpecOnWire>,
}

impl SpecOnWire {
    fn from(s: &BlockSpec) -> Self {
        SpecOnWire {
            request: s.request.clone(),
            ns: s.keys.first().map_or(0, |k| k.ns.0),
            keys: crate::control::hex_keys(&s.keys),
            blocks: s.blocks.clone(),
            local: s.local,
            producer: s.producer.clone(),
            hold: s.hold,
        }
    }

    fn into_spec(self) -> Result<BlockSpec, String> {
        Ok(BlockSpec {
            keys: crate::control::parse_keys(self.ns, &self.keys)?,
            request: self.request,
            blocks: self.blocks,
            local: self.local,
            producer: self.producer,
            hold: self.hold,
        })
    }
}

impl ConnectorMetadata {
    /// The metadata as JSON, for a serving engine that hands it from its scheduler process to its
    /// workers (vLLM pickles it).
    #[must_use]
    pub fn to_json(&self) -> String {
        let wire = MetadataOnWire {
            loads: self.loads.iter().map(SpecOnWire::from).collect(),
            saves: self.saves.iter().map(SpecOnWire::from).collect(),
        };
        serde_json::to_string(&wire).expect("metadata serialises")
    }

    /// Metadata from [`ConnectorMetadata::to_json`]; the error says what is malformed.
    pub fn from_json(json: &str) -> Result<ConnectorMetadata, crate::ConnectorError> {
        let bad = |e: String| crate::ConnectorError::Blocks(format!("connector metadata: {e}"));
        let wire: MetadataOnWire = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        let specs = |v: Vec<SpecOnWire>| -> Result<Vec<BlockSpec>, crate::ConnectorError> {
            v.into_iter().map(|s| s.into_spec().map_err(bad)).collect()
        };
        Ok(ConnectorMetadata {
            loads: specs(wire.loads)?,
            saves: specs(wire.saves)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::NamespaceId;

    #[test]
    fn metadata_survives_json_and_refuses_garbage() {
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
            }],
            saves: vec![BlockSpec {
                request: "r2".into(),
                keys: vec![key(9)],
                blocks: vec![0],
                local: true,
                producer: None,
                hold: true,
            }],
        };
        assert_eq!(ConnectorMetadata::from_json(&meta.to_json()).unwrap(), meta);
        assert!(ConnectorMetadata::from_json("{\"loads\":[]}").is_err());
        let bad_key = meta.to_json().replace(&"01".repeat(32), "zz");
        assert!(ConnectorMetadata::from_json(&bad_key).is_err());
    }
}
