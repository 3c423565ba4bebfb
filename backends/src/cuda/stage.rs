//! The stager's pinned buffers: [`PinnedSlot`] as a [`StageSlot`], and a stager of two on a GPU's stream.

use std::ops::Range;
use std::sync::Arc;

use transfer_engine::MemoryRegion;

use super::ffi::{PinnedSlot, Stream};
use super::{CudaError, Gpu};
use crate::staging::{StageSlot, Stager, StagingError};

impl From<CudaError> for StagingError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Memory(e) => StagingError::Memory(e),
            other => StagingError::Copy(other.to_string()),
        }
    }
}

impl StageSlot for PinnedSlot {
    fn capacity(&self) -> usize {
        PinnedSlot::capacity(self)
    }
    fn fetch(&mut self, src: &MemoryRegion, range: Range<usize>) -> Result<(), StagingError> {
        Ok(PinnedSlot::fetch(self, src, range)?)
    }
    fn push(&mut self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), StagingError> {
        Ok(PinnedSlot::push(self, dst, offset, len)?)
    }
    fn bytes(&mut self) -> Result<&[u8], StagingError> {
        Ok(PinnedSlot::bytes(self)?)
    }
    fn bytes_mut(&mut self) -> Result<&mut [u8], StagingError> {
        Ok(PinnedSlot::bytes_mut(self)?)
    }
    fn settle(&mut self) -> Result<(), StagingError> {
        Ok(PinnedSlot::settle(self)?)
    }
    fn busy(&mut self) -> Result<bool, StagingError> {
        Ok(PinnedSlot::busy(self)?)
    }
}

impl Stager<PinnedSlot> {
    /// Two pinned buffers of `unit` bytes on a new stream of `gpu`.
    pub fn pinned(gpu: &Gpu, unit: usize) -> Result<Self, CudaError> {
        let stream = Arc::new(Stream::new(gpu)?);
        Ok(Self::with_slots([
            PinnedSlot::new(&stream, unit)?,
            PinnedSlot::new(&stream, unit)?,
        ]))
    }
}
