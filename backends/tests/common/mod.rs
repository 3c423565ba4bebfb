//! Fixtures shared by the integration tests.
#![allow(unsafe_code)] // one fixture: host bytes presented as GPU memory, never dereferenced.
#![allow(dead_code)] // each test file uses part of it

use transfer_engine::{MemoryKind, RawMemory};

/// Host bytes that claim to be memory of GPU 0: the host side of the engine never reads memory of that
/// kind, so the claim only decides how a driver routes the bytes.
pub(crate) struct ClaimsToBeGpu(pub(crate) Box<[u8]>);

// SAFETY: the pointer and length are the boxed slice's, which this value owns and never moves or frees
// while it lives; nothing writes through the pointer (kind Device is never dereferenced by the host).
unsafe impl RawMemory for ClaimsToBeGpu {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr().cast_mut()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device { ordinal: 0 }
    }
}

/// `len` pseudo-random bytes of `seed` (xorshift), the same for the same seed.
pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
