//! A same-host node ([`ShmNode`], a [`Node`] of [`ShmDriver`]): one engine, its listener, its links and its
//! driver thread.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use tokio::sync::oneshot;
use transfer_engine::{KvLayout, MemoryRegion, PeerId, RegionHandle, RegionId, TransferRequest};

use super::memfd::SharedMemory;
use super::shared::{Pool, Shared};
use super::{ShmConfig, driver, handshake, io};
use crate::lock::lock;
use crate::node::{Driver, Node, NodeCore, driver::Sealed};
use crate::transport::{BoxFuture, PeerAddress, PeerInfo, TransportError};

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
    /// Connections, frames and units refused (see [`Node::log`]).
    pub refused: u64,
    /// Links lost (a peer exited, stalled or broke the protocol).
    pub peers_lost: u64,
}

/// One same-host node; stops its threads and removes its socket file when dropped. Its calls besides
/// [`Node`]'s: [`ShmNode::start`], the typed [`ShmNode::connect`], [`ShmNode::stats`],
/// [`ShmNode::shared_memory`], ...
pub type ShmNode = Node<ShmDriver>;

/// What a [`ShmNode`] moves bytes with: its listener, links and driver thread.
pub struct ShmDriver {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for ShmDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmDriver")
            .field("engine_id", &self.shared.engine_id())
            .field("socket_path", &self.shared.cfg.socket_path)
            .finish_non_exhaustive()
    }
}

impl Sealed for ShmDriver {}

impl Driver for ShmDriver {
    const BACKEND: &'static str = "shm";

    fn core(&self) -> &NodeCore {
        &self.shared.core
    }

    fn wake(&self) {
        self.shared.wake();
    }

    fn address(&self) -> Option<PeerAddress> {
        self.shared
            .cfg
            .socket_path
            .as_ref()
            .map(|p| PeerAddress::Shm(p.clone()))
    }

    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>> {
        Box::pin(async move {
            let PeerAddress::Shm(path) = address else {
                return Err(TransportError::cannot_reach("shm", address));
            };
            connect(&self.shared, path).await
        })
    }

    /// Host memory is copied by peers out of shared memory or by cross-memory attach; GPU memory (feature
    /// `cuda`) is exported through CUDA IPC and granted to every linked peer (the whole allocation holding
    /// it: see the `gpu` module).
    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        if memory.kind().is_host() {
            return Ok(self
                .shared
                .core
                .station
                .register_kv_region(layout, memory)?);
        }
        register_gpu_region(&self.shared, layout, memory)
    }

    fn region_unregistered(&self, id: RegionId) {
        self.shared.remove_gpu_region(id);
    }

    /// The peer must be linked and offer the destination region.
    fn check_route(&self, req: &TransferRequest) -> Result<(), TransportError> {
        match self.shared.peer_info(req.peer) {
            None => Err(TransportError::NoRoute {
                peer: req.peer,
                why: "connect to it first".into(),
            }),
            Some(info) if !info.segments.iter().any(|s| s.handle.id == req.dst_region) => {
                Err(TransportError::NoRoute {
                    peer: req.peer,
                    why: format!("it does not offer region {}", req.dst_region),
                })
            }
            Some(_) => Ok(()),
        }
    }

    /// Closes every link (peers see it go), stops the driver and the listener, removes the socket file.
    fn shutdown(&self) {
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
        self.shared.core.station.board.close();
    }
}

impl Node<ShmDriver> {
    /// Listens at the configured path (if any) and starts the driver.
    pub fn start(cfg: ShmConfig) -> Result<Self, TransportError> {
        if cfg.pull_chunk == 0 || cfg.queue_frames == 0 || cfg.max_peers == 0 {
            return Err(TransportError::config(
                "shm",
                "pull_chunk, queue_frames and max_peers must be non-zero",
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
        Ok(Node::from_driver(ShmDriver {
            shared,
            threads: Mutex::new(threads),
        }))
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.driver().shared
    }

    /// Where this node listens: what a peer passes to [`ShmNode::connect`].
    #[must_use]
    pub fn socket_path(&self) -> Option<&Path> {
        self.shared().cfg.socket_path.as_deref()
    }

    /// The engine's and the data path's counters.
    #[must_use]
    pub fn stats(&self) -> ShmStats {
        let shared = self.shared();
        let c = &shared.counters;
        ShmStats {
            engine: shared.core.station.engine().stats(),
            units_pulled: c.units_pulled.load(Ordering::Relaxed),
            units_by_cma: c.units_by_cma.load(Ordering::Relaxed),
            bytes_pulled: c.bytes_pulled.load(Ordering::Relaxed),
            frames_sent: c.frames_sent.load(Ordering::Relaxed),
            frames_dropped: c.frames_dropped.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            peers_lost: c.peers_lost.load(Ordering::Relaxed),
        }
    }

    /// `len` zeroed bytes of shared memory (a sealed memfd) for a region: every peer this node links to
    /// is granted it, so the units sent from it cost the receiver one plain copy. Register it like any
    /// memory ([`ShmNode::register_kv_region`]); memory from elsewhere is copied by cross-memory attach.
    pub fn shared_memory(&self, len: usize) -> Result<MemoryRegion, TransportError> {
        let memory = SharedMemory::create(len).map_err(io)?;
        let pool = Pool {
            address: transfer_engine::RawMemory::as_ptr(&memory) as u64,
            len: len as u64,
            fd: Arc::downgrade(memory.fd()),
        };
        let region = MemoryRegion::from_raw_memory(memory);
        self.shared().add_pool(pool);
        Ok(region)
    }

    /// Reaches the node listening at `path`: checks its credentials and that this node may copy from it,
    /// and learns its engine id and segments. A peer already linked answers from its link.
    pub async fn connect(&self, path: &Path) -> Result<PeerInfo, TransportError> {
        connect(self.shared(), path).await
    }

    /// A peer linked to this node, if any.
    #[must_use]
    pub fn peer(&self, peer: PeerId) -> Option<PeerInfo> {
        self.shared().peer_info(peer)
    }
}

#[cfg(feature = "cuda")]
fn register_gpu_region(
    shared: &Shared,
    layout: KvLayout,
    memory: MemoryRegion,
) -> Result<RegionHandle, TransportError> {
    let export = crate::cuda::ipc_export(&memory)?;
    let handle = shared.core.station.register_kv_region(layout, memory)?;
    shared.add_gpu_region(handle.id, export.base, export.len, export.handle);
    Ok(handle)
}

#[cfg(not(feature = "cuda"))]
fn register_gpu_region(
    _shared: &Shared,
    _layout: KvLayout,
    memory: MemoryRegion,
) -> Result<RegionHandle, TransportError> {
    Err(TransportError::config(
        "shm",
        format!(
            "{:?} needs CUDA IPC: {}",
            memory.kind(),
            crate::NO_GPU_SUPPORT
        ),
    ))
}

/// Reaches the node listening at `path` (see [`ShmNode::connect`]).
async fn connect(shared: &Arc<Shared>, path: &Path) -> Result<PeerInfo, TransportError> {
    if let Some(link) = shared.link_at(path) {
        return shared.peer_info(link.peer).ok_or(TransportError::Closed);
    }
    let (tx, rx) = oneshot::channel();
    let dialer = shared.clone();
    let target = path.to_owned();
    spawn("shm-dial", move || {
        let _ = tx.send(dial(&dialer, &target));
    })?;
    let limit = shared.cfg.liveness.handshake_timeout * 2;
    match tokio::time::timeout(limit, rx).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(TransportError::Closed),
        Err(_) => Err(TransportError::Timeout {
            what: format!("the handshake with {}", path.display()),
            waited: limit,
        }),
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, TransportError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| TransportError::Io {
            backend: "shm",
            message: format!("cannot start thread {name}: {e}"),
        })
}

/// Dials `path` and links to the node there.
fn dial(shared: &Arc<Shared>, path: &Path) -> Result<PeerInfo, TransportError> {
    let (stream, creds, mut welcome) = handshake::dial(shared, path)?;
    // The listener's own path is where it was reached, whatever its welcome says.
    welcome.path = Some(path.to_owned());
    let link = shared
        .admit(stream, creds, welcome, |_| Ok(()))
        .map_err(TransportError::Refused)?;
    Ok(PeerInfo {
        peer: link.peer,
        segments: link.segments.clone(),
    })
}
