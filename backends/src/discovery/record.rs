//! What the registry stores, and its text encoding (`key=value` lines, stable and readable in etcdctl).

use transfer_engine::{AccessKey, Dtype, KvLayout, RegionHandle, RegionId};

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

/// A region a peer offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRecord {
    /// Owning engine.
    pub owner: u32,
    /// Name of the segment.
    pub name: String,
    /// The region: id, access key, length and layout on its owner.
    pub handle: RegionHandle,
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
        let h = &self.handle;
        let mut s = format!(
            "owner={}\nname={}\nregion={}\nkey={}\nlen={}\n",
            self.owner, self.name, h.id.0, h.key.0, h.len
        );
        if let Some(l) = h.layout {
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
            handle: RegionHandle {
                id: RegionId(f.num(key, "region")? as u32),
                key: AccessKey(f.num(key, "key")?),
                len: f.num(key, "len")?,
                layout,
            },
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
            handle: RegionHandle {
                id: RegionId(2),
                key: AccessKey(u64::MAX),
                len: 8192,
                layout: Some(KvLayout::new(2, 1, 4096, 16, Dtype::F16).unwrap()),
            },
        };
        assert_eq!(SegmentRecord::decode("k", &s.encode()).unwrap(), s);
        assert!(PeerRecord::decode("k", "engine_id=x").is_err());
    }
}
