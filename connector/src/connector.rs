//! The connector object: its role, namespace, transport, local tier store and the two halves' state.

use crate::disk::{BlockFormat, DiskTier};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use backends::loopback::{CONSUMER, LoopbackPair};
use policy::Namespace;
use transfer_engine::{KvLayout, MemoryRegion, PeerId, RegionHandle};

use crate::config::{ConnectorConfig, KvRole};
use crate::control::{self, ControlClient};
use crate::data_plane::DataPlane;
use crate::error::ConnectorError;
use crate::keys::VllmHasher;
use crate::metrics::{Metrics, StoreFigures};
use crate::producer::{ProducerCore, lock};
use crate::runtime::OwnRuntime;
use crate::state::{SchedulerState, WorkerState};
use crate::store::TierStore;
use crate::tp::{RankHandshake, RankKv, check_pairing};

/// Where a consumer's KV comes from.
#[derive(Debug)]
pub(crate) enum Source {
    /// No source: this connector does not load.
    None,
    /// A producer in this process (loopback), sending to peer `PeerId`.
    Local(Arc<ProducerCore>, PeerId),
    /// Producers reached over their control channels: the configured one, and any a request's
    /// [`crate::KvTransferParams`] names.
    Remote(Remotes),
}

/// Most producers a consumer keeps a control connection to (the oldest is closed beyond it).
const MAX_PRODUCERS: usize = 256;

/// A consumer's control connections, by producer address.
#[derive(Debug)]
pub(crate) struct Remotes {
    /// The producer asked when a request names none.
    pub(crate) default: Option<SocketAddr>,
    timeout: std::time::Duration,
    clients: Mutex<Vec<(SocketAddr, Arc<ControlClient>)>>,
}

impl Remotes {
    pub(crate) fn new(default: Option<SocketAddr>, timeout: std::time::Duration) -> Remotes {
        Remotes {
            default,
            timeout,
            clients: Mutex::new(Vec::new()),
        }
    }

    /// The client of `producer` (or of the default producer), if there is one to ask.
    pub(crate) fn client(&self, producer: Option<SocketAddr>) -> Option<Arc<ControlClient>> {
        let addr = producer.or(self.default)?;
        let mut clients = lock(&self.clients);
        if let Some((_, c)) = clients.iter().find(|(a, _)| *a == addr) {
            return Some(c.clone());
        }
        if clients.len() >= MAX_PRODUCERS {
            clients.remove(0);
        }
        let c = Arc::new(ControlClient::new(addr, self.timeout));
        clients.push((addr, c.clone()));
        Some(c)
    }
}

/// A KV connector: the scheduler-side calls ([`KvConnector::get_num_new_matched_tokens`], ...) and the
/// worker-side calls ([`KvConnector::start_load_kv`], ...) of vLLM's v1 connector, one to one. See the
/// crate docs for the mapping and an example.
pub struct KvConnector {
    pub(crate) cfg: ConnectorConfig,
    pub(crate) namespace: Mutex<Namespace>,
    pub(crate) hasher: VllmHasher,
    pub(crate) rt: Arc<OwnRuntime>,
    pub(crate) transport: DataPlane,
    pub(crate) producer: Option<Arc<ProducerCore>>,
    pub(crate) source: Source,
    pub(crate) control_addr: Option<SocketAddr>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) sched: Mutex<SchedulerState>,
    pub(crate) worker: Mutex<WorkerState>,
    /// The registered KV caches of a consumer, as its producer addresses them.
    pub(crate) kv_handle: Mutex<Option<RegionHandle>>,
    /// Every rank's control address, in rank order, once the scheduler rank was told them.
    pub(crate) rank_controls: Mutex<Vec<SocketAddr>>,
}

impl std::fmt::Debug for KvConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvConnector")
            .field("role", &self.cfg.role)
            .field("control_addr", &self.control_addr)
            .finish_non_exhaustive()
    }
}

pub(crate) fn runtime() -> Result<Arc<OwnRuntime>, ConnectorError> {
    Ok(Arc::new(OwnRuntime::new()?))
}

impl KvConnector {
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
        source: Source,
    ) -> Result<KvConnector, ConnectorError> {
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
            }))
        } else {
            None
        };
        if cfg.role.loads() {
            rt.spawn(transport.clone().drain_incoming());
        }
        Ok(KvConnector {
            namespace: Mutex::new(cfg.namespace.clone()),
            hasher: cfg.hasher(),
            cfg,
            rt,
            transport,
            producer,
            source,
            control_addr: None,
            metrics,
            sched: Mutex::default(),
            worker: Mutex::default(),
            kv_handle: Mutex::new(None),
            rank_controls: Mutex::default(),
        })
    }

    /// The scheduler half alone, for a serving engine whose scheduler runs in a process of its own
    /// (vLLM's engine core): lookups ask producers over their control channels, and saves and loads are
    /// planned into metadata for the workers ([`crate::ConnectorMetadata::to_json`]). It moves no KV and
    /// holds no store, so its `request_finished` names no producer (the workers serve, at addresses the
    /// engine configured), and its worker calls fail for want of KV caches.
    pub fn scheduler(cfg: ConnectorConfig) -> Result<KvConnector, ConnectorError> {
        cfg.validate()?;
        // A transport nobody reaches: the scheduler half never submits or receives.
        let (end, _) = LoopbackPair::with_defaults().into_nodes();
        let source = if cfg.role.loads() {
            Source::Remote(Remotes::new(None, cfg.load_timeout))
        } else {
            Source::None
        };
        Ok(KvConnector {
            namespace: Mutex::new(cfg.namespace.clone()),
            hasher: cfg.hasher(),
            rt: runtime()?,
            transport: DataPlane::new(Arc::new(end)),
            producer: None,
            source,
            control_addr: None,
            metrics: Arc::new(Metrics::default()),
            sched: Mutex::default(),
            worker: Mutex::default(),
            kv_handle: Mutex::new(None),
            rank_controls: Mutex::default(),
            cfg,
        })
    }

    /// A producer and a consumer in one process, joined by the loopback backend (tests, and tier moves
    /// within one host).
    pub fn loopback_pair(
        producer: ConnectorConfig,
        consumer: ConnectorConfig,
    ) -> Result<(KvConnector, KvConnector), ConnectorError> {
        if producer.role != KvRole::Producer || consumer.role != KvRole::Consumer {
            return Err(ConnectorError::Config(
                "a loopback pair is one producer and one consumer".into(),
            ));
        }
        let rank = |c: &ConnectorConfig| RankKv {
            tp: c.tp,
            mla: c.is_mla(),
        };
        check_pairing(rank(&producer), rank(&consumer)).map_err(ConnectorError::TensorParallel)?;
        let producer_rt = runtime()?;
        let (producer_end, consumer_end) = LoopbackPair::with_defaults().into_nodes();
        let p = Self::assemble(
            producer,
            producer_rt,
            DataPlane::new(Arc::new(producer_end)),
            Source::None,
        )?;
        let core = p.producer.clone().expect("a producer has a store");
        let c = Self::assemble(
            consumer,
            runtime()?,
            DataPlane::new(Arc::new(consumer_end)),
            Source::Local(core, CONSUMER),
        )?;
        Ok((p, c))
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

    /// The connector's metrics.
    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
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
            if let Some(d) = store.disk_stats() {
                self.metrics.set_disk(&d);
            }
        }
        self.metrics.set_retransmits(self.transport.retransmits());
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
    /// hand the scheduler rank ([`KvConnector::set_rank_handshakes`]).
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

impl Drop for KvConnector {
    fn drop(&mut self) {
        // A TCP node stops its tasks on shutdown, which needs its runtime.
        let _guard = self.rt.enter();
        self.transport.shutdown();
    }
}
