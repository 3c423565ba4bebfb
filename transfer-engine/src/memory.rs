//! Plain host memory for in-process drivers: the bytes behind registered regions.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::{Error, RegionHandle, RegionId};

/// Host buffers keyed by region id. The engine only checks addresses; the bytes live here (or in a
/// driver's own memory: GPU buffers, a serving engine's KV pool).
#[derive(Debug, Default)]
pub struct HostMemory {
    buffers: BTreeMap<RegionId, Vec<u8>>,
}

impl HostMemory {
    /// Allocates zeroed bytes for a registered region.
    pub fn alloc(&mut self, region: &RegionHandle) -> Result<&mut [u8], Error> {
        let len = usize::try_from(region.len).map_err(|_| {
            Error::InvalidRequest(format!(
                "region of {} bytes does not fit in memory",
                region.len
            ))
        })?;
        Ok(self
            .buffers
            .entry(region.id)
            .or_insert_with(|| vec![0; len]))
    }

    /// Frees a region's bytes.
    pub fn free(&mut self, region: RegionId) -> Option<Vec<u8>> {
        self.buffers.remove(&region)
    }

    /// The region's bytes.
    pub fn region(&self, region: RegionId) -> Result<&[u8], Error> {
        self.buffers
            .get(&region)
            .map(Vec::as_slice)
            .ok_or(Error::UnknownRegion(region))
    }

    /// The region's bytes, writable.
    pub fn region_mut(&mut self, region: RegionId) -> Result<&mut [u8], Error> {
        self.buffers
            .get_mut(&region)
            .map(Vec::as_mut_slice)
            .ok_or(Error::UnknownRegion(region))
    }

    /// `range` of the region.
    pub fn read(&self, region: RegionId, range: Range<usize>) -> Result<&[u8], Error> {
        let buf = self.region(region)?;
        let len = buf.len() as u64;
        buf.get(range.clone()).ok_or(Error::OutOfBounds {
            region,
            offset: range.start as u64,
            length: range.len() as u64,
            len,
        })
    }

    /// `range` of the region, writable.
    pub fn write(&mut self, region: RegionId, range: Range<usize>) -> Result<&mut [u8], Error> {
        let buf = self.region_mut(region)?;
        let len = buf.len() as u64;
        buf.get_mut(range.clone()).ok_or(Error::OutOfBounds {
            region,
            offset: range.start as u64,
            length: range.len() as u64,
            len,
        })
    }
}
