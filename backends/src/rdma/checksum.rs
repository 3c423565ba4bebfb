//! Checksums of units in registered memory. Host bytes are checksummed in place. GPU bytes (registered
//! with `FI_HMEM`, so the NIC writes straight from and into them) cannot be read by the host: with feature
//! `cuda` they are copied to a host buffer a piece at a time and checksummed there, so GPU units are
//! verified end to end like host ones, at the price of one extra device-to-host copy on each end.

use std::ops::Range;

use transfer_engine::MemoryRegion;

use super::RdmaError;

/// Takes CRC-32Cs of units, whatever memory they are in.
#[derive(Debug, Default)]
pub(crate) struct UnitChecksum {
    #[cfg(feature = "cuda")]
    gpu: Option<gpu::DeviceCrc>,
}

impl UnitChecksum {
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

    /// Checks that units in memory of GPU `ordinal` can be checksummed here (a build with feature
    /// `cuda`, a driver, the GPU).
    pub(crate) fn check_device(ordinal: u32) -> Result<(), RdmaError> {
        #[cfg(feature = "cuda")]
        {
            crate::cuda::Gpu::open(ordinal)
                .map(|_| ())
                .map_err(|e| RdmaError::Config(format!("GPU {ordinal} cannot be used: {e}")))
        }
        #[cfg(not(feature = "cuda"))]
        Err(RdmaError::Config(format!(
            "memory of GPU {ordinal} cannot be used: this build has no GPU support (build `backends` \
             with feature `cuda`)"
        )))
    }

    #[cfg(feature = "cuda")]
    fn device(&mut self, memory: &MemoryRegion, range: Range<usize>) -> Result<u32, RdmaError> {
        self.gpu
            .get_or_insert_with(gpu::DeviceCrc::new)
            .crc32c(memory, range)
            .map_err(|e| RdmaError::Config(format!("checksumming GPU bytes: {e}")))
    }

    #[cfg(not(feature = "cuda"))]
    fn device(&mut self, memory: &MemoryRegion, _: Range<usize>) -> Result<u32, RdmaError> {
        Err(RdmaError::Config(format!(
            "{} cannot be checksummed: this build has no GPU support (feature `cuda`)",
            memory.kind()
        )))
    }
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
    pub(super) struct DeviceCrc {
        mover: GpuMover,
        scratch: MemoryRegion,
    }

    impl DeviceCrc {
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
            let algorithm = crc_fast::CrcAlgorithm::Crc32Iscsi;
            let mut crc = crc_fast::checksum(algorithm, &[]) as u32;
            for start in range.clone().step_by(PIECE) {
                let end = (start + PIECE).min(range.end);
                let report = self
                    .mover
                    .place(memory, start..end, &self.scratch, 0..end - start)?;
                let piece = report.crc32c.ok_or_else(|| {
                    CudaError::Invalid("a copy to host memory came back without a checksum".into())
                })?;
                crc = crc_fast::checksum_combine(
                    algorithm,
                    u64::from(crc),
                    u64::from(piece),
                    (end - start) as u64,
                ) as u32;
            }
            Ok(crc)
        }
    }
}
