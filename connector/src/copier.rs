//! Block copies between the KV caches and the tier store, wherever each lives: host bytes with the CPU,
//! GPU bytes (feature `cuda`) through `backends::cuda`'s copy engines (`cuMemcpy*Async` on a stream).

use transfer_engine::{MemoryKind, MemoryRegion};

use crate::ConnectorError;

/// Copies blocks between regions of any memory kind this build supports.
#[derive(Debug, Default)]
pub struct BlockCopier {
    /// Made on first use: most connectors only ever copy host memory.
    #[cfg(feature = "cuda")]
    gpu: std::sync::OnceLock<backends::cuda::GpuMover>,
}

impl BlockCopier {
    /// Checks that blocks in memory of `kind` can be copied here: always for host memory; for GPU memory
    /// only with feature `cuda` and the GPU's driver.
    pub fn check(kind: MemoryKind) -> Result<(), ConnectorError> {
        match kind {
            MemoryKind::Host | MemoryKind::PinnedHost => Ok(()),
            // The connector's own feature decides (`backends` may have GPU support through another crate).
            MemoryKind::Device { .. } if !cfg!(feature = "cuda") => Err(no_gpu(kind)),
            MemoryKind::Device { ordinal } => backends::check_gpu(ordinal)
                .map_err(|why| ConnectorError::Gpu(format!("KV caches on GPU {ordinal}: {why}"))),
        }
    }

    /// Copies `len` bytes at `src_at` of `src` to `dst_at` of `dst`.
    pub fn copy(
        &self,
        src: &MemoryRegion,
        src_at: usize,
        dst: &MemoryRegion,
        dst_at: usize,
        len: usize,
    ) -> Result<(), ConnectorError> {
        if src.kind().is_host() && dst.kind().is_host() {
            src.with_views(
                src_at..src_at + len,
                dst,
                dst_at..dst_at + len,
                |from, to| {
                    to.copy_from_slice(from);
                },
            )?;
            return Ok(());
        }
        self.gpu_copy(src, src_at, dst, dst_at, len)
    }

    #[cfg(feature = "cuda")]
    fn gpu_copy(
        &self,
        src: &MemoryRegion,
        src_at: usize,
        dst: &MemoryRegion,
        dst_at: usize,
        len: usize,
    ) -> Result<(), ConnectorError> {
        self.gpu
            .get_or_init(|| backends::cuda::GpuMover::new(4 << 20))
            .place(src, src_at..src_at + len, dst, dst_at..dst_at + len)
            .map(|_| ())
            .map_err(|e| ConnectorError::Gpu(format!("copying KV blocks: {e}")))
    }

    #[cfg(not(feature = "cuda"))]
    fn gpu_copy(
        &self,
        src: &MemoryRegion,
        _: usize,
        dst: &MemoryRegion,
        _: usize,
        _: usize,
    ) -> Result<(), ConnectorError> {
        let kind = if src.kind().is_host() {
            dst.kind()
        } else {
            src.kind()
        };
        Err(no_gpu(kind))
    }
}

fn no_gpu(kind: MemoryKind) -> ConnectorError {
    ConnectorError::Gpu(format!("KV caches in {kind}: {}", backends::NO_GPU_SUPPORT))
}
