//! The calls every node answers the same way, whatever its backend: memory, sending, receiving,
//! observing and stopping. They answer with [`TransportError`].

use std::time::{Duration, Instant};

use tokio::sync::broadcast;
use transfer_engine::{
    Counters, Event, KvLayout, MemoryRegion, RegionHandle, RegionId, SessionId, ShapingConfig,
    TransferRequest,
};

use super::station::Station;
use super::{Driver, LogEntry, Node, Role};
use crate::board::{IncomingSession, Outcome, Received};
use crate::transport::TransportError;

impl<D: Driver> Node<D> {
    /// The backend's name (`tcp`, `rdma`, `shm`).
    #[must_use]
    pub fn backend(&self) -> &'static str {
        D::BACKEND
    }

    /// This node's engine id; peers know it as `PeerId(engine_id)`.
    #[must_use]
    pub fn engine_id(&self) -> u32 {
        self.driver.core().engine_id()
    }

    // ---- memory ----

    /// Registers the caller's `memory` as a KV region of `layout`: transfers send from it and place into it
    /// (see [`MemoryRegion`] for who may touch which bytes while transfers run). Memory this backend
    /// cannot move is refused with a clear error; see each backend's docs for what registering costs it.
    pub fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        self.driver.register_kv_region(layout, memory)
    }

    /// Registers a KV region of `layout` over zeroed host memory the node allocates.
    pub fn kv_region(&self, layout: KvLayout) -> Result<RegionHandle, TransportError> {
        let len = usize::try_from(layout.total_bytes()).map_err(|_| TransportError::Config {
            backend: D::BACKEND,
            message: "the layout does not fit in memory".into(),
        })?;
        self.register_kv_region(layout, MemoryRegion::zeroed(len))
    }

    /// The memory behind a registered region.
    pub fn memory(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        Ok(self.station().engine().memory(id)?.clone())
    }

    /// The layout a registered region was registered with (`None` for a region of plain bytes).
    pub fn region_layout(&self, id: RegionId) -> Result<Option<KvLayout>, TransportError> {
        Ok(self.station().engine().region(id)?.layout)
    }

    /// Unregisters a region no live session uses and hands back its memory; it is no longer offered.
    pub fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        let memory = self.station().engine().unregister_region(id)?;
        self.driver.core().segments.withdraw(id);
        self.driver.region_unregistered(id);
        Ok(memory)
    }

    /// Offers a registered region to peers under `name` (replacing one of that name): peers that connect
    /// from now on find it. A region this node does not hold is refused.
    pub fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), TransportError> {
        self.station().engine().region(handle.id)?;
        self.driver.core().segments.offer(name, handle);
        Ok(())
    }

    /// Sets the engine's traffic shaping (link rate, KV share of it, per-class rates, bursts): a KV
    /// bandwidth cap that leaves room for collectives. Takes effect for every frame from now on.
    pub fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), TransportError> {
        self.station().engine().set_shaping(shaping)?;
        self.driver.wake();
        Ok(())
    }

    // ---- sending ----

    /// Starts a transfer; see [`Node::wait`]. Refused at once when the request is malformed, the peer was
    /// never reached, or it is held unreachable.
    pub fn submit(&self, req: TransferRequest) -> Result<SessionId, TransportError> {
        self.driver.check_role(Role::Send)?;
        let now = Instant::now();
        let peer = req.peer;
        let admitted = self.driver.core().admit(peer, |verdict| {
            self.driver.verdict_holds(peer, verdict, now)
        })?;
        if admitted.cleared {
            self.driver.verdict_cleared(peer, now);
        }
        self.driver.check_route(&req)?;
        let id = self.driver.start_session(req)?;
        drop(admitted);
        self.driver.wake();
        Ok(id)
    }

    /// The producer of sending session `session` has written every layer below `until`: those layers may
    /// go out (for requests made with `TransferRequest::with_layers_written`).
    pub fn layers_written(&self, session: SessionId, until: u32) -> Result<(), TransportError> {
        self.driver.check_role(Role::Send)?;
        self.station().engine().layers_written(session, until)?;
        self.driver.wake();
        Ok(())
    }

    /// Stops sending session `session`: every block not yet acknowledged is reported for recompute, here
    /// and at the receiver.
    pub fn cancel(&self, session: SessionId) -> Result<(), TransportError> {
        self.driver.check_role(Role::Send)?;
        self.station().engine().cancel(session)?;
        self.driver.wake();
        Ok(())
    }

    /// Waits, at most `limit`, until sending session `session` is over: delivered and acknowledged, or its
    /// undelivered blocks reported for recompute.
    pub async fn wait(
        &self,
        session: SessionId,
        limit: Duration,
    ) -> Result<Outcome, TransportError> {
        self.driver.check_role(Role::Send)?;
        let run = self.station().board.wait_sent(session);
        Ok(tokio::time::timeout(limit, run)
            .await
            .map_err(|_| TransportError::Timeout {
                what: format!("session {session}"),
                waited: limit,
            })??)
    }

    /// Submits and waits.
    pub async fn transfer(
        &self,
        req: TransferRequest,
        limit: Duration,
    ) -> Result<Outcome, TransportError> {
        let id = self.submit(req)?;
        self.wait(id, limit).await
    }

    // ---- receiving ----

    /// The notice of the next incoming session nobody has taken yet (the session already runs: the engine
    /// admitted it when its open arrived), waiting for one: who sends it and where it lands.
    pub async fn next_incoming(&self) -> Result<IncomingSession, TransportError> {
        self.driver.check_role(Role::Receive)?;
        Ok(self.station().board.next_incoming().await?)
    }

    /// Waits until receiving session `session` is known here (its sender's first frame arrived, or it
    /// finished recently). Bound it with a timeout: a session that never comes is waited for forever.
    pub async fn wait_announced(&self, session: SessionId) -> Result<(), TransportError> {
        self.driver.check_role(Role::Receive)?;
        Ok(self.station().board.wait_announced(session).await?)
    }

    /// The consumer is about to compute `layer` of receiving session `session` (layers in order): the
    /// sender may keep up to its prefetch depth of layers beyond it in flight, and a layer not yet whole
    /// becomes urgent. Returns whether the layer is complete.
    pub fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, TransportError> {
        self.driver.check_role(Role::Receive)?;
        let complete = self.station().consume_layer(session, layer)?;
        self.driver.wake();
        Ok(complete)
    }

    /// Stops receiving session `session`: none of its bytes is placed from now on, and its blocks not yet
    /// verified are reported for recompute.
    pub fn abandon_receive(&self, session: SessionId) -> Result<(), TransportError> {
        self.driver.check_role(Role::Receive)?;
        self.station().abandon_receive(session)?;
        self.driver.wake();
        Ok(())
    }

    /// Waits until `layer` of receiving session `session` has arrived whole and verified; if the session
    /// ends without it, the error names the layer's blocks to recompute.
    pub async fn wait_layer(&self, session: SessionId, layer: u32) -> Result<(), TransportError> {
        self.driver.check_role(Role::Receive)?;
        Ok(self.station().board.wait_layer(session, layer).await?)
    }

    /// Waits until receiving session `session` is over.
    pub async fn wait_received(&self, session: SessionId) -> Result<Received, TransportError> {
        self.driver.check_role(Role::Receive)?;
        Ok(self.station().board.wait_received(session).await?)
    }

    // ---- observing ----

    /// Every engine event from now on (a subscriber more than [`crate::board::KEEP_EVENTS`] behind is told
    /// how many it missed).
    #[must_use]
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.station().board.subscribe()
    }

    /// The engine's counters.
    #[must_use]
    pub fn counters(&self) -> Counters {
        self.station().engine().stats()
    }

    /// Connection-level events, refusals and errors, oldest first (the newest [`super::KEEP_LINES`]; a line
    /// that came several times in a row says how many). Each is also a `tracing` event.
    #[must_use]
    pub fn log(&self) -> Vec<String> {
        self.driver.core().log.lines_after(0).0
    }

    /// The log lines numbered after `seen` (still kept), and the newest line's number: call again with it
    /// to read each line once.
    #[must_use]
    pub fn log_after(&self, seen: u64) -> (Vec<String>, u64) {
        self.driver.core().log.lines_after(seen)
    }

    /// The log's entries, oldest first, each with its kind, peer and error (see [`Node::log`]).
    #[must_use]
    pub fn log_entries(&self) -> Vec<LogEntry> {
        self.driver.core().log.entries()
    }

    /// The newest log entry's number (0 before the first): pass it to [`Node::log_entries_after`] to take
    /// only the entries that come after now.
    #[must_use]
    pub fn log_mark(&self) -> u64 {
        self.driver.core().log.newest()
    }

    /// The log's entries numbered after `seen` (still kept), and the newest entry's number: call again
    /// with it to take each entry once.
    #[must_use]
    pub fn log_entries_after(&self, seen: u64) -> (Vec<LogEntry>, u64) {
        self.driver.core().log.entries_after(seen)
    }

    /// Live sessions (both roles).
    #[must_use]
    pub fn live_sessions(&self) -> usize {
        self.station().engine().live_sessions()
    }

    fn station(&self) -> &Station {
        &self.driver.core().station
    }

    /// Stops the node: its tasks or threads end, waiters are woken with [`crate::WaitError::Closed`], and
    /// peers see it go as a lost peer. Idempotent; dropping the node does it too.
    pub fn shutdown(&self) {
        self.driver.shutdown();
    }
}
