//! Namespaces: everything that must match for two KV blocks to be interchangeable. The type lives in the
//! core (the lane handshake checks it too); this crate's keys are hashed inside it.

pub use transfer_engine::{HASH_SEED, Namespace, NamespaceId};
