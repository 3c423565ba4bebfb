//! [`DmaBuffer`]: host memory registered for peers' RMA writes, which a NIC (or, on the `shm` provider,
//! a peer process) may write at any moment, under no lock of ours and whatever the protocol says: a peer
//! with the key can write any byte at any time. So no `&[u8]` or `&mut [u8]` of it ever exists. Bytes move
//! in and out only by raw copies into or out of memory this process owns, one copy at a time (a lock
//! keeps this process's own threads from ever racing each other on it), and whatever is read out is
//! checked by its CRC-32C afterwards, on the private copy: a torn read is a failed checksum, never
//! undefined behaviour in safe code.
#![allow(unsafe_code)]

use std::ops::Range;
use std::ptr;
use std::sync::Mutex;

use crate::lock::lock;

/// Host memory that remote writes land in; see the [module docs](self).
pub(crate) struct DmaBuffer {
    base: *mut u8,
    len: usize,
    /// Held for each copy in or out: this process's threads never copy into or out of it at once.
    copying: Mutex<()>,
}

impl std::fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaBuffer")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

// SAFETY: the buffer exclusively owns its allocation (freed once, in `Drop`); every access from this
// process is a raw copy made under `copying`, so moving or sharing the owner between threads never lets
// two of them touch its bytes at once.
unsafe impl Send for DmaBuffer {}
// SAFETY: see `Send`: shared access only copies under `copying`, and hands out no reference to the bytes.
unsafe impl Sync for DmaBuffer {}

impl DmaBuffer {
    /// `len` zeroed bytes.
    pub(crate) fn zeroed(len: usize) -> Self {
        let bytes = vec![0u8; len].into_boxed_slice();
        Self {
            base: Box::into_raw(bytes).cast::<u8>(),
            len,
            copying: Mutex::new(()),
        }
    }

    /// Its address, for registration with the provider.
    pub(crate) fn address(&self) -> *mut u8 {
        self.base
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `range` lies inside the buffer.
    fn holds(&self, range: &Range<usize>) -> bool {
        range.start <= range.end && range.end <= self.len
    }

    /// Copies `src` into the buffer at `offset`; refused (false) where it would not fit.
    pub(crate) fn copy_in(&self, offset: usize, src: &[u8]) -> bool {
        let Some(end) = offset.checked_add(src.len()) else {
            return false;
        };
        if !self.holds(&(offset..end)) {
            return false;
        }
        let _one_at_a_time = lock(&self.copying);
        // SAFETY: `offset..end` lies inside the allocation (checked above); `src` is memory this process
        // owns, which cannot overlap the buffer (no reference to the buffer's bytes is ever made); no other
        // thread of this process copies into or out of the buffer meanwhile (`copying` is held). A peer's
        // NIC may write the same bytes meanwhile: that is what the receiver's CRC check catches.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(offset), src.len()) };
        true
    }

    /// Copies the buffer's bytes at `offset` into `dst`; refused (false) where they would not fit.
    pub(crate) fn copy_out(&self, offset: usize, dst: &mut [u8]) -> bool {
        let Some(end) = offset.checked_add(dst.len()) else {
            return false;
        };
        if !self.holds(&(offset..end)) {
            return false;
        }
        let _one_at_a_time = lock(&self.copying);
        // SAFETY: as in `copy_in`, the other way: `dst` is exclusively borrowed memory of this process,
        // the source range lies inside the allocation, and only this thread of the process copies now.
        unsafe { ptr::copy_nonoverlapping(self.base.add(offset), dst.as_mut_ptr(), dst.len()) };
        true
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        // SAFETY: `base` came from `Box::into_raw` of a boxed slice of exactly `len` bytes and is freed once,
        // here. Its owners (the node's mirror table and the endpoint's registration) drop it only after the
        // registration is closed, so the provider no longer writes it.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.base, self.len)) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_go_in_and_come_out_and_out_of_bounds_copies_are_refused() {
        let buf = DmaBuffer::zeroed(64);
        assert!(buf.copy_in(10, &[1, 2, 3]));
        let mut out = [0u8; 5];
        assert!(buf.copy_out(9, &mut out));
        assert_eq!(out, [0, 1, 2, 3, 0]);
        assert!(!buf.copy_in(62, &[1, 2, 3]));
        assert!(!buf.copy_out(usize::MAX, &mut out));
        assert!(!buf.copy_in(usize::MAX - 1, &[1, 2, 3]));
        assert_eq!(buf.len(), 64);
    }
}
