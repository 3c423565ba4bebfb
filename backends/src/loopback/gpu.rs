//! Placement where either side is GPU memory. With feature `cuda`, the bytes move through the cuda
//! module's [`GpuMover`](crate::cuda::GpuMover) (`cuMemcpy*Async` on a stream of its own), and the CRC-32C
//! is taken over the host side of the copy; without it, such a move is refused with a clear error.
//!
//! What is verified: a host-to-GPU unit is checksummed by the producer as usual and compared with the CRC
//! the mover takes of the same host bytes. A GPU-to-host unit cannot be read by the producer; the engine is
//! handed the CRC of the bytes that landed, so it verifies the copy arrived whole, not an independent
//! sender's checksum. A GPU-to-GPU unit is not checksummed at all (the DMA engine's copy is trusted).

use std::ops::Range;

use transfer_engine::MemoryRegion;

use crate::TransportError;

/// Moves bytes for the loopback consumer when either region is GPU memory.
#[derive(Debug)]
pub(crate) struct GpuPlacer {
    #[cfg(feature = "cuda")]
    mover: crate::cuda::GpuMover,
}

impl GpuPlacer {
    pub(crate) fn new() -> Self {
        Self {
            #[cfg(feature = "cuda")]
            mover: crate::cuda::GpuMover::new(4 << 20),
        }
    }

    /// Whether a move between these regions needs the GPU.
    pub(crate) fn needed(src: &MemoryRegion, dst: &MemoryRegion) -> bool {
        !src.kind().is_host() || !dst.kind().is_host()
    }

    /// Copies `src_range` of `src` into `dst_range` of `dst`; returns the CRC-32C of the host side of the
    /// copy, or `None` for GPU to GPU.
    #[cfg(feature = "cuda")]
    pub(crate) fn place(
        &self,
        src: &MemoryRegion,
        src_range: Range<usize>,
        dst: &MemoryRegion,
        dst_range: Range<usize>,
    ) -> Result<Option<u32>, TransportError> {
        self.mover
            .place(src, src_range, dst, dst_range)
            .map(|report| report.crc32c)
            .map_err(|e| TransportError::Device {
                backend: "loopback",
                message: format!("GPU copy failed: {e}"),
            })
    }

    /// Without feature `cuda`, GPU memory cannot be moved: refused with a clear error.
    #[cfg(not(feature = "cuda"))]
    pub(crate) fn place(
        &self,
        src: &MemoryRegion,
        _src_range: Range<usize>,
        dst: &MemoryRegion,
        _dst_range: Range<usize>,
    ) -> Result<Option<u32>, TransportError> {
        let kind = if src.kind().is_host() {
            dst.kind()
        } else {
            src.kind()
        };
        Err(TransportError::Unsupported {
            backend: "loopback",
            what: format!("move {kind}: {}", crate::NO_GPU_SUPPORT),
        })
    }
}
