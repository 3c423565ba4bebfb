//! Opening a worker over each transport: TCP, TCP with the same-host backend beside it, RDMA, shm, the
//! in-process loopback pair, or any the caller started. A role that saves serves the control channel
//! of [`crate::control`] (on `control_listen`, or a free loopback port), where schedulers look up and
//! consumers' workers ask for loads.

use std::net::SocketAddr;
use std::sync::Arc;

use backends::Transport;
use backends::loopback::LoopbackPair;
use backends::tcp::{TcpConfig, TcpNode};
use policy::Namespace;

use super::{KvWorker, runtime};
use crate::config::{ConnectorConfig, KvRole};
use crate::control;
use crate::data_plane::{DataPlane, SameHostTransport};
use crate::error::ConnectorError;
use crate::runtime::OwnRuntime;

impl KvWorker {
    /// A worker over TCP. A producer (or `both`) serves lookups and loads on `control_listen`; a
    /// consumer (or `both`) loads from the producers its scheduler's metadata names. `tcp` sets up the
    /// transfer engine's node (its listen address, lanes, shaping, secret); a consumer's node must listen.
    /// The node's lanes check the connector's namespace: leave `tcp.namespace` at its default (the
    /// connector fills it in) or give it the connector's; another one is refused as a configuration
    /// mistake.
    pub fn tcp(
        cfg: ConnectorConfig,
        tcp: TcpConfig,
        control_listen: Option<SocketAddr>,
    ) -> Result<KvWorker, ConnectorError> {
        let rt = runtime()?;
        let node = Self::tcp_node(&cfg, &rt, tcp)?;
        Self::remote(cfg, rt, DataPlane::new(node), control_listen)
    }

    /// A worker over TCP for remote peers and the same-host backend for peers on this host: a
    /// consumer names both endpoints in each load, and a producer on the consumer's host copies through
    /// shared memory (counted in `kv_same_host_loads_total`), falling back to TCP when it cannot reach the
    /// consumer there. A consumer's shm node must listen (`ShmConfig::socket_path`) for producers to use
    /// it; a producer's needs no socket. The KV bandwidth cap (`TcpConfig` shaping or the connector's)
    /// applies to TCP only.
    #[cfg(target_os = "linux")]
    pub fn tcp_with_shm(
        cfg: ConnectorConfig,
        tcp: TcpConfig,
        shm: backends::shm::ShmConfig,
        control_listen: Option<SocketAddr>,
    ) -> Result<KvWorker, ConnectorError> {
        let rt = runtime()?;
        let node = Self::tcp_node(&cfg, &rt, tcp)?;
        let same_host = SameHostTransport::new(Self::shm_node(&cfg, shm)?);
        let plane = DataPlane::with_same_host(node, same_host);
        Self::remote(cfg, rt, plane, control_listen)
    }

    /// Gives a backend's handshake the connector's secret and lane namespace: a backend config that names
    /// its own (`what`) must agree with the connector's.
    fn lane_security(
        cfg: &ConnectorConfig,
        what: &str,
        secret: &mut Option<backends::tcp::Secret>,
        namespace: &mut Namespace,
    ) -> Result<(), ConnectorError> {
        match (&*secret, &cfg.secret) {
            (Some(a), Some(b)) if a != b => {
                return Err(ConnectorError::Config(format!(
                    "{what}'s secret differs from the connector's: give one (the connector's secret is \
                     the lanes' too)"
                )));
            }
            (None, Some(s)) => *secret = Some(s.clone()),
            _ => {}
        }
        // The lane handshake checks the model, block size and dtype only (see `lane_namespace`): a
        // backend namespace of another weight version still agrees.
        let lanes = Namespace {
            weight_version: 0,
            ..namespace.clone()
        };
        if *namespace != Namespace::default() && lanes != cfg.lane_namespace() {
            return Err(ConnectorError::Config(format!(
                "{what}::namespace is {namespace} but the connector's is {}: leave {what}::namespace at \
                 its default (the connector sets it) or give it the connector's",
                cfg.namespace
            )));
        }
        *namespace = cfg.lane_namespace();
        Ok(())
    }

    /// The same-host node of `shm`, with the connector's secret and lane namespace.
    #[cfg(target_os = "linux")]
    fn shm_node(
        cfg: &ConnectorConfig,
        mut shm: backends::shm::ShmConfig,
    ) -> Result<Arc<backends::shm::ShmNode>, ConnectorError> {
        Self::lane_security(cfg, "ShmConfig", &mut shm.secret, &mut shm.namespace)?;
        Ok(Arc::new(backends::shm::ShmNode::start(shm)?))
    }

    fn tcp_node(
        cfg: &ConnectorConfig,
        rt: &OwnRuntime,
        mut tcp: TcpConfig,
    ) -> Result<Arc<dyn Transport>, ConnectorError> {
        Self::lane_security(
            cfg,
            "TcpConfig",
            &mut tcp.security.secret,
            &mut tcp.namespace,
        )?;
        let node = rt.block_on(TcpNode::start(tcp))?;
        if cfg.role.loads() && node.local_addr().is_none() {
            return Err(ConnectorError::Config(
                "a consumer's TCP node must listen (set TcpConfig::listen): producers connect to it".into(),
            ));
        }
        Ok(Arc::new(node))
    }

    /// A worker over RDMA (libfabric: verbs, efa, or here its tcp and shm providers), with the same
    /// control channel as [`KvWorker::tcp`]: the consumer names its endpoint in each load, and the
    /// producer reaches it and writes into the KV caches it published.
    #[cfg(feature = "rdma")]
    pub fn rdma(
        cfg: ConnectorConfig,
        rdma: backends::rdma::RdmaConfig,
        control_listen: Option<SocketAddr>,
    ) -> Result<KvWorker, ConnectorError> {
        let node = backends::rdma::RdmaNode::start(rdma)?;
        Self::over(cfg, Arc::new(node), control_listen)
    }

    /// A worker over the same-host backend (a Unix socket; shared memory or cross-memory attach),
    /// for a producer and consumers on one host, with the same control channel as [`KvWorker::tcp`].
    /// A consumer's node must listen (`ShmConfig::socket_path`): the producer dials it and copies
    /// nothing itself; the consumer's node copies each unit out of the producer's memory into its KV
    /// caches.
    #[cfg(target_os = "linux")]
    pub fn shm(
        cfg: ConnectorConfig,
        shm: backends::shm::ShmConfig,
        control_listen: Option<SocketAddr>,
    ) -> Result<KvWorker, ConnectorError> {
        let node = Self::shm_node(&cfg, shm)?;
        Self::over(cfg, node, control_listen)
    }

    /// A worker over a transport the caller started (any backend), with the control channel of
    /// [`KvWorker::tcp`]. The worker shuts the transport down when it is dropped.
    pub fn over(
        cfg: ConnectorConfig,
        transport: Arc<dyn Transport>,
        control_listen: Option<SocketAddr>,
    ) -> Result<KvWorker, ConnectorError> {
        Self::remote(cfg, runtime()?, DataPlane::new(transport), control_listen)
    }

    /// A worker over two transports the caller started: `main` for every peer, and `same_host` for
    /// peers on its host (see [`KvWorker::tcp_with_shm`]). The worker shuts both down when dropped.
    pub fn over_with_same_host(
        cfg: ConnectorConfig,
        main: Arc<dyn Transport>,
        same_host: SameHostTransport,
        control_listen: Option<SocketAddr>,
    ) -> Result<KvWorker, ConnectorError> {
        let plane = DataPlane::with_same_host(main, same_host);
        Self::remote(cfg, runtime()?, plane, control_listen)
    }

    /// A producer and a consumer worker in one process, joined by the loopback backend (tests, and an
    /// embedder's in-process prefill and decode): the producer serves its control channel on a free
    /// loopback port, as over any transport. Tensor-parallel places that do not pair are refused here.
    pub fn loopback_pair(
        producer: ConnectorConfig,
        consumer: ConnectorConfig,
    ) -> Result<(KvWorker, KvWorker), ConnectorError> {
        if producer.role != KvRole::Producer || consumer.role != KvRole::Consumer {
            return Err(ConnectorError::Config(
                "a loopback pair is one producer and one consumer".into(),
            ));
        }
        let rank = |c: &ConnectorConfig| crate::tp::RankKv {
            tp: c.tp,
            mla: c.is_mla(),
        };
        crate::tp::check_pairing(rank(&producer), rank(&consumer))
            .map_err(ConnectorError::TensorParallel)?;
        let (p, c) = LoopbackPair::with_defaults().into_nodes();
        Ok((
            Self::over(producer, Arc::new(p), None)?,
            Self::over(consumer, Arc::new(c), None)?,
        ))
    }

    /// The one path of every worker: a role that saves serves its control channel.
    fn remote(
        cfg: ConnectorConfig,
        rt: Arc<OwnRuntime>,
        transport: DataPlane,
        control_listen: Option<SocketAddr>,
    ) -> Result<KvWorker, ConnectorError> {
        if cfg.role.loads() && transport.address().is_none() {
            return Err(ConnectorError::Config(format!(
                "a consumer's {} node needs an address producers can reach",
                transport.backend()
            )));
        }
        let mut c = Self::assemble(cfg, rt, transport)?;
        if let Some(core) = c.producer.clone() {
            let addr = control_listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
            let listener = c.rt.block_on(tokio::net::TcpListener::bind(addr))?;
            c.control_addr = Some(listener.local_addr()?);
            c.rt.spawn(control::serve(core, listener));
        }
        Ok(c)
    }
}
