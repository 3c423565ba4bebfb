//! The RDMA backend over libfabric (OFI), behind feature `rdma`: one backend for InfiniBand and RoCE (the
//! `verbs` provider), AWS EFA (`efa`), and, without a NIC, the `tcp` (through `ofi_rxm`) and `shm` providers.
//!
//! # Data path
//! A node opens one reliable-datagram endpoint (`FI_EP_RDM`) with messages and RMA writes, and registers
//! each region's memory once (`fi_mr_reg`), when the region is registered with the engine. Peers learn
//! each other's endpoint address, published regions, their remote addresses and keys in a hello/welcome
//! exchange over messages ([`RdmaNode::connect`]).
//!
//! A data unit the engine asks for is sent as two operations:
//! - its payload by `fi_writedata`, straight from the sender's registered memory into the receiver's
//!   registered region at the offset the plan gives (the virtual address under `FI_MR_VIRT_ADDR`, the
//!   offset into the registration otherwise), with 32 bits of remote CQ data, the unit's *token*; a unit
//!   larger than the provider's largest write goes as several writes with the same token;
//! - its 48-byte frame header (session, sequence, layer, block, offset, length, CRC-32C of the payload),
//!   by `fi_send` in a small message that names the token, the write count and where the bytes land.
//!
//! The receiver matches the two by token, in whichever order they complete (no provider ordering is
//! assumed): when the header and every write's remote completion are in, it checks that the engine's
//! placement for the header is where the bytes landed, verifies the CRC-32C over the bytes in place and
//! calls [`transfer_engine::Engine::handle_data`]. Acks, nacks, retransmits and recompute run unchanged in
//! the engine; control frames go as messages into pre-posted receive slots. A token is the tag the
//! receiver gave the sending peer in the handshake (top 12 bits) and a counter (low 20 bits), so a write
//! names its sender.
//!
//! The provider enforces the rest: a write with a wrong key, or beyond the registered region, is refused
//! by it and completes with an error at the sender (logged as a refusal; the engine resends and, if the
//! unit never arrives, hands its blocks back for recompute). A peer holding a region's key can write
//! anywhere inside that region, as with any RDMA: the engine verifies every unit's CRC before calling it
//! delivered, and a unit whose bytes land elsewhere than the receiver's plan says is refused.
//!
//! # Host memory: mirrored unless granted in place
//! NICs write and read registered memory outside a region's shard locks, and a resent unit (its ack was
//! late) is written again over bytes that may already have verified. So by default host regions are
//! registered as host mirrors ([`HostMemoryAccess::Mirrored`]): a unit is copied into the mirror under the
//! source's read locks before it is posted, and from the mirror into its destination under write locks
//! (the CRC taken in the same pass) only when the engine's plan still wants it, so a resend over verified
//! bytes is dropped, never placed, as on TCP. No safe view of the caller's memory can race with a NIC.
//! Registering host regions in place, zero-copy, takes the caller's promise ([`InPlace::granted`], an
//! `unsafe fn`); docs/PERFORMANCE.md gives the figures of both.
//! Control frames larger than a message slot (64 KiB by default: an open with very long block lists, an
//! ack with very many ranges) cannot be sent; they are logged as refusals.
//!
//! # Waiting
//! One driver thread per node owns the endpoint. While work is outstanding it polls the completion queue,
//! spinning briefly and then napping with a doubling backoff (the `tcp` and `shm` providers progress only
//! inside calls on the queue); when idle it naps a millisecond between polls, so an idle node costs no
//! core (`fi_cq_sread` spun inside libfabric on shm). See `wait.rs` for what was measured.

mod beat;
mod driver;
mod ffi;
mod in_place;
mod message;
mod node;
pub mod probe;
mod provider;
mod shared;
mod stuck;
mod units;
mod wait;

use std::time::Duration;

use crate::{Liveness, TransportError};
use transfer_engine::EngineConfig;

pub use ffi::{ProviderInfo, parked_endpoints};
pub use in_place::{HostMemoryAccess, InPlace};
pub use node::{RdmaDriver, RdmaNode};
pub use probe::{ProbeReport, WriteAnswer, probe_refusals, provider_limit_gbps};
pub use provider::{Provider, available_providers};
pub use shared::{NodeStats, PeerInfo};

/// Settings of one RDMA node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RdmaConfig {
    /// The engine's settings; `engine.engine_id` is the node's identity in messages.
    pub engine: EngineConfig,
    /// Which provider to use.
    pub provider: Provider,
    /// The provider's domain (device or interface) to use, e.g. `lo` for `tcp` on one host, `mlx5_0` for
    /// verbs; `None` takes the first the provider lists.
    pub domain: Option<String>,
    /// Most data units in flight (posted and not yet completed locally).
    pub window_units: usize,
    /// Most payload bytes in flight.
    pub window_bytes: u64,
    /// Bytes of one message slot (control frames larger than this cannot be sent).
    pub slot_bytes: usize,
    /// Message slots for sends.
    pub send_slots: usize,
    /// Receive slots kept posted.
    pub recv_slots: usize,
    /// Largest single RDMA write; larger units go as several (capped by the provider's limit).
    pub max_write_bytes: usize,
    /// Ask for delivery completion on writes (`FI_DELIVERY_COMPLETE`): a write completes at the sender
    /// only once its bytes are placed at the target, so a write the target's provider refuses (wrong key,
    /// out of range) comes back as an error at once. Without it a refused write is only noticed when the
    /// unit is never acknowledged.
    pub delivery_complete: bool,
    /// A unit whose writes have not completed after this long stops counting against the window (the
    /// provider dropped a refused write without a completion, or the peer vanished).
    pub write_timeout: Duration,
    /// When a peer is given up on: `handshake_timeout` bounds [`RdmaNode::connect`]'s hello/welcome
    /// exchange; a peer whose writes all fail (error completions, or writes that never complete) for
    /// `unreachable_after`, none succeeding, or that answers none of the frames asking it to (opens,
    /// units, closes) for `answer_timeout`, sending nothing at all, is declared unreachable: its sessions
    /// end at once with recompute and a reason. A live peer that stalls that long is declared unreachable
    /// too. New sessions to an unreachable peer are refused until it sends a message again, which
    /// [`RdmaNode::connect`] asks it to (the rule of every [`crate::transport::Transport`]).
    pub liveness: Liveness,
    /// A driver that has not come back from one step for this long is taken as stuck inside a provider
    /// call (on `shm`, a peer process that died holding a lock in shared memory leaves the call spinning
    /// for good): every live session ends at once with recompute, its peer given as unreachable, and the
    /// node refuses new sessions and registrations (5 s). [`RdmaNode::shutdown`] does not wait for such a
    /// driver. Calls towards an `shm` peer whose process is known to have exited are refused before they
    /// reach the provider, so this is only for one that dies during a call.
    pub stuck_after: Duration,
    /// Ask for a provider that registers GPU memory (`FI_HMEM`, CUDA), so GPU regions are registered in
    /// place and NICs write straight from and into them. Off by default: providers without it would not
    /// be found. Without it, GPU regions are staged through host mirrors (see [`RdmaNode::register_kv_region`]).
    /// GPU regions need feature `cuda` either way.
    pub gpu_memory: bool,
    /// How NICs reach host regions: through host mirrors by default (the safe API's contract holds),
    /// or in place, zero-copy, under the caller's `unsafe` promise ([`InPlace::granted`]).
    pub host_memory: HostMemoryAccess,
}

impl RdmaConfig {
    /// Default settings for engine `engine_id` on `provider`.
    #[must_use]
    pub fn new(engine_id: u32, provider: Provider) -> Self {
        Self {
            engine: rdma_engine_config(engine_id),
            provider,
            domain: None,
            window_units: 64,
            window_bytes: 64 << 20,
            slot_bytes: 64 << 10,
            send_slots: 256,
            recv_slots: 256,
            max_write_bytes: 16 << 20,
            delivery_complete: true,
            write_timeout: Duration::from_secs(5),
            liveness: Liveness::default(),
            stuck_after: Duration::from_secs(5),
            gpu_memory: false,
            host_memory: HostMemoryAccess::Mirrored,
        }
    }

    /// The same settings on `domain`.
    #[must_use]
    pub fn with_domain(mut self, domain: &str) -> Self {
        self.domain = Some(domain.to_owned());
        self
    }
}

/// Engine settings for RDMA: the transport is reliable, so (as for TCP) the retransmit floor starts at
/// 100 ms and each process draws a fresh seed for its session ids; and (as for TCP) slices sent for the
/// first time travel coalesced, up to [`crate::tcp::TCP_COALESCE_BYTES`] a frame, each frame being a
/// header message, a write post and two completions whatever its size. On libfabric's `shm` and `tcp`
/// providers here, 4 MiB blocks in 64 KiB slices moved 5.0-5.4 and 2.8-3.5 GB/s one slice a frame,
/// 6.1-7.3 and 4.4-5.8 coalesced (2 alternating pairs each).
#[must_use]
pub fn rdma_engine_config(engine_id: u32) -> EngineConfig {
    crate::tcp::tcp_engine_config(engine_id)
}

/// No libfabric provider fits; `found` names what was found.
pub(crate) fn no_provider(found: String) -> TransportError {
    TransportError::config("rdma", format!("no usable libfabric provider: {found}"))
}

/// A memory registration this endpoint does not hold: this node's own bookkeeping failed.
pub(crate) fn unknown_registration(id: u32) -> TransportError {
    own(format!("unknown memory registration {id}"))
}

/// This node's own I/O or bookkeeping failed (a completion error, no free slot, a thread).
pub(crate) fn own(message: impl Into<String>) -> TransportError {
    TransportError::Io {
        backend: "rdma",
        message: message.into(),
    }
}

/// Bits of a token that count; the rest is the writer's tag.
const TOKEN_COUNTER_BITS: u32 = 20;
/// Most tags (peers writing into one node).
const MAX_TAGS: u16 = 1 << (32 - TOKEN_COUNTER_BITS);

/// The CQ data of a write: `tag` in the top bits, `counter` below.
fn token(tag: u16, counter: u32) -> u32 {
    (u32::from(tag) << TOKEN_COUNTER_BITS) | (counter & ((1 << TOKEN_COUNTER_BITS) - 1))
}

/// The tag in a token.
fn token_tag(token: u32) -> u16 {
    u16::try_from(token >> TOKEN_COUNTER_BITS).unwrap_or(u16::MAX)
}
