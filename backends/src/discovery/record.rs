//! What the registry stores, and its text encoding (`key=value` lines, stable and readable in etcdctl).

use transfer_engine::{Dtype, KvLayout, RegionId};

use super::DiscoveryError;

/// A registered peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRecord {
    /// Its engine id (its `PeerId`).
    pub engine_id: u32,
    /// The address it listens on.
    pub addr: String,
    /// Its KV namespace, as text (for operators; the handshake checks the real thing).
    pub namespace: String,
}

/// A region a peer offers: which one, how long and laid out how. Not its access key: a peer that may write
/// into it learns the key in the authenticated handshake ([`crate::Transport::connect`] returns the
/// peer's segments, keys included), never from the registry, which anyone who reaches it can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRecord {
    /// Owning engine.
    pub owner: u32,
    /// Name of the segment.
    pub name: String,
    /// The region's id on its owner.
    pub region: RegionId,
    /// Its length in bytes.
    pub len: u64,
    /// Its layout, for a KV region.
    pub layout: Option<KvLayout>,
}

impl PeerRecord {
    /// The record as `key=value` lines.
    #[must_use]
    pub fn encode(&self) -> String {
        format!(
            "engine_id={}\naddr={}\nnamespace={}\n",
            self.engine_id, self.addr, self.namespace
        )
    }

    /// Reads a record stored under `key`.
    pub fn decode(key: &str, text: &str) -> Result<Self, DiscoveryError> {
        let f = Fields::parse(key, text);
        Ok(Self {
            engine_id: f.num(key, "engine_id")? as u32,
            addr: f.get(key, "addr")?.to_string(),
            namespace: f.get(key, "namespace")?.to_string(),
        })
    }
}

impl SegmentRecord {
    /// The record as `key=value` lines.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut s = format!(
            "owner={}\nname={}\nregion={}\nlen={}\n",
            self.owner, self.name, self.region.0, self.len
        );
        if let Some(l) = self.layout {
            s += &format!(
                "layers={}\nblocks={}\nblock_bytes={}\ntokens={}\ndtype={}\n",
                l.layers,
                l.blocks_per_layer,
                l.block_bytes,
                l.tokens_per_block,
                l.dtype.code()
            );
        }
        s
    }

    /// Reads a record stored under `key`.
    pub fn decode(key: &str, text: &str) -> Result<Self, DiscoveryError> {
        let f = Fields::parse(key, text);
        let layout = if f.get(key, "layers").is_ok() {
            let dtype = Dtype::from_code(f.num(key, "dtype")? as u8).ok_or_else(|| {
                DiscoveryError::Malformed {
                    key: key.into(),
                    reason: "unknown dtype".into(),
                }
            })?;
            Some(
                KvLayout::new(
                    f.num(key, "layers")? as u32,
                    f.num(key, "blocks")? as u32,
                    f.num(key, "block_bytes")?,
                    f.num(key, "tokens")? as u32,
                    dtype,
                )
                .map_err(|e| DiscoveryError::Malformed {
                    key: key.into(),
                    reason: e.to_string(),
                })?,
            )
        } else {
            None
        };
        Ok(Self {
            owner: f.num(key, "owner")? as u32,
            name: f.get(key, "name")?.to_string(),
            region: RegionId(f.num(key, "region")? as u32),
            len: f.num(key, "len")?,
            layout,
        })
    }
}

struct Fields<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Fields<'a> {
    fn parse(_key: &str, text: &'a str) -> Self {
        Self(text.lines().filter_map(|l| l.split_once('=')).collect())
    }

    fn get(&self, key: &str, name: &str) -> Result<&'a str, DiscoveryError> {
        self.0
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| DiscoveryError::Malformed {
                key: key.into(),
                reason: format!("missing field {name}"),
            })
    }

    fn num(&self, key: &str, name: &str) -> Result<u64, DiscoveryError> {
        self.get(key, name)?
            .parse()
            .map_err(|_| DiscoveryError::Malformed {
                key: key.into(),
                reason: format!("field {name} is not a number"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let p = PeerRecord {
            engine_id: 3,
            addr: "127.0.0.1:9".into(),
            namespace: "model 'm'".into(),
        };
        assert_eq!(PeerRecord::decode("k", &p.encode()).unwrap(), p);
        let s = SegmentRecord {
            owner: 3,
            name: "kv".into(),
            region: RegionId(2),
            len: 8192,
            layout: Some(KvLayout::new(2, 1, 4096, 16, Dtype::F16).unwrap()),
        };
        assert_eq!(SegmentRecord::decode("k", &s.encode()).unwrap(), s);
        assert!(
            !s.encode().contains("key="),
            "a record carries no access key"
        );
        assert!(PeerRecord::decode("k", "engine_id=x").is_err());
    }
}
