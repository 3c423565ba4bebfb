//! What carries the KV between the two processes of `te-bench pd`: one connector constructor per
//! backend, the same connector code above it.

use std::net::SocketAddr;

use backends::tcp::TcpConfig;
use connector::{KvConnector, KvRole};

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

/// The connector of `role` with engine id `engine_id` on the chosen backend; a consumer asks the producer
/// whose control address is `producer`.
pub(super) fn connector(
    args: &PdArgs,
    role: KvRole,
    engine_id: u32,
    producer: Option<SocketAddr>,
) -> anyhow::Result<KvConnector> {
    let cfg = config(args, role);
    match args.backend {
        PdBackend::Tcp => {
            let mut tcp = TcpConfig::with_engine_id(engine_id);
            // A producer only dials; a consumer listens for it on loopback.
            tcp.listen = role.loads().then(|| SocketAddr::from(([127, 0, 0, 1], 0)));
            Ok(KvConnector::tcp(cfg, tcp, None, producer)?)
        }
        #[cfg(feature = "rdma")]
        PdBackend::Rdma => {
            let rdma = crate::rdma::node_config(engine_id, &args.provider, None);
            Ok(KvConnector::rdma(cfg, rdma, None, producer)?)
        }
        #[cfg(not(feature = "rdma"))]
        PdBackend::Rdma => {
            anyhow::bail!(
                "this te-bench was built without feature `rdma`: --backend rdma is not available"
            )
        }
    }
}
