//! The sans-IO core of the KV-cache transfer engine.
//!
//! Nothing here touches a socket, a thread, an async runtime or the clock: drivers (the loopback and TCP
//! backends, the simulated fabric) feed the [`Engine`] with time, frames and timeouts, and carry out the
//! [`Transmit`]s it asks for. The same code therefore runs under tokio, under a unit test that steps time by
//! hand, and under a deterministic simulation.
//!
//! An engine's methods come in four kinds, in the style of `quinn-proto`:
//! - getters: [`Engine::stats`], [`Engine::session_stats`], [`Engine::region`];
//! - inputs: [`Engine::handle_frame`], [`Engine::handle_data`], [`Engine::handle_timeout`];
//! - commands: [`Engine::register_region`], [`Engine::submit`], [`Engine::cancel`];
//! - outputs: [`Engine::poll_transmit`], [`Engine::poll_timeout`], [`Engine::poll_event`].
//!
//! The core never copies payload: a data [`Transmit`] names the region range its bytes live in, and on
//! receive [`Engine::placement`] says where the driver should put them. [`HostMemory`] is a plain host-memory
//! store that in-process drivers use for the bytes themselves.

mod backoff;
mod budget;
mod checksum;
mod control;
mod engine;
mod error;
mod event;
mod layout;
mod memory;
mod plan;
pub mod policy;
mod receiver;
mod region;
mod rtt;
mod sender;
mod stats;
mod transmit;
pub mod wire;

pub use backoff::Backoff;
pub use budget::RetransmitBudget;
pub use checksum::{copy_and_crc32c, crc32c};
pub use engine::{Engine, EngineConfig, Placement};
pub use error::Error;
pub use event::{Event, Role};
pub use layout::{BlockId, Dtype, KvLayout};
pub use memory::HostMemory;
pub use plan::{
    AUTO_MAX_UNIT_BYTES, DEFAULT_EXCLUSIVE_MIN_BYTES, DEFAULT_SLICE_BYTES, MIN_SLICE_BYTES,
    TransferMode,
};
pub use policy::{TrafficClass, TransferShape};
pub use region::{AccessKey, RegionHandle, RegionId};
pub use stats::Counters;
pub use transmit::{Body, Lane, PayloadRef, PeerId, SessionId, TransferRequest, Transmit};
pub use wire::{FrameKind, HEADER_LEN, Header, WireError};
