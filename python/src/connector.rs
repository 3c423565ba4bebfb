//! What both connector halves share in Python: the step metadata that crosses from the scheduler to the
//! workers, transfer parameters as dicts, addresses, and the metrics as numbers.

use std::collections::HashMap;
use std::net::SocketAddr;

use connector::{ConnectorMetadata, KvTransferParams, MetricsSnapshot};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::errors::{config, err};

/// An address `"IP:PORT"` named `what`, if given.
pub(crate) fn addr(what: &str, a: Option<String>) -> PyResult<Option<SocketAddr>> {
    a.map(|a| a.parse())
        .transpose()
        .map_err(|e| config(format!("{what}: {e}")))
}

/// Addresses `"IP:PORT"` named `what`.
pub(crate) fn addrs(what: &str, list: &[String]) -> PyResult<Vec<SocketAddr>> {
    list.iter()
        .map(|a| a.parse().map_err(|e| config(format!("{what}: {a:?}: {e}"))))
        .collect()
}

/// The scheduler's plan for one step (vLLM's `KVConnectorMetadata`), handed to each worker's
/// `bind_connector_metadata`; it crosses between processes as `to_bytes()` (the keys raw, not hex).
#[pyclass(name = "ConnectorMetadata", module = "kv_transfer", frozen)]
pub(crate) struct PyConnectorMetadata(pub(crate) ConnectorMetadata);

#[pymethods]
impl PyConnectorMetadata {
    /// The plan as bytes (to hand it to another process).
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.to_bytes())
    }

    /// A plan from `to_bytes()`.
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> PyResult<Self> {
        ConnectorMetadata::from_bytes(data).map(Self).map_err(err)
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

/// Transfer parameters from the dict a producer's `request_finished` returned.
pub(crate) fn params_from(d: &Bound<'_, PyDict>) -> PyResult<KvTransferParams> {
    let producer: String = d
        .get_item("producer")?
        .ok_or_else(|| config("transfer_params has no \"producer\""))?
        .extract()?;
    let producer = addr("transfer_params producer", Some(producer))?.expect("given");
    let ranks: Vec<String> = d
        .get_item("ranks")?
        .map(|r| r.extract())
        .transpose()?
        .unwrap_or_default();
    Ok(KvTransferParams {
        producer,
        ranks: addrs("transfer_params ranks", &ranks)?,
    })
}

/// Transfer parameters as the JSON-serialisable dict vLLM carries.
pub(crate) fn params_dict<'py>(
    py: Python<'py>,
    p: &KvTransferParams,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("producer", p.producer.to_string())?;
    if !p.ranks.is_empty() {
        let ranks: Vec<String> = p.ranks.iter().map(ToString::to_string).collect();
        d.set_item("ranks", ranks)?;
    }
    Ok(d)
}

/// The metrics as numbers, by name.
pub(crate) fn snapshot(s: &MetricsSnapshot) -> HashMap<&'static str, u64> {
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
        ("index_lookups", s.index_lookups),
        ("index_lookup_failures", s.index_lookup_failures),
        ("index_stale_entries", s.index_stale_entries),
        ("index_published", s.index_published),
        ("index_publish_dropped", s.index_publish_dropped),
        ("index_renew_failures", s.index_renew_failures),
        ("index_resyncs", s.index_resyncs),
        ("kv_events_dropped", s.kv_events_dropped),
    ])
}
