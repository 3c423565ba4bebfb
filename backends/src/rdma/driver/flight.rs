//! What the driver tracks of units in flight: outgoing units and their writes, writes the provider asked
//! to retry, and incoming units waiting for their other half.

use std::time::Instant;

use transfer_engine::Header;
use transfer_engine::PeerId;

use super::super::ffi::MrId;

/// A unit in flight from here: its writes not all completed.
pub(super) struct Outgoing {
    pub(super) peer: PeerId,
    pub(super) writes_left: u32,
    pub(super) bytes: u64,
    pub(super) posted: Instant,
}

/// A write not yet accepted by the provider (it asked to try again).
pub(super) struct QueuedWrite {
    pub(super) dest: u64,
    pub(super) src: MrId,
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) addr: u64,
    pub(super) key: u64,
    pub(super) token: u32,
    pub(super) unit: u64,
}

/// A unit arriving here: its header message and its writes, in either order.
#[derive(Default)]
pub(super) struct Incoming {
    pub(super) header: Option<(u32, u32, u32, u64, Header)>,
    pub(super) landed: u32,
}
