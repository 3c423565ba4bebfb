//! [`KvScheduler`]: the scheduler half of a connector (vLLM's scheduler-role connector, in its engine-core
//! process). It hashes prompts, asks producers what they hold ([`lookup`]), plans each step's saves and
//! loads for the workers ([`plan`]) and names where a finished request's KV waits. It moves no KV and
//! holds no store; the worker half ([`crate::KvWorker`]) does.

mod index;
mod lookup;
mod plan;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backends::Fault;
use policy::Namespace;

use crate::config::ConnectorConfig;
use crate::error::ConnectorError;
use crate::keys::{ScopedKey, VllmHasher, scoped};
use crate::metrics::Metrics;
use crate::producer::lock;
use crate::producers::Producers;
use crate::request::{KvRequest, KvTransferParams};
use crate::runtime::OwnRuntime;
use crate::state::SchedulerState;
use crate::tp::{RankHandshake, RankKv, rank_controls};
use lookup::{Candidate, Found, Lookups, Taken};

/// Where a request's loaded tokens come from (vLLM's `CacheHitSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitSource {
    /// This instance's own store, in host memory.
    Host,
    /// This instance's own store, read back from its disk tier.
    Disk,
    /// Another instance (host memory or disk there).
    Remote,
}

/// Where a scheduler looks for a prompt's KV, and what it tells consumers of its own.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Sources {
    /// The producer asked for a request that names none in its transfer parameters.
    pub default: Option<SocketAddr>,
    /// Other instances asked, beside the default, for the longest prefix they hold (cross-instance
    /// prefix reuse); the one holding the most serves.
    pub peers: Vec<SocketAddr>,
    /// Instances a registry announced in this scheduler's namespace (see
    /// [`KvScheduler::set_discovered`]), asked as `peers` are, after them.
    pub discovered: Vec<SocketAddr>,
    /// This instance's own workers' control address (rank 0), for a role that saves: a finished
    /// request's transfer parameters name it, and a `both` instance asks its own store there too, as a
    /// lower tier that serves when it holds at least as much as any other.
    pub own: Option<SocketAddr>,
}

impl Sources {
    /// Only `default` (a consumer of one producer).
    #[must_use]
    pub fn producer(default: SocketAddr) -> Sources {
        Sources {
            default: Some(default),
            ..Sources::default()
        }
    }

    /// Only `own` (a producer naming its workers' control address).
    #[must_use]
    pub fn own(own: SocketAddr) -> Sources {
        Sources {
            own: Some(own),
            ..Sources::default()
        }
    }
}

/// The scheduler half of a connector: it hashes prompts, looks up producers, plans saves and loads.
/// Every call returns without waiting on the network:
/// a lookup runs in the background, and [`KvScheduler::get_num_new_matched_tokens`] answers `None` while
/// it does.
pub struct KvScheduler {
    pub(crate) cfg: ConnectorConfig,
    namespace: Mutex<Namespace>,
    hasher: VllmHasher,
    rt: Arc<OwnRuntime>,
    producers: Arc<Producers>,
    sources: Mutex<Sources>,
    lookups: Arc<Lookups>,
    pub(crate) state: Mutex<SchedulerState>,
    pub(crate) metrics: Arc<Metrics>,
    lookup_errors: Mutex<Vec<ConnectorError>>,
    rank_controls: Mutex<Vec<SocketAddr>>,
    index: Mutex<Option<Arc<cluster::IndexClient>>>,
}

impl std::fmt::Debug for KvScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvScheduler")
            .field("role", &self.cfg.role)
            .field("sources", &*lock(&self.sources))
            .finish_non_exhaustive()
    }
}

impl KvScheduler {
    /// The scheduler half of `cfg`'s role, looking for KV at `sources`.
    pub fn new(cfg: ConnectorConfig, sources: Sources) -> Result<KvScheduler, ConnectorError> {
        cfg.validate()?;
        Ok(KvScheduler {
            namespace: Mutex::new(cfg.namespace.clone()),
            hasher: cfg.hasher(),
            rt: Arc::new(OwnRuntime::new()?),
            producers: Arc::new(Producers::new(
                cfg.load_timeout,
                cfg.control_identity(Vec::new()),
            )),
            sources: Mutex::new(sources),
            lookups: Arc::default(),
            state: Mutex::default(),
            metrics: Arc::new(Metrics::default()),
            lookup_errors: Mutex::default(),
            rank_controls: Mutex::default(),
            index: Mutex::default(),
            cfg,
        })
    }

    /// Counts into `metrics` (one the instance's worker keeps, when both halves live in one process)
    /// instead of metrics of its own.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> KvScheduler {
        self.metrics = metrics;
        self
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &ConnectorConfig {
        &self.cfg
    }

    /// The namespace keys are made in now.
    #[must_use]
    pub fn namespace(&self) -> Namespace {
        lock(&self.namespace).clone()
    }

    /// Switches to weight version `version`: keys are made in the new namespace from now on.
    pub fn set_weight_version(&self, version: u64) {
        lock(&self.namespace).weight_version = version;
    }

    /// Replaces the peers asked beside the default producer (what discovery found, say).
    pub fn set_peers(&self, peers: Vec<SocketAddr>) {
        lock(&self.sources).peers = peers;
    }

    /// Replaces the instances discovery found (a registry's latest answer), asked beside `peers`.
    pub fn set_discovered(&self, found: Vec<SocketAddr>) {
        lock(&self.sources).discovered = found;
    }

    /// Every peer asked beside the default producer now: `peers`, then what discovery found (each once).
    #[must_use]
    pub fn peers(&self) -> Vec<SocketAddr> {
        let sources = lock(&self.sources);
        let mut out = sources.peers.clone();
        for addr in &sources.discovered {
            if !out.contains(addr) {
                out.push(*addr);
            }
        }
        out
    }

    /// The scheduler's metrics (lookups and the hit rate they give).
    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Every metric as Prometheus text.
    #[must_use]
    pub fn prometheus(&self) -> String {
        self.refresh_index_counters();
        self.metrics.prometheus()
    }

    /// The metrics as numbers, the index client's lookups read now.
    #[must_use]
    pub fn snapshot(&self) -> crate::MetricsSnapshot {
        self.refresh_index_counters();
        self.metrics.snapshot()
    }

    fn refresh_index_counters(&self) {
        if let Some(index) = self.index() {
            self.metrics.set_index_lookups(&index.stats().counts());
        }
    }

    /// The keys of `req`'s full blocks in the current namespace: the serving engine's own if it gave
    /// them, else vLLM's `sha256_cbor` prefix hashes of its tokens.
    #[must_use]
    pub fn request_keys(&self, req: &KvRequest<'_>) -> Vec<ScopedKey> {
        let ns = self.namespace();
        match req.external_keys {
            Some(keys) => scoped(&ns, keys),
            None => scoped(&ns, &self.hasher.block_hashes(req.tokens, req.extras)),
        }
    }

    /// vLLM's `get_num_new_matched_tokens`: how many tokens of `req` beyond the `num_computed` already in
    /// the engine's own cache can be loaded (blocks a producer stores whole, or is saving now: their
    /// layers stream as they are saved), and whether the load is asynchronous (with
    /// [`ConnectorConfig::async_loads`] and something to load). At least one prompt token is always left
    /// to compute. `None` while the request's lookup runs: ask again (vLLM does, on a later step). The
    /// first call hashes the prompt once and asks every candidate producer at once (the request's named
    /// producer, or the default one and the peers), each for at most
    /// [`ConnectorConfig::lookup_timeout`]; a producer that does not answer holds nothing (see
    /// [`KvScheduler::take_lookup_errors`]). A producer that refuses this instance's configuration (its
    /// tensor-parallel place) is the error, whose `fault()` is the caller's. The scheduler tracks the request until
    /// [`KvScheduler::request_finished`]: call it for every request.
    pub fn get_num_new_matched_tokens(
        &self,
        req: &KvRequest<'_>,
        num_computed: usize,
    ) -> Result<Option<(usize, bool)>, ConnectorError> {
        let mut found = match self.lookups.take(req.id) {
            Taken::Done(found) => found,
            Taken::Running => return Ok(None),
            Taken::Unknown => match self.start_lookup(req) {
                Some(found) => found,
                None => return Ok(None),
            },
        };
        // A producer that refused this instance's configuration (tensor-parallel places that do not
        // pair) is a mistake to fix, not a miss to recompute: it is the answer.
        if let Some(at) = found.errors.iter().position(|e| e.fault() == Fault::Caller) {
            return Err(found.errors.swap_remove(at));
        }
        Ok(Some(self.track(req, num_computed, found)))
    }

    /// As [`KvScheduler::get_num_new_matched_tokens`], waiting for the lookup (for an embedder without a
    /// step loop to ask again). It waits at most twice [`ConnectorConfig::lookup_timeout`].
    pub fn wait_matched_tokens(
        &self,
        req: &KvRequest<'_>,
        num_computed: usize,
    ) -> Result<(usize, bool), ConnectorError> {
        let limit = self.cfg.lookup_timeout * 2 + Duration::from_millis(100);
        for _ in 0..2 {
            if let Some(answer) = self.get_num_new_matched_tokens(req, num_computed)? {
                return Ok(answer);
            }
            self.lookups.wait(req.id, limit);
        }
        Err(ConnectorError::Control {
            peer: "lookup".into(),
            message: format!(
                "the lookup of request {} did not end within {limit:?}",
                req.id
            ),
        })
    }

    /// Whether `request`'s lookup runs: [`KvScheduler::get_num_new_matched_tokens`] would answer `None`
    /// (a caller asking every step can skip passing the prompt again).
    #[must_use]
    pub fn lookup_running(&self, request: &str) -> bool {
        self.lookups.running(request)
    }

    /// Waits, at most `limit`, until one of the running lookups ends; returns at once when none runs.
    /// For an engine step that schedules nothing while lookups run: asking again at once would spin
    /// the engine's loop, and on a small host starve the very producers the lookups wait for.
    pub fn wait_for_lookups(&self, limit: Duration) {
        self.lookups.wait_any(limit);
    }

    /// Why producers did not answer lookups since the last call (they counted as holding nothing).
    pub fn take_lookup_errors(&self) -> Vec<ConnectorError> {
        std::mem::take(&mut lock(&self.lookup_errors))
    }

    /// Starts `req`'s lookup in the background; `Some` when there is nobody to ask or nothing to look up.
    fn start_lookup(&self, req: &KvRequest<'_>) -> Option<Found> {
        let keys = Arc::new(self.request_keys(req));
        if !self.cfg.role.loads() {
            return Some(Found::nothing(keys));
        }
        let bs = self.cfg.namespace.block_size as usize;
        let usable = keys.len().min(req.tokens.len().saturating_sub(1) / bs);
        let candidates = self.candidates(req.transfer_params);
        // With an index, a request naming no producer asks the holders it names instead of every peer.
        let index = self.index().filter(|_| req.transfer_params.is_none());
        if usable == 0 || (candidates.is_empty() && index.is_none()) {
            return Some(Found::nothing(keys));
        }
        let generation = self.lookups.start(req.id);
        let (lookups, producers, id) = (
            self.lookups.clone(),
            self.producers.clone(),
            req.id.to_owned(),
        );
        let (tp, deadline) = (self.rank_kv(), self.cfg.lookup_timeout);
        let always = self.candidates_without_peers();
        self.rt.spawn(async move {
            let candidates = match index {
                Some(index) => index::candidates(&index, &keys[..usable], always, candidates).await,
                None => candidates,
            };
            let found = lookup::ask(producers, candidates, keys, usable, tp, deadline).await;
            lookups.finish(&id, generation, found);
        });
        None
    }

    /// Who a lookup of a request naming `named` asks: the named producer (its rank for this one), or the
    /// default producer and the peers; and this instance's own store for a `both` instance.
    fn candidates(&self, named: Option<&KvTransferParams>) -> Vec<Candidate> {
        let sources = lock(&self.sources);
        let mut out: Vec<Candidate> = Vec::new();
        let mut add = |addr: SocketAddr, producer: Option<KvTransferParams>, own: bool| {
            if !out.iter().any(|c| c.addr == addr) {
                out.push(Candidate {
                    addr,
                    producer,
                    own,
                });
            }
        };
        let own = sources.own.filter(|_| self.cfg.role.saves());
        if let Some(own) = own {
            add(own, None, true);
        }
        match named {
            Some(p) => add(p.control_for(self.cfg.tp), Some(p.clone()), false),
            None => {
                let asked = sources.peers.iter().chain(&sources.discovered);
                for addr in sources.default.iter().chain(asked) {
                    add(*addr, Some(KvTransferParams::single(*addr)), false);
                }
            }
        }
        out
    }

    /// This instance's own store (for a role that saves) and the default producer: whom a lookup asks
    /// whatever the index says.
    fn candidates_without_peers(&self) -> Vec<Candidate> {
        let sources = lock(&self.sources);
        let own = sources.own.filter(|_| self.cfg.role.saves());
        let mut out: Vec<Candidate> = own
            .map(|addr| Candidate {
                addr,
                producer: None,
                own: true,
            })
            .into_iter()
            .collect();
        if let Some(addr) = sources.default.filter(|d| Some(*d) != own) {
            out.push(Candidate {
                addr,
                producer: Some(KvTransferParams::single(addr)),
                own: false,
            });
        }
        out
    }

    /// This rank's tensor-parallel place and whether its KV is MLA.
    fn rank_kv(&self) -> RankKv {
        RankKv {
            tp: self.cfg.tp,
            mla: self.cfg.is_mla(),
        }
    }

    /// vLLM's `get_external_cache_hit_sources`: the `num_external_tokens` a request loads, split by where
    /// they come from (only non-zero counts; empty for a request not tracked or loading nothing).
    #[must_use]
    pub fn hit_sources(
        &self,
        request: &str,
        num_external_tokens: usize,
    ) -> Vec<(HitSource, usize)> {
        let bs = self.cfg.namespace.block_size as usize;
        let state = lock(&self.state);
        let Some(t) = state.requests.get(request) else {
            return Vec::new();
        };
        if num_external_tokens == 0 {
            return Vec::new();
        }
        if !t.local {
            return vec![(HitSource::Remote, num_external_tokens)];
        }
        let disk = (t.disk_blocks * bs).min(num_external_tokens);
        [
            (HitSource::Host, num_external_tokens - disk),
            (HitSource::Disk, disk),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
    }

    /// vLLM's `request_finished`: the request is done. Returns whether the engine must keep its blocks
    /// until the workers' `get_finished` reports it (never: a producer copies each layer into its tier
    /// store during `save_kv_layer`, so the engine's blocks are free once the step ends, and the store
    /// holds them for a decode: see [`KvScheduler::hold_for_decode`]), and, from a role that saves,
    /// where a consumer finds the request's KV (vLLM's `kv_transfer_params`): its workers' control
    /// address and, under tensor parallelism, every rank's (see [`KvScheduler::set_rank_handshakes`]).
    pub fn request_finished(&self, request: &str) -> (bool, Option<KvTransferParams>) {
        lock(&self.state).requests.remove(request);
        self.lookups.forget(request);
        let own = lock(&self.sources).own.filter(|_| self.cfg.role.saves());
        let params = own.map(|producer| KvTransferParams {
            producer,
            ranks: lock(&self.rank_controls).clone(),
        });
        (false, params)
    }

    /// vLLM's `set_xfer_handshake_metadata`: every rank's handshake (the workers'
    /// [`crate::KvWorker::rank_handshake`]), gathered by the serving engine, so transfer parameters name
    /// each rank's control address. Needed on a producer's scheduler under tensor parallelism; the error
    /// names a missing or wrong rank.
    pub fn set_rank_handshakes(&self, handshakes: &[RankHandshake]) -> Result<(), ConnectorError> {
        let controls = rank_controls(self.cfg.tp, handshakes)?;
        if let Some(first) = controls.first() {
            let mut sources = lock(&self.sources);
            sources.own = sources.own.or(Some(*first));
        }
        *lock(&self.rank_controls) = controls;
        Ok(())
    }
}
