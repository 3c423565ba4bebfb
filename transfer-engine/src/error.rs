//! The core's error type: one enum whose variants say what went wrong, whose fault it is and what to do.

use std::ops::Range;

use crate::{FrameKind, KvLayout, MemoryKind, PeerId, RegionId, SessionId, WireError};

/// Whose fault an error is: who must act on it. Every layer's error answers this from its variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The call or the configuration was wrong (a malformed request, an unknown session, a capability the
    /// backend lacks): change it, retrying will not help.
    Caller,
    /// The peer refused, broke the protocol or does not match this side (version, namespace, layout): its
    /// blocks are recomputed; another peer may serve.
    Peer,
    /// The path failed: the peer is unreachable, a layer was lost, this node's own I/O failed or it is
    /// shut down. The same request may succeed later.
    Transport,
    /// The GPU (its driver or a device copy) failed.
    Device,
}

impl Fault {
    /// The fault's name in lower case (`caller`, `peer`, `transport`, `device`), for logs and metrics.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Fault::Caller => "caller",
            Fault::Peer => "peer",
            Fault::Transport => "transport",
            Fault::Device => "device",
        }
    }
}

/// Everything the core can refuse. None of these leave the engine in a bad state: the offending input is
/// dropped and every other session carries on. A refused frame is [`Error::Refused`], the peer's fault;
/// every other variant answers a call, and is the caller's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A frame from `peer` was refused; `cause` says why. Raised only by the frame inputs
    /// ([`crate::Engine::handle_frame`] and its siblings), always the peer's fault.
    #[error("refused a frame from peer {peer}: {cause}", peer = peer.0)]
    Refused {
        /// The peer that sent it.
        peer: PeerId,
        /// What was wrong with it.
        cause: Box<Error>,
    },
    /// A frame could not be decoded.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// Two KV layouts disagree on a field that must match.
    #[error(
        "{field} {local} does not match the peer's {remote}: configure both sides with the same {field}"
    )]
    LayoutMismatch {
        /// Which field disagrees (for example "block size (tokens per block)").
        field: &'static str,
        /// This side's value.
        local: u64,
        /// The other side's value.
        remote: u64,
    },
    /// A KV layout (its dimensions, strides, heads or tensor views) is not usable.
    #[error("invalid KV layout: {0}")]
    InvalidLayout(String),
    /// A transfer's layers or block lists are not usable.
    #[error("invalid block list: {0}")]
    InvalidBlocks(String),
    /// A transfer cannot be cut into units as asked (slice size, unit limits).
    #[error("cannot cut the transfer into units: {0}")]
    InvalidUnits(String),
    /// A shaping setting (token bucket, KV share) is not usable.
    #[error("invalid shaping: {0}")]
    InvalidShaping(String),
    /// A transfer describes a region with another layout than the one it was registered with.
    #[error(
        "the transfer describes region {region} as {given:?}, but it was registered as {registered:?}"
    )]
    LayoutDiffers {
        /// The region.
        region: RegionId,
        /// The layout the transfer gives.
        given: Box<KvLayout>,
        /// The layout the region was registered with.
        registered: Box<KvLayout>,
    },
    /// A region is registered over less memory than its length.
    #[error(
        "a region of {len} bytes needs at least that much memory, but {given} bytes were given"
    )]
    MemoryTooSmall {
        /// The region's length.
        len: u64,
        /// The memory's length.
        given: u64,
    },
    /// A copy's source and destination are the same memory (two views of one region at once).
    #[error("the source and destination are the same memory: register distinct memory for each")]
    SameRegion,
    /// A frame of this kind was handed to the wrong input (data frames go through
    /// [`crate::Engine::placement`] and [`crate::Engine::handle_data`]; the others through
    /// [`crate::Engine::handle_frame`]).
    #[error("a {0:?} frame was handed to the wrong engine input")]
    WrongInput(FrameKind),
    /// A layer outside a session's layers was named.
    #[error("layer {layer} is not part of session {session} (layers {}..{})", layers.start, layers.end)]
    LayerOutside {
        /// The session.
        session: SessionId,
        /// The layer named.
        layer: u32,
        /// The session's layers.
        layers: Range<u32>,
    },
    /// The region id is not registered here.
    #[error("region {0} is not registered: register it before naming it in a transfer")]
    UnknownRegion(RegionId),
    /// The access key does not match the region's.
    #[error("wrong access key for region {0}: use the key returned when the region was registered")]
    WrongKey(RegionId),
    /// An access falls outside the region.
    #[error("bytes {offset}..{end} are outside region {region} of {len} bytes", end = offset.saturating_add(*length))]
    OutOfBounds {
        /// The region addressed.
        region: RegionId,
        /// First byte addressed.
        offset: u64,
        /// Number of bytes addressed.
        length: u64,
        /// The region's length.
        len: u64,
    },
    /// An access falls outside a region's memory.
    #[error("bytes {offset}..{end} are outside memory of {len} bytes", end = offset.saturating_add(*length))]
    MemoryRange {
        /// First byte addressed.
        offset: u64,
        /// Number of bytes addressed.
        length: u64,
        /// The memory's length.
        len: u64,
    },
    /// The memory cannot be read or written by the CPU: the driver must copy through the device's API.
    #[error("{0} cannot be accessed from the host: stage it through host memory")]
    NotHostMemory(MemoryKind),
    /// The region is reserved for another peer's writes.
    #[error("region {region} belongs to another peer: peer {peer} may not write into it", peer = peer.0)]
    NotOwner {
        /// The region.
        region: RegionId,
        /// The peer that tried.
        peer: PeerId,
    },
    /// The region is in use by a live session and cannot be unregistered.
    #[error("region {region} is in use by session {session}: cancel or finish it first")]
    RegionBusy {
        /// The region.
        region: RegionId,
        /// A session using it.
        session: SessionId,
    },
    /// No live session has this id.
    #[error("unknown session {0}")]
    UnknownSession(SessionId),
    /// A frame names a session but does not fit it (wrong unit, wrong addressing, bad control payload).
    #[error("frame does not fit session {session}: {reason}")]
    FrameMismatch {
        /// The session named by the frame.
        session: SessionId,
        /// What did not fit.
        reason: String,
    },
    /// An open reuses a session id this engine already closed.
    #[error(
        "session {0} was already used and closed here: a restarted peer reused its session ids (seed each \
         engine process's rng_seed differently)"
    )]
    SessionReused(SessionId),
    /// An open names a session id another peer has open here.
    #[error("session {session} is already open here from peer {other}: session ids are unique per engine", other = other.0)]
    SessionTaken {
        /// The session id.
        session: SessionId,
        /// The peer that holds it.
        other: PeerId,
    },
    /// A peer opened more sessions here than it may.
    #[error("peer {peer} already has {live} sessions open here, the most allowed: wait for some to finish", peer = peer.0)]
    TooManySessions {
        /// The peer.
        peer: PeerId,
        /// Its open sessions.
        live: usize,
    },
}

impl Error {
    /// Whose fault this is: a refused frame (or what only a frame can do wrong) is the peer's, every other
    /// error the caller's.
    #[must_use]
    pub fn fault(&self) -> Fault {
        match self {
            // These describe only what a peer's frame did.
            Error::Refused { .. }
            | Error::Wire(_)
            | Error::FrameMismatch { .. }
            | Error::SessionReused(_)
            | Error::SessionTaken { .. }
            | Error::TooManySessions { .. } => Fault::Peer,
            _ => Fault::Caller,
        }
    }

    /// This error as the refusal of a frame from `peer` (unchanged if it is one already).
    #[must_use]
    pub fn refused_from(self, peer: PeerId) -> Error {
        match self {
            Error::Refused { .. } => self,
            cause => Error::Refused {
                peer,
                cause: Box::new(cause),
            },
        }
    }

    /// What was wrong: the cause of a refused frame, or this error itself.
    #[must_use]
    pub fn cause(&self) -> &Error {
        match self {
            Error::Refused { cause, .. } => cause,
            other => other,
        }
    }
}
