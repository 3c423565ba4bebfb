//! I/O drivers for the KV-cache transfer engine. Each drives the sans-IO [`transfer_engine::Engine`]
//! state machines and moves the bytes they point at.
//!
//! - [`loopback`]: two engines in one process; payload is copied once, straight from the producer's region
//!   into the consumer's.
//! - [`tcp`]: a tokio TCP node per engine: pooled lanes per peer, vectored writes, handshake with version,
//!   identity, KV namespace and optional shared-secret authentication, bounds-checked remote access.
//! - [`discovery`]: where peers and segments live, behind one trait: an embedded in-process registry, and
//!   etcd (feature `etcd`) with leases so a dead peer's entries expire.
#![forbid(unsafe_code)]

pub mod board;
pub mod discovery;
pub mod loopback;
mod station;
pub mod tcp;

pub use board::{IncomingSession, Outcome, Received, WaitError};
