//! The crate's one error type.

use transfer_engine::SessionId;

/// What can go wrong in a connector call. Every error is a value the caller handles; none yields wrong
/// KV: a load that fails names the blocks to recompute ([`crate::KvWorker::failed_blocks`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectorError {
    /// The configuration is not usable; the message says which field.
    #[error("invalid connector configuration: {0}")]
    Config(String),
    /// The call is not allowed in this role (a producer never loads, a consumer never saves).
    #[error("{call} is not available to a {role} connector")]
    WrongRole {
        /// The call.
        call: &'static str,
        /// The connector's role.
        role: &'static str,
    },
    /// The worker has not registered its KV caches yet.
    #[error("register the KV caches (register_kv_caches) before {0}")]
    NoKvCaches(&'static str),
    /// A request id the connector does not know in this step.
    #[error("unknown request {0:?}")]
    UnknownRequest(String),
    /// The block lists of a request do not fit the layout.
    #[error("bad block list: {0}")]
    Blocks(String),
    /// The transfer engine refused a command.
    #[error(transparent)]
    Engine(#[from] transfer_engine::Error),
    /// The transport (loopback, TCP or RDMA) failed; [`backends::TransportError::fault`] says whose
    /// fault it is.
    #[error(transparent)]
    Transport(#[from] backends::TransportError),
    /// KV caches in GPU memory cannot be used here (no GPU support, no driver), or a copy between them and
    /// the tier store failed on the GPU.
    #[error("GPU: {0}")]
    Gpu(String),
    /// The tier manager refused its configuration.
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    /// The control connection to a producer failed or it answered with an error.
    #[error("producer at {peer}: {message}")]
    Control {
        /// The producer's control address.
        peer: String,
        /// What happened.
        message: String,
    },
    /// Two instances' tensor-parallel ranks cannot exchange KV (different sizes, or different ranks).
    #[error("tensor parallelism: {0}")]
    TensorParallel(String),
    /// A load session ended without some of its layers.
    #[error("load session {session} lost layer {layer}: its blocks must be recomputed")]
    LayerLost {
        /// The session.
        session: SessionId,
        /// The layer.
        layer: u32,
    },
    /// The disk tier failed (a full disk, an I/O error, a configuration it cannot use).
    #[error(transparent)]
    Disk(#[from] crate::disk::DiskError),
    /// A socket or runtime operation failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl ConnectorError {
    /// Whose fault this is: who must act on it.
    #[must_use]
    pub fn fault(&self) -> backends::Fault {
        use backends::Fault;
        match self {
            ConnectorError::Config(_)
            | ConnectorError::WrongRole { .. }
            | ConnectorError::NoKvCaches(_)
            | ConnectorError::UnknownRequest(_)
            | ConnectorError::Blocks(_)
            | ConnectorError::Policy(_)
            | ConnectorError::TensorParallel(_) => Fault::Caller,
            ConnectorError::Engine(e) => e.fault(),
            ConnectorError::Transport(e) => e.fault(),
            ConnectorError::Gpu(_) => Fault::Device,
            // The producer (or the registry) failed or answered with an error: another may serve.
            ConnectorError::Control { .. } => Fault::Peer,
            ConnectorError::LayerLost { .. } | ConnectorError::Io(_) => Fault::Transport,
            ConnectorError::Disk(e) => match e {
                crate::disk::DiskError::Config(_)
                | crate::disk::DiskError::DirectUnsupported(_) => Fault::Caller,
                _ => Fault::Transport,
            },
        }
    }
}
