//! A same-host node: one engine, its listener, its links and its driver thread. The calls mirror the TCP
//! and RDMA nodes': register caller memory, connect, submit and await transfers, accept incoming
//! sessions, await them layer by layer, subscribe to events.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{broadcast, oneshot};
use transfer_engine::{
    Event, KvLayout, MemoryRegion, PeerId, RegionHandle, RegionId, SessionId, ShapingConfig,
    TransferRequest,
};

use super::memfd::SharedMemory;
use super::shared::{Pool, Shared};
use super::{ShmConfig, ShmError, driver, handshake};
use crate::board::{IncomingSession, Outcome, Received};
use crate::lock::lock;
use crate::transport::{PeerInfo, Segment};

/// Counters of a node: the engine's and the data path's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShmStats {
    /// The engine's counters.
    pub engine: transfer_engine::Counters,
    /// Data units copied in from peers.
    pub units_pulled: u64,
    /// Of those, units copied by cross-memory attach (their source was not in granted shared memory).
    pub units_by_cma: u64,
    /// Their bytes.
    pub bytes_pulled: u64,
    /// Frames written to peers.
    pub frames_sent: u64,
    /// Frames dropped: the peer's queue was full, or it had no link (the engine resends).
    pub frames_dropped: u64,
    /// Connections, frames and units refused (see [`ShmNode::log`]).
    pub refused: u64,
    /// Links lost (a peer exited, stalled or broke the protocol).
    pub peers_lost: u64,
}

/// One same-host node; stops its threads and removes its socket file when dropped.
pub struct ShmNode {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for ShmNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmNode")
            .field("engine_id", &self.shared.engine_id)
            .field("socket_path", &self.shared.cfg.socket_path)
            .finish_non_exhaustive()
    }
}

impl ShmNode {
    /// Listens at the configured path (if any) and starts the driver.
    pub fn start(cfg: ShmConfig) -> Result<Self, ShmError> {
        if cfg.pull_chunk == 0 || cfg.queue_frames == 0 || cfg.max_peers == 0 {
            return Err(ShmError::Config(
                "pull_chunk, queue_frames and max_peers must be non-zero".into(),
            ));
        }
        let listener = cfg
            .socket_path
            .as_deref()
            .map(handshake::listen)
            .transpose()?;
        let (wake, woken) = mpsc::sync_channel(1);
        let shared = Arc::new(Shared::new(cfg, wake));
        let mut threads = Vec::new();
        let s = shared.clone();
        threads.push(spawn("shm-driver", move || driver::run(&s, &woken))?);
        if let Some(listener) = listener {
            let s = shared.clone();
            threads.push(spawn("shm-listen", move || {
                handshake::serve(&s, &listener)
            })?);
        }
        Ok(Self {
            shared,
            threads: Mutex::new(threads),
        })
    }

    /// Where this node listens: what a peer passes to [`ShmNode::connect`].
    #[must_use]
    pub fn socket_path(&self) -> Option<&Path> {
        self.shared.cfg.socket_path.as_deref()
    }

    pub(crate) fn board(&self) -> &crate::board::Board {
        &self.shared.station.board
    }

    /// This node's engine id; peers know it as `PeerId(engine_id)`.
    #[must_use]
    pub fn engine_id(&self) -> u32 {
        self.shared.engine_id
    }

    /// The engine's and the data path's counters.
    #[must_use]
    pub fn stats(&self) -> ShmStats {
        let c = &self.shared.counters;
        ShmStats {
            engine: self.shared.station.engine().stats(),
            units_pulled: c.units_pulled.load(Ordering::Relaxed),
            units_by_cma: c.units_by_cma.load(Ordering::Relaxed),
            bytes_pulled: c.bytes_pulled.load(Ordering::Relaxed),
            frames_sent: c.frames_sent.load(Ordering::Relaxed),
            frames_dropped: c.frames_dropped.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            peers_lost: c.peers_lost.load(Ordering::Relaxed),
        }
    }

    /// Links made and lost, refusals and errors, oldest first (the newest 1024).
    #[must_use]
    pub fn log(&self) -> Vec<String> {
        self.shared.log()
    }

    /// Registers the caller's `memory` as a KV region of `layout`. Host memory is copied by peers out of
    /// shared memory or by cross-memory attach; GPU memory (feature `cuda`) is exported through CUDA IPC
    /// and granted to every linked peer (the whole allocation holding it: see the `gpu` module).
    pub fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, ShmError> {
        if memory.kind().is_host() {
            return Ok(self.shared.station.register_kv_region(layout, memory)?);
        }
        self.register_gpu_region(layout, memory)
    }

    #[cfg(feature = "cuda")]
    fn register_gpu_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, ShmError> {
        let export = crate::cuda::ipc_export(&memory)?;
        let handle = self.shared.station.register_kv_region(layout, memory)?;
        self.shared
            .add_gpu_region(handle.id, export.base, export.len, export.handle);
        Ok(handle)
    }

    #[cfg(not(feature = "cuda"))]
    fn register_gpu_region(
        &self,
        _layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, ShmError> {
        Err(ShmError::Config(format!(
            "{:?} needs CUDA IPC, and this build has no `cuda` feature",
            memory.kind()
        )))
    }

    /// `len` zeroed bytes of shared memory (a sealed memfd) for a region: every peer this node links to
    /// is granted it, so the units sent from it cost the receiver one plain copy. Register it like any
    /// memory ([`ShmNode::register_kv_region`]); memory from elsewhere is copied by cross-memory attach.
    pub fn shared_memory(&self, len: usize) -> Result<MemoryRegion, ShmError> {
        let memory = SharedMemory::create(len)?;
        let pool = Pool {
            address: transfer_engine::RawMemory::as_ptr(&memory) as u64,
            len: len as u64,
            fd: Arc::downgrade(memory.fd()),
        };
        let region = MemoryRegion::from_raw_memory(memory);
        self.shared.add_pool(pool);
        Ok(region)
    }

    /// Registers a KV region of `layout` over zeroed host memory.
    pub fn kv_region(&self, layout: KvLayout) -> Result<RegionHandle, ShmError> {
        let len = usize::try_from(layout.total_bytes())
            .map_err(|_| ShmError::Config("the layout does not fit in memory".into()))?;
        self.register_kv_region(layout, MemoryRegion::zeroed(len))
    }

    /// The memory behind a registered region.
    pub fn memory(&self, id: RegionId) -> Result<MemoryRegion, ShmError> {
        Ok(self.shared.station.engine().memory(id)?.clone())
    }

    /// Unregisters a region no live session uses and hands back its memory.
    pub fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, ShmError> {
        let memory = self.shared.station.engine().unregister_region(id)?;
        lock(&self.shared.published).retain(|s| s.handle.id != id);
        self.shared.remove_gpu_region(id);
        Ok(memory)
    }

    /// Offers a registered region to peers under `name` (in hellos and welcomes from now on).
    pub fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), ShmError> {
        self.shared.station.engine().region(handle.id)?;
        let mut published = lock(&self.shared.published);
        published.retain(|s| s.name != name);
        published.push(Segment {
            name: name.to_owned(),
            handle,
        });
        Ok(())
    }

    /// Reaches the node listening at `path`: checks its credentials and that this node may copy from it,
    /// and learns its engine id and segments. A peer already linked answers from its link.
    pub async fn connect(&self, path: &Path) -> Result<PeerInfo, ShmError> {
        if let Some(link) = self.shared.link_at(path) {
            return self.shared.peer_info(link.peer).ok_or(ShmError::Closed);
        }
        let (tx, rx) = oneshot::channel();
        let shared = self.shared.clone();
        let target = path.to_owned();
        spawn("shm-dial", move || {
            let _ = tx.send(dial(&shared, &target));
        })?;
        let limit = self.shared.cfg.connect_timeout * 2;
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ShmError::Closed),
            Err(_) => Err(ShmError::Timeout {
                what: format!("the handshake with {}", path.display()),
                waited: limit,
            }),
        }
    }

    /// A peer linked to this node, if any.
    #[must_use]
    pub fn peer(&self, peer: PeerId) -> Option<PeerInfo> {
        self.shared.peer_info(peer)
    }

    /// Starts a transfer; see [`ShmNode::wait`]. The peer must be linked and offer the destination region.
    pub fn submit(&self, req: TransferRequest) -> Result<SessionId, ShmError> {
        if let Some(reason) = lock(&self.shared.unreachable).get(&req.peer) {
            return Err(ShmError::Unreachable(reason.clone()));
        }
        match self.shared.peer_info(req.peer) {
            None => {
                return Err(ShmError::NoRoute(req.peer, "connect to it first".into()));
            }
            Some(info) if !info.segments.iter().any(|s| s.handle.id == req.dst_region) => {
                return Err(ShmError::NoRoute(
                    req.peer,
                    format!("it does not offer region {}", req.dst_region),
                ));
            }
            Some(_) => {}
        }
        let id = self.shared.station.submit(req)?;
        self.shared.wake();
        Ok(id)
    }

    /// The producer of sending session `session` has written every layer below `until`.
    pub fn layers_written(&self, session: SessionId, until: u32) -> Result<(), ShmError> {
        self.shared
            .station
            .engine()
            .layers_written(session, until)?;
        self.shared.wake();
        Ok(())
    }

    /// Stops sending session `session`: every block not yet acknowledged is reported for recompute, here
    /// and at the receiver.
    pub fn cancel(&self, session: SessionId) -> Result<(), ShmError> {
        self.shared.station.engine().cancel(session)?;
        self.shared.wake();
        Ok(())
    }

    /// Stops receiving session `session`: none of its bytes is placed from now on.
    pub fn abandon_receive(&self, session: SessionId) -> Result<(), ShmError> {
        self.shared.station.abandon_receive(session)?;
        self.shared.wake();
        Ok(())
    }

    /// Sets the engine's traffic shaping for every frame from now on.
    pub fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), ShmError> {
        self.shared.station.engine().set_shaping(shaping)?;
        Ok(())
    }

    /// Waits until sending session `session` is over.
    pub async fn wait(&self, session: SessionId, limit: Duration) -> Result<Outcome, ShmError> {
        let run = self.shared.station.board.wait_sent(session);
        tokio::time::timeout(limit, run)
            .await
            .map_err(|_| ShmError::Timeout {
                what: format!("session {session}"),
                waited: limit,
            })?
            .map_err(ShmError::from)
    }

    /// Submits and waits.
    pub async fn transfer(
        &self,
        req: TransferRequest,
        limit: Duration,
    ) -> Result<Outcome, ShmError> {
        let id = self.submit(req)?;
        self.wait(id, limit).await
    }

    /// The notice of the next incoming session nobody has taken yet (the session already runs: the engine
    /// admitted it when its open arrived), waiting for one.
    pub async fn next_incoming(&self) -> Result<IncomingSession, ShmError> {
        Ok(self.shared.station.board.next_incoming().await?)
    }

    /// Waits until `layer` of receiving session `session` has arrived whole and verified.
    pub async fn wait_layer(&self, session: SessionId, layer: u32) -> Result<(), ShmError> {
        Ok(self.shared.station.board.wait_layer(session, layer).await?)
    }

    /// Waits until receiving session `session` is over.
    pub async fn wait_received(&self, session: SessionId) -> Result<Received, ShmError> {
        Ok(self.shared.station.board.wait_received(session).await?)
    }

    /// The consumer is about to compute `layer` of receiving session `session` (layers in order).
    pub fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, ShmError> {
        let complete = self.shared.station.consume_layer(session, layer)?;
        self.shared.wake();
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

    /// Stops the node: closes every link (peers see it go), stops the driver and the listener, removes
    /// the socket file. Idempotent.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake();
        let links: Vec<_> = lock(&self.shared.links).drain().map(|(_, l)| l).collect();
        for link in links {
            link.close();
        }
        let threads: Vec<_> = lock(&self.threads).drain(..).collect();
        let ran = !threads.is_empty();
        for t in threads {
            let _ = t.join();
        }
        if ran && let Some(path) = &self.shared.cfg.socket_path {
            let _ = std::fs::remove_file(path);
        }
        self.shared.station.board.close();
    }
}

impl Drop for ShmNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, ShmError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| ShmError::Config(format!("cannot start thread {name}: {e}")))
}

/// Dials `path` and links to the node there.
fn dial(shared: &Arc<Shared>, path: &Path) -> Result<PeerInfo, ShmError> {
    let (stream, creds, mut welcome) = handshake::dial(shared, path)?;
    // The listener's own path is where it was reached, whatever its welcome says.
    welcome.path = Some(path.to_owned());
    let link = shared
        .admit(stream, creds, welcome, |_| Ok(()))
        .map_err(ShmError::Refused)?;
    Ok(PeerInfo {
        peer: link.peer,
        segments: link.segments.clone(),
    })
}
