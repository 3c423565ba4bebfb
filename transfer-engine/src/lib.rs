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
//! Regions are registered over a [`MemoryRegion`]: bytes the caller hands over (a `Vec`), memory it keeps
//! owning (host memory by pointer and length), or pinned and GPU memory from the backends. A data
//! [`Transmit`] names the region range its bytes live in, and on receive [`Engine::placement`] says where the
//! driver should put them: drivers read from and place into the caller's memory, with no copy at the API
//! boundary.
//!
//! ```
//! use std::time::Instant;
//! use transfer_engine::{Body, Dtype, Engine, EngineConfig, Event, KvLayout, MemoryRegion, PeerId, Role,
//!                       TransferMode, TransferRequest};
//!
//! // Two engines (a prefill producer and a decode consumer), each over memory it was handed.
//! let (mut prefill, mut decode) = (Engine::new(EngineConfig::with_engine_id(1)),
//!                                  Engine::new(EngineConfig::with_engine_id(2)));
//! let layout = KvLayout::new(4, 16, 64 << 10, 16, Dtype::Bf16)?; // 4 layers x 16 blocks x 64 KiB
//! let kv = vec![7u8; layout.total_bytes() as usize]; // the producer's KV pool
//! let src = prefill.register_kv_region(layout, MemoryRegion::from_vec(kv))?;
//! let pool = MemoryRegion::zeroed(layout.total_bytes() as usize); // the consumer's
//! let dst = decode.register_kv_region(layout, pool.clone())?; // id and key reach the producer out of band
//!
//! let now = Instant::now();
//! let req = TransferRequest::whole(PeerId(2), &src, &dst)?.with_mode(TransferMode::packetized());
//! let session = prefill.submit(now, req)?;
//!
//! // The driver's loop: carry transmits both ways as encoded bytes until the sender completes.
//! let mut done = false;
//! while !done {
//!     while let Some(mut t) = prefill.poll_transmit(now) {
//!         let bytes = prefill.encode_transmit(&mut t)?; // header sealed with the payload's CRC, payload
//!         decode.handle_datagram(now, PeerId(1), &bytes)?;
//!     }
//!     while let Some(t) = decode.poll_transmit(now) {
//!         let payload = if let Body::Control(p) = &t.body { p.clone() } else { Vec::new() };
//!         prefill.handle_frame(now, PeerId(2), &t.header, &payload)?;
//!     }
//!     while let Some(event) = prefill.poll_event() {
//!         if let Event::Completed { session: s, role: Role::Sender, stats } = event {
//!             assert_eq!((s, stats.recompute_blocks), (session, 0));
//!             done = true;
//!         }
//!     }
//! }
//! assert!(pool.read(0..pool.len())?.iter().all(|&b| b == 7)); // arrived in the caller's memory
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod backoff;
mod bucket;
mod budget;
mod checksum;
mod config;
mod engine;
mod error;
mod event;
mod layout;
mod memory;
mod namespace;
mod plan;
pub mod policy;
mod receiver;
mod region;
mod rtt;
mod scheduler;
mod sender;
mod stats;
mod transmit;
pub mod wire;

pub use backoff::Backoff;
pub use bucket::{DEFAULT_CELL_BYTES, TokenBucket};
pub use budget::RetransmitBudget;
pub use checksum::{copy_and_crc32c, crc32c, crc32c_combine};
pub use config::{EngineConfig, Placement};
pub use engine::{Engine, MAX_REPLIES_PER_PEER};
pub use error::{Error, Fault};
pub use event::{Event, Role};
pub use layout::{
    BlockId, BlockPlacement, ChunkSplit, Dtype, KvHeads, KvKind, KvLayout, TensorView,
};
pub use memory::{Bytes, BytesMut, MemoryKind, MemoryRegion, RawMemory, SHARD_BYTES};
pub use namespace::{HASH_SEED, Namespace, NamespaceId};
pub use plan::{
    AUTO_MAX_UNIT_BYTES, DEFAULT_EXCLUSIVE_MIN_BYTES, DEFAULT_SLICE_BYTES, MAX_COALESCED_SLICES,
    MIN_SLICE_BYTES, TransferMode,
};
pub use policy::{TrafficClass, TransferShape};
pub use region::{AccessKey, RegionHandle, RegionId};
pub use scheduler::ShapingConfig;
pub use stats::Counters;
pub use transmit::{Body, Channel, PayloadRef, PeerId, SessionId, TransferRequest, Transmit};
pub use wire::{FrameKind, HEADER_LEN, Header, WireError};

#[cfg(test)]
mod tests_support {
    use std::time::Instant;

    /// A real instant to start virtual time from (tests only: the core never reads the clock).
    #[expect(
        clippy::disallowed_methods,
        reason = "virtual time needs one real epoch to start from"
    )]
    pub(crate) fn epoch() -> Instant {
        Instant::now()
    }
}
