//! Buffers the endpoint owns: its pools of message slots, and guarded memory for the refusal probe.
#![allow(unsafe_code)]

use std::ptr;

use transfer_engine::MemoryRegion;

use super::MrId;

/// A pool of equal message slots in one registered allocation.
pub(super) struct Slots {
    pub(super) base: *mut u8,
    pub(super) slot_bytes: usize,
    pub(super) count: usize,
    pub(super) mr: Option<MrId>,
}

// SAFETY: a pool exclusively owns its allocation (freed once, in `Drop`); the raw pointer is only an
// address the provider was given, so moving the owner to another thread is sound.
unsafe impl Send for Slots {}

impl Slots {
    pub(super) fn new(count: usize, slot_bytes: usize) -> Self {
        let bytes = vec![0u8; count * slot_bytes].into_boxed_slice();
        Self {
            base: Box::into_raw(bytes).cast::<u8>(),
            slot_bytes,
            count,
            mr: None,
        }
    }

    pub(super) fn ptr(&self, slot: usize) -> *mut u8 {
        debug_assert!(slot < self.count);
        self.base.wrapping_add(slot * self.slot_bytes)
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        let len = self.count * self.slot_bytes;
        // SAFETY: `base` came from `Box::into_raw` of a boxed slice of exactly `len` bytes and is freed
        // once, here; the endpoint drops its pools only after closing every libfabric object.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.base, len)) });
    }
}

/// `len` bytes of host memory with `len` guard bytes on each side: the whole allocation (zeroed) and a
/// region over its middle third, for checking that a refused write landed nowhere near the region.
#[must_use]
pub(crate) fn guarded_region(len: usize) -> (MemoryRegion, MemoryRegion) {
    let whole = MemoryRegion::zeroed(3 * len);
    let middle = (whole.address() as *mut u8).wrapping_add(len);
    // SAFETY: `middle..middle + len` lies inside `whole`'s allocation, which the owner (a clone of `whole`)
    // keeps alive until the middle region's last clone drops. The two regions alias; the probe reads
    // `whole` only after every write to the middle has completed, so their locks never need to agree.
    let region =
        unsafe { MemoryRegion::from_raw_parts(middle, len, Some(Box::new(whole.clone()))) };
    (whole, region)
}
