//! The copy engine: moves a range between two regions of any kinds (host, pinned host, GPU) in blocks on a
//! CUDA stream, reporting each block as it completes with the CRC-32C of its host-side bytes.

use std::collections::VecDeque;
use std::ops::Range;

use transfer_engine::{MemoryKind, MemoryRegion};

use super::ffi::{DeviceSpan, Stream};
use super::{CudaError, Gpu, check_range};
use crate::staging::Stager;

/// Blocks a direct (pinned or device) copy keeps in flight at once.
const WINDOW: usize = 8;

/// How a copy ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Host to host: a CPU copy, checksummed in the same pass.
    HostToHost,
    /// Host to GPU; `staged` when the source is pageable and went through the engine's pinned buffers.
    HostToDevice {
        /// Whether the bytes went through the engine's pinned buffers.
        staged: bool,
    },
    /// GPU to host; `staged` when the destination is pageable and the bytes came through pinned buffers.
    DeviceToHost {
        /// Whether the bytes went through the engine's pinned buffers.
        staged: bool,
    },
    /// GPU to GPU (same device).
    DeviceToDevice,
}

/// One block that has completed.
///
/// `crc32c` is the CRC-32C of the block's bytes on the host side: the source bytes as handed to the DMA
/// (host to GPU), the bytes as landed in host memory (GPU to host), the copied bytes (host to host). A
/// GPU-to-GPU block never touches the host and carries `None`: it is not checksummed (the DMA engine's own
/// ECC protects it; a caller who needs proof reads it back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopied {
    /// Offset of the block from the start of the copy.
    pub offset: usize,
    /// Length of the block.
    pub len: usize,
    /// CRC-32C of the block's host-side bytes; `None` for GPU to GPU.
    pub crc32c: Option<u32>,
}

/// What a whole copy did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyReport {
    /// How it ran.
    pub route: Route,
    /// Bytes moved.
    pub bytes: u64,
    /// Blocks reported.
    pub blocks: usize,
    /// CRC-32C of all the bytes' host-side copies (the blocks' CRCs combined); `None` for GPU to GPU.
    pub crc32c: Option<u32>,
}

/// Moves bytes between host, pinned host and GPU regions of one GPU on its own stream, `block` bytes at a
/// time. Pinned host and GPU memory are copied directly by DMA, up to 8 blocks in flight; pageable host
/// memory goes through two pinned buffers (the CPU copy and checksum of one block overlaps the DMA of the
/// other). Host regions are viewed through their shard locks for the whole copy.
pub struct CopyEngine {
    gpu: Gpu,
    stream: std::sync::Arc<Stream>,
    stager: Stager<super::ffi::PinnedSlot>,
    block: usize,
}

impl std::fmt::Debug for CopyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyEngine")
            .field("gpu", &self.gpu)
            .field("block", &self.block)
            .finish_non_exhaustive()
    }
}

impl CopyEngine {
    /// An engine on `gpu` moving `block` bytes at a time.
    pub fn new(gpu: &Gpu, block: usize) -> Result<Self, CudaError> {
        if block == 0 {
            return Err(CudaError::Invalid("a block size of 0 bytes".into()));
        }
        Ok(Self {
            gpu: gpu.clone(),
            stream: std::sync::Arc::new(Stream::new(gpu)?),
            stager: Stager::pinned(gpu, block)?,
            block,
        })
    }

    /// The block size.
    #[must_use]
    pub fn block(&self) -> usize {
        self.block
    }

    /// Copies `src_range` of `src` into `dst` at `dst_offset`, calling `on_block` for each block, in order,
    /// as it completes. Returns once every block has.
    pub fn copy(
        &mut self,
        src: &MemoryRegion,
        src_range: Range<usize>,
        dst: &MemoryRegion,
        dst_offset: usize,
        mut on_block: impl FnMut(BlockCopied),
    ) -> Result<CopyReport, CudaError> {
        let mut whole: Option<u32> = None;
        let mut report = |b: BlockCopied| {
            whole = match (whole, b.crc32c) {
                (None, Some(crc)) if b.offset == 0 => Some(crc),
                (Some(acc), Some(crc)) => Some(transfer_engine::crc32c_combine(acc, crc, b.len)),
                _ => None,
            };
            on_block(b);
        };
        let mut report = self.copy_blocks(src, src_range, dst, dst_offset, &mut report)?;
        report.crc32c = match (whole, report.route) {
            (_, Route::DeviceToDevice) => None,
            (None, _) if report.bytes == 0 => Some(transfer_engine::crc32c(&[])),
            (whole, _) => whole,
        };
        Ok(report)
    }

    fn copy_blocks(
        &mut self,
        src: &MemoryRegion,
        src_range: Range<usize>,
        dst: &MemoryRegion,
        dst_offset: usize,
        mut on_block: impl FnMut(BlockCopied),
    ) -> Result<CopyReport, CudaError> {
        if src_range.start > src_range.end {
            return Err(CudaError::Invalid(format!("reversed range {src_range:?}")));
        }
        let len = src_range.len();
        check_range(src_range.start, len, src.len())?;
        check_range(dst_offset, len, dst.len())?;
        let dst_range = dst_offset..dst_offset + len;
        let blocks = Blocks {
            len,
            size: self.block,
        };
        for (what, kind) in [("source", src.kind()), ("destination", dst.kind())] {
            if !kind.is_host() {
                self.gpu.check_device(what, kind)?;
            }
        }
        let route = match (src.kind(), dst.kind()) {
            (s, d) if s.is_host() && d.is_host() => {
                host_to_host(src, src_range, dst, dst_range, blocks, &mut on_block)?;
                Route::HostToHost
            }
            (MemoryKind::PinnedHost, _) => {
                let view = src.read(src_range)?;
                let to = DeviceSpan::of(dst, dst_range)?;
                self.direct_h2d(&view, to, blocks, &mut on_block)?;
                Route::HostToDevice { staged: false }
            }
            (MemoryKind::Host, _) => {
                self.staged_h2d(src, src_range, dst, dst_offset, blocks, &mut on_block)?;
                Route::HostToDevice { staged: true }
            }
            (_, MemoryKind::PinnedHost) => {
                let from = DeviceSpan::of(src, src_range)?;
                let mut view = dst.write(dst_range)?;
                self.direct_d2h(&mut view, from, blocks, &mut on_block)?;
                Route::DeviceToHost { staged: false }
            }
            (_, MemoryKind::Host) => {
                self.staged_d2h(src, src_range.start, dst, dst_range, blocks, &mut on_block)?;
                Route::DeviceToHost { staged: true }
            }
            _ => {
                let from = DeviceSpan::of(src, src_range)?;
                let to = DeviceSpan::of(dst, dst_range)?;
                if from.overlaps(&to) {
                    return Err(CudaError::Invalid("source and destination overlap".into()));
                }
                self.d2d(to, from, blocks, &mut on_block)?;
                Route::DeviceToDevice
            }
        };
        Ok(CopyReport {
            route,
            bytes: len as u64,
            blocks: blocks.count(),
            crc32c: None,
        })
    }

    fn direct_h2d(
        &self,
        view: &[u8],
        to: DeviceSpan<'_>,
        blocks: Blocks,
        on_block: &mut impl FnMut(BlockCopied),
    ) -> Result<(), CudaError> {
        self.stream.scope(|s| {
            let mut window = VecDeque::with_capacity(WINDOW);
            for b in blocks.iter() {
                let bytes = &view[b.clone()];
                let pending = s.h2d(to.sub(b.clone())?, bytes)?;
                // Checksummed while the DMA runs: the pinned bytes are locked for reading meanwhile.
                let crc = transfer_engine::crc32c(bytes);
                window.push_back((pending, done(&b, Some(crc))));
                if window.len() == WINDOW {
                    settle_front(&mut window, on_block)?;
                }
            }
            while !window.is_empty() {
                settle_front(&mut window, on_block)?;
            }
            Ok(())
        })
    }

    fn direct_d2h(
        &self,
        view: &mut [u8],
        from: DeviceSpan<'_>,
        blocks: Blocks,
        on_block: &mut impl FnMut(BlockCopied),
    ) -> Result<(), CudaError> {
        self.stream.scope(|s| {
            let mut window = VecDeque::with_capacity(WINDOW);
            let mut rest = view;
            for b in blocks.iter() {
                let (chunk, tail) = rest.split_at_mut(b.len());
                rest = tail;
                window.push_back((s.d2h(chunk, from.sub(b.clone())?)?, b.clone()));
                if window.len() == WINDOW {
                    land_front(&mut window, on_block)?;
                }
            }
            while !window.is_empty() {
                land_front(&mut window, on_block)?;
            }
            Ok(())
        })
    }

    fn d2d(
        &self,
        to: DeviceSpan<'_>,
        from: DeviceSpan<'_>,
        blocks: Blocks,
        on_block: &mut impl FnMut(BlockCopied),
    ) -> Result<(), CudaError> {
        self.stream.scope(|s| {
            let mut window = VecDeque::with_capacity(WINDOW);
            for b in blocks.iter() {
                let pending = s.d2d(to.sub(b.clone())?, from.sub(b.clone())?)?;
                window.push_back((pending, done(&b, None)));
                if window.len() == WINDOW {
                    settle_front(&mut window, on_block)?;
                }
            }
            while !window.is_empty() {
                settle_front(&mut window, on_block)?;
            }
            Ok(())
        })
    }

    /// Pageable host to GPU: each block is copied (and checksummed, in the same pass) into a free pinned
    /// buffer, whose DMA then runs while the next block is copied into the other buffer.
    fn staged_h2d(
        &mut self,
        src: &MemoryRegion,
        src_range: Range<usize>,
        dst: &MemoryRegion,
        dst_offset: usize,
        blocks: Blocks,
        on_block: &mut impl FnMut(BlockCopied),
    ) -> Result<(), CudaError> {
        let view = src.read(src_range)?;
        let mut placed: VecDeque<BlockCopied> = VecDeque::with_capacity(2);
        let result = (|| {
            for b in blocks.iter() {
                let mut landing = self.stager.receive()?;
                // The buffer this reuses held the block before last, whose DMA has now completed.
                if placed.len() == 2
                    && let Some(block) = placed.pop_front()
                {
                    on_block(block);
                }
                let buffer = &mut landing.buffer()?[..b.len()];
                let crc = transfer_engine::copy_and_crc32c(buffer, &view[b.clone()]);
                landing.push(dst, dst_offset + b.start, b.len())?;
                placed.push_back(done(&b, Some(crc)));
            }
            self.stager.flush()
        })();
        if result.is_err() {
            // Never leave a DMA running from a buffer a later copy reuses.
            let _ = self.stager.flush();
        }
        result?;
        placed.into_iter().for_each(on_block);
        Ok(())
    }

    /// GPU to pageable host: the DMA of block N+1 into one pinned buffer runs while block N is copied out of
    /// the other (and checksummed, in the same pass).
    fn staged_d2h(
        &mut self,
        src: &MemoryRegion,
        src_start: usize,
        dst: &MemoryRegion,
        dst_range: Range<usize>,
        blocks: Blocks,
        on_block: &mut impl FnMut(BlockCopied),
    ) -> Result<(), CudaError> {
        let mut view = dst.write(dst_range)?;
        let at = |b: &Range<usize>| src_start + b.start..src_start + b.end;
        let result = (|| {
            let mut blocks = blocks.iter().peekable();
            if let Some(first) = blocks.peek() {
                self.stager.prefetch(src, at(first))?;
            }
            while let Some(b) = blocks.next() {
                if let Some(next) = blocks.peek() {
                    self.stager.prefetch(src, at(next))?;
                }
                let unit = self.stager.take()?;
                let crc = transfer_engine::copy_and_crc32c(&mut view[b.clone()], unit.bytes());
                on_block(done(&b, Some(crc)));
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = self.stager.flush();
            // Drop prefetched units an error left behind, so the next copy starts clean.
            while self.stager.take().is_ok() {}
        }
        result
    }
}

/// The blocks of a copy of `len` bytes, `size` bytes each (the last may be shorter), made as they are
/// needed so a copy's bookkeeping stays small whatever its length.
#[derive(Debug, Clone, Copy)]
struct Blocks {
    len: usize,
    size: usize,
}

impl Blocks {
    fn iter(self) -> impl Iterator<Item = Range<usize>> {
        (0..self.len)
            .step_by(self.size)
            .map(move |at| at..(at + self.size).min(self.len))
    }

    fn count(self) -> usize {
        self.len.div_ceil(self.size)
    }
}

fn done(b: &Range<usize>, crc32c: Option<u32>) -> BlockCopied {
    BlockCopied {
        offset: b.start,
        len: b.len(),
        crc32c,
    }
}

/// Waits for the oldest copy in the window and reports its block.
fn settle_front(
    window: &mut VecDeque<(super::ffi::Pending<'_, ()>, BlockCopied)>,
    on_block: &mut impl FnMut(BlockCopied),
) -> Result<(), CudaError> {
    if let Some((pending, block)) = window.pop_front() {
        pending.wait()?;
        on_block(block);
    }
    Ok(())
}

/// Waits for the oldest device-to-host copy in the window, checksums what landed and reports it.
fn land_front(
    window: &mut VecDeque<(super::ffi::Pending<'_, &mut [u8]>, Range<usize>)>,
    on_block: &mut impl FnMut(BlockCopied),
) -> Result<(), CudaError> {
    if let Some((pending, b)) = window.pop_front() {
        let landed = pending.wait()?;
        on_block(done(&b, Some(transfer_engine::crc32c(landed))));
    }
    Ok(())
}

/// Host to host, one CPU pass that copies and checksums each block.
fn host_to_host(
    src: &MemoryRegion,
    src_range: Range<usize>,
    dst: &MemoryRegion,
    dst_range: Range<usize>,
    blocks: Blocks,
    on_block: &mut impl FnMut(BlockCopied),
) -> Result<(), CudaError> {
    if src.same_memory(dst) {
        return Err(CudaError::Invalid(
            "source and destination are the same memory".into(),
        ));
    }
    src.with_views(src_range, dst, dst_range, |from, to| {
        for b in blocks.iter() {
            let crc = transfer_engine::copy_and_crc32c(&mut to[b.clone()], &from[b.clone()]);
            on_block(done(&b, Some(crc)));
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_crcs_combine_into_the_crc_of_the_whole() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 13 + i / 97) as u8).collect();
        let mut acc = transfer_engine::crc32c(&data[..4096]);
        for chunk in data[4096..].chunks(4096) {
            acc = transfer_engine::crc32c_combine(acc, transfer_engine::crc32c(chunk), chunk.len());
        }
        assert_eq!(acc, transfer_engine::crc32c(&data));
    }

    #[test]
    fn blocks_cover_the_copy_once_with_a_shorter_last_block() {
        let blocks = Blocks { len: 10, size: 4 };
        assert_eq!(blocks.iter().collect::<Vec<_>>(), [0..4, 4..8, 8..10]);
        assert_eq!(blocks.count(), 3);
        assert_eq!(Blocks { len: 0, size: 4 }.iter().count(), 0);
        assert_eq!(Blocks { len: 0, size: 4 }.count(), 0);
    }
}
