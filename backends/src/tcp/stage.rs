//! Staging on lanes: which regions a lane cannot send from or receive into in place (GPU memory, and host
//! memory when [`super::Buffers::stage_host_memory`] asks), and the stagers a lane keeps for them, one per
//! kind of memory, made the first time the lane meets it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use transfer_engine::MemoryKind;

use super::TcpConfig;
use crate::staging::{AnyStager, HostSlot, StageSlot, Stager, StagingError};

/// Bytes lanes moved through staging buffers, both ways, and the bytes of staging buffers lanes hold.
#[derive(Debug, Default)]
pub(crate) struct StagedCounters {
    pub(crate) sent: AtomicU64,
    pub(crate) received: AtomicU64,
    pub(crate) held: Arc<AtomicU64>,
}

impl StagedCounters {
    pub(crate) fn add_sent(&self, bytes: usize) {
        self.sent.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    pub(crate) fn add_received(&self, bytes: usize) {
        self.received.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// A lane that has moved nothing for this long lets its staging buffers go (a lane holds two buffers per
/// kind of memory only while it moves such bytes).
pub(crate) const RELEASE_IDLE_STAGERS: Duration = Duration::from_secs(1);

/// Whether lanes stage the bytes of memory of `kind`.
pub(crate) fn staged(cfg: &TcpConfig, kind: MemoryKind) -> bool {
    !kind.is_host() || cfg.buffers.stage_host_memory
}

/// Checks, at registration, that lanes will be able to stage memory of `kind` (a driver for its GPU).
pub(crate) fn check_stageable(kind: MemoryKind) -> Result<(), String> {
    match kind {
        MemoryKind::Device { ordinal } => crate::check_gpu(ordinal),
        MemoryKind::Host | MemoryKind::PinnedHost => Ok(()),
    }
}

/// One lane direction's stagers, one per kind of memory it met.
pub(crate) struct LaneStagers {
    stagers: Vec<(MemoryKind, AnyStager)>,
    /// The node's count of staging bytes held, kept up to date as stagers come and go.
    held: Arc<AtomicU64>,
}

impl LaneStagers {
    pub(crate) fn new(counters: &StagedCounters) -> Self {
        Self {
            stagers: Vec::new(),
            held: Arc::clone(&counters.held),
        }
    }

    /// The stager for memory of `kind`, made on first use with buffers of `unit` bytes.
    pub(crate) fn get(
        &mut self,
        kind: MemoryKind,
        unit: usize,
    ) -> Result<&mut AnyStager, StagingError> {
        let i = match self.stagers.iter().position(|(k, _)| *k == kind) {
            Some(i) => i,
            None => {
                let stager = match kind {
                    MemoryKind::Device { ordinal } => gpu::stager(ordinal, unit)?,
                    MemoryKind::Host | MemoryKind::PinnedHost => host_stager(unit),
                };
                self.held
                    .fetch_add(2 * stager.unit_capacity() as u64, Ordering::Relaxed);
                self.stagers.push((kind, stager));
                self.stagers.len() - 1
            }
        };
        Ok(&mut self.stagers[i].1)
    }

    /// Whether the lane holds no staging buffers.
    pub(crate) fn is_empty(&self) -> bool {
        self.stagers.is_empty()
    }

    /// Lets every staging buffer go (after waiting for its copies); the next use makes new ones.
    pub(crate) fn release(&mut self) {
        // A failed wait leaves nothing to do but drop: each buffer waits for its own stream on drop.
        let _ = self.flush();
        for (_, stager) in self.stagers.drain(..) {
            self.held
                .fetch_sub(2 * stager.unit_capacity() as u64, Ordering::Relaxed);
        }
    }

    /// Waits for every device copy in flight.
    pub(crate) fn flush(&mut self) -> Result<(), StagingError> {
        for (_, stager) in &mut self.stagers {
            stager.flush()?;
        }
        Ok(())
    }
}

impl Drop for LaneStagers {
    fn drop(&mut self) {
        self.release();
    }
}

fn host_stager(unit: usize) -> AnyStager {
    let slot = || -> Box<dyn StageSlot + Send> { Box::new(HostSlot::new(unit)) };
    Stager::with_slots([slot(), slot()])
}

#[cfg(feature = "cuda")]
mod gpu {
    use crate::cuda::Gpu;
    use crate::staging::{AnyStager, Stager, StagingError};

    pub(super) fn stager(ordinal: u32, unit: usize) -> Result<AnyStager, StagingError> {
        let gpu = Gpu::open(ordinal)?;
        Ok(Stager::pinned(&gpu, unit)?.boxed())
    }
}

#[cfg(not(feature = "cuda"))]
mod gpu {
    use crate::staging::{AnyStager, StagingError};

    pub(super) fn stager(_: u32, _: usize) -> Result<AnyStager, StagingError> {
        Err(StagingError::Copy(crate::NO_GPU_SUPPORT.into()))
    }
}
