//! What carries the KV between the two processes of `te-bench pd`: one connector constructor per
//! backend, the same connector code above it.

use std::net::SocketAddr;

use backends::tcp::TcpConfig;
use connector::{KvRole, KvScheduler, KvWorker, Sources};

use super::{PdArgs, config};

/// The transports `te-bench pd` runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PdBackend {
    /// TCP lanes (tokio).
    Tcp,
    /// libfabric (feature `rdma`), on the provider `--provider` names.
    Rdma,
}

impl PdBackend {
    pub(crate) fn name(self) -> &'static str {
        match self {
            PdBackend::Tcp => "tcp",
            PdBackend::Rdma => "rdma",
        }
    }
}

/// One instance's two connector halves, in one process here (vLLM runs them in two): the metadata
/// crosses between them as bytes, as between processes, and both count into the worker's metrics.
pub(super) struct Halves {
    pub(super) scheduler: KvScheduler,
    pub(super) worker: KvWorker,
}

impl Halves {
    /// The scheduler's plan for this step, handed to the worker.
    pub(super) fn plan_step(&self) -> anyhow::Result<()> {
        let bytes = self.scheduler.build_connector_meta().to_bytes();
        self.worker
            .bind_connector_metadata(connector::ConnectorMetadata::from_bytes(&bytes)?);
        Ok(())
    }

    /// Both halves switch to weight version `version`.
    pub(super) fn set_weight_version(&self, version: u64) {
        self.scheduler.set_weight_version(version);
        self.worker.set_weight_version(version);
    }
}

/// The connector of `role` with engine id `engine_id` on the chosen backend; a consumer asks the producer
/// whose control address is `producer`.
pub(super) fn connector(
    args: &PdArgs,
    role: KvRole,
    engine_id: u32,
    producer: Option<SocketAddr>,
) -> anyhow::Result<Halves> {
    let worker = worker(args, role, engine_id)?;
    let mut sources = Sources::default();
    sources.default = producer;
    sources.own = worker.control_addr();
    let scheduler =
        KvScheduler::new(config(args, role), sources)?.with_metrics(worker.shared_metrics());
    Ok(Halves { scheduler, worker })
}

fn worker(args: &PdArgs, role: KvRole, engine_id: u32) -> anyhow::Result<KvWorker> {
    let cfg = config(args, role);
    match args.backend {
        PdBackend::Tcp => {
            let mut tcp = TcpConfig::with_engine_id(engine_id);
            // A producer only dials; a consumer listens for it on loopback.
            tcp.listen = role.loads().then(|| SocketAddr::from(([127, 0, 0, 1], 0)));
            Ok(KvWorker::tcp(cfg, tcp, None)?)
        }
        #[cfg(feature = "rdma")]
        PdBackend::Rdma => {
            let rdma = crate::rdma::node_config(engine_id, &args.provider, None);
            Ok(KvWorker::rdma(cfg, rdma, None)?)
        }
        #[cfg(not(feature = "rdma"))]
        PdBackend::Rdma => {
            anyhow::bail!(
                "this te-bench was built without feature `rdma`: --backend rdma is not available"
            )
        }
    }
}
