//! What every lane task needs from its node, and nothing more: the configuration, the node's core (engine,
//! log, segments, verdicts), the driver's wake-up, counters and the queue total. Readers, writers and links hold this, not
//! the node's whole state, so they sit below it.

use std::sync::atomic::AtomicU64;

use tokio::sync::Notify;

use super::stage::StagedCounters;
use super::{Secret, TcpConfig};
use crate::node::NodeCore;

#[derive(Default)]
pub(crate) struct LaneCounters {
    pub(crate) lanes_opened: AtomicU64,
    pub(crate) lanes_closed: AtomicU64,
    pub(crate) handshakes_refused: AtomicU64,
    pub(crate) refusals_unanswered: AtomicU64,
    pub(crate) bad_frames: AtomicU64,
    pub(crate) unroutable: AtomicU64,
    pub(crate) control_dropped: AtomicU64,
    pub(crate) control_frames_throttled: AtomicU64,
    pub(crate) data_frames_throttled: AtomicU64,
    pub(crate) peers_forgotten: AtomicU64,
    pub(crate) lanes_shed: AtomicU64,
}

/// The lane tasks' view of their node.
pub(crate) struct Context {
    pub(crate) cfg: TcpConfig,
    pub(crate) core: NodeCore,
    /// Wakes the driver: new input, freed queue space, a lane came or went.
    pub(crate) wake: Notify,
    /// Frame bytes queued for all peers' lanes.
    pub(crate) total_queued: AtomicU64,
    pub(crate) counters: LaneCounters,
    /// Bytes lanes staged (GPU regions, or host regions when asked).
    pub(crate) staged: StagedCounters,
    pub(crate) next_lane: AtomicU64,
}

pub(crate) use crate::lock::lock;

impl Context {
    pub(crate) fn new(cfg: TcpConfig) -> Self {
        Self {
            core: NodeCore::new("tcp", cfg.engine.clone()),
            cfg,
            wake: Notify::new(),
            total_queued: AtomicU64::new(0),
            counters: LaneCounters::default(),
            staged: StagedCounters::default(),
            next_lane: AtomicU64::new(1),
        }
    }

    pub(crate) fn secret(&self) -> Option<&[u8]> {
        self.cfg.security.secret.as_ref().map(Secret::as_bytes)
    }
}
