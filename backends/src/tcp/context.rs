//! What every lane task needs from its node, and nothing more: the configuration, the engine's station,
//! the driver's wake-up, counters, the queue total and the log. Readers, writers and links hold this, not
//! the node's whole state, so they sit below it.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

use super::stage::StagedCounters;
use super::{Secret, TcpConfig};
use crate::node::station::Station;

/// Log lines kept for the user (oldest dropped first).
const KEEP_LOG: usize = 1024;

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
}

/// The lane tasks' view of their node.
pub(crate) struct Context {
    pub(crate) cfg: TcpConfig,
    pub(crate) station: Station,
    /// Wakes the driver: new input, freed queue space, a lane came or went.
    pub(crate) wake: Notify,
    /// Frame bytes queued for all peers' lanes.
    pub(crate) total_queued: AtomicU64,
    pub(crate) counters: LaneCounters,
    /// Bytes lanes staged (GPU regions, or host regions when asked).
    pub(crate) staged: StagedCounters,
    pub(crate) next_lane: AtomicU64,
    /// The newest log lines, each with its number (counting from 1).
    log: Mutex<VecDeque<(u64, String)>>,
    logged: AtomicU64,
}

pub(crate) use crate::lock::lock;

impl Context {
    pub(crate) fn new(cfg: TcpConfig) -> Self {
        Self {
            station: Station::new(cfg.engine.clone()),
            cfg,
            wake: Notify::new(),
            total_queued: AtomicU64::new(0),
            counters: LaneCounters::default(),
            staged: StagedCounters::default(),
            next_lane: AtomicU64::new(1),
            log: Mutex::new(VecDeque::new()),
            logged: AtomicU64::new(0),
        }
    }

    pub(crate) fn log(&self, line: String) {
        let mut log = lock(&self.log);
        if log.len() >= KEEP_LOG {
            log.pop_front();
        }
        let n = self.logged.fetch_add(1, Ordering::Relaxed) + 1;
        log.push_back((n, line));
    }

    /// The log lines numbered after `seen` (still kept), and the newest line's number.
    pub(crate) fn log_after(&self, seen: u64) -> (Vec<String>, u64) {
        let log = lock(&self.log);
        let lines = log
            .iter()
            .filter(|(n, _)| *n > seen)
            .map(|(_, l)| l.clone())
            .collect();
        (lines, log.back().map_or(seen, |(n, _)| *n))
    }

    pub(crate) fn secret(&self) -> Option<&[u8]> {
        self.cfg.secret.as_ref().map(Secret::as_bytes)
    }
}
