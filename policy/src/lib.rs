//! KV-cache placement policy: block keys and namespaces, heat scoring, a tier manager and a
//! conversation-continuation policy, and the Mooncake request traces they are tuned on. The baselines they
//! are measured against (LRU, S3-FIFO, LIRS, ARC, W-TinyLFU, Belady's optimum) and trace replay live in the
//! `cache-research` crate.
//!
//! Everything is deterministic: hashes use a fixed seed ([`namespace::HASH_SEED`]), time is passed in,
//! and no result depends on hash-map iteration order.
#![forbid(unsafe_code)]

pub mod continuation;
pub mod error;
pub mod heat;
pub mod key;
pub mod namespace;
pub mod recency;
pub mod tier;
pub mod trace;

pub use error::PolicyError;
pub use heat::{DecayClock, Heat, HeatConfig};
pub use key::{ExtraKey, block_key, chain_keys, external_key};
pub use namespace::{Namespace, NamespaceId};
pub use tier::{NearestOrder, TierCapacities, TierConfig, TierManager, TierMetadata};
pub use trace::{Request, Trace};
