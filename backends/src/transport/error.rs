//! The one error of the [`super::Transport`] interface, with whose fault it is.

use std::time::Duration;

use transfer_engine::{Error as EngineError, PeerId};

use crate::board::WaitError;

/// Whose fault an error is: what a caller should do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The call was wrong (a malformed request, an unknown session, a bad configuration, a capability the
    /// backend lacks): change the call, retrying it will not help.
    Caller,
    /// The peer refused, misbehaved or went away: its blocks are recomputed; another peer, or the same
    /// one later, may serve.
    Peer,
    /// This node's own I/O failed or it is shut down.
    Transport,
}

/// Errors of every [`super::Transport`]; [`TransportError::fault`] says whose they are.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The engine refused a command (a malformed or out-of-bounds request, an unknown region or session):
    /// always the caller's.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A wait ended without its answer (unknown session, no such layer, layer lost, node shut down).
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// The configuration is not usable.
    #[error("invalid {backend} configuration: {message}")]
    Config {
        /// The backend.
        backend: &'static str,
        /// What is wrong.
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
        /// Why.
        why: String,
    },
    /// The peer answered nothing for the backend's `unreachable_after`: new sessions to it are refused
    /// until it answers again.
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// The peer refused this node (handshake, version, namespace, authentication) or broke the protocol.
    #[error("refused by the peer: {0}")]
    Refused(String),
    /// A wait ran out of time.
    #[error("{what} did not finish within {waited:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// The node's own I/O failed (a socket, a libfabric call, a thread).
    #[error("{backend} I/O failed: {message}")]
    Io {
        /// The backend.
        backend: &'static str,
        /// What failed.
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
            TransportError::Engine(_) => Fault::Caller,
            TransportError::Wait(WaitError::LayerLost { .. }) => Fault::Peer,
            TransportError::Wait(WaitError::Closed) => Fault::Transport,
            TransportError::Wait(_) => Fault::Caller,
            TransportError::Config { .. }
            | TransportError::Unsupported { .. }
            | TransportError::NoRoute { .. } => Fault::Caller,
            TransportError::Unreachable(_)
            | TransportError::Refused(_)
            | TransportError::Timeout { .. } => Fault::Peer,
            TransportError::Io { .. } | TransportError::Closed => Fault::Transport,
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

impl From<crate::tcp::TcpError> for TransportError {
    fn from(e: crate::tcp::TcpError) -> Self {
        use crate::tcp::TcpError as T;
        match e {
            // A peer that refuses, resets, closes or does not answer the connection is the peer's doing.
            T::Io(e) if peer_gone(&e) => TransportError::Unreachable(e.to_string()),
            T::Io(e) => TransportError::Io {
                backend: "tcp",
                message: e.to_string(),
            },
            T::Engine(e) => TransportError::Engine(e),
            T::Wait(e) => TransportError::Wait(e),
            T::Handshake(m) => TransportError::Refused(m),
            T::Config(message) => TransportError::Config {
                backend: "tcp",
                message,
            },
            T::Unreachable(m) => TransportError::Unreachable(m),
            T::NoRoute(peer) => TransportError::NoRoute {
                peer,
                why: "connect to it first or add its address".into(),
            },
            T::Timeout { what, waited } => TransportError::Timeout { what, waited },
            T::Closed => TransportError::Closed,
        }
    }
}

#[cfg(feature = "rdma")]
impl From<crate::rdma::RdmaError> for TransportError {
    fn from(e: crate::rdma::RdmaError) -> Self {
        use crate::rdma::RdmaError as R;
        match e {
            e @ (R::Fabric { .. } | R::UnknownRegistration(_)) => TransportError::Io {
                backend: "rdma",
                message: e.to_string(),
            },
            R::NoProvider(message) | R::Config(message) => TransportError::Config {
                backend: "rdma",
                message,
            },
            R::Protocol(m) => TransportError::Refused(m),
            R::Engine(e) => TransportError::Engine(e),
            R::Wait(e) => TransportError::Wait(e),
            R::Unreachable(m) => TransportError::Unreachable(m),
            R::NoRoute(peer, why) => TransportError::NoRoute { peer, why },
            R::Timeout { what, waited } => TransportError::Timeout { what, waited },
            R::Closed => TransportError::Closed,
        }
    }
}

#[cfg(target_os = "linux")]
impl From<crate::shm::ShmError> for TransportError {
    fn from(e: crate::shm::ShmError) -> Self {
        use crate::shm::ShmError as S;
        match e {
            S::Config(message) => TransportError::Config {
                backend: "shm",
                message,
            },
            S::Io(e) => TransportError::Io {
                backend: "shm",
                message: e.to_string(),
            },
            S::Refused(m) => TransportError::Refused(m),
            S::Engine(e) => TransportError::Engine(e),
            S::Wait(e) => TransportError::Wait(e),
            S::Unreachable(m) => TransportError::Unreachable(m),
            S::NoRoute(peer, why) => TransportError::NoRoute { peer, why },
            S::Timeout { what, waited } => TransportError::Timeout { what, waited },
            S::Closed => TransportError::Closed,
            #[cfg(feature = "cuda")]
            S::Cuda(e) => TransportError::Io {
                backend: "shm",
                message: e.to_string(),
            },
        }
    }
}

impl From<crate::loopback::LoopbackError> for TransportError {
    fn from(e: crate::loopback::LoopbackError) -> Self {
        use crate::loopback::LoopbackError as L;
        match e {
            L::Engine(e) => TransportError::Engine(e),
            L::Wait(e) => TransportError::Wait(e),
            L::Unreachable(m) => TransportError::Unreachable(m),
            L::Unsupported { end, what } => TransportError::Unsupported {
                backend: "loopback",
                what: format!("{what} from its {end} end"),
            },
            L::Stalled { pending, waited } => TransportError::Timeout {
                what: format!("{pending} session(s)"),
                waited,
            },
        }
    }
}
