//! The one error of the backends, with whose fault it is.

use std::time::Duration;

use transfer_engine::{Error as EngineError, PeerId};

pub use transfer_engine::Fault;

use crate::board::WaitError;
use crate::node::handshake::Mismatch;

/// Errors of every backend and of the [`super::Transport`] interface. The variants come in four groups,
/// and [`TransportError::fault`] follows from them: the caller's (a request the engine refused, a bad
/// configuration, a capability the backend lacks, a peer never connected), the peer's (it refused this
/// node or broke the protocol), the transport's (unreachable, timed out, lost, this node's own I/O) and
/// the device's (GPU).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The engine refused a command (the caller's), or a frame a peer sent (the peer's: see
    /// [`transfer_engine::Error::fault`]).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A wait ended without its answer: an unknown session or layer (the caller's), a layer lost or the
    /// node shut down (the transport's).
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// The configuration is not usable.
    #[error("invalid {backend} configuration: {message}")]
    Config {
        /// The backend.
        backend: &'static str,
        /// What is wrong, and what to set instead.
        message: String,
    },
    /// This backend cannot do what was asked.
    #[error("the {backend} transport cannot {what}")]
    Unsupported {
        /// The backend.
        backend: &'static str,
        /// What it cannot do.
        what: String,
    },
    /// The peer was never reached, or does not offer what the request addresses.
    #[error("no route to peer {peer:?}: {why}")]
    NoRoute {
        /// The peer.
        peer: PeerId,
        /// Why, and what to do.
        why: String,
    },
    /// The peer refused this node, with its reason (a Reject in the handshake: another version,
    /// namespace or secret there, or a limit of the peer's); the reason says which side must change what.
    #[error("refused by the peer: {0}")]
    Refused(String),
    /// The peer and this node cannot talk: another protocol version, the same engine id, another KV
    /// namespace, or a shared secret on one side only or not the same on both.
    #[error("the peer does not fit this node: {0}")]
    Mismatch(#[from] Mismatch),
    /// The peer sent something this node cannot use: it broke the protocol.
    #[error("the peer broke the {backend} protocol: {message}")]
    Protocol {
        /// The backend.
        backend: &'static str,
        /// What it sent.
        message: String,
    },
    /// The peer answered nothing for the backend's `unreachable_after`, or its connection is gone: new
    /// sessions to it are refused until it answers again.
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// A wait ran out of time.
    #[error("{what} did not finish within {waited:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// The node's own I/O failed (a socket, a thread, a registration).
    #[error("{backend} I/O failed: {message}")]
    Io {
        /// The backend.
        backend: &'static str,
        /// What failed.
        message: String,
    },
    /// A libfabric call failed.
    #[error("{call} failed: {message} ({code})")]
    Fabric {
        /// The call.
        call: &'static str,
        /// Its return code (a negative `FI_E*`).
        code: i64,
        /// libfabric's text for it.
        message: String,
    },
    /// The GPU failed: its driver is missing or refused a call, or a device copy failed.
    #[error("GPU failed ({backend}): {message}")]
    Device {
        /// The backend.
        backend: &'static str,
        /// The driver's words.
        message: String,
    },
    /// The node is shut down.
    #[error("the node is shut down")]
    Closed,
}

impl TransportError {
    /// Whose fault this is.
    #[must_use]
    pub fn fault(&self) -> Fault {
        match self {
            TransportError::Engine(e) => e.fault(),
            TransportError::Wait(WaitError::LayerLost { .. } | WaitError::Closed) => {
                Fault::Transport
            }
            TransportError::Wait(_)
            | TransportError::Config { .. }
            | TransportError::Unsupported { .. }
            | TransportError::NoRoute { .. } => Fault::Caller,
            TransportError::Refused(_)
            | TransportError::Mismatch(_)
            | TransportError::Protocol { .. } => Fault::Peer,
            TransportError::Unreachable(_)
            | TransportError::Timeout { .. }
            | TransportError::Io { .. }
            | TransportError::Fabric { .. }
            | TransportError::Closed => Fault::Transport,
            TransportError::Device { .. } => Fault::Device,
        }
    }

    /// `backend` cannot reach a node at `address` (an address of another backend).
    #[must_use]
    pub fn cannot_reach(backend: &'static str, address: &super::PeerAddress) -> Self {
        TransportError::Unsupported {
            backend,
            what: format!("reach {address}"),
        }
    }

    /// An I/O error of `backend`: a peer that refuses, resets, closes or does not answer is unreachable;
    /// anything else is this node's own I/O failing.
    #[must_use]
    pub fn io(backend: &'static str, e: &std::io::Error) -> Self {
        if peer_gone(e) {
            TransportError::Unreachable(e.to_string())
        } else {
            TransportError::Io {
                backend,
                message: e.to_string(),
            }
        }
    }

    /// A configuration error of `backend`.
    #[must_use]
    pub fn config(backend: &'static str, message: impl Into<String>) -> Self {
        TransportError::Config {
            backend,
            message: message.into(),
        }
    }

    /// A protocol violation by a peer of `backend`.
    #[must_use]
    pub fn protocol(backend: &'static str, message: impl Into<String>) -> Self {
        TransportError::Protocol {
            backend,
            message: message.into(),
        }
    }

    /// The blocks to recompute when a wait ended because its layer was lost.
    #[must_use]
    pub fn lost_blocks(&self) -> Option<&[transfer_engine::BlockId]> {
        match self {
            TransportError::Wait(WaitError::LayerLost { blocks, .. }) => Some(blocks),
            _ => None,
        }
    }
}

/// Whether an I/O error means the peer is not there (refused, reset, closed, silent, unroutable).
fn peer_gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::UnexpectedEof
            | K::BrokenPipe
            | K::TimedOut
            | K::HostUnreachable
            | K::NetworkUnreachable
    )
}

#[cfg(feature = "cuda")]
impl From<crate::cuda::CudaError> for TransportError {
    fn from(e: crate::cuda::CudaError) -> Self {
        TransportError::Device {
            backend: "cuda",
            message: e.to_string(),
        }
    }
}
