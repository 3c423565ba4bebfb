//! A TCP node ([`TcpNode`], a [`Node`] of [`TcpDriver`]): one engine, its regions, its listener, its lanes,
//! and the driver task that polls the engine.
//!
//! The engine sits behind one mutex that is only ever held for short, non-blocking calls: the driver task
//! polls transmits, timers and events; lane readers ask for placements and hand in received frames. All
//! socket work happens outside it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::net::TcpListener;
use transfer_engine::{KvLayout, MemoryRegion, PeerId, RegionHandle, TransferRequest};

use super::TcpConfig;
use super::accept;
use super::context::{Context, lock};
use super::driver;
use super::lane;
use super::state::{NodeState, PeerInfo};
use crate::node::reach::Verdict;
use crate::node::{Driver, Node, NodeCore, driver::Sealed};
use crate::transport::{BoxFuture, PeerAddress, TransportError};

/// Lane and refusal counters of a node, beside the engine's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// The engine's counters.
    pub engine: transfer_engine::Counters,
    /// Lanes opened (both directions).
    pub lanes_opened: u64,
    /// Lanes closed.
    pub lanes_closed: u64,
    /// Inbound lanes shed at the lane bound for a newcomer from an address holding fewer (of those
    /// closed).
    pub lanes_shed: u64,
    /// Connections refused in the handshake.
    pub handshakes_refused: u64,
    /// Refused connections closed without a Reject, because `StrangerLimits::max_pending_refusals` were being
    /// answered already (a connect flood).
    pub refusals_unanswered: u64,
    /// Lanes closed because their peer sent a frame that failed to decode or addressed memory it may not.
    pub lanes_closed_for_bad_frames: u64,
    /// Frames dropped because no lane to their peer existed or could be dialed.
    pub unroutable_frames: u64,
    /// Frame bytes queued for lanes right now (bounded by `queue_bytes` plus one frame).
    pub queued_bytes: u64,
    /// Control frames dropped because their peer's queue was over its share (a peer not reading).
    pub control_frames_dropped: u64,
    /// Times a lane's reader waited because its peer sent control frames beyond
    /// `StrangerLimits::control_frames_per_sec`.
    pub control_frames_throttled: u64,
    /// Times a lane's reader waited because its peer, or its peer's address, sent Data payload beyond
    /// `StrangerLimits::data_bytes_per_sec_per_peer` or `StrangerLimits::data_bytes_per_sec_per_address`.
    pub data_frames_throttled: u64,
    /// Peers this node holds a link to now (see [`Liveness::forget_peer_after`](crate::tcp::Liveness::forget_peer_after)).
    pub peers_known: u64,
    /// Strangers forgotten after idling past `Liveness::forget_peer_after`.
    pub peers_forgotten: u64,
    /// Incoming sessions whose notice was dropped because nobody accepted them in time (their transfers
    /// ran all the same).
    pub incoming_dropped: u64,
    /// Payload bytes lanes sent through staging buffers (GPU regions, or host regions with
    /// [`crate::tcp::Buffers::stage_host_memory`]).
    pub staged_bytes_sent: u64,
    /// Payload bytes lanes received through staging buffers.
    pub staged_bytes_received: u64,
    /// Bytes of staging buffers lanes hold right now: two buffers of `stage_bytes` per lane direction and
    /// kind of memory it moves, let go after a second without such bytes.
    pub staging_bytes_held: u64,
}

/// A TCP node: an engine, the memory behind its regions, a listener and lanes to its peers. Its calls
/// besides [`Node`]'s: [`TcpNode::start`], the typed [`TcpNode::connect`], [`TcpNode::stats`],
/// [`TcpNode::local_addr`], [`TcpNode::add_peer`], ... Dropping it stops its tasks and closes its lanes.
pub type TcpNode = Node<TcpDriver>;

/// What a [`TcpNode`] moves bytes with: its listener, lanes and the driver task that polls the engine.
pub struct TcpDriver {
    state: Arc<NodeState>,
}

impl std::fmt::Debug for TcpDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpDriver")
            .field("engine_id", &self.state.ctx.cfg.engine.engine_id)
            .field("listen", &self.state.listen)
            .finish_non_exhaustive()
    }
}

impl Sealed for TcpDriver {}

impl Driver for TcpDriver {
    const BACKEND: &'static str = "tcp";

    fn core(&self) -> &NodeCore {
        &self.state.ctx.core
    }

    fn wake(&self) {
        self.state.ctx.wake.notify_one();
    }

    fn address(&self) -> Option<PeerAddress> {
        self.state.listen.map(PeerAddress::Tcp)
    }

    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>> {
        Box::pin(async move {
            let PeerAddress::Tcp(addr) = address else {
                return Err(TransportError::cannot_reach("tcp", address));
            };
            lane::dial(&self.state, *addr, None, None).await
        })
    }

    /// Lanes send from the caller's memory and receive into it in place (see [`MemoryRegion`] for who may
    /// touch which bytes while transfers run). GPU memory (feature `cuda`) is staged through each lane's
    /// two pinned buffers instead, the device copy of one unit overlapping the socket send or receive of
    /// the other; it is refused with a clear error when this build has no GPU support or its GPU cannot be
    /// opened.
    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        super::stage::check_stageable(memory.kind()).map_err(|why| {
            TransportError::config(
                "tcp",
                format!("TCP lanes cannot send or receive {}: {why}", memory.kind()),
            )
        })?;
        Ok(self
            .state
            .ctx
            .core
            .station
            .register_kv_region(layout, memory)?)
    }

    /// Fails at once when the peer cannot be reached: no lane and no address to dial.
    fn check_route(&self, req: &TransferRequest) -> Result<(), TransportError> {
        let link = self.state.link(req.peer);
        link.pin();
        if link.routable() {
            return Ok(());
        }
        Err(TransportError::NoRoute {
            peer: req.peer,
            why: "connect to it first or add its address".into(),
        })
    }

    /// A peer declared unreachable after its connections were lost is refused for
    /// [`Liveness::unreachable_hold`](crate::tcp::Liveness::unreachable_hold), or until a lane to it opens
    /// again.
    fn verdict_holds(&self, peer: PeerId, verdict: &Verdict, now: Instant) -> bool {
        now.duration_since(verdict.since) < self.state.ctx.cfg.liveness.unreachable_hold
            && self.state.link(peer).lane_count() == 0
    }

    /// The first transfer after the hold dials the peer again, its earlier dial failures forgotten.
    fn verdict_cleared(&self, peer: PeerId, now: Instant) {
        self.state.link(peer).reset_dial_failures(now);
    }

    /// Stops the driver, listener and lanes.
    fn shutdown(&self) {
        self.state.shutdown.send_replace(true);
        self.state.ctx.core.station.board.close();
        let links = self.state.all_links();
        for link in links {
            link.abort_all(&self.state.ctx);
        }
    }
}

impl Node<TcpDriver> {
    /// Starts a node: binds its listener (if any) and spawns its driver on the current tokio runtime.
    pub async fn start(cfg: TcpConfig) -> Result<Self, TransportError> {
        if cfg.limits.max_lanes_per_peer == 0
            || cfg.buffers.batch_bytes == 0
            || cfg.buffers.stage_bytes == 0
        {
            return Err(TransportError::config(
                "tcp",
                "max_lanes_per_peer, batch_bytes and stage_bytes must be at least 1",
            ));
        }
        let listener = match cfg.listen {
            Some(addr) => {
                if !addr.ip().is_loopback()
                    && cfg.security.secret.is_none()
                    && !cfg.security.allow_unauthenticated_remote
                {
                    return Err(TransportError::config(
                        "tcp",
                        format!(
                            "refusing to listen on {addr} without a shared secret: set a secret, listen \
                             on 127.0.0.1, or set allow_unauthenticated_remote"
                        ),
                    ));
                }
                Some(TcpListener::bind(addr).await.map_err(io)?)
            }
            None => None,
        };
        let listen = listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()
            .map_err(io)?;
        let state = Arc::new(NodeState::new(Context::new(cfg), listen));
        tokio::spawn(driver::drive(state.clone()));
        if let Some(listener) = listener {
            tokio::spawn(accept::accept_loop(state.clone(), listener));
        }
        Ok(Node::from_driver(TcpDriver { state }))
    }

    fn state(&self) -> &Arc<NodeState> {
        &self.driver().state
    }

    /// The address the node listens on.
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.state().listen
    }

    /// Counters of the engine and the lanes.
    #[must_use]
    pub fn stats(&self) -> NodeStats {
        let state = self.state();
        let c = &state.ctx.counters;
        NodeStats {
            engine: state.ctx.core.station.engine().stats(),
            lanes_opened: c.lanes_opened.load(Ordering::Relaxed),
            lanes_closed: c.lanes_closed.load(Ordering::Relaxed),
            lanes_shed: c.lanes_shed.load(Ordering::Relaxed),
            handshakes_refused: c.handshakes_refused.load(Ordering::Relaxed),
            refusals_unanswered: c.refusals_unanswered.load(Ordering::Relaxed),
            lanes_closed_for_bad_frames: c.bad_frames.load(Ordering::Relaxed),
            unroutable_frames: c.unroutable.load(Ordering::Relaxed),
            incoming_dropped: state.ctx.core.station.board.incoming_dropped(),
            control_frames_dropped: c.control_dropped.load(Ordering::Relaxed),
            control_frames_throttled: c.control_frames_throttled.load(Ordering::Relaxed),
            data_frames_throttled: c.data_frames_throttled.load(Ordering::Relaxed),
            peers_known: lock(&state.links).len() as u64,
            peers_forgotten: c.peers_forgotten.load(Ordering::Relaxed),
            queued_bytes: state.ctx.total_queued.load(Ordering::Relaxed),
            staged_bytes_sent: state.ctx.staged.sent.load(Ordering::Relaxed),
            staged_bytes_received: state.ctx.staged.received.load(Ordering::Relaxed),
            staging_bytes_held: state.ctx.staged.held.load(Ordering::Relaxed),
        }
    }

    /// The address lanes to `peer` are dialed at, if known (for a peer that connected here: the address
    /// its connection came from, with the port its handshake named).
    #[must_use]
    pub fn peer_addr(&self, peer: PeerId) -> Option<SocketAddr> {
        lock(&self.state().links).get(&peer).and_then(|l| l.addr())
    }

    /// Open lanes to `peer`.
    #[must_use]
    pub fn lanes(&self, peer: PeerId) -> usize {
        lock(&self.state().links)
            .get(&peer)
            .map_or(0, |l| l.lane_count())
    }

    /// Records `peer`'s address so lanes to it are dialed on demand.
    pub fn add_peer(&self, peer: PeerId, addr: SocketAddr) {
        let link = self.state().link(peer);
        link.pin();
        link.set_addr(addr);
    }

    /// Dials `addr`, runs the handshake and opens a first lane. With `want`, asks the peer to provide a
    /// region of that layout (offered back as segment `served`).
    pub async fn connect(
        &self,
        addr: SocketAddr,
        want: Option<KvLayout>,
    ) -> Result<PeerInfo, TransportError> {
        lane::dial(self.state(), addr, None, want).await
    }

    /// Closes every lane to `peer` at once, as a lost connection would. Transfers in flight carry on over
    /// new lanes if the peer's address is known, or end with recompute at their deadline.
    pub fn disconnect(&self, peer: PeerId) {
        if let Some(link) = lock(&self.state().links).get(&peer) {
            link.abort_all(&self.state().ctx);
        }
    }
}

/// A socket error of this node.
fn io(e: std::io::Error) -> TransportError {
    TransportError::io("tcp", &e)
}
