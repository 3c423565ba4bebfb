//! `Connector`: the KV connector shaped after vLLM's v1 connector, one call for each of vLLM's.

use std::collections::HashMap;

use backends::tcp::TcpConfig;
use connector::{
    ConnectorConfig, ConnectorMetadata, KvConnector, KvRequest, KvTransferParams, RequestExtras,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict};

use crate::layout::PyKvLayout;
use crate::settings::config;
use crate::{buffer, err};

fn addr(what: &str, a: Option<String>) -> PyResult<Option<std::net::SocketAddr>> {
    a.map(|a| a.parse())
        .transpose()
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

/// The control addresses every remote connector takes: where a producer serves, whom a consumer asks.
type ControlAddrs = (Option<std::net::SocketAddr>, Option<std::net::SocketAddr>);

fn control_addrs(
    control_listen: Option<String>,
    producer: Option<String>,
) -> PyResult<ControlAddrs> {
    Ok((
        addr("control_listen", control_listen)?,
        addr("producer", producer)?,
    ))
}

/// The TCP node of engine `engine_id` listening on `listen`, as `Connector.tcp*` set it up.
fn tcp_config(engine_id: u32, listen: Option<String>) -> PyResult<TcpConfig> {
    Ok({
        let mut cfg = TcpConfig::with_engine_id(engine_id);
        cfg.listen = addr("listen", listen)?;
        cfg
    })
}

/// The scheduler's plan for one step (vLLM's `KVConnectorMetadata`), handed to each worker's
/// `bind_connector_metadata`.
#[pyclass(name = "ConnectorMetadata", module = "kv_transfer", frozen)]
pub(crate) struct PyConnectorMetadata(ConnectorMetadata);

#[pymethods]
impl PyConnectorMetadata {
    /// The plan as JSON (to hand it to another process).
    fn to_json(&self) -> String {
        self.0.to_json()
    }

    /// A plan from [`PyConnectorMetadata::to_json`].
    #[staticmethod]
    fn from_json(json: &str) -> PyResult<Self> {
        ConnectorMetadata::from_json(json).map(Self).map_err(err)
    }

    /// Requests with loads planned.
    #[getter]
    fn loads(&self) -> Vec<String> {
        self.0.loads.iter().map(|s| s.request.clone()).collect()
    }

    /// Requests with saves planned.
    #[getter]
    fn saves(&self) -> Vec<String> {
        self.0.saves.iter().map(|s| s.request.clone()).collect()
    }
}

/// A KV connector: the scheduler-side and worker-side calls of vLLM's v1 connector, one to one. Every
/// waiting call releases the GIL.
#[pyclass(name = "Connector", module = "kv_transfer", frozen)]
pub(crate) struct PyConnector(KvConnector);

#[pymethods]
impl PyConnector {
    /// A producer and a consumer in this process, joined by the loopback backend.
    #[staticmethod]
    fn loopback_pair(
        producer: &Bound<'_, PyDict>,
        consumer: &Bound<'_, PyDict>,
    ) -> PyResult<(PyConnector, PyConnector)> {
        let (p, c) =
            KvConnector::loopback_pair(config(producer)?, config(consumer)?).map_err(err)?;
        Ok((PyConnector(p), PyConnector(c)))
    }

    /// The scheduler half alone (vLLM's scheduler-role connector, in the engine-core process): lookups
    /// and plans, no KV moved, no store.
    #[staticmethod]
    fn scheduler(py: Python<'_>, settings: &Bound<'_, PyDict>) -> PyResult<PyConnector> {
        let cfg = config(settings)?;
        py.detach(|| KvConnector::scheduler(cfg))
            .map(PyConnector)
            .map_err(err)
    }

    /// A connector over TCP: its engine `engine_id` listens on `listen` (consumers must), a producer
    /// serves lookups and loads on `control_listen`, a consumer asks `producer` by default.
    #[staticmethod]
    #[pyo3(signature = (settings, engine_id, listen = Some("127.0.0.1:0".to_owned()), control_listen = None, producer = None))]
    fn tcp(
        py: Python<'_>,
        settings: &Bound<'_, PyDict>,
        engine_id: u32,
        listen: Option<String>,
        control_listen: Option<String>,
        producer: Option<String>,
    ) -> PyResult<PyConnector> {
        let cfg = config(settings)?;
        let tcp = tcp_config(engine_id, listen)?;
        let (control, producer) = control_addrs(control_listen, producer)?;
        py.detach(|| KvConnector::tcp(cfg, tcp, control, producer))
            .map(PyConnector)
            .map_err(err)
    }

    /// A connector over TCP for remote peers with the same-host backend beside it (Linux) for peers on
    /// this host: a producer copies through shared memory to a consumer that names its host and listens on
    /// Unix socket `socket`, and falls back to TCP when it cannot reach it there. `listen`,
    /// `control_listen` and `producer` are as in [`PyConnector::tcp`]; the KV bandwidth cap applies to TCP.
    #[staticmethod]
    #[pyo3(signature = (settings, engine_id, listen = Some("127.0.0.1:0".to_owned()), socket = None, control_listen = None, producer = None))]
    fn tcp_with_shm(
        py: Python<'_>,
        settings: &Bound<'_, PyDict>,
        engine_id: u32,
        listen: Option<String>,
        socket: Option<std::path::PathBuf>,
        control_listen: Option<String>,
        producer: Option<String>,
    ) -> PyResult<PyConnector> {
        let cfg = config(settings)?;
        let tcp = tcp_config(engine_id, listen)?;
        let shm = backends::shm::ShmConfig::new(engine_id, socket);
        let (control, producer) = control_addrs(control_listen, producer)?;
        py.detach(|| KvConnector::tcp_with_shm(cfg, tcp, shm, control, producer))
            .map(PyConnector)
            .map_err(err)
    }

    /// A connector over the same-host backend (Linux; producer and consumers on one host), with the same
    /// control channel as [`PyConnector::tcp`]. A consumer's node listens on Unix socket `socket`
    /// (required for a role that loads) and copies each unit straight out of the producer's memory.
    #[staticmethod]
    #[pyo3(signature = (settings, engine_id, socket = None, control_listen = None, producer = None))]
    fn shm(
        py: Python<'_>,
        settings: &Bound<'_, PyDict>,
        engine_id: u32,
        socket: Option<std::path::PathBuf>,
        control_listen: Option<String>,
        producer: Option<String>,
    ) -> PyResult<PyConnector> {
        let cfg = config(settings)?;
        let shm = backends::shm::ShmConfig::new(engine_id, socket);
        let (control, producer) = control_addrs(control_listen, producer)?;
        py.detach(|| KvConnector::shm(cfg, shm, control, producer))
            .map(PyConnector)
            .map_err(err)
    }

    /// A connector over RDMA (libfabric: `provider` `"auto"`, `"auto-local"` for peers on this host,
    /// `"tcp"`, `"shm"`, `"verbs"`, `"efa"`, on `domain` or the provider's first), with the same control
    /// channel as [`PyConnector::tcp`]. Needs a build with feature `rdma`; without it the error says how
    /// to make one.
    #[staticmethod]
    #[pyo3(signature = (settings, engine_id, provider = "auto-local", domain = None, control_listen = None, producer = None))]
    fn rdma(
        py: Python<'_>,
        settings: &Bound<'_, PyDict>,
        engine_id: u32,
        provider: &str,
        domain: Option<String>,
        control_listen: Option<String>,
        producer: Option<String>,
    ) -> PyResult<PyConnector> {
        let cfg = config(settings)?;
        let (control, producer) = control_addrs(control_listen, producer)?;
        rdma_connector(py, cfg, engine_id, provider, domain, control, producer)
    }

    /// `"producer"`, `"consumer"` or `"both"`.
    #[getter]
    fn role(&self) -> &'static str {
        self.0.role().name()
    }

    /// Where a producer serves lookups and loads (`"IP:PORT"`), for consumers and transfer parameters.
    #[getter]
    fn control_addr(&self) -> Option<String> {
        self.0.control_addr().map(|a| a.to_string())
    }

    /// Registers the worker's KV caches in place (use `kv_transfer.register_kv_caches`, which takes any
    /// writable buffer or CUDA array): `layout` as the engine placed them, or `blocks` blocks per layer
    /// layer-major; `device` is the CUDA ordinal of GPU KV caches, `None` for host memory.
    #[pyo3(signature = (address, nbytes, keepalive, layout = None, blocks = None, device = None))]
    fn _register_kv_caches(
        &self,
        address: usize,
        nbytes: usize,
        keepalive: Py<PyAny>,
        layout: Option<PyKvLayout>,
        blocks: Option<u32>,
        device: Option<u32>,
    ) -> PyResult<()> {
        let memory = buffer::region(address, nbytes, keepalive, device)?;
        match (layout, blocks) {
            (Some(l), None) => self.0.register_kv_layout(memory, l.0),
            (None, Some(b)) => self.0.register_kv_caches(memory, b),
            _ => {
                return Err(PyValueError::new_err(
                    "give a layout or a block count, not both",
                ));
            }
        }
        .map_err(err)
    }

    /// vLLM's `get_num_new_matched_tokens`: tokens of the request beyond `num_computed` that can be
    /// loaded, and whether the load is asynchronous. `transfer_params` is what a producer's
    /// `request_finished` returned, carried by the proxy.
    #[pyo3(signature = (request_id, tokens, num_computed = 0, transfer_params = None))]
    fn get_num_new_matched_tokens(
        &self,
        py: Python<'_>,
        request_id: &str,
        tokens: Vec<u32>,
        num_computed: usize,
        transfer_params: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<(usize, bool)> {
        let params = transfer_params.map(params_from).transpose()?;
        let extras = RequestExtras::default();
        let req = KvRequest {
            id: request_id,
            tokens: &tokens,
            extras: &extras,
            external_keys: None,
            transfer_params: params.as_ref(),
        };
        py.detach(|| self.0.get_num_new_matched_tokens(&req, num_computed))
            .map_err(err)
    }

    /// vLLM's `update_state_after_alloc`.
    fn update_state_after_alloc(
        &self,
        request_id: &str,
        block_ids: Vec<u32>,
        num_external_tokens: usize,
    ) -> PyResult<()> {
        self.0
            .update_state_after_alloc(request_id, &block_ids, num_external_tokens)
            .map_err(err)
    }

    /// What this step does to a request (vLLM's `SchedulerOutput`): blocks appended to its table (or its
    /// new table, with `replace`) and the tokens computed by the step's end; saves then cover only
    /// computed blocks. Returns whether the request is tracked.
    fn record_step(
        &self,
        request: &str,
        new_blocks: Vec<u32>,
        replace: bool,
        computed_tokens: usize,
    ) -> bool {
        self.0
            .record_step(request, &new_blocks, replace, computed_tokens)
    }

    /// A producer's request that a decode will load (vLLM's `do_remote_decode`): its saved blocks stay
    /// held in the store until a load of them completes or `hold_timeout` passes. Call it after
    /// `get_num_new_matched_tokens`.
    fn hold_for_decode(&self, request_id: &str) -> PyResult<()> {
        self.0.hold_for_decode(request_id).map_err(err)
    }

    /// vLLM's `build_connector_meta`.
    fn build_connector_meta(&self) -> PyConnectorMetadata {
        PyConnectorMetadata(self.0.build_connector_meta())
    }

    /// vLLM's `request_finished`: `(delay_free, kv_transfer_params)`; a producer's parameters are a
    /// JSON-serialisable dict.
    fn request_finished<'py>(
        &self,
        py: Python<'py>,
        request_id: &str,
    ) -> PyResult<(bool, Option<Bound<'py, PyDict>>)> {
        let (delay, params) = self.0.request_finished(request_id);
        let dict = params
            .map(|p| {
                let d = PyDict::new(py);
                d.set_item("producer", p.producer.to_string())?;
                if !p.ranks.is_empty() {
                    let ranks: Vec<String> = p.ranks.iter().map(ToString::to_string).collect();
                    d.set_item("ranks", ranks)?;
                }
                Ok::<_, PyErr>(d)
            })
            .transpose()?;
        Ok((delay, dict))
    }

    /// vLLM's `bind_connector_metadata`.
    fn bind_connector_metadata(&self, meta: &PyConnectorMetadata) {
        self.0.bind_connector_metadata(meta.0.clone());
    }

    /// vLLM's `clear_connector_metadata`.
    fn clear_connector_metadata(&self) {
        self.0.clear_connector_metadata();
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
    fn get_finished(&self) -> (Vec<String>, Vec<String>) {
        self.0.get_finished()
    }

    /// vLLM's `get_block_ids_with_load_errors`: blocks to recompute.
    fn failed_blocks(&self) -> Vec<u32> {
        self.0.failed_blocks()
    }

    /// Why loads could not start since the last call.
    fn take_load_errors(&self) -> Vec<String> {
        self.0
            .take_load_errors()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// Every metric as Prometheus text.
    fn prometheus(&self) -> String {
        self.0.prometheus()
    }

    /// The metrics as numbers, by name.
    fn metrics(&self) -> HashMap<&'static str, u64> {
        let s = self.0.snapshot();
        HashMap::from([
            ("lookup_blocks", s.lookup_blocks),
            ("lookup_hits", s.lookup_hits),
            ("bytes_in", s.bytes_in),
            ("bytes_out", s.bytes_out),
            ("retransmits", s.retransmits),
            ("recompute_blocks", s.recompute_blocks),
            ("saved_blocks", s.saved_blocks),
            ("loads", s.loads),
            ("load_us", s.latency_sum_us),
            ("local_tier_bytes", s.local_tier_bytes),
            ("save_dropped_blocks", s.save_dropped),
            ("abandoned_blocks", s.abandoned_blocks),
            ("same_host_loads", s.same_host_loads),
            ("same_host_fallbacks", s.same_host_fallbacks),
            ("held_blocks", s.held_blocks),
            ("hold_expired_blocks", s.hold_expired_blocks),
        ])
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

/// Transfer parameters from the dict a producer's `request_finished` returned.
fn params_from(d: &Bound<'_, PyDict>) -> PyResult<KvTransferParams> {
    let producer: String = d
        .get_item("producer")?
        .ok_or_else(|| PyValueError::new_err("transfer_params has no \"producer\""))?
        .extract()?;
    let producer = addr("transfer_params producer", Some(producer))?.expect("given");
    let ranks: Vec<String> = d
        .get_item("ranks")?
        .map(|r| r.extract())
        .transpose()?
        .unwrap_or_default();
    let ranks = ranks
        .into_iter()
        .map(|r| addr("transfer_params ranks", Some(r)).map(|a| a.expect("given")))
        .collect::<PyResult<_>>()?;
    Ok(KvTransferParams { producer, ranks })
}

#[cfg(feature = "rdma")]
fn rdma_connector(
    py: Python<'_>,
    cfg: ConnectorConfig,
    engine_id: u32,
    provider: &str,
    domain: Option<String>,
    control: Option<std::net::SocketAddr>,
    producer: Option<std::net::SocketAddr>,
) -> PyResult<PyConnector> {
    let rdma = crate::rdma_config(engine_id, provider, domain);
    py.detach(|| KvConnector::rdma(cfg, rdma, control, producer))
        .map(PyConnector)
        .map_err(err)
}

#[cfg(not(feature = "rdma"))]
fn rdma_connector(
    _py: Python<'_>,
    _cfg: ConnectorConfig,
    _engine_id: u32,
    _provider: &str,
    _domain: Option<String>,
    _control: Option<std::net::SocketAddr>,
    _producer: Option<std::net::SocketAddr>,
) -> PyResult<PyConnector> {
    Err(crate::no_rdma())
}
