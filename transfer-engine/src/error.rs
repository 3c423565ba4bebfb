//! The core's error type: one enum, every variant says what went wrong and what to do.

use crate::{MemoryKind, PeerId, RegionId, SessionId, WireError};

/// Everything the core can refuse. None of these leave the engine in a bad state: the offending input is
/// dropped and every other session carries on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// A layout or transfer request is not usable as given.
    #[error("invalid transfer request: {0}")]
    InvalidRequest(String),
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
}
