//! [`KvWorker`]: the worker half of a connector (vLLM's worker-role connector, one in each worker process):
//! its KV caches registered in place, its transport node, and for a role that saves the host tier store
//! with the control server that serves consumers. It loads ([`load`]) and saves ([`save`]) what the
//! scheduler half's metadata plans; how one is made over each transport is [`open`].

mod events;
mod index;
mod load;
mod open;
mod save;

use crate::disk::{BlockFormat, DiskTier};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use policy::Namespace;
use transfer_engine::{KvLayout, MemoryRegion, RegionHandle};

use crate::config::{ConnectorConfig, KvRole};
use crate::control;
use crate::data_plane::DataPlane;
use crate::error::ConnectorError;
use crate::metrics::{Metrics, StoreFigures};
use crate::producer::{ProducerCore, lock};
use crate::producers::Producers;
use crate::runtime::OwnRuntime;
use crate::state::WorkerState;
use crate::store::TierStore;
use crate::tp::{RankHandshake, RankKv};

/// The worker half of a connector: KV caches, transport, store and control server. Its calls are vLLM's
/// worker-side connector calls, one
/// to one (see the crate docs for the mapping).
pub struct KvWorker {
    pub(crate) cfg: ConnectorConfig,
    pub(crate) namespace: Mutex<Namespace>,
    pub(crate) rt: Arc<OwnRuntime>,
    pub(crate) transport: DataPlane,
    pub(crate) producer: Option<Arc<ProducerCore>>,
    /// Control connections to the producers loads come from.
    pub(crate) producers: Producers,
    pub(crate) control_addr: Option<SocketAddr>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) worker: Mutex<WorkerState>,
    /// The registered KV caches of a consumer, as its producer addresses them.
    pub(crate) kv_handle: Mutex<Option<RegionHandle>>,
    /// The counters of the index client this worker publishes through ([`KvWorker::publish_to_index`]).
    pub(crate) index_stats: Mutex<Option<Arc<cluster::IndexStats>>>,
}

impl std::fmt::Debug for KvWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvWorker")
            .field("role", &self.cfg.role)
            .field("control_addr", &self.control_addr)
            .finish_non_exhaustive()
    }
}

pub(crate) fn runtime() -> Result<Arc<OwnRuntime>, ConnectorError> {
    Ok(Arc::new(OwnRuntime::new()?))
}

impl KvWorker {
    /// Runs `f` on the connector's runtime and waits for it, from any thread (see `runtime.rs`).
    pub(crate) fn block_on<F>(&self, f: F) -> F::Output
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        self.rt.block_on(f)
    }

    pub(crate) fn assemble(
        cfg: ConnectorConfig,
        rt: Arc<OwnRuntime>,
        transport: DataPlane,
    ) -> Result<KvWorker, ConnectorError> {
        cfg.validate()?;
        if let Some(shaping) = cfg.shaping.clone() {
            transport.set_shaping(shaping)?;
        }
        let metrics = Arc::new(Metrics::default());
        let producer = if cfg.role.saves() {
            let layout: KvLayout = cfg.kv_layout(cfg.store_blocks)?;
            let bytes = usize::try_from(layout.total_bytes())
                .map_err(|_| ConnectorError::Config("the store does not fit in memory".into()))?;
            let mut store =
                TierStore::with_memory(layout, MemoryRegion::zeroed(bytes), cfg.store_segments)?;
            if let Some(disk) = &cfg.disk {
                let tier = DiskTier::open(disk.clone(), BlockFormat::of(&layout))?;
                store = store.with_disk(tier, cfg.disk_min_sharers)?;
            }
            if cfg.kv_events {
                store.keep_kv_events();
            }
            let store_handle = transport.register(layout, store.memory().clone())?;
            metrics.set_host_capacity(u64::from(cfg.store_blocks));
            Some(Arc::new(ProducerCore {
                store: Mutex::new(store),
                store_handle,
                transport: transport.clone(),
                namespace: Mutex::new(cfg.namespace.id()),
                metrics: metrics.clone(),
                started: Instant::now(),
                prefetch_depth: cfg.prefetch_depth,
                timeout: cfg.load_timeout,
                hold_timeout: cfg.hold_timeout,
                runtime: rt.handle().clone(),
                streams: Mutex::default(),
                rank: RankKv {
                    tp: cfg.tp,
                    mla: cfg.is_mla(),
                },
                control: cfg.control_identity(Vec::new()),
            }))
        } else {
            None
        };
        if cfg.role.loads() {
            rt.spawn(transport.clone().drain_incoming());
        }
        Ok(KvWorker {
            namespace: Mutex::new(cfg.namespace.clone()),
            producers: Producers::new(cfg.load_timeout, cfg.control_identity(transport.engines())),
            cfg,
            rt,
            transport,
            producer,
            control_addr: None,
            metrics,
            worker: Mutex::default(),
            kv_handle: Mutex::new(None),
            index_stats: Mutex::new(None),
        })
    }

    /// The role.
    #[must_use]
    pub fn role(&self) -> KvRole {
        self.cfg.role
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

    /// Where a producer serves lookups and loads (pass it to consumers).
    #[must_use]
    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control_addr
    }

    /// Where this worker's main transport is reached (what its loads name as their destination).
    #[must_use]
    pub fn address(&self) -> Option<backends::PeerAddress> {
        self.transport.address()
    }

    /// The connector's metrics.
    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The metrics, to share with the instance's scheduler half in one process
    /// ([`crate::KvScheduler::with_metrics`]).
    #[must_use]
    pub fn shared_metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The metrics as numbers, with the store's gauges read now.
    #[must_use]
    pub fn snapshot(&self) -> crate::MetricsSnapshot {
        self.refresh_gauges();
        self.metrics.snapshot()
    }

    /// Every metric as Prometheus text (see [`crate::metrics`] for the names).
    #[must_use]
    pub fn prometheus(&self) -> String {
        self.refresh_gauges();
        self.metrics.prometheus()
    }

    pub(crate) fn refresh_gauges(&self) {
        if let Some(core) = &self.producer {
            let store = lock(&core.store);
            self.metrics.set_store(StoreFigures {
                host_blocks: store.used() as u64,
                held_blocks: store.held() as u64,
                hold_expired: store.holds_expired(),
            });
            self.metrics
                .set_kv_events_dropped(store.kv_events_dropped());
            if let Some(d) = store.disk_stats() {
                self.metrics.set_disk(&d);
            }
        }
        self.metrics.set_retransmits(self.transport.retransmits());
        if let Some(stats) = lock(&self.index_stats).as_ref() {
            self.metrics.set_index_publishing(&stats.counts());
        }
    }

    /// Leading blocks of `keys` this worker's own tier store holds whole (a producer's prefix reuse:
    /// those blocks need no prefill). 0 without a store.
    #[must_use]
    pub fn stored_prefix(&self, keys: &[crate::keys::ScopedKey]) -> usize {
        self.producer.as_ref().map_or(0, |core| core.lookup(keys))
    }

    /// Slots of the local tier store in use now, and the most ever in use (0, 0 without a store).
    #[must_use]
    pub fn store_usage(&self) -> (usize, usize) {
        self.producer.as_ref().map_or((0, 0), |core| {
            let s = lock(&core.store);
            (s.used(), s.peak_used())
        })
    }

    /// What the local tier store's disk tier did (`None` without a store or a disk tier).
    #[must_use]
    pub fn disk_stats(&self) -> Option<crate::store::DiskTierStats> {
        self.producer
            .as_ref()
            .and_then(|core| lock(&core.store).disk_stats())
    }

    /// Bytes of one block across all layers.
    #[must_use]
    pub fn block_bytes_all_layers(&self) -> u64 {
        self.cfg.block_bytes * u64::from(self.cfg.layers)
    }

    /// Switches to weight version `version`: keys are made in the new namespace from now on, and a
    /// producer drops every stored block of the old one, so no KV of the old weights is served after it.
    pub fn set_weight_version(&self, version: u64) {
        let old = {
            let mut ns = lock(&self.namespace);
            let old = ns.id();
            ns.weight_version = version;
            old
        };
        if let Some(core) = &self.producer {
            *lock(&core.namespace) = lock(&self.namespace).id();
            lock(&core.store).drop_namespace(old);
            // Loads streaming blocks of the old version that were still being saved end now.
            core.advance_streams();
        }
    }

    /// This rank's tensor-parallel place and whether its KV is MLA.
    pub(crate) fn rank_kv(&self) -> RankKv {
        RankKv {
            tp: self.cfg.tp,
            mla: self.cfg.is_mla(),
        }
    }

    /// vLLM's `get_handshake_metadata`: this worker's rank and control address, for the serving engine to
    /// hand the scheduler ([`crate::KvScheduler::set_rank_handshakes`]).
    #[must_use]
    pub fn rank_handshake(&self) -> RankHandshake {
        RankHandshake {
            tp: self.cfg.tp,
            control: self.control_addr,
        }
    }

    /// Registers the worker's KV caches: `memory` holds `blocks` blocks per layer in the configured
    /// layout (layer-major). A consumer's loads land in it in place; a producer saves out of it.
    pub fn register_kv_caches(
        &self,
        memory: MemoryRegion,
        blocks: u32,
    ) -> Result<(), ConnectorError> {
        self.register_kv_layout(memory, self.cfg.kv_layout(blocks)?)
    }

    /// Registers the worker's KV caches as the serving engine placed them: `layout` says where every
    /// (layer, block) lies in `memory` (see [`KvLayout::from_vllm`] for vLLM's views over one buffer).
    /// Its layers, tokens and bytes per block, dtype and heads must be the configured ones (the error
    /// names both values); a consumer's loads land in place, a producer saves out of it.
    pub fn register_kv_layout(
        &self,
        memory: MemoryRegion,
        layout: KvLayout,
    ) -> Result<(), ConnectorError> {
        self.cfg.check_caches(&layout)?;
        crate::copier::BlockCopier::check(memory.kind())?;
        if (memory.len() as u64) < layout.total_bytes() {
            return Err(ConnectorError::Config(format!(
                "KV caches of {} bytes are smaller than {} blocks of the layout ({} bytes)",
                memory.len(),
                layout.blocks_per_layer,
                layout.total_bytes()
            )));
        }
        if self.cfg.role.loads() {
            let region = self.transport.register(layout, memory.clone())?;
            self.transport.publish(control::KV_SEGMENT, region)?;
            *lock(&self.kv_handle) = Some(region.main);
        }
        lock(&self.worker).kv = Some((memory, layout));
        Ok(())
    }
}

impl Drop for KvWorker {
    fn drop(&mut self) {
        // A TCP node stops its tasks on shutdown, which needs its runtime.
        let _guard = self.rt.enter();
        self.transport.shutdown();
    }
}
