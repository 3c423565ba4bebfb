//! A TCP node: one engine, its regions, its listener, its lanes, and the driver task that polls the engine.
//!
//! The engine sits behind one mutex that is only ever held for short, non-blocking calls: the driver task
//! polls transmits, timers and events; lane readers ask for placements and hand in received frames. All
//! socket work happens outside it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::broadcast;
use transfer_engine::{
    Event, KvLayout, MemoryRegion, PeerId, RegionHandle, RegionId, SessionId, ShapingConfig,
    TransferRequest,
};

use super::accept;
use super::context::{Context, lock};
use super::driver;
use super::handshake::Segment;
use super::lane;
use super::reach;
use super::state::{NodeState, PeerInfo};
use super::{TcpConfig, TcpError};
use crate::board::{IncomingSession, Outcome, Received};

/// Lane and refusal counters of a node, beside the engine's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// The engine's counters.
    pub engine: transfer_engine::Counters,
    /// Lanes opened (both directions).
    pub lanes_opened: u64,
    /// Lanes closed.
    pub lanes_closed: u64,
    /// Connections refused in the handshake.
    pub handshakes_refused: u64,
    /// Refused connections closed without a Reject, because `TcpConfig::max_pending_refusals` were being
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
    /// `TcpConfig::control_frames_per_sec`.
    pub control_frames_throttled: u64,
    /// Times a lane's reader waited because its peer, or its peer's address, sent Data payload beyond
    /// `TcpConfig::data_bytes_per_sec_per_peer` or `TcpConfig::data_bytes_per_sec_per_address`.
    pub data_frames_throttled: u64,
    /// Peers this node holds a link to now (see [`TcpConfig::forget_peer_after`]).
    pub peers_known: u64,
    /// Strangers forgotten after idling past `TcpConfig::forget_peer_after`.
    pub peers_forgotten: u64,
    /// Incoming sessions whose notice was dropped because nobody accepted them in time (their transfers
    /// ran all the same).
    pub incoming_dropped: u64,
    /// Payload bytes lanes sent through staging buffers (GPU regions, or host regions with
    /// [`crate::tcp::TcpConfig::stage_host_memory`]).
    pub staged_bytes_sent: u64,
    /// Payload bytes lanes received through staging buffers.
    pub staged_bytes_received: u64,
    /// Bytes of staging buffers lanes hold right now: two buffers of `stage_bytes` per lane direction and
    /// kind of memory it moves, let go after a second without such bytes.
    pub staging_bytes_held: u64,
}

/// A TCP node: an engine, the memory behind its regions, a listener and lanes to its peers.
///
/// Methods come in the engine's kinds: getters ([`TcpNode::stats`], [`TcpNode::local_addr`], ...),
/// commands ([`TcpNode::register_kv_region`], [`TcpNode::connect`], [`TcpNode::submit`], ...) and waits
/// ([`TcpNode::wait`], [`TcpNode::transfer`]). Dropping the node stops its tasks and closes its lanes.
pub struct TcpNode {
    state: Arc<NodeState>,
}

impl std::fmt::Debug for TcpNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpNode")
            .field("engine_id", &self.state.ctx.cfg.engine.engine_id)
            .field("listen", &self.state.listen)
            .finish_non_exhaustive()
    }
}

impl TcpNode {
    /// Starts a node: binds its listener (if any) and spawns its driver on the current tokio runtime.
    pub async fn start(cfg: TcpConfig) -> Result<Self, TcpError> {
        if cfg.max_lanes_per_peer == 0 || cfg.batch_bytes == 0 || cfg.stage_bytes == 0 {
            return Err(TcpError::Config(
                "max_lanes_per_peer, batch_bytes and stage_bytes must be at least 1".into(),
            ));
        }
        let listener = match cfg.listen {
            Some(addr) => {
                if !addr.ip().is_loopback()
                    && cfg.secret.is_none()
                    && !cfg.allow_unauthenticated_remote
                {
                    return Err(TcpError::Config(format!(
                        "refusing to listen on {addr} without a shared secret: set a secret, listen on \
                         127.0.0.1, or set allow_unauthenticated_remote"
                    )));
                }
                Some(TcpListener::bind(addr).await?)
            }
            None => None,
        };
        let listen = listener.as_ref().map(TcpListener::local_addr).transpose()?;
        let state = Arc::new(NodeState::new(Context::new(cfg), listen));
        tokio::spawn(driver::drive(state.clone()));
        if let Some(listener) = listener {
            tokio::spawn(accept::accept_loop(state.clone(), listener));
        }
        Ok(Self { state })
    }

    // ---- getters ----

    /// The address the node listens on.
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.state.listen
    }

    /// This node's engine id; peers know it as `PeerId(engine_id)`.
    #[must_use]
    pub fn engine_id(&self) -> u32 {
        self.state.ctx.cfg.engine.engine_id
    }

    /// The memory behind a registered region.
    pub fn memory(&self, id: RegionId) -> Result<MemoryRegion, TcpError> {
        Ok(self.state.ctx.station.engine().memory(id)?.clone())
    }

    /// Counters of the engine and the lanes.
    #[must_use]
    pub fn stats(&self) -> NodeStats {
        let c = &self.state.ctx.counters;
        NodeStats {
            engine: self.state.ctx.station.engine().stats(),
            lanes_opened: c.lanes_opened.load(Ordering::Relaxed),
            lanes_closed: c.lanes_closed.load(Ordering::Relaxed),
            handshakes_refused: c.handshakes_refused.load(Ordering::Relaxed),
            refusals_unanswered: c.refusals_unanswered.load(Ordering::Relaxed),
            lanes_closed_for_bad_frames: c.bad_frames.load(Ordering::Relaxed),
            unroutable_frames: c.unroutable.load(Ordering::Relaxed),
            incoming_dropped: self.state.ctx.station.board.incoming_dropped(),
            control_frames_dropped: c.control_dropped.load(Ordering::Relaxed),
            control_frames_throttled: c.control_frames_throttled.load(Ordering::Relaxed),
            data_frames_throttled: c.data_frames_throttled.load(Ordering::Relaxed),
            peers_known: lock(&self.state.links).len() as u64,
            peers_forgotten: c.peers_forgotten.load(Ordering::Relaxed),
            queued_bytes: self.state.ctx.total_queued.load(Ordering::Relaxed),
            staged_bytes_sent: self.state.ctx.staged.sent.load(Ordering::Relaxed),
            staged_bytes_received: self.state.ctx.staged.received.load(Ordering::Relaxed),
            staging_bytes_held: self.state.ctx.staged.held.load(Ordering::Relaxed),
        }
    }

    /// The address lanes to `peer` are dialed at, if known (for a peer that connected here: the address
    /// its connection came from, with the port its handshake named).
    #[must_use]
    pub fn peer_addr(&self, peer: PeerId) -> Option<SocketAddr> {
        lock(&self.state.links).get(&peer).and_then(|l| l.addr())
    }

    /// Open lanes to `peer`.
    #[must_use]
    pub fn lanes(&self, peer: PeerId) -> usize {
        lock(&self.state.links)
            .get(&peer)
            .map_or(0, |l| l.lane_count())
    }

    /// Connection-level refusals and errors, oldest first (the newest 1024).
    #[must_use]
    pub fn log(&self) -> Vec<String> {
        self.state.ctx.log_after(0).0
    }

    /// The log lines numbered after `seen` (still kept), and the newest line's number: call again with
    /// it to print each line once.
    #[must_use]
    pub fn log_after(&self, seen: u64) -> (Vec<String>, u64) {
        self.state.ctx.log_after(seen)
    }

    /// Every engine event from now on (a subscriber more than [`crate::board::KEEP_EVENTS`] behind is
    /// told how many it missed).
    #[must_use]
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.state.ctx.station.board.subscribe()
    }

    /// Live sessions (both roles).
    #[must_use]
    pub fn live_sessions(&self) -> usize {
        self.state.ctx.station.engine().live_sessions()
    }

    pub(crate) fn board(&self) -> &crate::board::Board {
        &self.state.ctx.station.board
    }

    // ---- commands ----

    /// Registers the caller's `memory` as a KV region of `layout`: lanes send from it and receive into it
    /// in place (see [`MemoryRegion`] for who may touch which bytes while transfers run). GPU memory
    /// (feature `cuda`) is staged through each lane's two pinned buffers instead, the device copy of one
    /// unit overlapping the socket send or receive of the other; it is refused with a clear error when this
    /// build has no GPU support or its GPU cannot be opened.
    pub fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TcpError> {
        super::stage::check_stageable(memory.kind()).map_err(|why| {
            TcpError::Config(format!(
                "TCP lanes cannot send or receive {}: {why}",
                memory.kind()
            ))
        })?;
        Ok(self.state.ctx.station.register_kv_region(layout, memory)?)
    }

    /// Registers a KV region of `layout` over zeroed host memory the node allocates.
    pub fn kv_region(&self, layout: KvLayout) -> Result<RegionHandle, TcpError> {
        let len = usize::try_from(layout.total_bytes())
            .map_err(|_| TcpError::Config("the layout does not fit in memory".into()))?;
        self.register_kv_region(layout, MemoryRegion::zeroed(len))
    }

    /// Sets the engine's traffic shaping (link rate, KV share of it, per-class rates, bursts): a KV
    /// bandwidth cap that leaves room for collectives. Takes effect for every frame from now on.
    pub fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), TcpError> {
        self.state.ctx.station.engine().set_shaping(shaping)?;
        self.state.ctx.wake.notify_one();
        Ok(())
    }

    /// Unregisters a region no live session uses and hands back its memory; it is no longer offered.
    pub fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TcpError> {
        let memory = self.state.ctx.station.engine().unregister_region(id)?;
        lock(&self.state.segments).retain(|s| s.handle.id != id);
        Ok(memory)
    }

    /// Offers a registered region to peers under `name`: it is listed in the handshake's welcome from
    /// now on. A region this node does not hold is refused.
    pub fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), TcpError> {
        self.state.ctx.station.engine().region(handle.id)?;
        let mut segs = lock(&self.state.segments);
        segs.retain(|s| s.name != name);
        segs.push(Segment {
            name: name.into(),
            handle,
        });
        Ok(())
    }

    /// Records `peer`'s address so lanes to it are dialed on demand.
    pub fn add_peer(&self, peer: PeerId, addr: SocketAddr) {
        let link = self.state.link(peer);
        link.pin();
        link.set_addr(addr);
    }

    /// Dials `addr`, runs the handshake and opens a first lane. With `want`, asks the peer to provide a
    /// region of that layout (offered back as segment `served`).
    pub async fn connect(
        &self,
        addr: SocketAddr,
        want: Option<KvLayout>,
    ) -> Result<PeerInfo, TcpError> {
        lane::dial(&self.state, addr, None, want).await
    }

    /// Closes every lane to `peer` at once, as a lost connection would. Transfers in flight carry on over
    /// new lanes if the peer's address is known, or end with recompute at their deadline.
    pub fn disconnect(&self, peer: PeerId) {
        if let Some(link) = lock(&self.state.links).get(&peer) {
            link.abort_all(&self.state.ctx);
        }
    }

    /// Starts a transfer; see [`TcpNode::wait`].
    ///
    /// Fails at once when the peer cannot be reached: no lane and no address to dial, or declared
    /// unreachable after its connections were lost, for [`TcpConfig::unreachable_hold`] (or until a lane
    /// to it opens again). The first transfer after that hold dials the peer again.
    pub fn submit(&self, req: TransferRequest) -> Result<SessionId, TcpError> {
        let link = self.state.link(req.peer);
        link.pin();
        let reach = reach::check_held(&link, self.state.ctx.cfg.unreachable_hold, Instant::now())?;
        if !link.routable() {
            return Err(TcpError::NoRoute(req.peer));
        }
        let id = self.state.ctx.station.submit(req)?;
        drop(reach);
        self.state.ctx.wake.notify_one();
        Ok(id)
    }

    /// The producer of sending session `session` has written every layer below `until`: those layers may
    /// go out (for requests made with `TransferRequest::with_layers_written`).
    pub fn layers_written(&self, session: SessionId, until: u32) -> Result<(), TcpError> {
        self.state
            .ctx
            .station
            .engine()
            .layers_written(session, until)?;
        self.state.ctx.wake.notify_one();
        Ok(())
    }

    /// Stops sending session `session`: every block not yet acknowledged is reported for recompute, here
    /// and at the receiver.
    pub fn cancel(&self, session: SessionId) -> Result<(), TcpError> {
        self.state.ctx.station.engine().cancel(session)?;
        self.state.ctx.wake.notify_one();
        Ok(())
    }

    /// Stops receiving session `session`: none of its bytes is placed from now on, and its blocks not yet
    /// verified are reported for recompute.
    pub fn abandon_receive(&self, session: SessionId) -> Result<(), TcpError> {
        self.state.ctx.station.abandon_receive(session)?;
        self.state.ctx.wake.notify_one();
        Ok(())
    }

    /// Waits until sending session `session` is over (delivered and acknowledged, or reported for
    /// recompute).
    pub async fn wait(&self, session: SessionId, limit: Duration) -> Result<Outcome, TcpError> {
        let run = self.state.ctx.station.board.wait_sent(session);
        Ok(tokio::time::timeout(limit, run)
            .await
            .map_err(|_| TcpError::Timeout {
                what: format!("session {session}"),
                waited: limit,
            })??)
    }

    /// The notice of the next incoming session nobody has taken yet (the session already runs: the engine
    /// admitted it when its open arrived), waiting for one: who sends it and where it lands.
    pub async fn next_incoming(&self) -> Result<IncomingSession, TcpError> {
        Ok(self.state.ctx.station.board.next_incoming().await?)
    }

    /// Waits until `layer` of receiving session `session` has arrived whole and verified (an error names
    /// the layer's blocks to recompute if the session ended without it).
    pub async fn wait_layer(&self, session: SessionId, layer: u32) -> Result<(), TcpError> {
        Ok(self
            .state
            .ctx
            .station
            .board
            .wait_layer(session, layer)
            .await?)
    }

    /// Waits until receiving session `session` is over.
    pub async fn wait_received(&self, session: SessionId) -> Result<Received, TcpError> {
        Ok(self.state.ctx.station.board.wait_received(session).await?)
    }

    /// The consumer is about to compute `layer` of receiving session `session` (layers in order): the
    /// sender may then keep up to its prefetch depth of layers beyond it in flight, and a layer not yet
    /// whole becomes urgent. Returns whether the layer is complete.
    pub fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, TcpError> {
        let complete = self.state.ctx.station.consume_layer(session, layer)?;
        self.state.ctx.wake.notify_one();
        Ok(complete)
    }

    /// Submits and waits.
    pub async fn transfer(
        &self,
        req: TransferRequest,
        limit: Duration,
    ) -> Result<Outcome, TcpError> {
        let id = self.submit(req)?;
        self.wait(id, limit).await
    }

    /// Stops the node: its driver, listener and lanes.
    pub fn shutdown(&self) {
        self.state.shutdown.send_replace(true);
        self.state.ctx.station.board.close();
        let links = self.state.all_links();
        for link in links {
            link.abort_all(&self.state.ctx);
        }
    }
}

impl Drop for TcpNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}
