//! KV-cache placement policy: block keys and namespaces, heat scoring, a tier manager, LRU and Belady
//! baselines, and replay of Mooncake request traces.
//!
//! Everything is deterministic: hashes use a fixed seed ([`namespace::HASH_SEED`]), time is passed in,
//! and no result depends on hash-map iteration order.
#![forbid(unsafe_code)]

pub mod belady;
pub mod error;
pub mod heat;
pub mod key;
pub mod lru;
pub mod namespace;
pub mod replay;
pub mod tier;
pub mod trace;

pub use error::PolicyError;
pub use heat::{DecayClock, Heat, HeatConfig};
pub use key::{ExtraKey, block_key, chain_keys, external_key};
pub use namespace::{Namespace, NamespaceId};
pub use replay::{PolicyKind, ReplayReport, replay};
pub use tier::{TierCapacities, TierConfig, TierManager};
pub use trace::{Request, Trace};
