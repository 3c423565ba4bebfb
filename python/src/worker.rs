//! `Worker`: the connector's worker half (vLLM's worker-role connector, one in each worker process): its
//! KV caches registered in place, its transport node, and for a role that saves the tier store and the
//! control server. Every call that waits or moves bytes releases the GIL.

use std::collections::HashMap;

use backends::tcp::TcpConfig;
use connector::KvWorker;
use connector::store::KvEvent;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::connector::{PyConnectorMetadata, addr, snapshot};
use crate::errors::{config, err};
use crate::layout::PyKvLayout;
use crate::settings::PySettings;

/// The worker half: loads and saves what the scheduler half's metadata plans.
#[pyclass(name = "Worker", module = "kv_transfer", frozen)]
pub(crate) struct PyWorker(pub(crate) KvWorker);

/// The TCP node of engine `engine_id` listening on `listen`.
fn tcp_config(engine_id: u32, listen: Option<String>) -> PyResult<TcpConfig> {
    let mut cfg = TcpConfig::with_engine_id(engine_id);
    cfg.listen = addr("listen", listen)?;
    Ok(cfg)
}

#[pymethods]
impl PyWorker {
    /// A producer and a consumer worker in this process, joined by the loopback backend; the producer
    /// serves its control channel on a free loopback port (`control_addr`).
    #[staticmethod]
    fn loopback_pair(
        py: Python<'_>,
        producer: &PySettings,
        consumer: &PySettings,
    ) -> PyResult<(PyWorker, PyWorker)> {
        let (p, c) = (producer.config().clone(), consumer.config().clone());
        let (p, c) = py.detach(|| KvWorker::loopback_pair(p, c)).map_err(err)?;
        Ok((PyWorker(p), PyWorker(c)))
    }

    /// A worker over TCP: its engine `engine_id` listens on `listen` (a role that loads must), and a role
    /// that saves serves lookups and loads on `control_listen` (a free loopback port by default).
    #[staticmethod]
    #[pyo3(signature = (settings, engine_id, listen = Some("127.0.0.1:0".to_owned()), control_listen = None))]
    fn tcp(
        py: Python<'_>,
        settings: &PySettings,
        engine_id: u32,
        listen: Option<String>,
        control_listen: Option<String>,
    ) -> PyResult<PyWorker> {
        let cfg = settings.config().clone();
        let tcp = tcp_config(engine_id, listen)?;
        let control = addr("control_listen", control_listen)?;
        py.detach(|| KvWorker::tcp(cfg, tcp, control))
            .map(PyWorker)
            .map_err(err)
    }

    /// A worker over TCP with the same-host backend beside it (Linux): a producer copies through shared
    /// memory to a consumer that names its host and listens on Unix socket `socket`, and falls back to
    /// TCP when it cannot reach it there.
    #[staticmethod]
    #[pyo3(signature = (settings, engine_id, listen = Some("127.0.0.1:0".to_owned()), socket = None, control_listen = None))]
    fn tcp_with_shm(
        py: Python<'_>,
        settings: &PySettings,
        engine_id: u32,
        listen: Option<String>,
        socket: Option<std::path::PathBuf>,
        control_listen: Option<String>,
    ) -> PyResult<PyWorker> {
        let cfg = settings.config().clone();
        let tcp = tcp_config(engine_id, listen)?;
        let shm = backends::shm::ShmConfig::new(engine_id, socket);
        let control = addr("control_listen", control_listen)?;
        py.detach(|| KvWorker::tcp_with_shm(cfg, tcp, shm, control))
            .map(PyWorker)
            .map_err(err)
    }

    /// A worker over the same-host backend (Linux): a consumer's node listens on Unix socket `socket`
    /// (required for a role that loads) and copies each unit straight out of the producer's memory.
    #[staticmethod]
    #[pyo3(signature = (settings, engine_id, socket = None, control_listen = None))]
    fn shm(
        py: Python<'_>,
        settings: &PySettings,
        engine_id: u32,
        socket: Option<std::path::PathBuf>,
        control_listen: Option<String>,
    ) -> PyResult<PyWorker> {
        let cfg = settings.config().clone();
        let shm = backends::shm::ShmConfig::new(engine_id, socket);
        let control = addr("control_listen", control_listen)?;
        py.detach(|| KvWorker::shm(cfg, shm, control))
            .map(PyWorker)
            .map_err(err)
    }

    /// A worker over RDMA (libfabric: `provider` `"auto"`, `"auto-local"`, `"tcp"`, `"shm"`, `"verbs"`,
    /// `"efa"`, on `domain` or the provider's first). Needs a build with feature `rdma`; without it the
    /// error says how to make one.
    #[staticmethod]
    #[pyo3(signature = (settings, engine_id, provider = "auto-local", domain = None, control_listen = None))]
    fn rdma(
        py: Python<'_>,
        settings: &PySettings,
        engine_id: u32,
        provider: &str,
        domain: Option<String>,
        control_listen: Option<String>,
    ) -> PyResult<PyWorker> {
        let cfg = settings.config().clone();
        let control = addr("control_listen", control_listen)?;
        rdma_worker(py, cfg, engine_id, provider, domain, control)
    }

    /// `"producer"`, `"consumer"` or `"both"`.
    #[getter]
    fn role(&self) -> &'static str {
        self.0.role().name()
    }

    /// Where a role that saves serves lookups and loads (`"IP:PORT"`).
    #[getter]
    fn control_addr(&self) -> Option<String> {
        self.0.control_addr().map(|a| a.to_string())
    }

    /// Publishes what this worker's store holds to the cluster index at `url` (`redis://host:port`),
    /// under a lease of `lease` seconds renewed in the background, until the worker is dropped.
    /// `instance`: the address others load from it by (default: its control address).
    #[pyo3(signature = (url, instance = None, lease = 5.0))]
    fn publish_to_index(&self, url: String, instance: Option<String>, lease: f64) -> PyResult<()> {
        let mut cfg = cluster::IndexConfig::new(url, instance.unwrap_or_default());
        cfg.lease = seconds("lease", lease)?;
        self.0.publish_to_index(cfg).map_err(err)
    }

    /// vLLM's `get_handshake_metadata`: this rank's place and control address, for the scheduler's
    /// `set_rank_handshakes`.
    fn rank_handshake<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let h = self.0.rank_handshake();
        let d = PyDict::new(py);
        d.set_item("rank", h.tp.rank)?;
        d.set_item("size", h.tp.size)?;
        d.set_item("control", h.control.map(|a| a.to_string()))?;
        Ok(d)
    }

    /// vLLM's `register_kv_caches`: registers `caches` in place (a torch tensor on the host or a GPU, a
    /// CUDA array, or any writable, C-contiguous buffer; held while the worker lives). Give `layout` for
    /// caches as the serving engine placed them (`KvLayout.from_vllm(...)`), or `blocks` for a
    /// layer-major pool of that many blocks per layer.
    #[pyo3(signature = (caches, layout = None, blocks = None))]
    fn register_kv_caches(
        &self,
        py: Python<'_>,
        caches: &Bound<'_, PyAny>,
        layout: Option<PyKvLayout>,
        blocks: Option<u32>,
    ) -> PyResult<()> {
        let memory = crate::objects::memory_of(caches)?;
        py.detach(|| match (layout, blocks) {
            (Some(l), None) => self.0.register_kv_layout(memory, l.0).map_err(err),
            (None, Some(b)) => self.0.register_kv_caches(memory, b).map_err(err),
            _ => Err(config("give a layout or a block count, not both")),
        })
    }

    /// vLLM's `bind_connector_metadata`.
    fn bind_connector_metadata(&self, meta: &PyConnectorMetadata) {
        self.0.bind_connector_metadata(meta.0.clone());
    }

    /// vLLM's `clear_connector_metadata`.
    fn clear_connector_metadata(&self) {
        self.0.clear_connector_metadata();
    }

    /// vLLM's `handle_preemptions`: a load of a request `meta` names as preempted is abandoned at once.
    fn handle_preemptions(&self, meta: &PyConnectorMetadata) {
        self.0.handle_preemptions(&meta.0);
    }

    /// vLLM's `start_load_kv`.
    fn start_load_kv(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.0.start_load_kv()).map_err(err)
    }

    /// vLLM's `wait_for_layer_load`.
    fn wait_for_layer_load(&self, py: Python<'_>, layer: u32) -> PyResult<()> {
        py.detach(|| self.0.wait_for_layer_load(layer)).map_err(err)
    }

    /// vLLM's `save_kv_layer`.
    fn save_kv_layer(&self, py: Python<'_>, layer: u32) -> PyResult<()> {
        py.detach(|| self.0.save_kv_layer(layer)).map_err(err)
    }

    /// vLLM's `wait_for_save`.
    fn wait_for_save(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.0.wait_for_save()).map_err(err)
    }

    /// vLLM's `get_finished`: `(finished_sending, finished_receiving)` request ids.
    fn get_finished(&self, py: Python<'_>) -> (Vec<String>, Vec<String>) {
        py.detach(|| self.0.get_finished())
    }

    /// vLLM's `get_block_ids_with_load_errors`: blocks to recompute.
    fn failed_blocks(&self) -> Vec<u32> {
        self.0.failed_blocks()
    }

    /// The store's KV events since the last call (setting `kv_events`), oldest first: `(kind, hash,
    /// parent, tokens, medium)` with kind `"stored"` or `"removed"`, hashes of 32 bytes (`parent`
    /// `None` for a prompt's first block or unknown, `tokens` empty when unknown or removed), medium
    /// vLLM's name (`"CPU"` for host memory, `"STORAGE"` for the disk tier).
    #[allow(clippy::type_complexity)]
    fn take_kv_events<'py>(
        &self,
        py: Python<'py>,
    ) -> Vec<(
        &'static str,
        Bound<'py, PyBytes>,
        Option<Bound<'py, PyBytes>>,
        Vec<u32>,
        &'static str,
    )> {
        self.0
            .take_kv_events()
            .into_iter()
            .map(|e| match e {
                KvEvent::Stored {
                    hash,
                    medium,
                    origin,
                    ..
                } => (
                    "stored",
                    PyBytes::new(py, &hash.0),
                    origin.parent.map(|p| PyBytes::new(py, &p.0)),
                    origin.tokens.to_vec(),
                    medium.vllm_name(),
                ),
                KvEvent::Removed { hash, medium, .. } => (
                    "removed",
                    PyBytes::new(py, &hash.0),
                    None,
                    Vec::new(),
                    medium.vllm_name(),
                ),
            })
            .collect()
    }

    /// KV events dropped because they were not taken in time.
    fn kv_events_dropped(&self) -> u64 {
        self.0.kv_events_dropped()
    }

    /// Why loads could not start since the last call (their blocks are failed blocks), as exceptions of
    /// their class.
    fn take_load_errors(&self) -> Vec<PyErr> {
        self.0.take_load_errors().into_iter().map(err).collect()
    }

    /// Switches to weight version `version`: a producer drops every stored block of the old one.
    fn set_weight_version(&self, py: Python<'_>, version: u64) {
        py.detach(|| self.0.set_weight_version(version));
    }

    /// Every metric as Prometheus text.
    fn prometheus(&self) -> String {
        self.0.prometheus()
    }

    /// The metrics as numbers, by name.
    fn metrics(&self) -> HashMap<&'static str, u64> {
        snapshot(&self.0.snapshot())
    }

    /// What the store's disk tier did, by name (`None` without a disk tier): blocks demoted to it and
    /// dropped on the way, promoted back and failed, recovered at start-up, and the disk's own counters.
    fn disk_stats(&self) -> Option<HashMap<&'static str, u64>> {
        let s = self.0.disk_stats()?;
        Some(HashMap::from([
            ("demoted", s.demoted),
            ("demote_dropped", s.demote_dropped),
            ("promoted", s.promoted),
            ("promote_failed", s.promote_failed),
            ("recovered", s.recovered),
            ("capacity_blocks", u64::from(s.capacity_blocks)),
            ("blocks", s.disk.blocks as u64),
            ("written", s.disk.written),
            ("dropped_queue_full", s.disk.dropped_queue_full),
            ("disk_full", s.disk.disk_full),
            ("write_errors", s.disk.write_errors),
            ("disk_hits", s.disk.disk_hits),
            ("corrupt", s.disk.corrupt),
            ("read_errors", s.disk.read_errors),
        ]))
    }
}

#[cfg(feature = "rdma")]
fn rdma_worker(
    py: Python<'_>,
    cfg: connector::ConnectorConfig,
    engine_id: u32,
    provider: &str,
    domain: Option<String>,
    control: Option<std::net::SocketAddr>,
) -> PyResult<PyWorker> {
    let rdma = crate::rdma_config(engine_id, provider, domain);
    py.detach(|| KvWorker::rdma(cfg, rdma, control))
        .map(PyWorker)
        .map_err(err)
}

#[cfg(not(feature = "rdma"))]
fn rdma_worker(
    _py: Python<'_>,
    _cfg: connector::ConnectorConfig,
    _engine_id: u32,
    _provider: &str,
    _domain: Option<String>,
    _control: Option<std::net::SocketAddr>,
) -> PyResult<PyWorker> {
    Err(crate::no_rdma())
}

/// `value` seconds as a duration, or a configuration error naming `what`.
pub(crate) fn seconds(what: &str, value: f64) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(value).map_err(|_| {
        config(format!(
            "`{what}` must be a non-negative number of seconds, not {value}"
        ))
    })
}
