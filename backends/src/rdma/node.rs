//! An RDMA node: one engine, its registered regions, one libfabric endpoint and the driver thread that
//! owns it. The calls mirror [`crate::tcp::TcpNode`]'s: register caller memory, connect, submit and await
//! transfers, accept incoming sessions, await them layer by layer, subscribe to events.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{broadcast, oneshot};
use transfer_engine::{
    Event, KvLayout, MemoryRegion, PeerId, RegionHandle, RegionId, SessionId, TransferRequest,
};

use super::ffi::{Endpoint, MrId, ProviderInfo};
use super::message::RdmaSegment;
use super::provider::resolve;
use super::{RdmaConfig, RdmaError, driver};
use crate::board::{IncomingSession, Outcome, Received};
use crate::station::Station;

/// Refusal and log lines kept (oldest dropped first).
const KEEP_LOG: usize = 1024;

/// A peer reached by [`RdmaNode::connect`] (or that connected to this node).
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The peer (its engine id).
    pub peer: PeerId,
    /// Regions it offers.
    pub segments: Vec<RdmaSegment>,
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

/// Data-path counters of a node, beside the engine's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// The engine's counters.
    pub engine: transfer_engine::Counters,
    /// RDMA writes posted.
    pub writes: u64,
    /// Writes the provider completed with an error (a refused key or range, a lost peer).
    pub write_errors: u64,
    /// Peers' writes that landed here.
    pub remote_writes: u64,
    /// Messages sent.
    pub messages_sent: u64,
    /// Messages received.
    pub messages_received: u64,
    /// Frames, messages or units refused (see [`RdmaNode::log`]).
    pub refused: u64,
}

/// What the driver reports back through the node.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) writes: AtomicU64,
    pub(crate) write_errors: AtomicU64,
    pub(crate) remote_writes: AtomicU64,
    pub(crate) messages_sent: AtomicU64,
    pub(crate) messages_received: AtomicU64,
    pub(crate) refused: AtomicU64,
}

/// A region registered with both the engine and the endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalRegion {
    pub(crate) mr: MrId,
    pub(crate) rkey: u64,
    pub(crate) rma_base: u64,
}

/// A peer as the driver reaches it.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// Its address-vector handle.
    pub(crate) addr: u64,
    /// The tag it asked us to use in our writes to it (None until its welcome or hello arrives).
    pub(crate) write_tag: Option<u16>,
    /// The tag we gave it for its writes to us.
    pub(crate) our_tag: u16,
    /// What it offers.
    pub(crate) segments: Vec<RdmaSegment>,
}

/// What API calls ask of the driver thread (which alone touches the endpoint).
pub(crate) enum Command {
    Register(MemoryRegion, mpsc::Sender<Result<LocalRegion, RdmaError>>),
    Deregister(MrId),
    Connect(Vec<u8>, oneshot::Sender<Result<PeerInfo, RdmaError>>),
}

/// State shared by the API and the driver thread.
pub(crate) struct Shared {
    pub(crate) station: Station,
    pub(crate) engine_id: u32,
    pub(crate) cfg: RdmaConfig,
    pub(crate) info: ProviderInfo,
    pub(crate) name: Vec<u8>,
    pub(crate) commands: Mutex<VecDeque<Command>>,
    pub(crate) stop: AtomicBool,
    pub(crate) regions: Mutex<HashMap<RegionId, LocalRegion>>,
    pub(crate) published: Mutex<Vec<RdmaSegment>>,
    pub(crate) routes: Mutex<HashMap<PeerId, Route>>,
    /// Each sending session's destination: its region and layout (for the remote offsets).
    pub(crate) sessions: Mutex<HashMap<SessionId, (RegionId, KvLayout)>>,
    pub(crate) counters: Counters,
    log: Mutex<VecDeque<String>>,
}

impl Shared {
    pub(crate) fn log(&self, line: String) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        let mut log = lock(&self.log);
        if log.len() == KEEP_LOG {
            log.pop_front();
        }
        log.push_back(line);
    }

    fn command(&self, cmd: Command) {
        // The driver sees it within its idle nap (1 ms) or at once when busy.
        lock(&self.commands).push_back(cmd);
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One RDMA node; stops its driver thread and closes its endpoint when dropped.
pub struct RdmaNode {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RdmaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaNode")
            .field("engine_id", &self.shared.engine_id)
            .field("provider", &self.shared.info)
            .finish_non_exhaustive()
    }
}

impl RdmaNode {
    /// Opens an endpoint on the configured provider and starts the node's driver thread.
    pub fn start(cfg: RdmaConfig) -> Result<Self, RdmaError> {
        if cfg.window_units == 0 || cfg.window_bytes == 0 || cfg.max_write_bytes == 0 {
            return Err(RdmaError::Config(
                "the window and the largest write must be non-zero".into(),
            ));
        }
        if cfg.slot_bytes < 256 || cfg.send_slots == 0 || cfg.recv_slots == 0 {
            return Err(RdmaError::Config(
                "message slots must be at least 256 bytes, and there must be some".into(),
            ));
        }
        let (provider, domain) = resolve(&cfg.provider, cfg.domain.as_deref())?;
        let ep = Endpoint::open(
            &provider,
            domain.as_deref(),
            cfg.send_slots,
            cfg.recv_slots,
            cfg.slot_bytes,
        )?;
        let shared = Arc::new(Shared {
            station: Station::new(cfg.engine.clone()),
            engine_id: cfg.engine.engine_id,
            info: ep.info().clone(),
            name: ep.name()?,
            cfg,
            commands: Mutex::default(),
            stop: AtomicBool::new(false),
            regions: Mutex::default(),
            published: Mutex::default(),
            routes: Mutex::default(),
            sessions: Mutex::default(),
            counters: Counters::default(),
            log: Mutex::default(),
        });
        let driver_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rdma-{}", shared.engine_id))
            .spawn(move || driver::run(ep, &driver_shared))
            .map_err(|e| RdmaError::Config(format!("cannot start the driver thread: {e}")))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// This node's endpoint address: what a peer passes to [`RdmaNode::connect`].
    #[must_use]
    pub fn address(&self) -> &[u8] {
        &self.shared.name
    }

    /// The provider and domain in use.
    #[must_use]
    pub fn provider(&self) -> &ProviderInfo {
        &self.shared.info
    }

    /// This node's engine id; peers know it as `PeerId(engine_id)`.
    #[must_use]
    pub fn engine_id(&self) -> u32 {
        self.shared.engine_id
    }

    /// The engine's and the data path's counters.
    #[must_use]
    pub fn stats(&self) -> NodeStats {
        let c = &self.shared.counters;
        NodeStats {
            engine: self.shared.station.engine().stats(),
            writes: c.writes.load(Ordering::Relaxed),
            write_errors: c.write_errors.load(Ordering::Relaxed),
            remote_writes: c.remote_writes.load(Ordering::Relaxed),
            messages_sent: c.messages_sent.load(Ordering::Relaxed),
            messages_received: c.messages_received.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
        }
    }

    /// Refusals and errors, oldest first (the newest 1024).
    #[must_use]
    pub fn log(&self) -> Vec<String> {
        lock(&self.shared.log).iter().cloned().collect()
    }

    /// Registers the caller's `memory` as a KV region of `layout`, with the engine and once with the
    /// provider (peers write into it in place; transfers read from it in place).
    pub fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, RdmaError> {
        let (tx, rx) = mpsc::channel();
        self.shared.command(Command::Register(memory.clone(), tx));
        let local = rx.recv().map_err(|_| RdmaError::Closed)??;
        match self.shared.station.register_kv_region(layout, memory) {
            Ok(handle) => {
                lock(&self.shared.regions).insert(handle.id, local);
                Ok(handle)
            }
            Err(e) => {
                self.shared.command(Command::Deregister(local.mr));
                Err(e.into())
            }
        }
    }

    /// Registers a KV region of `layout` over zeroed host memory.
    pub fn kv_region(&self, layout: KvLayout) -> Result<RegionHandle, RdmaError> {
        let len = usize::try_from(layout.total_bytes())
            .map_err(|_| RdmaError::Config("the layout does not fit in memory".into()))?;
        self.register_kv_region(layout, MemoryRegion::zeroed(len))
    }

    /// The memory behind a registered region.
    pub fn memory(&self, id: RegionId) -> Result<MemoryRegion, RdmaError> {
        Ok(self.shared.station.engine().memory(id)?.clone())
    }

    /// Unregisters a region no live session uses (from the engine and the provider) and hands back its
    /// memory.
    pub fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, RdmaError> {
        let memory = self.shared.station.engine().unregister_region(id)?;
        lock(&self.shared.published).retain(|s| s.handle.id != id);
        if let Some(local) = lock(&self.shared.regions).remove(&id) {
            self.shared.command(Command::Deregister(local.mr));
        }
        Ok(memory)
    }

    /// Offers a registered region to peers under `name` (in hello and welcome messages from now on).
    pub fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), RdmaError> {
        let local = *lock(&self.shared.regions)
            .get(&handle.id)
            .ok_or(transfer_engine::Error::UnknownRegion(handle.id))?;
        let mut published = lock(&self.shared.published);
        published.retain(|s| s.name != name);
        published.push(RdmaSegment {
            name: name.to_owned(),
            handle,
            rma_base: local.rma_base,
            rkey: local.rkey,
        });
        Ok(())
    }

    /// Reaches the node at endpoint address `address` (its [`RdmaNode::address`]): exchanges addresses,
    /// tags and published regions.
    pub async fn connect(&self, address: &[u8]) -> Result<PeerInfo, RdmaError> {
        let (tx, rx) = oneshot::channel();
        self.shared.command(Command::Connect(address.to_vec(), tx));
        let limit = self.shared.cfg.connect_timeout;
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(RdmaError::Closed),
            Err(_) => Err(RdmaError::Timeout {
                what: "the hello/welcome exchange".into(),
                waited: limit,
            }),
        }
    }

    /// A peer that connected to this node or that this node reached, if known.
    #[must_use]
    pub fn peer(&self, peer: PeerId) -> Option<PeerInfo> {
        lock(&self.shared.routes).get(&peer).map(|r| PeerInfo {
            peer,
            segments: r.segments.clone(),
        })
    }

    /// Starts a transfer; see [`RdmaNode::wait`]. The peer must have been reached and must offer the
    /// destination region.
    pub fn submit(&self, req: TransferRequest) -> Result<SessionId, RdmaError> {
        {
            let routes = lock(&self.shared.routes);
            let route = routes
                .get(&req.peer)
                .ok_or_else(|| RdmaError::NoRoute(req.peer, "connect to it first".into()))?;
            if route.write_tag.is_none() {
                return Err(RdmaError::NoRoute(
                    req.peer,
                    "its welcome has not arrived yet".into(),
                ));
            }
            if !route.segments.iter().any(|s| s.handle.id == req.dst_region) {
                return Err(RdmaError::NoRoute(
                    req.peer,
                    format!("it does not offer region {}", req.dst_region),
                ));
            }
        }
        let (dst, layout) = (req.dst_region, req.dst_layout);
        // The route is recorded under the engine's lock, before the driver can poll the session.
        let mut sessions = lock(&self.shared.sessions);
        let id = self.shared.station.submit(req)?;
        sessions.insert(id, (dst, layout));
        drop(sessions);
        Ok(id)
    }

    /// The producer of sending session `session` has written every layer below `until`: those layers may
    /// go out (for requests made with `TransferRequest::with_layers_written`; the driver picks them up on
    /// its next poll).
    pub fn layers_written(&self, session: SessionId, until: u32) -> Result<(), RdmaError> {
        self.shared
            .station
            .engine()
            .layers_written(session, until)?;
        Ok(())
    }

    /// Waits until sending session `session` is over (delivered and acknowledged, or reported for
    /// recompute).
    pub async fn wait(&self, session: SessionId, limit: Duration) -> Result<Outcome, RdmaError> {
        let run = self.shared.station.board.wait_sent(session);
        Ok(tokio::time::timeout(limit, run)
            .await
            .map_err(|_| RdmaError::Timeout {
                what: format!("session {session}"),
                waited: limit,
            })??)
    }

    /// Submits and waits.
    pub async fn transfer(
        &self,
        req: TransferRequest,
        limit: Duration,
    ) -> Result<Outcome, RdmaError> {
        let id = self.submit(req)?;
        self.wait(id, limit).await
    }

    /// The next incoming session nobody has accepted yet, waiting for one.
    pub async fn accept(&self) -> Result<IncomingSession, RdmaError> {
        Ok(self.shared.station.board.accept().await?)
    }

    /// Waits until `layer` of receiving session `session` has arrived whole and verified.
    pub async fn wait_layer(&self, session: SessionId, layer: u32) -> Result<(), RdmaError> {
        Ok(self.shared.station.board.wait_layer(session, layer).await?)
    }

    /// Waits until receiving session `session` is over.
    pub async fn wait_received(&self, session: SessionId) -> Result<Received, RdmaError> {
        Ok(self.shared.station.board.wait_received(session).await?)
    }

    /// The consumer is about to compute `layer` of receiving session `session` (layers in order).
    pub fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, RdmaError> {
        let complete = self.shared.station.consume_layer(session, layer)?;
        Ok(complete)
    }

    /// Every event from now on.
    #[must_use]
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.shared.station.board.subscribe()
    }

    /// Live sessions (both roles).
    #[must_use]
    pub fn live_sessions(&self) -> usize {
        self.shared.station.engine().live_sessions()
    }

    /// Stops the driver thread and closes the endpoint (waits for the thread).
    pub fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.station.board.close();
    }
}

impl Drop for RdmaNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}
