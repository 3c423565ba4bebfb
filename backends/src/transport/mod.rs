//! The one interface every backend implements: [`Transport`].
//!
//! A transport is one engine with its I/O: it registers regions over the caller's memory, publishes them to
//! peers as named [`Segment`]s, connects to peers by [`PeerAddress`], sends sessions (submit, layers
//! written, cancel, wait with a time limit) and receives them (take notice of the next incoming, wait for one
//! to be announced, wait layer by layer while consuming layers, wait whole), and reports events, counters and
//! shutdown. Loopback, TCP, RDMA and shm implement it with the same semantics, checked by one conformance
//! suite (`backends/tests/conformance.rs`); a backend that cannot do something answers
//! [`TransportError::Unsupported`], never a silent no-op.
//!
//! The trait is object safe: waits return boxed futures, so a caller may hold an `Arc<dyn Transport>` and
//! pick the backend at run time (the connector does). Waits are plain futures on tokio's sync primitives;
//! the time-limited [`Transport::wait`] needs a tokio timer, the others may be bounded by the caller.
//!
//! ```
//! use std::sync::Arc;
//! use backends::{Transport, loopback::LoopbackPair};
//! use transfer_engine::{Dtype, KvLayout, MemoryRegion, TransferRequest};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (prefill, decode) = LoopbackPair::with_defaults().into_nodes();
//! let (prefill, decode): (Arc<dyn Transport>, Arc<dyn Transport>) =
//!     (Arc::new(prefill), Arc::new(decode));
//! let layout = KvLayout::new(2, 8, 4096, 16, Dtype::Bf16)?;
//! let src = prefill.register_kv_region(layout, MemoryRegion::from_vec(vec![1; 65536]))?;
//! let dst = decode.register_kv_region(layout, MemoryRegion::zeroed(65536))?;
//! decode.publish_segment("kv", dst)?;
//! let peer = prefill.connect(&decode.address().unwrap()).await?; // the same call on every backend
//! let req = TransferRequest::whole(peer.peer, &src, peer.segment("kv").unwrap())?;
//! let out = prefill.transfer(req, std::time::Duration::from_secs(10)).await?;
//! assert!(out.recompute.is_empty());
//! # Ok(())
//! # }
//! ```
//!
//! # Dead peers
//! Every backend applies one rule: a peer that answers nothing for the backend's `unreachable_after` while
//! sessions to it are live is unreachable. Its sessions end at once, every block not yet acknowledged
//! reported for recompute with a reason; new sessions to it are refused with
//! [`TransportError::Unreachable`] until it answers again, which [`Transport::connect`] asks it to do.

mod address;
mod close;
mod error;

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::broadcast;
use transfer_engine::{
    Counters, Event, KvLayout, MemoryRegion, PeerId, RegionHandle, RegionId, SessionId,
    ShapingConfig, TransferRequest,
};

pub use address::{BadAddress, PeerAddress};
pub use close::CloseReason;
pub use error::{Fault, TransportError};

use crate::board::{IncomingSession, Outcome, Received};

/// A boxed, sendable future: what the trait's waits return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A registered region a node offers to its peers under a name: what a sender needs to address it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Name under which it is offered.
    pub name: String,
    /// The region as registered on its owner (id, access key, length, layout).
    pub handle: RegionHandle,
}

/// A peer this node reached or that reached it, and the segments it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer (its engine id).
    pub peer: PeerId,
    /// Segments it offers.
    pub segments: Vec<Segment>,
}

impl PeerInfo {
    /// The offered segment called `name`.
    #[must_use]
    pub fn segment(&self, name: &str) -> Option<&RegionHandle> {
        self.segments
            .iter()
            .find(|s| s.name == name)
            .map(|s| &s.handle)
    }
}

/// One engine and its I/O, whatever moves the bytes. See the [module docs](self).
pub trait Transport: Send + Sync + Debug {
    /// The backend's name (`loopback`, `tcp`, `rdma`, `shm`, ...), for messages and metrics.
    fn backend(&self) -> &'static str;

    /// This node's engine id; peers know it as `PeerId(engine_id)`.
    fn engine_id(&self) -> u32;

    /// Where peers reach this node (what they pass to [`Transport::connect`]); `None` for a node that only
    /// dials.
    fn address(&self) -> Option<PeerAddress>;

    // ---- memory ----

    /// Registers the caller's `memory` as a KV region of `layout`: transfers send from it and place into it
    /// under its shard locks, no copy in or out at the API (see [`MemoryRegion`] for who may touch which
    /// bytes while transfers run, and how each backend keeps that). Memory this
    /// backend cannot move (GPU memory without GPU support, say) is refused with a clear error.
    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError>;

    /// Unregisters a region no live session uses and hands back its memory.
    fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TransportError>;

    /// The memory behind a registered region.
    fn memory(&self, id: RegionId) -> Result<MemoryRegion, TransportError>;

    /// Offers a registered region to peers under `name` (replacing one of that name): peers that connect
    /// from now on find it in their [`PeerInfo`].
    fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), TransportError>;

    // ---- peers ----

    /// Reaches the node at `address`: learns its identity and the segments it offers. Calling it again
    /// refreshes them, and asks a peer found unreachable to answer again.
    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>>;

    /// Sets the engine's traffic shaping (the KV bandwidth cap, per-class rates) for every frame from now on.
    fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), TransportError>;

    // ---- sending ----

    /// Starts a transfer; see [`Transport::wait`]. Refused at once when the request is malformed, the peer
    /// was never reached, or it is unreachable.
    fn submit(&self, req: TransferRequest) -> Result<SessionId, TransportError>;

    /// The producer of sending session `session` has written every layer below `until`: those layers may
    /// go out (for requests made with `TransferRequest::with_layers_written`).
    fn layers_written(&self, session: SessionId, until: u32) -> Result<(), TransportError>;

    /// Stops sending session `session`: every block not yet acknowledged is reported for recompute, here
    /// and at the receiver.
    fn cancel(&self, session: SessionId) -> Result<(), TransportError>;

    /// Waits, at most `limit`, until sending session `session` is over: delivered and acknowledged, or its
    /// undelivered blocks reported for recompute.
    fn wait(
        &self,
        session: SessionId,
        limit: Duration,
    ) -> BoxFuture<'_, Result<Outcome, TransportError>>;

    /// Submits and waits.
    fn transfer(
        &self,
        req: TransferRequest,
        limit: Duration,
    ) -> BoxFuture<'_, Result<Outcome, TransportError>> {
        let submitted = self.submit(req);
        Box::pin(async move { self.wait(submitted?, limit).await })
    }

    // ---- receiving ----

    /// The notice of the next incoming session nobody has taken yet (the session already runs: the engine
    /// admitted it when its open arrived), waiting for one: who sends it and where it lands.
    fn next_incoming(&self) -> BoxFuture<'_, Result<IncomingSession, TransportError>>;

    /// Waits until receiving session `session` is known here (its sender's first frame arrived, or it
    /// finished recently): a consumer told of a session by another channel may wait for it before
    /// consuming its layers. Bound it with a timeout: a session that never comes is waited for forever.
    fn wait_announced(&self, session: SessionId) -> BoxFuture<'_, Result<(), TransportError>>;

    /// The consumer is about to compute `layer` of receiving session `session` (layers in order): the
    /// sender may keep up to its prefetch depth of layers beyond it in flight, and a layer not yet whole
    /// becomes urgent. Returns whether the layer is complete.
    fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, TransportError>;

    /// Stops receiving session `session` (the consumer gave up on it): none of its bytes is placed from
    /// now on, so memory handed back for recompute is never written by it again; its blocks not yet
    /// verified are reported for recompute.
    fn abandon_receive(&self, session: SessionId) -> Result<(), TransportError>;

    /// Waits until `layer` of receiving session `session` has arrived whole and verified; if the session
    /// ends without it, the error ([`crate::WaitError::LayerLost`]) names the blocks to recompute.
    fn wait_layer(
        &self,
        session: SessionId,
        layer: u32,
    ) -> BoxFuture<'_, Result<(), TransportError>>;

    /// Waits until receiving session `session` is over.
    fn wait_received(&self, session: SessionId) -> BoxFuture<'_, Result<Received, TransportError>>;

    // ---- observing ----

    /// Every engine event from now on (a subscriber more than [`crate::board::KEEP_EVENTS`] behind is told
    /// how many it missed).
    fn subscribe(&self) -> broadcast::Receiver<Event>;

    /// The engine's counters.
    fn counters(&self) -> Counters;

    /// Live sessions (both roles).
    fn live_sessions(&self) -> usize;

    /// Stops the node: its threads or tasks end, waiters are woken with [`crate::WaitError::Closed`], and
    /// peers see it go as a lost peer. Idempotent; dropping the node does it too.
    fn shutdown(&self);
}
