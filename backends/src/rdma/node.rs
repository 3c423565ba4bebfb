//! An RDMA node ([`RdmaNode`], a [`Node`] of [`RdmaDriver`]): one engine, its registered regions, one
//! libfabric endpoint and the driver thread that owns it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::oneshot;
use transfer_engine::{
    KvLayout, MemoryKind, MemoryRegion, PeerId, RegionHandle, RegionId, SessionId, TransferRequest,
};

use super::ffi::{DmaBuffer, Endpoint, ProviderInfo};
use super::provider::resolve;
use super::shared::{Command, Counters, NodeStats, PeerInfo, Shared, ToRegister, lock, peer_info};
use super::units::UnitCopies;
use super::{RdmaConfig, driver};
use crate::node::{Driver, Node, NodeCore, driver::Sealed};
use crate::transport::{BoxFuture, PeerAddress, TransportError};

/// One RDMA node; stops its driver thread and closes its endpoint when dropped. Its calls besides
/// [`Node`]'s: [`RdmaNode::start`], the typed [`RdmaNode::connect`], [`RdmaNode::address`],
/// [`RdmaNode::stats`], ...
pub type RdmaNode = Node<RdmaDriver>;

/// What an [`RdmaNode`] moves bytes with: its endpoint, driver thread and the watch over it.
pub struct RdmaDriver {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The watch over the driver (see `stuck.rs`).
    watch: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for RdmaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaDriver")
            .field("engine_id", &self.shared.engine_id())
            .field("provider", &self.shared.info)
            .finish_non_exhaustive()
    }
}

impl Sealed for RdmaDriver {}

/// The driver thread polls the engine (every `IDLE_WAIT` at most, at once after a submit or command), so
/// commands need no wake-up.
impl Driver for RdmaDriver {
    const BACKEND: &'static str = "rdma";

    fn core(&self) -> &NodeCore {
        &self.shared.core
    }

    fn address(&self) -> Option<PeerAddress> {
        Some(PeerAddress::Rdma {
            provider: Some(self.shared.info.provider.clone()),
            name: self.shared.name.clone(),
        })
    }

    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>> {
        Box::pin(async move {
            let PeerAddress::Rdma { provider, name } = address else {
                return Err(TransportError::cannot_reach("rdma", address));
            };
            let ours = &self.shared.info.provider;
            if let Some(theirs) = provider.as_ref().filter(|p| *p != ours) {
                return Err(TransportError::Unsupported {
                    backend: "rdma",
                    what: format!(
                        "reach a node on provider {theirs} from one on {ours}: start both on one provider"
                    ),
                });
            }
            connect(&self.shared, name).await
        })
    }

    /// Registers the caller's `memory` as a KV region of `layout`, with the engine and once with the
    /// provider: a host region through a host mirror of its size (units copied in and out under the
    /// region's locks), unless [`super::RdmaConfig::host_memory`] grants it in place; a GPU region in
    /// place on a provider with `FI_HMEM` when asked for, through a mirror otherwise.
    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        let staged = match memory.kind() {
            MemoryKind::Device { ordinal } => {
                UnitCopies::check_device(ordinal)?;
                !(self.shared.cfg.gpu_memory && self.shared.info.hmem)
            }
            MemoryKind::Host | MemoryKind::PinnedHost => {
                self.shared.cfg.host_memory == super::HostMemoryAccess::Mirrored
            }
        };
        let mirror = staged.then(|| Arc::new(DmaBuffer::zeroed(memory.len())));
        let (tx, rx) = mpsc::channel();
        let registered = match &mirror {
            Some(mirror) => ToRegister::Mirror(mirror.clone()),
            None => ToRegister::InPlace(memory.clone()),
        };
        self.shared.command(Command::Register(registered, tx));
        let local = driver_reply(&self.shared, &rx)??;
        match self.shared.core.station.register_kv_region(layout, memory) {
            Ok(handle) => {
                if let Some(mirror) = mirror {
                    lock(&self.shared.mirrors).insert(handle.id, mirror);
                }
                lock(&self.shared.regions).insert(handle.id, local);
                Ok(handle)
            }
            Err(e) => {
                self.shared.command(Command::Deregister(local.mr));
                Err(e.into())
            }
        }
    }

    /// The region leaves the provider too.
    fn region_unregistered(&self, id: RegionId) {
        if let Some(local) = lock(&self.shared.regions).remove(&id) {
            self.shared.command(Command::Deregister(local.mr));
        }
        lock(&self.shared.mirrors).remove(&id);
    }

    /// The peer must have been reached, have answered, and offer the destination region; a node whose
    /// driver is stuck in a provider call starts nothing.
    fn check_route(&self, req: &TransferRequest) -> Result<(), TransportError> {
        if let Some(quiet) = self.shared.stuck() {
            return Err(Shared::stuck_error(quiet));
        }
        let routes = lock(&self.shared.routes);
        let route = routes
            .get(&req.peer)
            .ok_or_else(|| TransportError::NoRoute {
                peer: req.peer,
                why: "connect to it first".into(),
            })?;
        if route.write_tag.is_none() {
            return Err(TransportError::NoRoute {
                peer: req.peer,
                why: "its welcome has not arrived yet".into(),
            });
        }
        if !route.segments.iter().any(|s| s.handle.id == req.dst_region) {
            return Err(TransportError::NoRoute {
                peer: req.peer,
                why: format!("it does not offer region {}", req.dst_region),
            });
        }
        Ok(())
    }

    /// The session's destination is recorded under the engine's lock, before the driver can poll it.
    fn start_session(&self, req: TransferRequest) -> Result<SessionId, TransportError> {
        let (dst, layout) = (req.dst_region, req.dst_layout);
        let mut sessions = lock(&self.shared.sessions);
        let id = self.shared.core.station.submit(req)?;
        sessions.insert(id, (dst, layout));
        drop(sessions);
        Ok(id)
    }

    /// Stops the driver thread and closes the endpoint (waits for the thread). Idempotent. A driver
    /// stuck inside a provider call (see [`super::RdmaConfig::stuck_after`]) is not waited for: it is
    /// left behind with the endpoint it owns, which stays open.
    fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(watch) = lock(&self.watch).take() {
            watch.thread().unpark();
            let _ = watch.join();
        }
        let thread = lock(&self.thread).take();
        if let Some(t) = thread {
            while !t.is_finished() && self.shared.stuck().is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                self.shared.failed(
                    None,
                    "shutdown: the driver is stuck inside a provider call; left behind".into(),
                );
            }
        }
        // Commands the driver never took are dropped: their callers see the node closed.
        lock(&self.shared.commands).clear();
        self.shared.core.station.board.close();
    }
}

impl Node<RdmaDriver> {
    /// Opens an endpoint on the configured provider and starts the node's driver thread.
    pub fn start(cfg: RdmaConfig) -> Result<Self, TransportError> {
        if cfg.window_units == 0 || cfg.window_bytes == 0 || cfg.max_write_bytes == 0 {
            return Err(TransportError::config(
                "rdma",
                "the window and the largest write must be non-zero",
            ));
        }
        if cfg.slot_bytes < 256 || cfg.send_slots == 0 || cfg.recv_slots == 0 {
            return Err(TransportError::config(
                "rdma",
                "message slots must be at least 256 bytes, and there must be some",
            ));
        }
        let (provider, domain) = resolve(&cfg.provider, cfg.domain.as_deref(), cfg.gpu_memory)?;
        let ep = Endpoint::open(
            &provider,
            domain.as_deref(),
            cfg.send_slots,
            cfg.recv_slots,
            cfg.slot_bytes,
            cfg.gpu_memory,
        )?;
        let shared = Arc::new(Shared {
            core: NodeCore::new("rdma", cfg.engine.clone()),
            info: ep.info().clone(),
            name: ep.name()?,
            cfg,
            commands: Mutex::default(),
            stop: AtomicBool::new(false),
            regions: Mutex::default(),
            mirrors: Mutex::default(),
            routes: Mutex::default(),
            sessions: Mutex::default(),
            counters: Counters::default(),
            beat: super::beat::Beat::default(),
        });
        let driver_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rdma-{}", shared.engine_id()))
            .spawn(move || driver::run(ep, &driver_shared))
            .map_err(|e| super::own(format!("cannot start the driver thread: {e}")))?;
        let node = Node::from_driver(RdmaDriver {
            shared,
            thread: Mutex::new(Some(thread)),
            watch: Mutex::new(None),
        });
        let watched = node.shared().clone();
        let watch = std::thread::Builder::new()
            .name(format!("rdma-watch-{}", node.shared().engine_id()))
            .spawn(move || super::stuck::watch(&watched))
            .map_err(|e| super::own(format!("cannot start the driver's watch: {e}")))?;
        *lock(&node.driver().watch) = Some(watch);
        Ok(node)
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.driver().shared
    }

    /// This node's endpoint address: what a peer passes to [`RdmaNode::connect`].
    #[must_use]
    pub fn address(&self) -> &[u8] {
        &self.shared().name
    }

    /// The provider and domain in use.
    #[must_use]
    pub fn provider(&self) -> &ProviderInfo {
        &self.shared().info
    }

    /// The engine's and the data path's counters.
    #[must_use]
    pub fn stats(&self) -> NodeStats {
        let c = &self.shared().counters;
        NodeStats {
            engine: self.shared().core.station.engine().stats(),
            writes: c.writes.load(Ordering::Relaxed),
            write_errors: c.write_errors.load(Ordering::Relaxed),
            remote_writes: c.remote_writes.load(Ordering::Relaxed),
            messages_sent: c.messages_sent.load(Ordering::Relaxed),
            messages_received: c.messages_received.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
        }
    }

    /// Reaches the node at endpoint address `address` (its [`RdmaNode::address`]): exchanges addresses,
    /// tags and published regions.
    pub async fn connect(&self, address: &[u8]) -> Result<PeerInfo, TransportError> {
        connect(self.shared(), address).await
    }

    /// A peer that connected to this node or that this node reached, if known.
    #[must_use]
    pub fn peer(&self, peer: PeerId) -> Option<PeerInfo> {
        lock(&self.shared().routes)
            .get(&peer)
            .map(|r| peer_info(peer, &r.segments))
    }
}

/// Reaches the node at endpoint address `address` (see [`RdmaNode::connect`]).
async fn connect(shared: &Shared, address: &[u8]) -> Result<PeerInfo, TransportError> {
    let (tx, rx) = oneshot::channel();
    shared.command(Command::Connect(address.to_vec(), tx));
    let limit = shared.cfg.liveness.handshake_timeout;
    match tokio::time::timeout(limit, rx).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(TransportError::Closed),
        Err(_) => Err(TransportError::Timeout {
            what: "the hello/welcome exchange".into(),
            waited: limit,
        }),
    }
}

/// The driver's answer on `rx`; [`TransportError::Closed`] when it stopped, the stuck error when it is
/// stuck in a provider call (see [`super::RdmaConfig::stuck_after`]).
fn driver_reply<T>(shared: &Shared, rx: &mpsc::Receiver<T>) -> Result<T, TransportError> {
    loop {
        match rx.recv_timeout(super::stuck::TICK) {
            Ok(answer) => return Ok(answer),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(TransportError::Closed),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(quiet) = shared.stuck() {
                    return Err(Shared::stuck_error(quiet));
                }
            }
        }
    }
}
