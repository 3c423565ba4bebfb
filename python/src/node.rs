//! `Node`: one engine and its I/O (loopback, TCP, same-host or RDMA), its regions, transfers and the
//! receiving side.

use std::sync::Arc;

use backends::board::{IncomingSession, Outcome, Received};
use backends::loopback::LoopbackPair;
use backends::tcp::{TcpConfig, TcpNode};
use backends::{PeerAddress, Transport};
use pyo3::prelude::*;
use transfer_engine::{
    BlockId, MemoryRegion, PeerId, RegionHandle, SessionId, TransferMode, TransferRequest,
};

use crate::layout::PyKvLayout;
use crate::{block_on, duration, err, runtime, within};

/// One engine and its I/O: a loopback end ([`PyNode::loopback_pair`]), a TCP node ([`PyNode::tcp`]), a
/// same-host node ([`PyNode::shm`]) or an RDMA node ([`PyNode::rdma`]).
#[pyclass(name = "Node", module = "kv_transfer", frozen)]
pub(crate) struct PyNode(pub(crate) Arc<dyn Transport>);

/// A region registered on this node: what transfers send from or land in.
#[pyclass(name = "Region", module = "kv_transfer", frozen)]
pub(crate) struct PyRegion {
    handle: RegionHandle,
    memory: MemoryRegion,
}

/// How a peer addresses a region (its id, access key, length and layout): from `Region.handle` or a
/// peer's published segments.
#[pyclass(
    name = "RegionHandle",
    module = "kv_transfer",
    frozen,
    skip_from_py_object
)]
#[derive(Clone)]
pub(crate) struct PyRegionHandle(pub(crate) RegionHandle);

/// How a session ended: blocks to recompute (empty when all arrived) and why.
#[pyclass(name = "Outcome", module = "kv_transfer", frozen, get_all)]
pub(crate) struct PyOutcome {
    /// The session.
    session: u64,
    /// `(layer, block)` of every block that did not arrive intact: recompute them.
    recompute: Vec<(u32, u32)>,
    /// Why blocks were not delivered, when the peer refused or was lost.
    reason: Option<String>,
    /// Seconds from submit until the sender learned the end (sending sessions; `None` receiving).
    elapsed: Option<f64>,
}

/// An incoming session: who sends it and where it lands.
#[pyclass(name = "Incoming", module = "kv_transfer", frozen, get_all)]
pub(crate) struct PyIncoming {
    /// The session.
    session: u64,
    /// The sender's engine id.
    peer: u64,
    /// The local region it lands in.
    region: u32,
    /// The layers that will arrive, `(start, end)`.
    layers: (u32, u32),
    /// The destination blocks within each layer.
    blocks: Vec<u32>,
}

fn blocks(ids: &[BlockId]) -> Vec<(u32, u32)> {
    ids.iter().map(|b| (b.layer, b.block)).collect()
}

impl From<Outcome> for PyOutcome {
    fn from(o: Outcome) -> Self {
        Self {
            session: o.session.0,
            recompute: blocks(&o.recompute),
            reason: o.reason,
            elapsed: Some(o.elapsed.as_secs_f64()),
        }
    }
}

impl From<Received> for PyOutcome {
    fn from(r: Received) -> Self {
        Self {
            session: r.incoming.session.0,
            recompute: blocks(&r.recompute),
            reason: r.reason,
            elapsed: None,
        }
    }
}

impl From<IncomingSession> for PyIncoming {
    fn from(i: IncomingSession) -> Self {
        Self {
            session: i.session.0,
            peer: i.peer.0,
            region: i.region.0,
            layers: (i.layers.start, i.layers.end),
            blocks: i.blocks,
        }
    }
}

/// The mode called `mode`, with `slice_bytes` slices where it has slices.
fn mode(mode: &str, slice_bytes: u32) -> PyResult<TransferMode> {
    Ok(match mode {
        "exclusive" => TransferMode::Exclusive,
        "packetized" => TransferMode::Packetized { slice_bytes },
        "auto" => TransferMode::Auto {
            slice_bytes,
            exclusive_min_bytes: transfer_engine::DEFAULT_EXCLUSIVE_MIN_BYTES,
        },
        _ => {
            return Err(crate::errors::config(format!(
                "unknown mode {mode:?}: use exclusive, packetized or auto"
            )));
        }
    })
}

#[pymethods]
impl PyNode {
    /// Two engines in this process, joined in memory: `(producer, consumer)`.
    #[staticmethod]
    fn loopback_pair() -> (PyNode, PyNode) {
        let (a, b) = LoopbackPair::with_defaults().into_nodes();
        (PyNode(Arc::new(a)), PyNode(Arc::new(b)))
    }

    /// A TCP node of engine `engine_id`, listening on `listen` (`"IP:PORT"`; `None`: it only dials).
    #[staticmethod]
    #[pyo3(signature = (engine_id, listen = Some("127.0.0.1:0".to_owned())))]
    fn tcp(py: Python<'_>, engine_id: u32, listen: Option<String>) -> PyResult<PyNode> {
        let listen = listen
            .map(|a| a.parse())
            .transpose()
            .map_err(|e| crate::errors::config(format!("listen: {e}")))?;
        let mut cfg = TcpConfig::with_engine_id(engine_id);
        cfg.listen = listen;
        let node = block_on(py, TcpNode::start(cfg)).map_err(err)?;
        Ok(PyNode(Arc::new(node)))
    }

    /// A same-host node of engine `engine_id` (Linux), listening on Unix socket `socket` (a path; made
    /// mode 0600, a stale socket file there replaced; `None`: it only dials). Peers on this host reach
    /// it at `"shm:PATH"`; the receiving node copies each unit out of the sender's memory.
    #[staticmethod]
    #[pyo3(signature = (engine_id, socket = None))]
    fn shm(py: Python<'_>, engine_id: u32, socket: Option<std::path::PathBuf>) -> PyResult<PyNode> {
        let cfg = backends::shm::ShmConfig::new(engine_id, socket);
        let node = py
            .detach(|| backends::shm::ShmNode::start(cfg))
            .map_err(err)?;
        Ok(PyNode(Arc::new(node)))
    }

    /// An RDMA node of engine `engine_id` over libfabric: `provider` `"auto"` (efa, then verbs, then tcp),
    /// `"auto-local"` (shm too, for peers on this host) or a name (`"verbs"`, `"efa"`, `"tcp"`, `"shm"`);
    /// `domain` the device or interface (`"mlx5_0"`, `"lo"`; `None`: the provider's first). Peers reach it
    /// at its `address` (`"rdma:PROVIDER:HEX"`). Needs a build with feature `rdma`; without it the error says how.
    #[staticmethod]
    #[pyo3(signature = (engine_id, provider = "auto-local", domain = None))]
    fn rdma(
        py: Python<'_>,
        engine_id: u32,
        provider: &str,
        domain: Option<String>,
    ) -> PyResult<PyNode> {
        rdma_node(py, engine_id, provider, domain)
    }

    /// The backend's name: `loopback`, `tcp`, `shm` or `rdma`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.0.backend()
    }

    /// This node's engine id (peers know it by it).
    #[getter]
    fn engine_id(&self) -> u32 {
        self.0.engine_id()
    }

    /// Where peers reach this node (`"IP:PORT"` for TCP, `"loopback"`), or `None`.
    #[getter]
    fn address(&self) -> Option<String> {
        self.0.address().map(|a| a.to_string())
    }

    /// Registers the memory `buffer` holds, in place, as a KV region of `layout`: a writable,
    /// C-contiguous host buffer (`bytearray`, numpy arrays, `memoryview`), a torch tensor (host or CUDA,
    /// any dtype), or in a build with `"cuda"` in `FEATURES` any contiguous CUDA array
    /// (`__cuda_array_interface__`). The buffer is held, exported, while the region lives.
    fn register(
        &self,
        py: Python<'_>,
        layout: &PyKvLayout,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<PyRegion> {
        let memory = crate::objects::memory_of(buffer)?;
        if (memory.len() as u64) < layout.0.total_bytes() {
            return Err(crate::errors::config(format!(
                "a buffer of {} bytes is smaller than the layout's {}",
                memory.len(),
                layout.0.total_bytes()
            )));
        }
        py.detach(|| self.register_memory(layout, memory))
    }

    /// Registers a zeroed region the engine allocates, of `layout`'s size.
    fn register_zeroed(&self, layout: &PyKvLayout) -> PyResult<PyRegion> {
        let len = usize::try_from(layout.0.total_bytes()).map_err(err)?;
        self.register_memory(layout, MemoryRegion::zeroed(len))
    }

    /// Offers `region` to peers under `name`.
    fn publish(&self, name: &str, region: &PyRegion) -> PyResult<()> {
        self.0.publish_segment(name, region.handle).map_err(err)
    }

    /// Reaches the node at `address` and returns `(peer, segments)`: its engine id and the regions it
    /// publishes, by name.
    #[pyo3(signature = (address, timeout = 10.0))]
    fn connect(
        &self,
        py: Python<'_>,
        address: &str,
        timeout: f64,
    ) -> PyResult<(u64, Vec<(String, PyRegionHandle)>)> {
        let addr: PeerAddress = address.parse().map_err(err)?;
        let transport = self.0.clone();
        let info = within(py, timeout, "connect", async move {
            transport.connect(&addr).await.map_err(err)
        })?;
        let segments = info
            .segments
            .into_iter()
            .map(|s| (s.name, PyRegionHandle(s.handle)))
            .collect();
        Ok((info.peer.0, segments))
    }

    /// Starts sending `src`'s blocks to `dst` on `peer`: every block of every layer (blocks `None`), or
    /// `src_blocks[i]` into `dst_blocks[i]` for layers `layers` (`(start, end)`, default all). Returns the
    /// session id; `wait` reports how it ended.
    #[pyo3(signature = (peer, src, dst, src_blocks = None, dst_blocks = None, layers = None, mode = "auto", slice_bytes = 65536, prefetch_depth = None, deadline = None))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        peer: u64,
        src: &PyRegion,
        dst: &PyRegionHandle,
        src_blocks: Option<Vec<u32>>,
        dst_blocks: Option<Vec<u32>>,
        layers: Option<(u32, u32)>,
        mode: &str,
        slice_bytes: u32,
        prefetch_depth: Option<u32>,
        deadline: Option<f64>,
    ) -> PyResult<u64> {
        let peer = PeerId(peer);
        let req = match (src_blocks, dst_blocks) {
            (None, None) if layers.is_none() => TransferRequest::whole(peer, &src.handle, &dst.0),
            (s, d) => {
                let all = |h: &RegionHandle| -> Vec<u32> {
                    h.layout
                        .map_or(Vec::new(), |l| (0..l.blocks_per_layer).collect())
                };
                let layers = layers.map_or_else(
                    || 0..src.handle.layout.map_or(0, |l| l.layers),
                    |(a, b)| a..b,
                );
                TransferRequest::blocks(
                    peer,
                    &src.handle,
                    s.unwrap_or_else(|| all(&src.handle)),
                    &dst.0,
                    d.unwrap_or_else(|| all(&dst.0)),
                    layers,
                )
            }
        }
        .map_err(err)?;
        let mut req = req.with_mode(self::mode(mode, slice_bytes)?);
        if let Some(depth) = prefetch_depth {
            req = req.with_prefetch_depth(depth);
        }
        if let Some(s) = deadline {
            req = req.with_deadline(duration(s)?);
        }
        self.0.submit(req).map(|s| s.0).map_err(err)
    }

    /// Waits at most `timeout` seconds until sending session `session` is over.
    #[pyo3(signature = (session, timeout = 60.0))]
    fn wait(&self, py: Python<'_>, session: u64, timeout: f64) -> PyResult<PyOutcome> {
        let limit = duration(timeout)?;
        let transport = self.0.clone();
        block_on(py, async move {
            transport.wait(SessionId(session), limit).await
        })
        .map(PyOutcome::from)
        .map_err(err)
    }

    /// Stops sending session `session`; its unacknowledged blocks are recomputed.
    fn cancel(&self, session: u64) -> PyResult<()> {
        self.0.cancel(SessionId(session)).map_err(err)
    }

    /// The next incoming session, waiting at most `timeout` seconds.
    #[pyo3(signature = (timeout = 60.0))]
    fn next_incoming(&self, py: Python<'_>, timeout: f64) -> PyResult<PyIncoming> {
        let transport = self.0.clone();
        within(py, timeout, "next_incoming", async move {
            transport
                .next_incoming()
                .await
                .map(PyIncoming::from)
                .map_err(err)
        })
    }

    /// The consumer is about to compute `layer` of receiving session `session`: moves its prefetch
    /// window. Returns whether the layer is already whole.
    fn consume_layer(&self, session: u64, layer: u32) -> PyResult<bool> {
        self.0.consume_layer(SessionId(session), layer).map_err(err)
    }

    /// Waits at most `timeout` seconds until `layer` of receiving session `session` is whole and
    /// verified; raises if the session ended without it (the message names the blocks).
    #[pyo3(signature = (session, layer, timeout = 60.0))]
    fn wait_layer(&self, py: Python<'_>, session: u64, layer: u32, timeout: f64) -> PyResult<()> {
        let transport = self.0.clone();
        within(py, timeout, "wait_layer", async move {
            transport
                .wait_announced(SessionId(session))
                .await
                .map_err(err)?;
            transport
                .wait_layer(SessionId(session), layer)
                .await
                .map_err(err)
        })
    }

    /// Waits at most `timeout` seconds until receiving session `session` is over.
    #[pyo3(signature = (session, timeout = 60.0))]
    fn wait_received(&self, py: Python<'_>, session: u64, timeout: f64) -> PyResult<PyOutcome> {
        let transport = self.0.clone();
        within(py, timeout, "wait_received", async move {
            transport
                .wait_announced(SessionId(session))
                .await
                .map_err(err)?;
            transport
                .wait_received(SessionId(session))
                .await
                .map(PyOutcome::from)
                .map_err(err)
        })
    }

    /// The engine's counters, by name.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = self.0.counters();
        vec![
            ("bytes_sent", c.bytes_sent),
            ("bytes_received", c.bytes_received),
            ("bytes_acked", c.bytes_acked),
            ("retransmits", c.retransmits),
            ("checksum_failures", c.checksum_failures),
            ("blocks_delivered", c.blocks_delivered),
            ("recompute_blocks", c.recompute_blocks),
        ]
    }

    /// Live sessions, both roles.
    fn live_sessions(&self) -> usize {
        self.0.live_sessions()
    }

    /// Stops the node (idempotent; dropping it does too).
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| {
            let _guard = runtime().enter();
            self.0.shutdown();
        });
    }
}

impl PyNode {
    fn register_memory(&self, layout: &PyKvLayout, memory: MemoryRegion) -> PyResult<PyRegion> {
        let handle = self
            .0
            .register_kv_region(layout.0, memory.clone())
            .map_err(err)?;
        Ok(PyRegion { handle, memory })
    }
}

impl Drop for PyNode {
    fn drop(&mut self) {
        // A TCP node stops its tasks on shutdown, which needs the runtime.
        let _guard = runtime().enter();
        self.0.shutdown();
    }
}

#[pymethods]
impl PyRegion {
    /// How peers address this region.
    #[getter]
    fn handle(&self) -> PyRegionHandle {
        PyRegionHandle(self.handle)
    }

    /// The region's id on its node.
    #[getter]
    fn id(&self) -> u32 {
        self.handle.id.0
    }

    /// Bytes of the region.
    #[getter]
    fn nbytes(&self) -> usize {
        self.memory.len()
    }

    /// A copy of `length` bytes at `offset`, read under the region's locks (safe while sessions run).
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
        length: usize,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let end = offset
            .checked_add(length)
            .ok_or_else(|| crate::errors::config("offset + length overflows"))?;
        // The read waits on the region's locks (a session placing into it), so without the GIL.
        let bytes = py.detach(|| self.memory.read(offset..end).map(|b| b.to_vec()));
        Ok(pyo3::types::PyBytes::new(py, &bytes.map_err(err)?))
    }
}

#[pymethods]
impl PyRegionHandle {
    /// The region's id on its owner.
    #[getter]
    fn id(&self) -> u32 {
        self.0.id.0
    }

    /// Bytes of the region.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.0.len
    }

    /// The region's KV layout, if it has one.
    #[getter]
    fn layout(&self) -> Option<PyKvLayout> {
        self.0.layout.map(PyKvLayout)
    }
}

#[cfg(feature = "rdma")]
fn rdma_node(
    py: Python<'_>,
    engine_id: u32,
    provider: &str,
    domain: Option<String>,
) -> PyResult<PyNode> {
    let cfg = crate::rdma_config(engine_id, provider, domain);
    let node = py
        .detach(|| backends::rdma::RdmaNode::start(cfg))
        .map_err(err)?;
    Ok(PyNode(Arc::new(node)))
}

#[cfg(not(feature = "rdma"))]
fn rdma_node(
    _py: Python<'_>,
    _engine_id: u32,
    _provider: &str,
    _domain: Option<String>,
) -> PyResult<PyNode> {
    Err(crate::no_rdma())
}
