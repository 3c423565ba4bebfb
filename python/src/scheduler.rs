//! `Scheduler`: the connector's scheduler half (vLLM's scheduler-role connector, in its engine-core
//! process). Its lookups run in Rust, in the background, every candidate producer asked at once: no call
//! here waits on the network, and none holds the GIL while it works.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use std::collections::HashMap;

use connector::{
    BlockHash, HitSource, KvRequest, KvScheduler, RankHandshake, RequestExtras, Sources, TpRank,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::connector::{PyConnectorMetadata, addr, addrs, params_dict, params_from, snapshot};
use crate::errors::{config, err};
use crate::settings;

/// The scheduler half: lookups, plans and transfer parameters; no KV moved, no store.
#[pyclass(name = "Scheduler", module = "kv_transfer", frozen)]
pub(crate) struct PyScheduler(Arc<KvScheduler>);

#[pymethods]
impl PyScheduler {
    /// The scheduler of `settings` (see `ConnectorSettings`): `producer` is asked for a request that
    /// names none, `peers` beside it (the one holding the longest prefix serves), `own` is this
    /// instance's workers' control address (named in a finished request's transfer parameters; a `both`
    /// instance's own store is asked there too).
    #[new]
    #[pyo3(signature = (settings, producer = None, peers = Vec::new(), own = None))]
    fn new(
        py: Python<'_>,
        settings: &settings::PySettings,
        producer: Option<String>,
        peers: Vec<String>,
        own: Option<String>,
    ) -> PyResult<Self> {
        let mut sources = Sources::default();
        sources.default = addr("producer", producer)?;
        sources.peers = addrs("peers", &peers)?;
        sources.own = addr("own", own)?;
        let cfg = settings.config().clone();
        py.detach(|| KvScheduler::new(cfg, sources))
            .map(|s| Self(Arc::new(s)))
            .map_err(err)
    }

    /// vLLM's `get_num_new_matched_tokens`: `(tokens to load, asynchronously)`, or `None` while the
    /// request's lookup runs (ask again on a later step). `transfer_params` is what a producer's
    /// `request_finished` returned, carried by the proxy; `block_hashes` are the serving engine's own keys
    /// (32 bytes each), used as they are instead of hashing `tokens`.
    #[pyo3(signature = (request_id, tokens, num_computed = 0, transfer_params = None, block_hashes = None))]
    fn get_num_new_matched_tokens(
        &self,
        py: Python<'_>,
        request_id: &str,
        tokens: Vec<u32>,
        num_computed: usize,
        transfer_params: Option<&Bound<'_, PyDict>>,
        block_hashes: Option<Vec<Vec<u8>>>,
    ) -> PyResult<Option<(usize, bool)>> {
        let params = transfer_params.map(params_from).transpose()?;
        let keys = block_hashes.map(|h| hashes(&h)).transpose()?;
        let extras = RequestExtras::default();
        let req = KvRequest {
            id: request_id,
            tokens: &tokens,
            extras: &extras,
            external_keys: keys.as_deref(),
            transfer_params: params.as_ref(),
        };
        py.detach(|| self.0.get_num_new_matched_tokens(&req, num_computed))
            .map_err(err)
    }

    /// As `get_num_new_matched_tokens`, waiting (GIL released) for the lookup to end.
    #[pyo3(signature = (request_id, tokens, num_computed = 0, transfer_params = None))]
    fn wait_matched_tokens(
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
        py.detach(|| self.0.wait_matched_tokens(&req, num_computed))
            .map_err(err)
    }

    /// Whether `block_hashes` (the serving engine's, 32 bytes each) are byte for byte the keys this
    /// scheduler would make of `tokens`: then they can be handed to `get_num_new_matched_tokens` and the
    /// prompt is not hashed again.
    fn keys_match(
        &self,
        py: Python<'_>,
        tokens: Vec<u32>,
        block_hashes: Vec<Vec<u8>>,
    ) -> PyResult<bool> {
        let theirs = hashes(&block_hashes)?;
        let extras = RequestExtras::default();
        let req = KvRequest {
            id: "",
            tokens: &tokens,
            extras: &extras,
            external_keys: None,
            transfer_params: None,
        };
        let ours = py.detach(|| self.0.request_keys(&req));
        Ok(!ours.is_empty()
            && ours.len() == theirs.len()
            && ours.iter().zip(&theirs).all(|(a, b)| a.hash == *b))
    }

    /// The serving engine's own hashes of `request_id`'s blocks (32 bytes each) when they are not this
    /// connector's keys: the KV events of its saves (setting `kv_events`) name the blocks by them. Call
    /// it once `get_num_new_matched_tokens` answered. Returns whether the request is tracked.
    fn set_engine_hashes(&self, request_id: &str, block_hashes: Vec<Vec<u8>>) -> PyResult<bool> {
        Ok(self.0.set_engine_hashes(request_id, hashes(&block_hashes)?))
    }

    /// Whether `request_id`'s lookup runs (`get_num_new_matched_tokens` would answer `None`): a cheap
    /// question for a caller asking every step, which then need not pass the prompt again.
    fn lookup_running(&self, request_id: &str) -> bool {
        self.0.lookup_running(request_id)
    }

    /// Waits (GIL released), at most `limit` seconds, until one of the running lookups ends; returns at
    /// once when none runs. For a step that schedules nothing while lookups run, so the engine's loop
    /// does not spin.
    fn wait_for_lookups(&self, py: Python<'_>, limit: f64) -> PyResult<()> {
        let limit = crate::worker::seconds("limit", limit)?;
        py.detach(|| self.0.wait_for_lookups(limit));
        Ok(())
    }

    /// Why producers did not answer lookups since the last call (they counted as holding nothing), as
    /// exceptions of their class.
    fn take_lookup_errors(&self) -> Vec<PyErr> {
        self.0.take_lookup_errors().into_iter().map(err).collect()
    }

    /// Replaces the peers asked beside the default producer.
    fn set_peers(&self, peers: Vec<String>) -> PyResult<()> {
        self.0.set_peers(addrs("peers", &peers)?);
        Ok(())
    }

    /// Asks the cluster index at `url` (`redis://host:port`) which instances hold a prompt, and only
    /// them (with this instance's own store and its default producer), instead of every peer; the peers
    /// are asked when the index does not answer within `timeout` seconds. `instance`: this instance's
    /// own name there (its control address), left out of the answers.
    #[pyo3(signature = (url, instance = None, timeout = 0.05))]
    fn use_index(&self, url: String, instance: Option<String>, timeout: f64) -> PyResult<()> {
        let mut cfg = cluster::IndexConfig::new(url, instance.unwrap_or_default());
        cfg.timeout = crate::worker::seconds("timeout", timeout)?;
        self.0.use_index(cfg).map_err(err)
    }

    /// The peers asked beside the default producer now: those given, then those `follow` found.
    fn peers(&self) -> Vec<String> {
        self.0.peers().iter().map(ToString::to_string).collect()
    }

    /// Follows `registry`: every `every` seconds, in the background, the producers announced there in
    /// `namespace` (`exclude` apart) are asked beside the peers given; a registry that does not answer
    /// leaves them as they were. Ends when the scheduler is dropped.
    #[pyo3(signature = (registry, namespace, exclude = None, every = 1.0))]
    fn follow(
        &self,
        registry: &crate::registry::PyRegistry,
        namespace: String,
        exclude: Option<String>,
        every: f64,
    ) -> PyResult<()> {
        let every = crate::duration(every)?.max(Duration::from_millis(10));
        let scheduler: Weak<KvScheduler> = Arc::downgrade(&self.0);
        registry.follow(namespace, exclude, every, move |peers: Vec<SocketAddr>| {
            let Some(s) = scheduler.upgrade() else {
                return false;
            };
            s.set_discovered(peers);
            true
        })
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
    /// held in the store until a load of them completes or `hold_timeout` passes.
    fn hold_for_decode(&self, request_id: &str) -> PyResult<()> {
        self.0.hold_for_decode(request_id).map_err(err)
    }

    /// The engine preempted `request_id` (vLLM's `preempted_req_ids`): the rest of its save plan is
    /// dropped and the workers are told in the next metadata. Returns whether it is tracked.
    fn request_preempted(&self, request_id: &str) -> bool {
        self.0.request_preempted(request_id)
    }

    /// vLLM's `get_external_cache_hit_sources`: the request's loaded tokens by where they come from,
    /// `{"host": n, "disk": n, "p2p": n}` with non-zero counts only.
    fn hit_sources(
        &self,
        request_id: &str,
        num_external_tokens: usize,
    ) -> HashMap<&'static str, usize> {
        self.0
            .hit_sources(request_id, num_external_tokens)
            .into_iter()
            .map(|(source, n)| {
                let name = match source {
                    HitSource::Host => "host",
                    HitSource::Disk => "disk",
                    HitSource::Remote => "p2p",
                };
                (name, n)
            })
            .collect()
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
        Ok((delay, params.map(|p| params_dict(py, &p)).transpose()?))
    }

    /// vLLM's `set_xfer_handshake_metadata`: every rank's `Worker.rank_handshake()` dict.
    fn set_rank_handshakes(&self, handshakes: Vec<Bound<'_, PyDict>>) -> PyResult<()> {
        let parsed = handshakes
            .iter()
            .map(rank_handshake)
            .collect::<PyResult<Vec<_>>>()?;
        self.0.set_rank_handshakes(&parsed).map_err(err)
    }

    /// Switches to weight version `version`: keys are made in the new namespace from now on.
    fn set_weight_version(&self, version: u64) {
        self.0.set_weight_version(version);
    }

    /// The scheduler's metrics as numbers, by name (lookups and their hits, its index lookups).
    fn metrics(&self) -> HashMap<&'static str, u64> {
        snapshot(&self.0.snapshot())
    }

    /// Every metric as Prometheus text.
    fn prometheus(&self) -> String {
        self.0.prometheus()
    }
}

/// 32-byte keys from Python `bytes`.
fn hashes(raw: &[Vec<u8>]) -> PyResult<Vec<BlockHash>> {
    raw.iter()
        .map(|h| {
            <[u8; 32]>::try_from(h.as_slice())
                .map(BlockHash)
                .map_err(|_| {
                    config(format!(
                        "a block hash of {} bytes: keys are 32 bytes",
                        h.len()
                    ))
                })
        })
        .collect()
}

/// A rank's handshake from the dict `Worker.rank_handshake()` gave.
fn rank_handshake(d: &Bound<'_, PyDict>) -> PyResult<RankHandshake> {
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(k)?
            .ok_or_else(|| config(format!("a rank handshake without {k:?}")))
    };
    let tp = TpRank::new(get("rank")?.extract()?, get("size")?.extract()?).map_err(err)?;
    let control: Option<String> = get("control")?.extract()?;
    Ok(RankHandshake {
        tp,
        control: addr("control", control)?,
    })
}
