//! What a node's links share with the rest of it: the node's core (engine, log, segments, verdicts), the
//! configuration, the stop flag, the driver's wake-up and the data path's counters. Links see only this (and hand a lost link
//! back through [`super::link::LinkOwner`]), so they do not depend on the node that owns them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;

use transfer_engine::PeerId;

use super::ShmConfig;
use crate::TransportError;
use crate::node::{LogKind, NodeCore};

/// Counters of the data path, beside the engine's.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) units_pulled: AtomicU64,
    pub(crate) units_by_cma: AtomicU64,
    pub(crate) bytes_pulled: AtomicU64,
    pub(crate) frames_sent: AtomicU64,
    pub(crate) frames_dropped: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) peers_lost: AtomicU64,
}

/// See the [module docs](self).
pub(crate) struct Context {
    pub(crate) core: NodeCore,
    pub(crate) cfg: ShmConfig,
    pub(crate) stop: AtomicBool,
    /// Wakes the driver (a command changed the engine, or a link handed it frames).
    wake: mpsc::SyncSender<()>,
    pub(crate) counters: Counters,
    /// The probe word peers read back through cross-memory attach.
    probe: Box<u64>,
}

impl Context {
    pub(crate) fn new(cfg: ShmConfig, wake: mpsc::SyncSender<()>) -> Self {
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        Self {
            core: NodeCore::new("shm", cfg.engine.clone()),
            cfg,
            stop: AtomicBool::new(false),
            wake,
            counters: Counters::default(),
            probe: Box::new(u64::from_le_bytes(seed) | 1),
        }
    }

    /// Address and value of the probe word, for this node's hello.
    pub(crate) fn probe(&self) -> (u64, u64) {
        (std::ptr::from_ref::<u64>(&self.probe) as u64, *self.probe)
    }

    /// Wakes the driver.
    pub(crate) fn wake(&self) {
        let _ = self.wake.try_send(());
    }

    /// This node's engine id.
    pub(crate) fn engine_id(&self) -> u32 {
        self.core.engine_id()
    }

    /// Counts and logs a refusal (a connection, frame or unit) of `kind`, from `peer` when known.
    pub(crate) fn refused(
        &self,
        kind: LogKind,
        peer: Option<PeerId>,
        text: impl Into<String>,
        error: Option<TransportError>,
    ) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        self.core.log.record(kind, peer, error, text);
    }
}
