//! Opening a connector over each transport: TCP, TCP with the same-host backend beside it, RDMA, shm,
//! or any the caller started, all with the control channel of [`crate::control`].

use std::net::SocketAddr;
use std::sync::Arc;

use backends::Transport;
use backends::tcp::{TcpConfig, TcpNode};
use policy::Namespace;

use crate::config::ConnectorConfig;
use crate::connector::{KvConnector, Remotes, Source, runtime};
use crate::control;
use crate::data_plane::{DataPlane, SameHostTransport};
use crate::error::ConnectorError;
use crate::runtime::OwnRuntime;

impl KvConnector {
    /// A connector over TCP. A producer (or `both`) serves lookups and loads on `control_listen`; a
    /// consumer (or `both`) asks the producer whose control address is `producer`. `tcp` sets up the
    /// transfer engine's node (its listen address, lanes, shaping, secret); a consumer's node must listen.
    /// The node's lanes check the connector's namespace: leave `tcp.namespace` at its default (the
    /// connector fills it in) or give it the connector's; another one is refused as a configuration
    /// mistake.
    pub fn tcp(
        cfg: ConnectorConfig,
        tcp: TcpConfig,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<KvConnector, ConnectorError> {
        let rt = runtime()?;
        let node = Self::tcp_node(&cfg, &rt, tcp)?;
        Self::remote(cfg, rt, DataPlane::new(node), control_listen, producer)
    }

    /// A connector over TCP for remote peers and the same-host backend for peers on this host: a
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
        producer: Option<SocketAddr>,
    ) -> Result<KvConnector, ConnectorError> {
        let rt = runtime()?;
        let node = Self::tcp_node(&cfg, &rt, tcp)?;
        let same_host = SameHostTransport::new(Arc::new(backends::shm::ShmNode::start(shm)?));
        let plane = DataPlane::with_same_host(node, same_host);
        Self::remote(cfg, rt, plane, control_listen, producer)
    }

    fn tcp_node(
        cfg: &ConnectorConfig,
        rt: &OwnRuntime,
        mut tcp: TcpConfig,
    ) -> Result<Arc<dyn Transport>, ConnectorError> {
        // Weight versions are told apart by the keys (a rolling update serves two at once), so the lane
        // handshake checks the model, block size and dtype only.
        let lanes = |ns: &Namespace| Namespace {
            weight_version: 0,
            ..ns.clone()
        };
        if tcp.namespace != Namespace::default() && lanes(&tcp.namespace) != lanes(&cfg.namespace) {
            return Err(ConnectorError::Config(format!(
                "TcpConfig::namespace is {} but the connector's is {}: leave TcpConfig::namespace at its \
                 default (the connector sets it) or give it the connector's",
                tcp.namespace, cfg.namespace
            )));
        }
        tcp.namespace = lanes(&cfg.namespace);
        let node = rt.block_on(TcpNode::start(tcp))?;
        if cfg.role.loads() && node.local_addr().is_none() {
            return Err(ConnectorError::Config(
                "a consumer's TCP node must listen (set TcpConfig::listen): producers connect to it".into(),
            ));
        }
        Ok(Arc::new(node))
    }

    /// A connector over RDMA (libfabric: verbs, efa, or here its tcp and shm providers), with the same
    /// control channel as [`KvConnector::tcp`]: the consumer names its endpoint in each load, and the
    /// producer reaches it and writes into the KV caches it published.
    #[cfg(feature = "rdma")]
    pub fn rdma(
        cfg: ConnectorConfig,
        rdma: backends::rdma::RdmaConfig,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<KvConnector, ConnectorError> {
        let node = backends::rdma::RdmaNode::start(rdma)?;
        Self::over(cfg, Arc::new(node), control_listen, producer)
    }

    /// A connector over the same-host backend (a Unix socket; shared memory or cross-memory attach),
    /// for a producer and consumers on one host, with the same control channel as [`KvConnector::tcp`].
    /// A consumer's node must listen (`ShmConfig::socket_path`): the producer dials it and copies
    /// nothing itself; the consumer's node copies each unit out of the producer's memory into its KV
    /// caches.
    #[cfg(target_os = "linux")]
    pub fn shm(
        cfg: ConnectorConfig,
        shm: backends::shm::ShmConfig,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<KvConnector, ConnectorError> {
        let node = backends::shm::ShmNode::start(shm)?;
        Self::over(cfg, Arc::new(node), control_listen, producer)
    }

    /// A connector over a transport the caller started (any backend): producers serve lookups and loads
    /// on `control_listen`, consumers ask `producer`, as in [`KvConnector::tcp`]. The connector shuts the
    /// transport down when it is dropped.
    pub fn over(
        cfg: ConnectorConfig,
        transport: Arc<dyn Transport>,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<KvConnector, ConnectorError> {
        Self::remote(
            cfg,
            runtime()?,
            DataPlane::new(transport),
            control_listen,
            producer,
        )
    }

    /// A connector over two transports the caller started: `main` for every peer, and `same_host` for
    /// peers on its host (see [`KvConnector::tcp_with_shm`]). The connector shuts both down when dropped.
    pub fn over_with_same_host(
        cfg: ConnectorConfig,
        main: Arc<dyn Transport>,
        same_host: SameHostTransport,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<KvConnector, ConnectorError> {
        let plane = DataPlane::with_same_host(main, same_host);
        Self::remote(cfg, runtime()?, plane, control_listen, producer)
    }

    /// The one path of every connector whose producer and consumer talk over a control channel.
    fn remote(
        cfg: ConnectorConfig,
        rt: Arc<OwnRuntime>,
        transport: DataPlane,
        control_listen: Option<SocketAddr>,
        producer: Option<SocketAddr>,
    ) -> Result<KvConnector, ConnectorError> {
        if cfg.role.loads() && transport.address().is_none() {
            return Err(ConnectorError::Config(format!(
                "a consumer's {} node needs an address producers can reach",
                transport.backend()
            )));
        }
        let source = match (cfg.role.loads(), producer) {
            (false, _) => Source::None,
            // Without a default producer, only requests whose transfer parameters name one load
            // (and a `both` connector's own tier store).
            (true, default) => Source::Remote(Remotes::new(default, cfg.load_timeout)),
        };
        let mut c = Self::assemble(cfg, rt, transport, source)?;
        if let Some(core) = c.producer.clone() {
            let addr = control_listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
            let listener = c.rt.block_on(tokio::net::TcpListener::bind(addr))?;
            c.control_addr = Some(listener.local_addr()?);
            c.rt.spawn(control::serve(core, listener));
        }
        Ok(c)
    }
}
