//! The bytes behind registered regions: memory the caller hands over, memory it keeps owning, and (from
//! the backends) pinned or GPU memory, all behind one type, [`MemoryRegion`].
//!
//! # Who may touch which bytes
//! A region is cut into shards of [`SHARD_BYTES`], each with a reader-writer lock. Every access through the
//! region ([`MemoryRegion::read`], [`MemoryRegion::write`] and the drivers' placements and sends) takes the
//! locks of the shards it covers, in ascending order, for as long as its view lives. So the engine, its
//! drivers and the caller never race on a byte, whoever owns the memory. Drivers hold a view only for one
//! non-blocking copy or syscall, never across a wait.
//!
//! What the locks cannot say, the caller keeps to:
//! - the source blocks of a live sending session are not changed until it completes (a change is sent as
//!   the new bytes, or fails the receiver's checksum and is resent);
//! - the destination blocks of a live receiving session are read only after they are reported delivered
//!   ([`crate::Event::BlockDelivered`], [`crate::Event::LayerComplete`]) and written by nobody else;
//! - memory registered with [`MemoryRegion::from_raw_parts`] is touched by the caller's own pointers only
//!   outside ranges that live sessions use, and stays valid until the last clone of its region drops.
//!
//! How each backend of the `backends` crate keeps this:
//! - loopback: the consumer's thread copies each unit into place under the destination shards' write
//!   locks, the producer takes its CRC under read locks; a unit that already verified is not placed again.
//! - TCP: a lane's reader receives a payload into place under write views and its writer sends from read
//!   views held for the `sendmsg`; a resend of a slice that already verified is read into a scratch
//!   buffer and dropped, never placed.
//! - RDMA: NICs read and write registered memory with no lock, so by default a node registers a host
//!   mirror of each host region instead: a unit is copied into the mirror under the source's read locks
//!   before its writes are posted, and out of the mirror into place under write locks (CRC taken on the
//!   copy, a piece at a time) only if the plan still wants it, so a resend over verified bytes is dropped.
//!   The mirror itself is never seen as a slice (a peer may write it at any time): only raw copies move
//!   bytes in and out of it. Registering
//!   the caller's memory in place, zero-copy, takes an `unsafe` promise (`InPlace::granted` in
//!   `backends::rdma`) that the caller's rules above hold and every peer with the key follows the
//!   protocol. GPU memory, which has no safe host views, is registered in place where the provider can.
//!
//! Views hold shard locks, so they follow the rules of locks: a thread holds one view at a time, or takes
//! several in ascending order of [`MemoryRegion::address`] and never two of the same region (the TCP
//! writer's views of a batch do this). Views cannot be sent to another thread, so a view held across an
//! `.await` in a spawned task does not compile.

#[allow(unsafe_code)]
mod raw;

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, RwLock};

pub use raw::{Bytes, BytesMut, RawMemory};

use crate::Error;

/// Bytes per shard lock: small enough that lanes placing different slices of one region rarely meet, large
/// enough that a region of 64 GiB needs only 65,536 locks.
pub const SHARD_BYTES: usize = 1 << 20;

/// Where a region's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Ordinary host memory.
    Host,
    /// Page-locked host memory (for example `cuMemHostAlloc`), usable as a DMA staging area.
    PinnedHost,
    /// GPU memory: the host never dereferences it; drivers copy through the device's API.
    Device {
        /// The device's ordinal.
        ordinal: u32,
    },
}

impl MemoryKind {
    /// Whether the CPU can read and write the bytes directly.
    #[must_use]
    pub fn is_host(self) -> bool {
        matches!(self, MemoryKind::Host | MemoryKind::PinnedHost)
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryKind::Host => f.write_str("host memory"),
            MemoryKind::PinnedHost => f.write_str("pinned host memory"),
            MemoryKind::Device { ordinal } => write!(f, "memory of GPU {ordinal}"),
        }
    }
}

/// The memory behind one registered region. Cloning is cheap and shares the bytes: the last clone to drop
/// releases them (or tells their owner, for caller-owned memory).
#[derive(Clone)]
pub struct MemoryRegion {
    inner: Arc<Inner>,
}

struct Inner {
    memory: Box<dyn RawMemory>,
    shards: Box<[RwLock<()>]>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("kind", &self.kind())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl MemoryRegion {
    /// `len` zeroed bytes of host memory, owned by the region.
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        Self::from_boxed(vec![0; len].into_boxed_slice())
    }

    /// Takes over the caller's bytes, without copying them.
    #[must_use]
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        Self::from_boxed(bytes.into_boxed_slice())
    }

    /// Takes over the caller's bytes, without copying them.
    #[must_use]
    pub fn from_boxed(bytes: Box<[u8]>) -> Self {
        Self::from_raw_memory(raw::HostBuffer::new(bytes))
    }

    /// Memory of any kind that implements [`RawMemory`] (pinned host and GPU memory in the backends).
    #[must_use]
    pub fn from_raw_memory(memory: impl RawMemory) -> Self {
        let shards = (0..memory.len().div_ceil(SHARD_BYTES))
            .map(|_| RwLock::new(()))
            .collect();
        Self {
            inner: Arc::new(Inner {
                memory: Box::new(memory),
                shards,
            }),
        }
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.memory.len()
    }

    /// Whether the region holds no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the bytes live.
    #[must_use]
    pub fn kind(&self) -> MemoryKind {
        self.inner.memory.kind()
    }

    /// The first byte's address (a device address for GPU memory), for registering the memory with a NIC
    /// or a device API. Never dereference it: use [`MemoryRegion::read`] and [`MemoryRegion::write`].
    #[must_use]
    pub fn address(&self) -> usize {
        self.inner.memory.as_ptr() as usize
    }

    /// Whether `self` and `other` share the same bytes.
    #[must_use]
    pub fn same_memory(&self, other: &MemoryRegion) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// How many clones of this region are alive (engines, drivers and the caller's). When the caller's is
    /// the only one left after unregistering, no driver can touch the bytes any more.
    #[must_use]
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Copies `bytes` into the region at `offset`.
    pub fn copy_from(&self, offset: usize, bytes: &[u8]) -> Result<(), Error> {
        let end = offset.checked_add(bytes.len()).ok_or(Error::MemoryRange {
            offset: offset as u64,
            length: bytes.len() as u64,
            len: self.len() as u64,
        })?;
        self.write(offset..end)?.copy_from_slice(bytes);
        Ok(())
    }

    /// Views `range` of `self` and `dst_range` of `dst` at once, taking the two views in order of address
    /// (the one order every holder of several views keeps), and hands them to `f`: how bytes move between
    /// two host regions without risking a circle of waits. Two views of one region are refused.
    pub fn with_views<T>(
        &self,
        range: Range<usize>,
        dst: &MemoryRegion,
        dst_range: Range<usize>,
        f: impl FnOnce(&[u8], &mut [u8]) -> T,
    ) -> Result<T, Error> {
        if self.same_memory(dst) {
            return Err(Error::SameRegion);
        }
        if self.address() < dst.address() {
            let src = self.read(range)?;
            Ok(f(&src, &mut dst.write(dst_range)?))
        } else {
            let mut to = dst.write(dst_range)?;
            Ok(f(&self.read(range)?, &mut to))
        }
    }

    /// The whole region as one vector (a copy).
    pub fn to_vec(&self) -> Result<Vec<u8>, Error> {
        Ok(self.read(0..self.len())?.to_vec())
    }

    /// CRC-32C of `range`.
    pub fn crc32c(&self, range: Range<usize>) -> Result<u32, Error> {
        Ok(crate::crc32c(&self.read(range)?))
    }

    /// Fills the region shard by shard: `f(offset, bytes)` for consecutive pieces covering it.
    pub fn fill_with(&self, mut f: impl FnMut(usize, &mut [u8])) -> Result<(), Error> {
        let mut start = 0;
        while start < self.len() {
            let end = (start + SHARD_BYTES).min(self.len());
            f(start, &mut self.write(start..end)?);
            start = end;
        }
        Ok(())
    }

    /// Checks that `range` lies inside host-addressable bytes; returns the shards it touches.
    fn check(&self, range: &Range<usize>) -> Result<Range<usize>, Error> {
        let kind = self.kind();
        if !kind.is_host() {
            return Err(Error::NotHostMemory(kind));
        }
        if range.start > range.end || range.end > self.len() {
            return Err(Error::MemoryRange {
                offset: range.start as u64,
                length: range.end.saturating_sub(range.start) as u64,
                len: self.len() as u64,
            });
        }
        if range.is_empty() {
            return Ok(0..0);
        }
        Ok(range.start / SHARD_BYTES..(range.end - 1) / SHARD_BYTES + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_cover_ranges_across_shards_and_agree_with_a_flat_buffer() {
        let len = 2 * SHARD_BYTES + 100;
        let flat: Vec<u8> = (0..len).map(|i| (i * 7 + i / 1000) as u8).collect();
        let region = MemoryRegion::from_vec(flat.clone());
        let range = SHARD_BYTES - 10..2 * SHARD_BYTES + 50;
        assert_eq!(
            &region.read(range.clone()).unwrap()[..],
            &flat[range.clone()]
        );
        assert_eq!(
            region.crc32c(range.clone()).unwrap(),
            crate::crc32c(&flat[range])
        );
        region.copy_from(5, &[9, 9, 9]).unwrap();
        assert_eq!(
            &region.read(4..9).unwrap()[..],
            &[flat[4], 9, 9, 9, flat[8]]
        );
        assert!(region.read(0..len + 1).is_err());
        assert!(region.write(len..len + 1).is_err());
        assert!(region.copy_from(usize::MAX, &[1]).is_err());
        assert_eq!(region.read(len..len).unwrap().len(), 0);
    }

    #[test]
    fn a_writer_waits_for_readers_of_its_shard() {
        let region = MemoryRegion::zeroed(SHARD_BYTES * 2);
        let view = region.read(0..10).unwrap();
        let other = region.clone();
        let writer = std::thread::spawn(move || {
            other.copy_from(SHARD_BYTES, &[1]).unwrap(); // another shard: no wait
            other.copy_from(0, &[2]).unwrap(); // waits for `view`
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(view[0], 0, "the reader's view is stable while it lives");
        drop(view);
        writer.join().unwrap();
        assert_eq!(region.read(0..1).unwrap()[0], 2);
    }

    #[test]
    fn two_regions_are_viewed_together_in_either_order_and_one_region_is_refused() {
        let a = MemoryRegion::from_vec((0..64).collect());
        let b = MemoryRegion::zeroed(64);
        for (src, dst) in [(&a, &b), (&b, &a)] {
            let copied = src
                .with_views(8..16, dst, 40..48, |s, d| {
                    d.copy_from_slice(s);
                    s.len()
                })
                .unwrap();
            assert_eq!(copied, 8);
        }
        assert_eq!(
            &b.to_vec().unwrap()[40..48],
            &(8..16).collect::<Vec<u8>>()[..]
        );
        assert_eq!(
            &a.to_vec().unwrap()[40..48],
            &[0; 8],
            "b's bytes 8..16 were zero"
        );
        assert!(a.with_views(0..1, &a.clone(), 2..3, |_, _| ()).is_err());
        assert!(a.with_views(0..65, &b, 0..65, |_, _| ()).is_err());
    }
}
