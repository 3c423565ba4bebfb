//! KV-cache placement policy: block keys and namespaces, heat scoring, a tier manager, a
//! conversation-continuation policy, the classic baselines (LRU, S3-FIFO, LIRS, ARC, W-TinyLFU) and
//! Belady's optimum, and replay of Mooncake request traces (one tier, or host memory with a disk below).
//!
//! Everything is deterministic: hashes use a fixed seed ([`namespace::HASH_SEED`]), time is passed in,
//! and no result depends on hash-map iteration order.
#![forbid(unsafe_code)]

pub mod arc;
pub mod belady;
pub mod cache;
pub mod continuation;
pub mod error;
pub mod heat;
pub mod key;
pub mod lirs;
pub mod lru;
pub mod namespace;
pub mod recency;
pub mod replay;
pub mod s3fifo;
pub mod tier;
pub mod tiered;
pub mod tinylfu;
pub mod trace;

pub use cache::BlockCache;
pub use error::PolicyError;
pub use heat::{DecayClock, Heat, HeatConfig};
pub use key::{ExtraKey, block_key, chain_keys, external_key};
pub use namespace::{Namespace, NamespaceId};
pub use replay::{PolicyKind, ReplayReport, replay};
pub use tier::{NearestOrder, TierCapacities, TierConfig, TierManager, TierMetadata};
pub use tiered::{TieredReport, replay_host_disk};
pub use trace::{Request, Trace};
