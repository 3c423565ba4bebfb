//! The bytes behind a node's registered regions, shared by its engine task and its lane tasks without
//! `unsafe`.
//!
//! Each region is cut into 1 MiB shards, each behind its own `RwLock`. A lane that receives a payload locks
//! only the shards its destination range touches, and only for the non-blocking `recv` syscall that copies
//! bytes from the kernel straight into them: the kernel copies into the region itself, with no intermediate
//! buffer. Senders take read locks for the `sendmsg` that reads the payload out of the region. Locks are
//! never held across an `.await`.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crc_fast::{CrcAlgorithm, Digest};
use transfer_engine::{Error, RegionHandle, RegionId};

/// Bytes per shard: small enough that two lanes writing one region rarely meet, large enough that a 4 MiB
/// exclusive unit is a handful of slices in one vectored syscall.
pub(crate) const SHARD_BYTES: usize = 1 << 20;

/// One registered region's bytes.
#[derive(Debug)]
pub struct SharedRegion {
    id: RegionId,
    len: usize,
    shards: Vec<RwLock<Box<[u8]>>>,
}

impl SharedRegion {
    fn new(id: RegionId, len: usize) -> Self {
        let shards = (0..len.div_ceil(SHARD_BYTES))
            .map(|i| {
                let n = SHARD_BYTES.min(len - i * SHARD_BYTES);
                RwLock::new(vec![0u8; n].into_boxed_slice())
            })
            .collect();
        Self { id, len, shards }
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region holds no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks that `range` lies inside the region.
    pub(crate) fn check(&self, range: &Range<usize>) -> Result<(), Error> {
        if range.start <= range.end && range.end <= self.len {
            Ok(())
        } else {
            Err(Error::OutOfBounds {
                region: self.id,
                offset: range.start as u64,
                length: range.end.saturating_sub(range.start) as u64,
                len: self.len as u64,
            })
        }
    }

    /// The pieces of `range` (already checked): shard index and the range within that shard.
    pub(crate) fn segments(
        &self,
        range: Range<usize>,
    ) -> impl Iterator<Item = (usize, Range<usize>)> + use<> {
        let mut pos = range.start;
        std::iter::from_fn(move || {
            if pos >= range.end {
                return None;
            }
            let shard = pos / SHARD_BYTES;
            let start = pos - shard * SHARD_BYTES;
            let end = (range.end - shard * SHARD_BYTES).min(SHARD_BYTES);
            pos = shard * SHARD_BYTES + end;
            Some((shard, start..end))
        })
    }

    pub(crate) fn read_shard(&self, shard: usize) -> RwLockReadGuard<'_, Box<[u8]>> {
        self.shards[shard]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write_shard(&self, shard: usize) -> RwLockWriteGuard<'_, Box<[u8]>> {
        self.shards[shard]
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// CRC-32C of `range`.
    pub fn crc32c(&self, range: Range<usize>) -> Result<u32, Error> {
        self.check(&range)?;
        let mut digest = Digest::new(CrcAlgorithm::Crc32Iscsi);
        for (shard, r) in self.segments(range) {
            digest.update(&self.read_shard(shard)[r]);
        }
        Ok(digest.finalize() as u32)
    }

    /// Copies `bytes` into the region at `offset`.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<(), Error> {
        let range = offset..offset.saturating_add(bytes.len());
        self.check(&range)?;
        let mut done = 0;
        for (shard, r) in self.segments(range) {
            let n = r.len();
            self.write_shard(shard)[r].copy_from_slice(&bytes[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Copies the region's bytes at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        let range = offset..offset.saturating_add(out.len());
        self.check(&range)?;
        let mut done = 0;
        for (shard, r) in self.segments(range) {
            let n = r.len();
            out[done..done + n].copy_from_slice(&self.read_shard(shard)[r]);
            done += n;
        }
        Ok(())
    }

    /// The whole region as one vector (a copy).
    #[must_use]
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.len];
        let mut done = 0;
        for shard in 0..self.shards.len() {
            let s = self.read_shard(shard);
            out[done..done + s.len()].copy_from_slice(&s);
            done += s.len();
        }
        out
    }

    /// Fills the region shard by shard: `f(offset, bytes)` for consecutive pieces covering it.
    pub fn fill_with(&self, mut f: impl FnMut(usize, &mut [u8])) {
        for shard in 0..self.shards.len() {
            f(shard * SHARD_BYTES, &mut self.write_shard(shard));
        }
    }
}

/// The regions of one node, by id.
#[derive(Debug, Clone, Default)]
pub struct SharedMemory {
    regions: Arc<RwLock<BTreeMap<RegionId, Arc<SharedRegion>>>>,
}

impl SharedMemory {
    /// Allocates zeroed bytes for a registered region (idempotent).
    pub fn alloc(&self, handle: &RegionHandle) -> Result<Arc<SharedRegion>, Error> {
        let len = usize::try_from(handle.len).map_err(|_| {
            Error::InvalidRequest(format!(
                "region of {} bytes does not fit in memory",
                handle.len
            ))
        })?;
        let mut map = self.regions.write().unwrap_or_else(PoisonError::into_inner);
        Ok(map
            .entry(handle.id)
            .or_insert_with(|| Arc::new(SharedRegion::new(handle.id, len)))
            .clone())
    }

    /// Frees a region's bytes (lanes still holding it finish their current frame).
    pub fn free(&self, id: RegionId) -> Option<Arc<SharedRegion>> {
        self.regions
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)
    }

    /// The region's bytes.
    pub fn get(&self, id: RegionId) -> Result<Arc<SharedRegion>, Error> {
        self.regions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned()
            .ok_or(Error::UnknownRegion(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::AccessKey;

    #[test]
    fn segments_cover_ranges_across_shards() {
        let r = SharedRegion::new(RegionId(1), 3 * SHARD_BYTES + 10);
        let segs: Vec<_> = r.segments(SHARD_BYTES - 4..2 * SHARD_BYTES + 4).collect();
        assert_eq!(
            segs,
            vec![
                (0, SHARD_BYTES - 4..SHARD_BYTES),
                (1, 0..SHARD_BYTES),
                (2, 0..4)
            ]
        );
        assert_eq!(
            r.segments(3 * SHARD_BYTES..3 * SHARD_BYTES + 10)
                .collect::<Vec<_>>(),
            vec![(3, 0..10)]
        );
        assert!(r.check(&(0..3 * SHARD_BYTES + 11)).is_err());
    }

    #[test]
    fn writes_reads_and_checksums_agree_with_a_flat_buffer() {
        let mem = SharedMemory::default();
        let handle = RegionHandle {
            id: RegionId(3),
            key: AccessKey(1),
            len: (2 * SHARD_BYTES + 100) as u64,
            layout: None,
        };
        let r = mem.alloc(&handle).unwrap();
        let data: Vec<u8> = (0..SHARD_BYTES + 50).map(|i| (i * 7) as u8).collect();
        r.write(SHARD_BYTES / 2, &data).unwrap();
        let mut out = vec![0; data.len()];
        r.read(SHARD_BYTES / 2, &mut out).unwrap();
        assert_eq!(out, data);
        let range = SHARD_BYTES / 2..SHARD_BYTES / 2 + data.len();
        assert_eq!(r.crc32c(range).unwrap(), transfer_engine::crc32c(&data));
        assert_eq!(&r.to_vec()[SHARD_BYTES / 2..][..data.len()], &data[..]);
        assert!(r.write(2 * SHARD_BYTES + 99, &[1, 2]).is_err());
        assert!(mem.get(RegionId(4)).is_err());
    }
}
