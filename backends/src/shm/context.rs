//! What a node's links share with the rest of it: the engine's station, the configuration, the stop flag,
//! the driver's wake-up, the data path's counters and the log. Links see only this (and hand a lost link
//! back through [`super::link::LinkOwner`]), so they do not depend on the node that owns them.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;

use super::ShmConfig;
use crate::lock::lock;
use crate::node::station::Station;

/// Log lines kept (oldest dropped first).
const KEEP_LOG: usize = 1024;

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
    pub(crate) station: Station,
    pub(crate) engine_id: u32,
    pub(crate) cfg: ShmConfig,
    pub(crate) stop: AtomicBool,
    /// Wakes the driver (a command changed the engine, or a link handed it frames).
    wake: mpsc::SyncSender<()>,
    pub(crate) counters: Counters,
    /// Log lines, each with how many times it came in a row (a flood of one refusal is one line).
    log: Mutex<VecDeque<(String, u64)>>,
    /// The probe word peers read back through cross-memory attach.
    probe: Box<u64>,
}

impl Context {
    pub(crate) fn new(cfg: ShmConfig, wake: mpsc::SyncSender<()>) -> Self {
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        Self {
            station: Station::new(cfg.engine.clone()),
            engine_id: cfg.engine.engine_id,
            cfg,
            stop: AtomicBool::new(false),
            wake,
            counters: Counters::default(),
            log: Mutex::default(),
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

    /// Records a log line (and counts it as a refusal when it is one). A line equal to the one before
    /// it is counted on that line instead, so a peer repeating one mistake cannot push the rest out.
    pub(crate) fn note(&self, line: String) {
        if line.starts_with("refused") {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
        }
        let mut log = lock(&self.log);
        if let Some((last, times)) = log.back_mut()
            && *last == line
        {
            *times += 1;
            return;
        }
        if log.len() >= KEEP_LOG {
            log.pop_front();
        }
        log.push_back((line, 1));
    }

    /// The log, oldest first; a line that came several times in a row says how many.
    pub(crate) fn log(&self) -> Vec<String> {
        lock(&self.log)
            .iter()
            .map(|(line, times)| match times {
                1 => line.clone(),
                n => format!("{line} ({n} times)"),
            })
            .collect()
    }
}
