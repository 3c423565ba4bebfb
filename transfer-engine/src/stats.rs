//! Counters, per session and engine-wide.

use std::ops::AddAssign;

/// Transfer counters. Per session and summed over the engine; read as a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Payload bytes put on the wire, retransmits included.
    pub bytes_sent: u64,
    /// Units put on the wire (slices and exclusive units; each slice of a coalesced frame counts),
    /// retransmits included.
    pub slices_sent: u64,
    /// Units sent again (resends always go one unit a frame).
    pub retransmits: u64,
    /// Payload bytes sent again.
    pub retransmit_bytes: u64,
    /// Payload bytes acknowledged as applied at the destination.
    pub bytes_acked: u64,
    /// Payload bytes received that verified and were applied.
    pub bytes_received: u64,
    /// Units received that verified and were applied (each slice of a coalesced frame counts).
    pub slices_received: u64,
    /// Data frames received for units already applied.
    pub duplicates: u64,
    /// Data frames whose payload failed its checksum.
    pub checksum_failures: u64,
    /// Blocks delivered intact (sender: acknowledged; receiver: verified).
    pub blocks_delivered: u64,
    /// Blocks handed back for recompute.
    pub recompute_blocks: u64,
    /// Resends parked because the engine-wide retransmit budget was spent (each time one is refused).
    pub budget_exhausted: u64,
    /// Frames refused as malformed, unknown or not fitting their session.
    pub frames_refused: u64,
    /// Answers to refused frames (a Reject for an open, a CloseAck for a closed session) not queued
    /// because their peer already had [`crate::MAX_REPLIES_PER_PEER`] waiting: a peer that floods
    /// refused frames and never reads cannot grow the engine's queue.
    pub replies_dropped: u64,
}

impl AddAssign for Counters {
    fn add_assign(&mut self, o: Self) {
        self.bytes_sent += o.bytes_sent;
        self.slices_sent += o.slices_sent;
        self.retransmits += o.retransmits;
        self.retransmit_bytes += o.retransmit_bytes;
        self.bytes_acked += o.bytes_acked;
        self.bytes_received += o.bytes_received;
        self.slices_received += o.slices_received;
        self.duplicates += o.duplicates;
        self.checksum_failures += o.checksum_failures;
        self.blocks_delivered += o.blocks_delivered;
        self.recompute_blocks += o.recompute_blocks;
        self.budget_exhausted += o.budget_exhausted;
        self.frames_refused += o.frames_refused;
        self.replies_dropped += o.replies_dropped;
    }
}
