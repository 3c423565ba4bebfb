//! Block keys: a chained hash over token blocks inside a namespace.
//!
//! `key(block i) = xxh3(namespace, key(block i-1), tokens of block i, extra keys)` with the fixed
//! [`HASH_SEED`], so a key identifies the whole prefix up to and including its block, and two processes
//! on two machines derive the same keys. Keys from a serving engine's own hashing are accepted as they are
//! ([`external_key`]).

use transfer_engine::policy::BlockKey;
use xxhash_rust::xxh3::Xxh3;

use crate::namespace::{HASH_SEED, Namespace, NamespaceId};

/// Extra inputs that make otherwise equal tokens produce different KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtraKey<'a> {
    /// A LoRA adapter id.
    Lora(u64),
    /// A cache salt (per tenant isolation).
    Salt(&'a [u8]),
    /// Anything else the serving engine folds in (multimodal input hashes, ...).
    Opaque(&'a [u8]),
}

/// The key of one block of `tokens` whose prefix ends in `parent` (`None` for the first block).
#[must_use]
pub fn block_key(
    ns: NamespaceId,
    parent: Option<BlockKey>,
    tokens: &[u32],
    extra: &[ExtraKey<'_>],
) -> BlockKey {
    let mut h = Xxh3::with_seed(HASH_SEED);
    h.update(b"blk1");
    h.update(&ns.0.to_le_bytes());
    match parent {
        None => h.update(&[0]),
        Some(p) => {
            h.update(&[1]);
            h.update(&p.0.to_le_bytes());
        }
    }
    h.update(&(tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h.update(&(extra.len() as u64).to_le_bytes());
    for e in extra {
        let (tag, bytes): (u8, &[u8]) = match e {
            ExtraKey::Lora(id) => {
                h.update(&[1]);
                h.update(&id.to_le_bytes());
                continue;
            }
            ExtraKey::Salt(b) => (2, b),
            ExtraKey::Opaque(b) => (3, b),
        };
        h.update(&[tag]);
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    BlockKey(h.digest())
}

/// Keys of every full block of `tokens` (a trailing partial block has no key: it cannot be shared).
#[must_use]
pub fn chain_keys(ns: &Namespace, tokens: &[u32], extra: &[ExtraKey<'_>]) -> Vec<BlockKey> {
    let id = ns.id();
    let size = ns.block_size.max(1) as usize;
    let mut parent = None;
    tokens
        .chunks_exact(size)
        .map(|block| {
            let key = block_key(id, parent, block, extra);
            parent = Some(key);
            key
        })
        .collect()
}

/// A serving engine's own block hash, used as it is.
#[must_use]
pub fn external_key(hash: u64) -> BlockKey {
    BlockKey(hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::Dtype;

    fn ns(version: u64) -> Namespace {
        Namespace {
            model: "m".into(),
            weight_version: version,
            block_size: 4,
            dtype: Dtype::Bf16,
        }
    }

    #[test]
    fn keys_chain_over_the_prefix() {
        let a = chain_keys(&ns(1), &[1, 2, 3, 4, 5, 6, 7, 8, 9], &[]);
        assert_eq!(a.len(), 2, "the partial third block has no key");
        let b = chain_keys(&ns(1), &[1, 2, 3, 4, 5, 6, 7, 8], &[]);
        assert_eq!(a, b);
        // Same second block, different first block: different second key.
        let c = chain_keys(&ns(1), &[0, 2, 3, 4, 5, 6, 7, 8], &[]);
        assert_ne!(a[0], c[0]);
        assert_ne!(a[1], c[1]);
        assert_eq!(a[1], block_key(ns(1).id(), Some(a[0]), &[5, 6, 7, 8], &[]));
    }

    #[test]
    fn weight_update_makes_old_keys_unreachable() {
        let tokens: Vec<u32> = (0..64).collect();
        let old = chain_keys(&ns(1), &tokens, &[]);
        let new = chain_keys(&ns(2), &tokens, &[]);
        assert!(old.iter().all(|k| !new.contains(k)));
    }

    #[test]
    fn extra_keys_separate_tenants_and_adapters() {
        let t = [1, 2, 3, 4];
        let plain = block_key(NamespaceId(7), None, &t, &[]);
        let lora = block_key(NamespaceId(7), None, &t, &[ExtraKey::Lora(3)]);
        let lora2 = block_key(NamespaceId(7), None, &t, &[ExtraKey::Lora(4)]);
        let salt = block_key(NamespaceId(7), None, &t, &[ExtraKey::Salt(b"a")]);
        let opaque = block_key(NamespaceId(7), None, &t, &[ExtraKey::Opaque(b"a")]);
        let keys = [plain, lora, lora2, salt, opaque];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn keys_are_deterministic_across_runs() {
        // Golden values: these must never change between runs, processes or machines.
        let keys = chain_keys(&ns(1), &(0..8).collect::<Vec<_>>(), &[]);
        assert_eq!(keys.iter().map(|k| k.0).collect::<Vec<_>>(), GOLDEN_KEYS);
        assert_eq!(
            block_key(NamespaceId::DEFAULT, None, &[], &[]).0,
            GOLDEN_EMPTY
        );
    }

    #[test]
    fn external_keys_pass_through() {
        assert_eq!(external_key(42), BlockKey(42));
    }

    const GOLDEN_KEYS: [u64; 2] = [8_031_210_241_479_239_449, 11_206_341_745_200_406_046];
    const GOLDEN_EMPTY: u64 = 18_214_392_230_044_102_050;
}
