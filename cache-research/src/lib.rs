//! Cache-policy research: how the [`policy`] crate's tier manager and continuation policy compare with the
//! classic baselines (LRU, S3-FIFO, LIRS, ARC, W-TinyLFU) and Belady's offline optimum, replayed on
//! Mooncake request traces (one tier, or host memory with a disk below). `te-bench replay` and the
//! figures in `FIGURES.md` are made with it; no serving engine depends on it.
//!
//! Everything is deterministic: hashes use the policy crate's fixed seed ([`policy::namespace::HASH_SEED`]),
//! time is the trace's, and no result depends on hash-map iteration order.
#![forbid(unsafe_code)]

pub mod arc;
pub mod belady;
pub mod cache;
pub mod lirs;
pub mod lru;
pub mod replay;
pub mod s3fifo;
pub mod tiered;
pub mod tinylfu;

pub use cache::BlockCache;
pub use replay::{PolicyKind, ReplayReport, replay};
pub use tiered::{TieredReport, replay_host_disk};
