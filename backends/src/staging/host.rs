//! Host staging buffers: the stager's buffers for host memory, copying at once with the CPU.

use std::ops::Range;

use transfer_engine::MemoryRegion;

use super::{StageSlot, StagingError};

/// A staging buffer of ordinary host memory. Its copies complete at once (a CPU copy through the region's
/// views), so it is never busy; a fetch takes the unit's CRC-32C in the same pass as its copy. A backend
/// stages host regions through it when asked to (to run and measure its staged path without a GPU); GPU
/// regions use `cuda::PinnedSlot`.
#[derive(Debug)]
pub struct HostSlot {
    bytes: Box<[u8]>,
    /// CRC-32C of the unit the last fetch copied in.
    fetched: Option<u32>,
}

impl HostSlot {
    /// A buffer of `capacity` zeroed bytes.
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            bytes: vec![0; capacity].into_boxed_slice(),
            fetched: None,
        }
    }
}

impl StageSlot for HostSlot {
    fn capacity(&self) -> usize {
        self.bytes.len()
    }

    fn fetch(&mut self, src: &MemoryRegion, range: Range<usize>) -> Result<(), StagingError> {
        self.fetched = None;
        let (len, capacity) = (range.len(), self.bytes.len());
        let into = self.bytes.get_mut(..len).ok_or(StagingError::Range {
            offset: 0,
            length: len as u64,
            len: capacity as u64,
        })?;
        self.fetched = Some(transfer_engine::copy_and_crc32c(into, &src.read(range)?));
        Ok(())
    }

    fn push(&mut self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), StagingError> {
        let from = self.bytes.get(..len).ok_or(StagingError::Range {
            offset: 0,
            length: len as u64,
            len: self.bytes.len() as u64,
        })?;
        dst.copy_from(offset, from)?;
        Ok(())
    }

    fn bytes(&mut self) -> Result<&[u8], StagingError> {
        Ok(&self.bytes)
    }

    fn bytes_mut(&mut self) -> Result<&mut [u8], StagingError> {
        self.fetched = None;
        Ok(&mut self.bytes)
    }

    fn settle(&mut self) -> Result<(), StagingError> {
        Ok(())
    }

    fn busy(&mut self) -> Result<bool, StagingError> {
        Ok(false)
    }

    fn fetched_crc32c(&self) -> Option<u32> {
        self.fetched
    }
}
