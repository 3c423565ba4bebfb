//! Units in memory the host cannot read or the provider cannot register: GPU regions.
//!
//! - **Registered in place** (a provider with `FI_HMEM`, asked for with [`super::RdmaConfig::gpu_memory`]):
//!   the NIC writes straight from and into GPU memory. The host cannot read those bytes, so with feature
//!   `cuda` a unit's CRC-32C is taken on a host copy (4 MiB pieces), on both ends: GPU units are verified end
//!   to end like host ones, at the price of one extra device-to-host copy per end.
//! - **Staged through a mirror** (any other provider): the region is registered as a host mirror of the same
//!   size, a [`DmaBuffer`] that peers write at any time and that is never seen as a slice. Sending, a unit
//!   is copied into the mirror (through a host piece for GPU memory), its CRC taken on this process's own
//!   bytes, before its writes are posted from the mirror; receiving, a unit that landed in the mirror is
//!   copied out into the region (through a host piece for GPU memory) and its CRC taken on the copy, before
//!   the engine hears of it. A peer that writes the mirror again meanwhile only fails that check. The mirror
//!   costs host memory the size of the region. Host regions are staged the same way (CPU copies) unless the
//!   caller grants them in place ([`super::HostMemoryAccess`]), so the staged path runs without a GPU too.

use std::ops::Range;

#[cfg(not(feature = "cuda"))]
use transfer_engine::MemoryKind;
use transfer_engine::MemoryRegion;

use super::ffi::DmaBuffer;
use crate::TransportError;

/// Bytes copied and checksummed at a time between a host region and its mirror: each piece is checksummed
/// while it is still in cache.
const PIECE: usize = 256 << 10;

/// Takes CRC-32Cs of units, and stages units between regions and their mirrors, whatever memory they are in.
#[derive(Debug, Default)]
pub(crate) struct UnitCopies {
    #[cfg(feature = "cuda")]
    gpu: Option<gpu::DeviceCopies>,
}

impl UnitCopies {
    /// Copies `range` of `src` into the same range of its `mirror` and returns the CRC-32C of the bytes
    /// copied (taken on `src`'s side, a piece at a time as it is copied).
    pub(crate) fn stage_out(
        &mut self,
        src: &MemoryRegion,
        mirror: &DmaBuffer,
        range: Range<usize>,
    ) -> Result<u32, TransportError> {
        if !src.kind().is_host() {
            return self.device_out(src, mirror, range);
        }
        let view = src.read(range.clone())?;
        let mut crc = transfer_engine::crc32c(&[]);
        for (i, piece) in view.chunks(PIECE).enumerate() {
            crc = transfer_engine::crc32c_combine(crc, transfer_engine::crc32c(piece), piece.len());
            if !mirror.copy_in(range.start + i * PIECE, piece) {
                return Err(outside(mirror, &range));
            }
        }
        Ok(crc)
    }

    /// Copies `range` of `mirror` (a unit that landed there) into the same range of `dst` and returns the
    /// CRC-32C of the bytes placed (taken on `dst`, a piece at a time as it is copied).
    pub(crate) fn stage_in(
        &mut self,
        mirror: &DmaBuffer,
        dst: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<u32, TransportError> {
        if !dst.kind().is_host() {
            return self.device_in(mirror, dst, range);
        }
        let mut view = dst.write(range.clone())?;
        let mut crc = transfer_engine::crc32c(&[]);
        for (i, piece) in view.chunks_mut(PIECE).enumerate() {
            if !mirror.copy_out(range.start + i * PIECE, piece) {
                return Err(outside(mirror, &range));
            }
            crc = transfer_engine::crc32c_combine(crc, transfer_engine::crc32c(piece), piece.len());
        }
        Ok(crc)
    }

    /// The CRC-32C of `range` of `memory`.
    pub(crate) fn crc32c(
        &mut self,
        memory: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<u32, TransportError> {
        if memory.kind().is_host() {
            return Ok(memory.crc32c(range)?);
        }
        self.device(memory, range)
    }

    /// Checks that units in memory of GPU `ordinal` can be checksummed and staged here (a build with feature
    /// `cuda`, a driver, the GPU).
    pub(crate) fn check_device(ordinal: u32) -> Result<(), TransportError> {
        crate::check_gpu(ordinal).map_err(|why| TransportError::Device {
            backend: "rdma",
            message: format!("GPU {ordinal} cannot be used: {why}"),
        })
    }

    #[cfg(feature = "cuda")]
    fn device(
        &mut self,
        memory: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<u32, TransportError> {
        self.gpu
            .get_or_insert_with(gpu::DeviceCopies::new)
            .crc32c(memory, range)
            .map_err(|e| TransportError::Device {
                backend: "rdma",
                message: format!("checksumming GPU bytes: {e}"),
            })
    }

    #[cfg(feature = "cuda")]
    fn device_out(
        &mut self,
        src: &MemoryRegion,
        mirror: &DmaBuffer,
        range: Range<usize>,
    ) -> Result<u32, TransportError> {
        self.gpu
            .get_or_insert_with(gpu::DeviceCopies::new)
            .out_to(src, mirror, range)
            .map_err(|e| TransportError::Device {
                backend: "rdma",
                message: format!("staging GPU bytes: {e}"),
            })
    }

    #[cfg(feature = "cuda")]
    fn device_in(
        &mut self,
        mirror: &DmaBuffer,
        dst: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<u32, TransportError> {
        self.gpu
            .get_or_insert_with(gpu::DeviceCopies::new)
            .in_from(mirror, dst, range)
            .map_err(|e| TransportError::Device {
                backend: "rdma",
                message: format!("staging GPU bytes: {e}"),
            })
    }

    #[cfg(not(feature = "cuda"))]
    fn device(&mut self, memory: &MemoryRegion, _: Range<usize>) -> Result<u32, TransportError> {
        Err(no_gpu(memory.kind()))
    }

    #[cfg(not(feature = "cuda"))]
    fn device_out(
        &mut self,
        src: &MemoryRegion,
        _: &DmaBuffer,
        _: Range<usize>,
    ) -> Result<u32, TransportError> {
        Err(no_gpu(src.kind()))
    }

    #[cfg(not(feature = "cuda"))]
    fn device_in(
        &mut self,
        _: &DmaBuffer,
        dst: &MemoryRegion,
        _: Range<usize>,
    ) -> Result<u32, TransportError> {
        Err(no_gpu(dst.kind()))
    }
}

/// A unit's range that does not lie inside its region's mirror (the two have the same length, so this is a
/// bug, reported rather than copied past the end).
fn outside(mirror: &DmaBuffer, range: &Range<usize>) -> TransportError {
    TransportError::Io {
        backend: "rdma",
        message: format!(
            "bytes {range:?} do not lie inside a mirror of {} bytes",
            mirror.len()
        ),
    }
}

#[cfg(not(feature = "cuda"))]
fn no_gpu(kind: MemoryKind) -> TransportError {
    TransportError::Unsupported {
        backend: "rdma",
        what: format!("use {kind}: {}", crate::NO_GPU_SUPPORT),
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::ops::Range;

    use transfer_engine::MemoryRegion;

    use super::DmaBuffer;
    use crate::cuda::{CudaError, GpuMover};

    /// Bytes copied to the host per piece.
    const PIECE: usize = 4 << 20;

    /// A copy engine pool and one host buffer to copy GPU bytes into.
    #[derive(Debug)]
    pub(super) struct DeviceCopies {
        mover: GpuMover,
        scratch: MemoryRegion,
    }

    impl DeviceCopies {
        pub(super) fn new() -> Self {
            Self {
                mover: GpuMover::new(PIECE),
                scratch: MemoryRegion::zeroed(PIECE),
            }
        }

        /// Copies `piece` of GPU memory `src` (at most [`PIECE`] bytes) to the start of the scratch buffer;
        /// returns the CRC-32C of the bytes copied.
        fn stage_piece(
            &mut self,
            src: &MemoryRegion,
            piece: Range<usize>,
        ) -> Result<u32, CudaError> {
            let len = piece.len();
            let report = self.mover.place(src, piece, &self.scratch, 0..len)?;
            report.crc32c.ok_or_else(|| {
                CudaError::Invalid("a copy to host memory came back without a checksum".into())
            })
        }

        pub(super) fn crc32c(
            &mut self,
            memory: &MemoryRegion,
            range: Range<usize>,
        ) -> Result<u32, CudaError> {
            let mut crc = transfer_engine::crc32c(&[]);
            for start in range.clone().step_by(PIECE) {
                let end = (start + PIECE).min(range.end);
                let piece = self.stage_piece(memory, start..end)?;
                crc = transfer_engine::crc32c_combine(crc, piece, end - start);
            }
            Ok(crc)
        }

        /// Copies `range` of GPU memory `src` into the same range of `mirror`, a piece at a time through
        /// the host scratch buffer; returns the CRC-32C of the bytes copied (taken on the scratch copy).
        pub(super) fn out_to(
            &mut self,
            src: &MemoryRegion,
            mirror: &DmaBuffer,
            range: Range<usize>,
        ) -> Result<u32, CudaError> {
            let mut crc = transfer_engine::crc32c(&[]);
            for start in range.clone().step_by(PIECE) {
                let end = (start + PIECE).min(range.end);
                let piece = self.stage_piece(src, start..end)?;
                let staged = self
                    .scratch
                    .read(0..end - start)
                    .map_err(|e| CudaError::Invalid(e.to_string()))?;
                if !mirror.copy_in(start, &staged) {
                    return Err(CudaError::Invalid(format!(
                        "bytes {start}..{end} lie outside the mirror"
                    )));
                }
                crc = transfer_engine::crc32c_combine(crc, piece, end - start);
            }
            Ok(crc)
        }

        /// Copies `range` of `mirror` into the same range of GPU memory `dst`, a piece at a time through the
        /// host scratch buffer; returns the CRC-32C of the bytes placed (taken on the scratch copy).
        pub(super) fn in_from(
            &mut self,
            mirror: &DmaBuffer,
            dst: &MemoryRegion,
            range: Range<usize>,
        ) -> Result<u32, CudaError> {
            let mut crc = transfer_engine::crc32c(&[]);
            for start in range.clone().step_by(PIECE) {
                let end = (start + PIECE).min(range.end);
                {
                    let mut staged = self
                        .scratch
                        .write(0..end - start)
                        .map_err(|e| CudaError::Invalid(e.to_string()))?;
                    if !mirror.copy_out(start, &mut staged) {
                        return Err(CudaError::Invalid(format!(
                            "bytes {start}..{end} lie outside the mirror"
                        )));
                    }
                    crc = transfer_engine::crc32c_combine(
                        crc,
                        transfer_engine::crc32c(&staged),
                        end - start,
                    );
                }
                self.mover
                    .place(&self.scratch, 0..end - start, dst, start..end)?;
            }
            Ok(crc)
        }
    }
}
