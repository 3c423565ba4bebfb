//! Units in memory the host cannot read or the provider cannot register: GPU regions.
//!
//! - **Registered in place** (a provider with `FI_HMEM`, asked for with [`super::RdmaConfig::gpu_memory`]):
//!   the NIC writes straight from and into GPU memory. The host cannot read those bytes, so with feature
//!   `cuda` a unit's CRC-32C is taken on a host copy (4 MiB pieces), on both ends: GPU units are verified end
//!   to end like host ones, at the price of one extra device-to-host copy per end.
//! - **Staged through a mirror** (any other provider): the region is registered as a host mirror of the same
//!   size (pinned, with feature `cuda`). Sending, a unit is copied GPU to mirror, its CRC taken on the host
//!   side of that copy, before its writes are posted from the mirror; receiving, a unit that landed in the
//!   mirror is checksummed there and copied to the GPU before the engine hears of it. The mirror costs host
//!   memory the size of the region. Host regions are staged the same way (CPU copies) unless the caller
//!   grants them in place ([`super::HostMemoryAccess`]), so the staged path runs without a GPU too.

use std::ops::Range;

use transfer_engine::{MemoryKind, MemoryRegion};

use super::RdmaError;

/// Takes CRC-32Cs of units, and stages units between regions and their mirrors, whatever memory they are in.
#[derive(Debug, Default)]
pub(crate) struct UnitCopies {
    #[cfg(feature = "cuda")]
    gpu: Option<gpu::DeviceCopies>,
}

impl UnitCopies {
    /// A host mirror of `len` bytes for a region of memory `kind` (pinned for GPU memory).
    pub(crate) fn mirror(kind: MemoryKind, len: usize) -> Result<MemoryRegion, RdmaError> {
        match kind {
            MemoryKind::Device { ordinal } => gpu_mirror(ordinal, len),
            MemoryKind::Host | MemoryKind::PinnedHost => Ok(MemoryRegion::zeroed(len)),
        }
    }

    /// Copies `range` of `src` into the same range of its `mirror` and returns the CRC-32C of the bytes
    /// copied (taken on the host side, in the same pass for host memory).
    pub(crate) fn stage_out(
        &mut self,
        src: &MemoryRegion,
        mirror: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<u32, RdmaError> {
        self.copy(src, mirror, range)
    }

    /// Copies `range` of `mirror` (a unit that landed there) into the same range of `dst` and returns the
    /// CRC-32C of the bytes that landed.
    pub(crate) fn stage_in(
        &mut self,
        mirror: &MemoryRegion,
        dst: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<u32, RdmaError> {
        self.copy(mirror, dst, range)
    }

    fn copy(
        &mut self,
        from: &MemoryRegion,
        to: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<u32, RdmaError> {
        if from.kind().is_host() && to.kind().is_host() {
            let crc = from.with_views(range.clone(), to, range, |src, dst| {
                transfer_engine::copy_and_crc32c(dst, src)
            })?;
            return Ok(crc);
        }
        self.device_copy(from, to, range)
    }

    /// The CRC-32C of `range` of `memory`.
    pub(crate) fn crc32c(
        &mut self,
        memory: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<u32, RdmaError> {
        if memory.kind().is_host() {
            return Ok(memory.crc32c(range)?);
        }
        self.device(memory, range)
    }

    /// Checks that units in memory of GPU `ordinal` can be checksummed and staged here (a build with feature
    /// `cuda`, a driver, the GPU).
    pub(crate) fn check_device(ordinal: u32) -> Result<(), RdmaError> {
        crate::check_gpu(ordinal)
            .map_err(|why| RdmaError::Config(format!("GPU {ordinal} cannot be used: {why}")))
    }

    #[cfg(feature = "cuda")]
    fn device(&mut self, memory: &MemoryRegion, range: Range<usize>) -> Result<u32, RdmaError> {
        self.gpu
            .get_or_insert_with(gpu::DeviceCopies::new)
            .crc32c(memory, range)
            .map_err(|e| RdmaError::Config(format!("checksumming GPU bytes: {e}")))
    }

    #[cfg(feature = "cuda")]
    fn device_copy(
        &mut self,
        from: &MemoryRegion,
        to: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<u32, RdmaError> {
        self.gpu
            .get_or_insert_with(gpu::DeviceCopies::new)
            .copy(from, to, range)
            .map_err(|e| RdmaError::Config(format!("staging GPU bytes: {e}")))
    }

    #[cfg(not(feature = "cuda"))]
    fn device(&mut self, memory: &MemoryRegion, _: Range<usize>) -> Result<u32, RdmaError> {
        Err(no_gpu(memory.kind()))
    }

    #[cfg(not(feature = "cuda"))]
    fn device_copy(
        &mut self,
        from: &MemoryRegion,
        to: &MemoryRegion,
        _: Range<usize>,
    ) -> Result<u32, RdmaError> {
        let kind = if from.kind().is_host() {
            to.kind()
        } else {
            from.kind()
        };
        Err(no_gpu(kind))
    }
}

#[cfg(not(feature = "cuda"))]
fn no_gpu(kind: MemoryKind) -> RdmaError {
    RdmaError::Config(format!("{kind} cannot be used: {}", crate::NO_GPU_SUPPORT))
}

#[cfg(feature = "cuda")]
fn gpu_mirror(ordinal: u32, len: usize) -> Result<MemoryRegion, RdmaError> {
    let gpu = crate::cuda::Gpu::open(ordinal)
        .map_err(|e| RdmaError::Config(format!("GPU {ordinal} cannot be used: {e}")))?;
    crate::cuda::PinnedHostMemory::alloc(&gpu, len)
        .map(crate::cuda::PinnedHostMemory::into_region)
        .map_err(|e| RdmaError::Config(format!("a pinned mirror of {len} bytes: {e}")))
}

#[cfg(not(feature = "cuda"))]
fn gpu_mirror(ordinal: u32, _: usize) -> Result<MemoryRegion, RdmaError> {
    Err(no_gpu(MemoryKind::Device { ordinal }))
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::ops::Range;

    use transfer_engine::MemoryRegion;

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

        pub(super) fn crc32c(
            &mut self,
            memory: &MemoryRegion,
            range: Range<usize>,
        ) -> Result<u32, CudaError> {
            let mut crc = transfer_engine::crc32c(&[]);
            for start in range.clone().step_by(PIECE) {
                let end = (start + PIECE).min(range.end);
                let report = self
                    .mover
                    .place(memory, start..end, &self.scratch, 0..end - start)?;
                let piece = report.crc32c.ok_or_else(|| {
                    CudaError::Invalid("a copy to host memory came back without a checksum".into())
                })?;
                crc = transfer_engine::crc32c_combine(crc, piece, end - start);
            }
            Ok(crc)
        }

        /// Copies `range` of `from` into the same range of `to` (one of them GPU memory); returns the
        /// CRC-32C of the host side's bytes.
        pub(super) fn copy(
            &mut self,
            from: &MemoryRegion,
            to: &MemoryRegion,
            range: Range<usize>,
        ) -> Result<u32, CudaError> {
            let report = self.mover.place(from, range.clone(), to, range)?;
            report.crc32c.ok_or_else(|| {
                CudaError::Invalid(
                    "a copy between host and GPU came back without a checksum".into(),
                )
            })
        }
    }
}
