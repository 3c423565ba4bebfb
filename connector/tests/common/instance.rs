//! One serving instance as the connector's tests drive it: its scheduler half and its worker half in one
//! process, the metadata handed from one to the other as bytes (as vLLM hands it between its processes).
//! It derefs to the worker; the scheduler's calls are its own, each lookup waited for. Both halves count
//! into one set of metrics.

use std::net::SocketAddr;
use std::sync::Arc;

use backends::Transport;
use backends::tcp::TcpConfig;
use connector::{
    ConnectorConfig, ConnectorError, ConnectorMetadata, KvRequest, KvScheduler, KvTransferParams,
    KvWorker, RankHandshake, ScopedKey, Sources,
};

/// A scheduler half and a worker half of one instance.
#[derive(Debug)]
pub(crate) struct Instance {
    pub(crate) scheduler: KvScheduler,
    pub(crate) worker: KvWorker,
}

impl std::ops::Deref for Instance {
    type Target = KvWorker;

    fn deref(&self) -> &KvWorker {
        &self.worker
    }
}

impl Instance {
    /// `worker` with a scheduler of `cfg` whose default producer is `producer` and whose own control
    /// address is the worker's.
    pub(crate) fn new(
        cfg: ConnectorConfig,
        worker: KvWorker,
        producer: Option<SocketAddr>,
    ) -> Result<Instance, ConnectorError> {
        let mut sources = Sources::default();
        sources.default = producer;
        sources.own = worker.control_addr();
        Ok(Instance {
            scheduler: KvScheduler::new(cfg, sources)?.with_metrics(worker.shared_metrics()),
            worker,
        })
    }

    /// An instance over TCP (see [`KvWorker::tcp`]) asking `producer` by default.
    pub(crate) fn tcp(
        cfg: ConnectorConfig,
        tcp: TcpConfig,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<Instance, ConnectorError> {
        let worker = KvWorker::tcp(cfg.clone(), tcp, control_listen)?;
        Instance::new(cfg, worker, producer)
    }

    /// An instance over TCP with the same-host backend beside it.
    #[cfg(target_os = "linux")]
    pub(crate) fn tcp_with_shm(
        cfg: ConnectorConfig,
        tcp: TcpConfig,
        shm: backends::shm::ShmConfig,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<Instance, ConnectorError> {
        let worker = KvWorker::tcp_with_shm(cfg.clone(), tcp, shm, control_listen)?;
        Instance::new(cfg, worker, producer)
    }

    /// An instance over the same-host backend.
    #[cfg(target_os = "linux")]
    pub(crate) fn shm(
        cfg: ConnectorConfig,
        shm: backends::shm::ShmConfig,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<Instance, ConnectorError> {
        let worker = KvWorker::shm(cfg.clone(), shm, control_listen)?;
        Instance::new(cfg, worker, producer)
    }

    /// An instance over RDMA.
    #[cfg(feature = "rdma")]
    pub(crate) fn rdma(
        cfg: ConnectorConfig,
        rdma: backends::rdma::RdmaConfig,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<Instance, ConnectorError> {
        let worker = KvWorker::rdma(cfg.clone(), rdma, control_listen)?;
        Instance::new(cfg, worker, producer)
    }

    /// An instance over a transport the caller started.
    pub(crate) fn over(
        cfg: ConnectorConfig,
        transport: Arc<dyn Transport>,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<Instance, ConnectorError> {
        let worker = KvWorker::over(cfg.clone(), transport, control_listen)?;
        Instance::new(cfg, worker, producer)
    }

    /// An instance over two transports the caller started (see [`KvWorker::over_with_same_host`]).
    pub(crate) fn over_with_same_host(
        cfg: ConnectorConfig,
        main: Arc<dyn Transport>,
        same_host: connector::SameHostTransport,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<Instance, ConnectorError> {
        let worker = KvWorker::over_with_same_host(cfg.clone(), main, same_host, control_listen)?;
        Instance::new(cfg, worker, producer)
    }

    /// A producer and a consumer instance over the loopback backend, the consumer asking the producer.
    pub(crate) fn loopback_pair(
        producer: ConnectorConfig,
        consumer: ConnectorConfig,
    ) -> Result<(Instance, Instance), ConnectorError> {
        let (p, c) = KvWorker::loopback_pair(producer.clone(), consumer.clone())?;
        let control = p.control_addr();
        Ok((
            Instance::new(producer, p, None)?,
            Instance::new(consumer, c, control)?,
        ))
    }

    /// The scheduler's `get_num_new_matched_tokens`, its lookup waited for.
    pub(crate) fn get_num_new_matched_tokens(
        &self,
        req: &KvRequest<'_>,
        num_computed: usize,
    ) -> Result<(usize, bool), ConnectorError> {
        self.scheduler.wait_matched_tokens(req, num_computed)
    }

    pub(crate) fn update_state_after_alloc(
        &self,
        request: &str,
        block_ids: &[u32],
        num_external_tokens: usize,
    ) -> Result<(), ConnectorError> {
        self.scheduler
            .update_state_after_alloc(request, block_ids, num_external_tokens)
    }

    pub(crate) fn record_step(
        &self,
        request: &str,
        new_blocks: &[u32],
        replace: bool,
        computed_tokens: usize,
    ) -> bool {
        self.scheduler
            .record_step(request, new_blocks, replace, computed_tokens)
    }

    pub(crate) fn hold_for_decode(&self, request: &str) -> Result<(), ConnectorError> {
        self.scheduler.hold_for_decode(request)
    }

    /// The scheduler's step metadata, as the workers read it after it crossed to their process.
    pub(crate) fn build_connector_meta(&self) -> ConnectorMetadata {
        let bytes = self.scheduler.build_connector_meta().to_bytes();
        ConnectorMetadata::from_bytes(&bytes).expect("the metadata reads back")
    }

    pub(crate) fn request_finished(&self, request: &str) -> (bool, Option<KvTransferParams>) {
        self.scheduler.request_finished(request)
    }

    pub(crate) fn set_rank_handshakes(
        &self,
        handshakes: &[RankHandshake],
    ) -> Result<(), ConnectorError> {
        self.scheduler.set_rank_handshakes(handshakes)
    }

    pub(crate) fn request_keys(&self, req: &KvRequest<'_>) -> Vec<ScopedKey> {
        self.scheduler.request_keys(req)
    }

    /// Both halves switch to weight version `version`.
    pub(crate) fn set_weight_version(&self, version: u64) {
        self.scheduler.set_weight_version(version);
        self.worker.set_weight_version(version);
    }

    /// Both halves' metrics (they share one registry), as Prometheus text.
    pub(crate) fn prometheus(&self) -> String {
        self.worker.prometheus()
    }
}
