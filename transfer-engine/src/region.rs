//! Registered memory regions: every access on behalf of a peer is key-checked and bounds-checked here.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use crate::{Error, KvLayout, MemoryRegion, PeerId};

/// Identifies a registered region within one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RegionId(pub u32);

impl fmt::Display for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Secret that a peer must present to write into a region.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AccessKey(pub u64);

impl fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AccessKey(..)")
    }
}

/// What registering a region returns: what a peer needs to address it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionHandle {
    /// The region's id.
    pub id: RegionId,
    /// The key a peer must present.
    pub key: AccessKey,
    /// Length in bytes.
    pub len: u64,
    /// The KV layout the region holds, if it was registered with one.
    pub layout: Option<KvLayout>,
}

/// A registered region: what peers address, and the memory behind it.
#[derive(Debug)]
struct Region {
    handle: RegionHandle,
    memory: MemoryRegion,
    /// The only peer allowed to write into the region, if it is reserved for one.
    owner: Option<PeerId>,
}

/// The table of registered regions.
#[derive(Debug, Default)]
pub(crate) struct RegionTable {
    next_id: u32,
    regions: BTreeMap<RegionId, Region>,
}

impl RegionTable {
    /// Registers the first `len` bytes of `memory` (at most its length), guarded by `key`.
    pub(crate) fn register(
        &mut self,
        memory: MemoryRegion,
        len: u64,
        key: AccessKey,
        layout: Option<KvLayout>,
    ) -> Result<RegionHandle, Error> {
        if len > memory.len() as u64 {
            return Err(Error::MemoryTooSmall {
                len,
                given: memory.len() as u64,
            });
        }
        self.next_id += 1;
        let handle = RegionHandle {
            id: RegionId(self.next_id),
            key,
            len,
            layout,
        };
        self.regions.insert(
            handle.id,
            Region {
                handle,
                memory,
                owner: None,
            },
        );
        Ok(handle)
    }

    /// Removes a region, handing back its memory.
    pub(crate) fn unregister(&mut self, id: RegionId) -> Result<MemoryRegion, Error> {
        self.regions
            .remove(&id)
            .map(|r| r.memory)
            .ok_or(Error::UnknownRegion(id))
    }

    /// The region, if registered.
    pub(crate) fn get(&self, id: RegionId) -> Result<&RegionHandle, Error> {
        self.regions
            .get(&id)
            .map(|r| &r.handle)
            .ok_or(Error::UnknownRegion(id))
    }

    /// Reserves a region for writes from `owner` only (or lifts the reservation).
    pub(crate) fn set_owner(&mut self, id: RegionId, owner: Option<PeerId>) -> Result<(), Error> {
        let region = self.regions.get_mut(&id).ok_or(Error::UnknownRegion(id))?;
        region.owner = owner;
        Ok(())
    }

    /// Checks that `peer` may write into region `id` (it is not reserved for another peer).
    pub(crate) fn check_writer(&self, id: RegionId, peer: PeerId) -> Result<(), Error> {
        let region = self.regions.get(&id).ok_or(Error::UnknownRegion(id))?;
        match region.owner {
            Some(owner) if owner != peer => Err(Error::NotOwner { region: id, peer }),
            _ => Ok(()),
        }
    }

    /// The memory behind a region.
    pub(crate) fn memory(&self, id: RegionId) -> Result<&MemoryRegion, Error> {
        self.regions
            .get(&id)
            .map(|r| &r.memory)
            .ok_or(Error::UnknownRegion(id))
    }

    /// Checks a peer's access: the key must match and `offset..offset + length` must lie inside the region.
    pub(crate) fn check_remote(
        &self,
        id: RegionId,
        key: AccessKey,
        offset: u64,
        length: u64,
    ) -> Result<Range<u64>, Error> {
        let region = self.get(id)?;
        if region.key != key {
            return Err(Error::WrongKey(id));
        }
        Self::bounds(region, offset, length)
    }

    /// Checks a local access (no key): `offset..offset + length` must lie inside the region.
    pub(crate) fn check_local(
        &self,
        id: RegionId,
        offset: u64,
        length: u64,
    ) -> Result<Range<u64>, Error> {
        Self::bounds(self.get(id)?, offset, length)
    }

    fn bounds(region: &RegionHandle, offset: u64, length: u64) -> Result<Range<u64>, Error> {
        match offset.checked_add(length) {
            Some(end) if end <= region.len => Ok(offset..end),
            _ => Err(Error::OutOfBounds {
                region: region.id,
                offset,
                length,
                len: region.len,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_and_bounds_are_checked() {
        let mut table = RegionTable::default();
        let r = table
            .register(MemoryRegion::zeroed(100), 100, AccessKey(7), None)
            .unwrap();
        assert!(
            table
                .register(MemoryRegion::zeroed(10), 11, AccessKey(7), None)
                .is_err()
        );
        assert_eq!(table.check_remote(r.id, AccessKey(7), 90, 10), Ok(90..100));
        assert_eq!(
            table.check_remote(r.id, AccessKey(8), 0, 1),
            Err(Error::WrongKey(r.id))
        );
        assert!(matches!(
            table.check_remote(r.id, AccessKey(7), 91, 10),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            table.check_local(r.id, u64::MAX, 2),
            Err(Error::OutOfBounds { .. })
        ));
        table.unregister(r.id).unwrap();
        assert_eq!(
            table.check_local(r.id, 0, 1),
            Err(Error::UnknownRegion(r.id))
        );
    }
}
