//! GPU-aware placement for in-process drivers (the loopback backend) and for tier moves: a pool of copy
//! engines per GPU, so concurrent callers each copy on their own stream.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use transfer_engine::policy::{BlockKey, Tier, TierMove};
use transfer_engine::{MemoryKind, MemoryRegion};

use super::{CopyEngine, CopyReport, CudaError, Gpu};

/// Moves bytes between any two regions when at least one is GPU memory, through a [`CopyEngine`] of that
/// GPU taken from a pool (made on first use, returned after the copy).
#[derive(Debug)]
pub struct GpuMover {
    block: usize,
    gpus: Mutex<HashMap<u32, Gpu>>,
    idle: Mutex<HashMap<u32, Vec<CopyEngine>>>,
}

impl GpuMover {
    /// A mover whose engines copy `block` bytes at a time.
    #[must_use]
    pub fn new(block: usize) -> Self {
        Self {
            block,
            gpus: Mutex::new(HashMap::new()),
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a move between these regions needs the GPU (either side is GPU memory); a driver keeps its
    /// plain host copy otherwise.
    #[must_use]
    pub fn needs_gpu(src: &MemoryRegion, dst: &MemoryRegion) -> bool {
        !src.kind().is_host() || !dst.kind().is_host()
    }

    fn gpu(&self, ordinal: u32) -> Result<Gpu, CudaError> {
        let mut gpus = self.gpus.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(gpu) = gpus.get(&ordinal) {
            return Ok(gpu.clone());
        }
        let gpu = Gpu::open(ordinal)?;
        gpus.insert(ordinal, gpu.clone());
        Ok(gpu)
    }

    /// Copies `src_range` of `src` into `dst_range` of `dst` (equal lengths) and returns the report, whose
    /// `crc32c` is the CRC-32C of the host-side bytes (`None` for GPU to GPU). The loopback backend's
    /// placement would call this where either region is GPU memory.
    pub fn place(
        &self,
        src: &MemoryRegion,
        src_range: Range<usize>,
        dst: &MemoryRegion,
        dst_range: Range<usize>,
    ) -> Result<CopyReport, CudaError> {
        if src_range.len() != dst_range.len() || src_range.start > src_range.end {
            return Err(CudaError::Invalid(format!(
                "source {src_range:?} and destination {dst_range:?} differ in length"
            )));
        }
        let ordinal = match (src.kind(), dst.kind()) {
            (MemoryKind::Device { ordinal }, _) | (_, MemoryKind::Device { ordinal }) => ordinal,
            _ => {
                return Err(CudaError::Invalid(
                    "neither region is GPU memory: copy it on the host".into(),
                ));
            }
        };
        let taken = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&ordinal)
            .and_then(Vec::pop);
        let mut engine = match taken {
            Some(engine) => engine,
            None => CopyEngine::new(&self.gpu(ordinal)?, self.block)?,
        };
        let report = engine.copy(src, src_range, dst, dst_range.start, |_| {});
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(ordinal)
            .or_default()
            .push(engine);
        report
    }

    /// Carries out tier moves between GPU and host tiers: `locate(key, tier)` names where a block lives in
    /// a tier (its region and range) or `None` when that tier has no room for it; `on_done` is called once
    /// per move, as it completes, with the report or the error. Drops (`to: None`) and moves that neither
    /// start nor end on the GPU are left to the caller (`Ok(None)`).
    pub fn run_tier_moves(
        &self,
        moves: &[TierMove],
        mut locate: impl FnMut(BlockKey, Tier) -> Option<(MemoryRegion, Range<usize>)>,
        mut on_done: impl FnMut(&TierMove, Result<Option<CopyReport>, CudaError>),
    ) {
        for m in moves {
            let outcome = match m.to {
                Some(to) if to != m.from && (to == Tier::Gpu || m.from == Tier::Gpu) => {
                    match (locate(m.key, m.from), locate(m.key, to)) {
                        (Some((src, sr)), Some((dst, dr))) => {
                            self.place(&src, sr, &dst, dr).map(Some)
                        }
                        _ => Err(CudaError::Invalid(format!(
                            "no place for block {:?} in tier {:?} or {:?}",
                            m.key, m.from, to
                        ))),
                    }
                }
                _ => Ok(None),
            };
            on_done(m, outcome);
        }
    }
}
