//! What the engine tells its user.

use std::ops::Range;

use crate::{BlockId, Counters, PeerId, RegionId, SessionId};

/// Which end of a session an event concerns (not a connector's `KvRole`, which says whether an instance
/// saves or loads KV).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The end pushing bytes.
    Sender,
    /// The end receiving them.
    Receiver,
}

/// Something that happened. Block ids are in the reporting side's own terms (source blocks on the sender,
/// destination blocks on the receiver).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The receiver accepted an incoming session.
    Incoming {
        /// The session.
        session: SessionId,
        /// The sending peer.
        peer: PeerId,
        /// The local region the KV lands in.
        region: RegionId,
        /// The layers that will arrive.
        layers: Range<u32>,
        /// The destination blocks, within each layer.
        blocks: Vec<u32>,
    },
    /// A block arrived intact and is in place (receiver).
    BlockDelivered {
        /// The session.
        session: SessionId,
        /// The destination block.
        block: BlockId,
    },
    /// Every block of a layer arrived intact (receiver): a consumer may compute on it.
    LayerComplete {
        /// The session.
        session: SessionId,
        /// The layer.
        layer: u32,
    },
    /// These blocks did not arrive intact in time: recompute them. Every other block was delivered.
    Recompute {
        /// The session.
        session: SessionId,
        /// Which end reports.
        role: Role,
        /// Exactly the blocks that were not delivered.
        blocks: Vec<BlockId>,
    },
    /// The peer refused the session (sender); every block is also reported for recompute.
    Refused {
        /// The session.
        session: SessionId,
        /// The peer's reason.
        reason: String,
    },
    /// The driver lost the peer for good (every connection gone, redialing refused) and ended the session
    /// early; a [`Event::Recompute`] and an [`Event::Completed`] follow.
    Aborted {
        /// The session.
        session: SessionId,
        /// Which end reports.
        role: Role,
        /// Why, in words (for example that the peer is unreachable).
        reason: String,
    },
    /// The session is over: every block was delivered or reported for recompute.
    Completed {
        /// The session.
        session: SessionId,
        /// Which end reports.
        role: Role,
        /// The session's final counters.
        stats: Counters,
    },
}
