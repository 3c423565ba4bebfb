//! The cluster KV pool: one index, on Redis or Valkey, of what every instance's tiers hold, and routing
//! by cache and load.
//!
//! Each instance publishes its tiers' contents ([`IndexEvent`]s, in batches, by a background
//! [`Publisher`]) under a lease it renews; any instance or router asks the index who holds a prompt's
//! leading blocks ([`IndexClient::lookup`], one round trip whatever the number of instances) and loads
//! from the best holder. The index is advisory: a stale entry costs one failed load and a recompute,
//! never wrong KV (the loader checks every block it receives), and without Redis an instance serves from
//! its own store. How it lies in Redis, and so how it shards over a Redis Cluster: [`schema`].
//!
//! [`route`] picks the instance a request should go to.

mod client;
mod config;
mod error;
mod holders;
pub mod local_redis;
mod publisher;
pub mod route;
pub mod schema;
mod stats;

pub use client::{IndexClient, IndexEvent};
pub use config::IndexConfig;
pub use error::IndexError;
pub use holders::{Holder, Holders, Segment};
pub use publisher::{Holdings, Publisher};
pub use schema::IndexTier;
pub use stats::{IndexCounts, IndexStats};
