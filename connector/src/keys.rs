//! Block keys compatible with vLLM v1's prefix caching under `--prefix-caching-hash-algo sha256_cbor`.
//!
//! A block's hash is `SHA-256(CBOR([parent, token_ids, extra_keys]))`: `parent` is the previous block's
//! 32-byte hash (the root hash for block 0), `token_ids` the block's tokens, `extra_keys` `null` or an array
//! of the block's extra keys (LoRA, multimodal items, cache salt). The root is `SHA-256(CBOR(seed))` with
//! the process's `PYTHONHASHSEED`, or `"vllm-none-hash"` when it is unset (vLLM ≥ 0.29). Only full blocks
//! are hashed. The tests check every case of vLLM's own vectors byte for byte
//! (`tests/data/vllm_block_hash_vectors.json`).
//!
//! Keys live inside a [`Namespace`] ([`ScopedKey`]): the same prompt under another weight version, model,
//! block size or dtype is another key, so KV computed by old weights is never served after an update.

use ciborium::Value;
use policy::{Namespace, NamespaceId};
use sha2::{Digest, Sha256};
use transfer_engine::policy::BlockKey;

/// The seed vLLM ≥ 0.29 hashes into the root when `PYTHONHASHSEED` is unset.
pub const NONE_HASH_SEED: &str = "vllm-none-hash";

/// One block's 32-byte hash: vLLM's `BlockHash`, or a serving engine's own key taken as it is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl std::fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockHash({})", self.to_hex())
    }
}

impl BlockHash {
    /// Lowercase hex of the 32 bytes.
    #[must_use]
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The hash as vLLM publishes it in KV events (`BlockStored`): the last 8 bytes as a big-endian u64.
    #[must_use]
    pub fn kv_event_u64(&self) -> u64 {
        let mut last = [0u8; 8];
        last.copy_from_slice(&self.0[24..]);
        u64::from_be_bytes(last)
    }

    /// A serving engine's own 64-bit block key (a KV-event hash, say), used as it is: zero-padded on the
    /// left so that [`BlockHash::kv_event_u64`] gives it back.
    #[must_use]
    pub fn external_u64(key: u64) -> BlockHash {
        let mut b = [0u8; 32];
        b[24..].copy_from_slice(&key.to_be_bytes());
        BlockHash(b)
    }
}

/// Which shape extra keys take: vLLM changed it in 0.31.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExtraKeyLayout {
    /// vLLM ≥ 0.31.0: `["lora", name, path]`, `["mm", identifier, offset]`, `["cache_salt", salt]`.
    #[default]
    Tagged,
    /// vLLM 0.28.0–0.30.0: the bare LoRA name, `[identifier, offset]`, the bare salt.
    Untagged,
}

/// A LoRA adapter a request runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lora {
    /// The adapter's name (`LoRARequest.lora_name`).
    pub name: String,
    /// Its path (`LoRARequest.lora_path`; only the tagged layout hashes it).
    pub path: String,
}

/// A multimodal item placed in the prompt: its placeholder tokens are `offset..offset + length`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmItem {
    /// The item's content hash, as vLLM's processor computes it (`mm_feature.identifier`).
    pub identifier: String,
    /// First placeholder token.
    pub offset: usize,
    /// Placeholder tokens.
    pub length: usize,
}

/// What besides the tokens goes into a request's block hashes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestExtras {
    /// The LoRA adapter, hashed into every block.
    pub lora: Option<Lora>,
    /// Multimodal items, hashed into each block they overlap.
    pub mm: Vec<MmItem>,
    /// Per-tenant cache salt, hashed into block 0 only (an empty salt is ignored).
    pub cache_salt: Option<String>,
    /// Extra-key shape.
    pub layout: ExtraKeyLayout,
    /// Lookahead tokens (vLLM ≥ 0.33 with an EAGLE or MTP drafter and no KV connector): a block is hashed
    /// only once this many tokens follow it, and they are hashed with it.
    pub lookahead_tokens: usize,
}

/// Computes vLLM's block hashes for one root and block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VllmHasher {
    root: BlockHash,
    block_size: usize,
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Canonical CBOR of `value` (ciborium writes shortest heads and definite lengths).
#[must_use]
pub fn cbor(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::into_writer(value, &mut out).expect("writing CBOR into a Vec cannot fail");
    out
}

/// vLLM's root hash: `SHA-256(CBOR(seed))` with `PYTHONHASHSEED` (`Some`), or with
/// [`NONE_HASH_SEED`] when it is unset (`None`, vLLM ≥ 0.29; older releases drew a random root).
#[must_use]
pub fn root_hash(python_hash_seed: Option<&str>) -> BlockHash {
    let seed = python_hash_seed.unwrap_or(NONE_HASH_SEED);
    BlockHash(sha256(&cbor(&Value::Text(seed.into()))))
}

/// The CBOR bytes vLLM hashes for one block.
#[must_use]
pub fn block_cbor(parent: &BlockHash, tokens: &[u32], extra: Option<Value>) -> Vec<u8> {
    let tokens = tokens.iter().map(|&t| Value::Integer(t.into())).collect();
    cbor(&Value::Array(vec![
        Value::Bytes(parent.0.to_vec()),
        Value::Array(tokens),
        extra.unwrap_or(Value::Null),
    ]))
}

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

impl VllmHasher {
    /// A hasher with this root and block size (tokens).
    #[must_use]
    pub fn new(root: BlockHash, block_size: usize) -> VllmHasher {
        VllmHasher {
            root,
            block_size: block_size.max(1),
        }
    }

    /// The root hash (block 0's parent).
    #[must_use]
    pub fn root(&self) -> BlockHash {
        self.root
    }

    /// Tokens per block.
    #[must_use]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The extra keys of tokens `start..end` (`None` when there are none), in vLLM's order.
    fn extra_keys(&self, extras: &RequestExtras, start: usize, end: usize) -> Option<Value> {
        let tagged = extras.layout == ExtraKeyLayout::Tagged;
        let mut keys = Vec::new();
        if let Some(lora) = &extras.lora {
            keys.push(if tagged {
                Value::Array(vec![text("lora"), text(&lora.name), text(&lora.path)])
            } else {
                text(&lora.name)
            });
        }
        for item in &extras.mm {
            if item.offset < end && item.offset + item.length > start {
                let offset = Value::Integer((item.offset as i64 - start as i64).into());
                let mut key = vec![text(&item.identifier), offset];
                if tagged {
                    key.insert(0, text("mm"));
                }
                keys.push(Value::Array(key));
            }
        }
        if start == 0
            && let Some(salt) = extras.cache_salt.as_deref().filter(|s| !s.is_empty())
        {
            keys.push(if tagged {
                Value::Array(vec![text("cache_salt"), text(salt)])
            } else {
                text(salt)
            });
        }
        (!keys.is_empty()).then_some(Value::Array(keys))
    }

    /// The third element of block `index`'s hashed array (extra keys, with lookahead tokens if any).
    fn block_extra(&self, tokens: &[u32], extras: &RequestExtras, index: usize) -> Option<Value> {
        let start = index * self.block_size;
        let end = start + self.block_size;
        let ahead = extras.lookahead_tokens;
        if ahead == 0 {
            return self.extra_keys(extras, start, end);
        }
        let mut items = vec![
            self.extra_keys(extras, start, end + ahead)
                .unwrap_or(Value::Null),
        ];
        items.extend(
            tokens[end..end + ahead]
                .iter()
                .map(|&t| Value::Integer(t.into())),
        );
        Some(Value::Array(items))
    }

    /// One block's hash.
    #[must_use]
    pub fn hash_block(
        &self,
        parent: &BlockHash,
        tokens: &[u32],
        extra: Option<Value>,
    ) -> BlockHash {
        BlockHash(sha256(&block_cbor(parent, tokens, extra)))
    }

    /// The CBOR bytes of block `index` of a request (for checking against other implementations).
    #[must_use]
    pub fn block_bytes(
        &self,
        parent: &BlockHash,
        tokens: &[u32],
        extras: &RequestExtras,
        index: usize,
    ) -> Vec<u8> {
        let start = index * self.block_size;
        block_cbor(
            parent,
            &tokens[start..start + self.block_size],
            self.block_extra(tokens, extras, index),
        )
    }

    /// Hashes of every full block of `tokens` (with the lookahead, every block followed by enough
    /// tokens), each chained on the one before.
    #[must_use]
    pub fn block_hashes(&self, tokens: &[u32], extras: &RequestExtras) -> Vec<BlockHash> {
        let blocks = tokens.len().saturating_sub(extras.lookahead_tokens) / self.block_size;
        let mut parent = self.root;
        (0..blocks)
            .map(|i| {
                let start = i * self.block_size;
                let block = &tokens[start..start + self.block_size];
                parent = self.hash_block(&parent, block, self.block_extra(tokens, extras, i));
                parent
            })
            .collect()
    }
}

/// A block key inside a namespace: what the store indexes and peers ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopedKey {
    /// The namespace (model, weight version, block size, dtype).
    pub ns: NamespaceId,
    /// The block hash within it.
    pub hash: BlockHash,
}

impl ScopedKey {
    /// `hash` inside namespace `ns`.
    #[must_use]
    pub fn new(ns: &Namespace, hash: BlockHash) -> ScopedKey {
        ScopedKey { ns: ns.id(), hash }
    }

    /// The 64-bit key the tier manager ranks the block by: the first 8 bytes of
    /// `SHA-256(namespace id, hash)`. The store checks the full key on every lookup, so a collision of
    /// these 64 bits can cost a hit, never serve a wrong block.
    #[must_use]
    pub fn tier_key(&self) -> BlockKey {
        let mut h = Sha256::new();
        h.update(self.ns.0.to_le_bytes());
        h.update(self.hash.0);
        let d: [u8; 32] = h.finalize().into();
        let mut first = [0u8; 8];
        first.copy_from_slice(&d[..8]);
        BlockKey(u64::from_le_bytes(first))
    }
}

/// Keys of `hashes` inside `ns`.
#[must_use]
pub fn scoped(ns: &Namespace, hashes: &[BlockHash]) -> Vec<ScopedKey> {
    let id = ns.id();
    hashes
        .iter()
        .map(|&hash| ScopedKey { ns: id, hash })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::Dtype;

    fn ns(version: u64) -> Namespace {
        Namespace {
            model: "m".into(),
            weight_version: version,
            block_size: 16,
            dtype: Dtype::Bf16,
        }
    }

    #[test]
    fn a_weight_update_changes_every_key() {
        let hasher = VllmHasher::new(root_hash(Some("0")), 16);
        let hashes = hasher.block_hashes(&(0..64).collect::<Vec<_>>(), &RequestExtras::default());
        let old = scoped(&ns(1), &hashes);
        let new = scoped(&ns(2), &hashes);
        for (a, b) in old.iter().zip(&new) {
            assert_ne!(a, b);
            assert_ne!(a.tier_key(), b.tier_key());
        }
    }

    #[test]
    fn external_keys_pass_through() {
        let h = BlockHash::external_u64(0xdead_beef);
        assert_eq!(h.kv_event_u64(), 0xdead_beef);
        assert_eq!(&h.0[..24], &[0u8; 24]);
    }
}
