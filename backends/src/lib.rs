//! I/O drivers for the KV-cache transfer engine. Each drives the sans-IO [`transfer_engine::Engine`]
//! state machines and moves the bytes they point at.
//!
//! - [`loopback`]: two engines in one process; payload is copied once, straight from the producer's region
//!   into the consumer's.

pub mod loopback;
