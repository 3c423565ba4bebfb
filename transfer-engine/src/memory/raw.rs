//! The one module of the core that holds `unsafe`: memory that regions are registered over, and the
//! views of it handed out under a shard lock.
//!
//! Everything unsafe about caller-owned memory is here. The rest of the workspace reaches the bytes only
//! through [`super::MemoryRegion`]'s guards, which hold the shard locks for as long as the view lives, so
//! two views of the same byte are never a writer and anyone else at once.

use std::any::Any;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use std::ops::Range;
use std::sync::PoisonError;

use super::{MemoryKind, MemoryRegion};
use crate::Error;

/// Memory that a region can be registered over: host memory the engine allocated, memory the caller owns,
/// pinned host memory or GPU memory from a backend.
///
/// # Safety
/// An implementor promises that, for as long as the value lives:
/// - `as_ptr()` and `len()` never change, and `as_ptr()..as_ptr() + len()` is one allocation that stays
///   valid (not moved, not freed) until the value is dropped;
/// - when [`RawMemory::kind`] is host-addressable ([`MemoryKind::is_host`]), those bytes are valid for CPU
///   reads and writes of any value (no uninitialised memory, no invariants on the bytes);
/// - nothing else reads or writes those bytes while a view handed out by [`super::MemoryRegion`] covers them
///   (the region's guards order its own users; other code must keep off ranges that live sessions use).
pub unsafe trait RawMemory: Send + Sync + 'static {
    /// First byte (a device address, for device memory: never dereferenced by the host).
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether there are no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where the bytes live.
    fn kind(&self) -> MemoryKind;
}

/// Host bytes owned by the region (a `Vec` or boxed slice handed over, or zeroed memory it allocated).
///
/// The allocation is held as the raw pointer [`Box::into_raw`] gave up, not as a `Box` beside a pointer
/// derived from it: a `Box` asserts unique access whenever it is moved, which would invalidate every
/// pointer taken from it before (under Stacked and Tree Borrows). Only this pointer reaches the bytes, and
/// [`Drop`] turns it back into the box to free them.
pub(crate) struct HostBuffer {
    /// From `Box::into_raw` of a `Box<[u8]>`; freed once, in `Drop`. For an empty slice it is the
    /// dangling, well-aligned pointer an empty box holds, and nothing was allocated.
    bytes: NonNull<[u8]>,
}

impl HostBuffer {
    pub(crate) fn new(bytes: Box<[u8]>) -> Self {
        // `Box::leak` is `Box::into_raw` as a reference: never null, also for an empty slice.
        Self {
            bytes: NonNull::from(Box::leak(bytes)),
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: `bytes` came from `Box::into_raw` (through `Box::leak`) of a `Box<[u8]>` in `new`, with
        // its length unchanged, and is turned back into that box exactly once, here. Every view of the
        // bytes borrows the region that owns this value, so none outlives it. For an empty slice the
        // box rebuilt is the empty box given up, and dropping it frees nothing.
        drop(unsafe { Box::from_raw(self.bytes.as_ptr()) });
    }
}

// SAFETY: the pointer is the one `Box::into_raw` gave up for the boxed slice this value owns, so it is one
// allocation of `len` initialised `u8`s that never moves (moving a `HostBuffer` moves only the pointer) and
// is freed only in `Drop`, with this value. No `Box` or reference to the bytes is kept beside it, so the
// region's views, derived from `as_ptr`, are the only way to the bytes.
unsafe impl RawMemory for HostBuffer {
    fn as_ptr(&self) -> *mut u8 {
        self.bytes.as_ptr().cast::<u8>()
    }
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
}

// SAFETY: `HostBuffer` is a uniquely owned heap allocation (like `Box<[u8]>`, which is Send and Sync); the raw
// pointer only stops the compiler from seeing that. Concurrent access is ordered by the region's locks.
unsafe impl Send for HostBuffer {}
// SAFETY: as for `Send`.
unsafe impl Sync for HostBuffer {}

/// Host memory the caller keeps owning, described by a pointer and a length.
pub(crate) struct BorrowedHost {
    ptr: *mut u8,
    len: usize,
    /// Dropped with the last clone of the region: the caller's way to learn that the memory is free again.
    _owner: Option<Box<dyn Any + Send + Sync>>,
}

impl BorrowedHost {
    /// # Safety
    /// The contract of [`super::MemoryRegion::from_raw_parts`].
    pub(crate) unsafe fn new(
        ptr: *mut u8,
        len: usize,
        owner: Option<Box<dyn Any + Send + Sync>>,
    ) -> Self {
        Self {
            ptr,
            len,
            _owner: owner,
        }
    }
}

// SAFETY: the caller of `BorrowedHost::new` (through the unsafe `MemoryRegion::from_raw_parts`) promised every
// clause of `RawMemory`'s contract for this pointer and length.
unsafe impl RawMemory for BorrowedHost {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
}

// SAFETY: the caller promised the memory may be used from any thread while registered (the `Send + Sync`
// clause of `from_raw_parts`); access is ordered by the region's locks.
unsafe impl Send for BorrowedHost {}
// SAFETY: as for `Send`.
unsafe impl Sync for BorrowedHost {}

/// A read-only view of a range of a host region; holds the shard locks it covers until dropped.
pub struct Bytes<'a> {
    _locks: Vec<RwLockReadGuard<'a, ()>>,
    ptr: *const u8,
    len: usize,
}

impl<'a> Bytes<'a> {
    /// # Safety
    /// `ptr..ptr + len` lies inside a host-addressable [`RawMemory`] that outlives `'a`, and `locks` are the
    /// read locks of every shard the range touches.
    pub(crate) unsafe fn new(
        locks: Vec<RwLockReadGuard<'a, ()>>,
        ptr: *const u8,
        len: usize,
    ) -> Self {
        Self {
            _locks: locks,
            ptr,
            len,
        }
    }
}

impl Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: by `Bytes::new`'s contract the range is valid, initialised host memory that outlives the
        // view, and the read locks held by `self` keep every writer (which needs the write locks) away.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A writable view of a range of a host region; holds the shard locks it covers until dropped.
pub struct BytesMut<'a> {
    _locks: Vec<RwLockWriteGuard<'a, ()>>,
    ptr: *mut u8,
    len: usize,
}

impl<'a> BytesMut<'a> {
    /// # Safety
    /// `ptr..ptr + len` lies inside a host-addressable [`RawMemory`] that outlives `'a`, and `locks` are the
    /// write locks of every shard the range touches.
    pub(crate) unsafe fn new(
        locks: Vec<RwLockWriteGuard<'a, ()>>,
        ptr: *mut u8,
        len: usize,
    ) -> Self {
        Self {
            _locks: locks,
            ptr,
            len,
        }
    }
}

impl Deref for BytesMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: as in `Bytes::deref`; the write locks exclude every other view.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for BytesMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `Bytes::deref`; the write locks held by `self` exclude every other view, and the
        // `&mut self` borrow makes this the only slice of it alive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

// SAFETY: a view is a borrowed slice plus lock guards; a `&[u8]` is Sync, and the guards are only dropped.
unsafe impl Sync for Bytes<'_> {}
// SAFETY: as a `&mut [u8]` is Sync.
unsafe impl Sync for BytesMut<'_> {}

impl MemoryRegion {
    /// Host memory the caller keeps owning: `len` bytes at `ptr`. `owner`, if given, is dropped when the
    /// last clone of the region drops, and may free the memory then.
    ///
    /// # Safety
    /// Until the last clone of the returned region (and of every region or engine it is registered with)
    /// has been dropped:
    /// - `ptr..ptr + len` is one live allocation of initialised host memory, valid for reads and writes, not
    ///   moved and not freed;
    /// - it may be read and written from any thread;
    /// - the caller's own code does not read or write bytes that a live session uses (see the module docs),
    ///   and never writes bytes while a view from this region covers them.
    #[must_use]
    pub unsafe fn from_raw_parts(
        ptr: *mut u8,
        len: usize,
        owner: Option<Box<dyn Any + Send + Sync>>,
    ) -> Self {
        // SAFETY: the caller promised `from_raw_parts`'s contract, which is `BorrowedHost::new`'s.
        let memory = unsafe { BorrowedHost::new(ptr, len, owner) };
        Self::from_raw_memory(memory)
    }

    /// A read-only view of `range`, waiting for writers of its shards to finish.
    pub fn read(&self, range: Range<usize>) -> Result<Bytes<'_>, Error> {
        let shards = self.check(&range)?;
        let locks = self.inner.shards[shards]
            .iter()
            .map(|l| l.read().unwrap_or_else(PoisonError::into_inner))
            .collect();
        let ptr = self.inner.memory.as_ptr().wrapping_add(range.start);
        // SAFETY: `check` proved the range lies inside host-addressable memory that lives as long as `self`
        // (the `RawMemory` contract), and `locks` are the read locks of every shard it touches.
        Ok(unsafe { Bytes::new(locks, ptr, range.len()) })
    }

    /// A writable view of `range`, waiting for every other view of its shards to end.
    pub fn write(&self, range: Range<usize>) -> Result<BytesMut<'_>, Error> {
        let shards = self.check(&range)?;
        let locks = self.inner.shards[shards]
            .iter()
            .map(|l| l.write().unwrap_or_else(PoisonError::into_inner))
            .collect();
        let ptr = self.inner.memory.as_ptr().wrapping_add(range.start);
        // SAFETY: as in `read`, with the write locks of every shard the range touches.
        Ok(unsafe { BytesMut::new(locks, ptr, range.len()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_the_caller_owns_is_used_in_place_and_released_by_the_last_clone() {
        let mut pool = vec![0u8; 4096];
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        struct Owner(std::sync::mpsc::Sender<()>);
        impl Drop for Owner {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        // SAFETY: `pool` outlives every clone (they are all dropped below, before it), and is only touched
        // through the region meanwhile.
        let region = unsafe {
            MemoryRegion::from_raw_parts(pool.as_mut_ptr(), pool.len(), Some(Box::new(Owner(tx))))
        };
        let clone = region.clone();
        clone.copy_from(100, b"kv").unwrap();
        assert_eq!(region.holders(), 2);
        drop(region);
        assert!(rx.try_recv().is_err(), "a clone still holds the memory");
        drop(clone);
        rx.try_recv()
            .expect("the owner is dropped with the last clone");
        assert_eq!(&pool[100..102], b"kv");
    }

    #[test]
    fn an_owned_buffer_keeps_its_bytes_in_place_when_moved() {
        let bytes: Box<[u8]> = (0..=255).collect();
        let heap = bytes.as_ptr() as usize;
        let buffer = HostBuffer::new(bytes);
        assert_eq!(buffer.as_ptr() as usize, heap, "no copy is made");
        let mut moved = vec![buffer]; // the value moves; its allocation does not
        let region = MemoryRegion::from_raw_memory(moved.pop().unwrap());
        assert_eq!(region.address(), heap);
        assert_eq!(region.len(), 256);
        region.copy_from(10, &[7, 7]).unwrap();
        let read = region.to_vec().unwrap();
        assert_eq!(&read[8..13], &[8, 9, 7, 7, 12]);
        assert_eq!(read[255], 255);
    }

    #[test]
    fn an_empty_owned_buffer_has_no_bytes_and_drops_cleanly() {
        for region in [
            MemoryRegion::zeroed(0),
            MemoryRegion::from_vec(Vec::new()),
            MemoryRegion::from_boxed(Box::new([])),
        ] {
            assert!(region.is_empty());
            assert_ne!(
                region.address(),
                0,
                "an empty buffer's pointer is dangling, not null"
            );
            assert_eq!(region.read(0..0).unwrap().len(), 0);
            assert!(region.read(0..1).is_err());
            assert!(region.to_vec().unwrap().is_empty());
            drop(region.clone());
        }
    }

    #[test]
    fn device_memory_is_refused_for_host_access() {
        struct Device;
        // SAFETY: never dereferenced: the region refuses host access to device memory.
        unsafe impl RawMemory for Device {
            fn as_ptr(&self) -> *mut u8 {
                0x1000 as *mut u8
            }
            fn len(&self) -> usize {
                4096
            }
            fn kind(&self) -> MemoryKind {
                MemoryKind::Device { ordinal: 0 }
            }
        }
        let region = MemoryRegion::from_raw_memory(Device);
        assert_eq!(
            region.read(0..1).err(),
            Some(Error::NotHostMemory(MemoryKind::Device { ordinal: 0 }))
        );
        assert_eq!(region.address(), 0x1000);
    }
}
