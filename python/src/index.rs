//! `ClusterIndex` and `Router`: what a router in front of many instances needs of the cluster index. A
//! prompt's block keys are made as the instances' connectors make them (the same `ConnectorSettings`:
//! model, weight version, block size, dtype, `PYTHONHASHSEED`), looked up in one round trip, and a
//! request's instance chosen by `cluster::route`'s policies.

use std::collections::HashMap;
use std::sync::Arc;

use backends::Fault;
use cluster::route::{Candidate, RequestCost, RoutePolicy, Router};
use cluster::{IndexClient, IndexConfig, IndexError};
use connector::ConnectorConfig;
use connector::keys::{RequestExtras, ScopedKey, VllmHasher, scoped};
use pyo3::prelude::*;
use std::sync::Mutex;

use crate::errors::{Classified, Classify, config, err};
use crate::settings::PySettings;
use crate::worker::seconds;

impl Classify for IndexError {
    fn classify(&self) -> Classified {
        let fault = match self {
            IndexError::Config(_) => Fault::Caller,
            IndexError::Timeout(_) | IndexError::Redis(_) => Fault::Transport,
        };
        Classified::new(fault, self.to_string())
    }
}

/// The cluster index as a router reads it, in one namespace.
#[pyclass(name = "ClusterIndex", module = "kv_transfer", frozen)]
pub(crate) struct PyClusterIndex {
    client: Arc<IndexClient>,
    settings: ConnectorConfig,
    hasher: VllmHasher,
}

#[pymethods]
impl PyClusterIndex {
    /// The index at `url` (`redis://host:port`), keys made as `settings` make them; each call answers
    /// within `timeout` seconds or fails with a `PeerUnreachableError` (then route without it).
    #[new]
    #[pyo3(signature = (url, settings, timeout = 0.05, prefix = None))]
    fn new(
        url: String,
        settings: &PySettings,
        timeout: f64,
        prefix: Option<String>,
    ) -> PyResult<Self> {
        let cfg = settings.config();
        let mut index = IndexConfig::new(url, "router");
        index.timeout = seconds("timeout", timeout)?;
        if let Some(p) = prefix {
            index.prefix = p;
        }
        let client = IndexClient::new(index).map_err(err)?;
        Ok(Self {
            client: Arc::new(client),
            hasher: cfg.hasher(),
            settings: cfg.clone(),
        })
    }

    /// Who holds `tokens`' leading full blocks (GIL released while it waits).
    fn lookup(&self, py: Python<'_>, tokens: Vec<u32>) -> PyResult<PyIndexAnswer> {
        let hashes = self.hasher.block_hashes(&tokens, &RequestExtras::default());
        let keys: Vec<_> = scoped(&self.settings.namespace, &hashes)
            .iter()
            .map(ScopedKey::tier_key)
            .collect();
        let client = Arc::clone(&self.client);
        let ns = self.settings.namespace.id();
        let found =
            crate::block_on(py, async move { client.lookup(ns, &keys).await }).map_err(err)?;
        Ok(PyIndexAnswer {
            blocks: hashes.len(),
            block_size: self.hasher.block_size(),
            pooled: found.pooled(),
            stale: found.stale_entries(),
            holders: found
                .holders
                .iter()
                .map(|h| (h.instance.clone(), h.blocks))
                .collect(),
        })
    }

    /// The instances holding a live lease in this namespace now, in address order.
    fn live(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let client = Arc::clone(&self.client);
        let ns = self.settings.namespace.id();
        crate::block_on(py, async move { client.live(ns).await }).map_err(err)
    }

    /// The namespace's id, as the index's keys name it (16 hex digits).
    #[getter]
    fn namespace(&self) -> String {
        format!("{:016x}", self.settings.namespace.id().0)
    }
}

/// What one lookup found.
#[pyclass(name = "IndexAnswer", module = "kv_transfer", frozen, get_all)]
pub(crate) struct PyIndexAnswer {
    /// The prompt's full blocks.
    blocks: usize,
    /// Tokens per block.
    block_size: usize,
    /// Leading blocks the pool holds between its instances (loadable by any of them).
    pooled: usize,
    /// Entries of lapsed leases the lookup skipped (and removes).
    stale: usize,
    /// Each instance holding the first block, with how many leading blocks it holds itself.
    holders: HashMap<String, usize>,
}

#[pymethods]
impl PyIndexAnswer {
    fn __repr__(&self) -> String {
        format!(
            "IndexAnswer(blocks={}, pooled={}, stale={}, holders={:?})",
            self.blocks, self.pooled, self.stale, self.holders
        )
    }
}

/// Chooses an instance per request: `"round-robin"`, `"least-loaded"`, `"cache"` or `"cache-load"`
/// (least expected time to first token).
#[pyclass(name = "Router", module = "kv_transfer", frozen)]
pub(crate) struct PyRouter(Mutex<Router>);

#[pymethods]
impl PyRouter {
    #[new]
    fn new(policy: &str) -> PyResult<Self> {
        let policy: RoutePolicy = policy.parse().map_err(config)?;
        Ok(Self(Mutex::new(Router::new(policy))))
    }

    /// The index in `candidates` (`(blocks held, seconds queued)` each) a request of `blocks` full
    /// blocks should go to, `pooled` of them loadable from the pool anywhere, at `compute_per_block`
    /// and `transfer_per_block` seconds a block.
    #[pyo3(signature = (candidates, blocks = 0, pooled = 0, compute_per_block = 0.0, transfer_per_block = 0.0))]
    fn choose(
        &self,
        candidates: Vec<(usize, f64)>,
        blocks: usize,
        pooled: usize,
        compute_per_block: f64,
        transfer_per_block: f64,
    ) -> PyResult<usize> {
        if candidates.is_empty() {
            return Err(config("no instance to route to"));
        }
        let cost = RequestCost {
            blocks,
            pooled,
            compute_per_block,
            transfer_per_block,
        };
        let cs: Vec<Candidate> = candidates
            .into_iter()
            .map(|(held, queued)| Candidate { held, queued })
            .collect();
        let mut router = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(router.choose(&cost, &cs))
    }

    /// The policy's name.
    #[getter]
    fn policy(&self) -> &'static str {
        let router = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        router.policy().name()
    }
}
