//! GPU memory (feature `cuda`): device memory and pinned host memory as region memory, a copy engine that
//! moves bytes between host and GPU regions on a CUDA stream, and a double-buffered pinned stager for
//! backends that must pass GPU bytes through the host (TCP).
//!
//! The CUDA driver (`libcuda`) is loaded at run time through `cudarc`, so this builds on machines without
//! CUDA. [`driver_present`] is checked before any context is made: without a driver, every entry point
//! ([`Gpu::open`] first, and nothing GPU-side can be made without a [`Gpu`]) returns
//! [`CudaError::NoDriver`], never a panic.
//!
//! - [`DeviceMemory`]: bytes the engine allocates on a GPU (`cuMemAlloc`); [`CallerDeviceMemory`]: a device
//!   pointer and length the serving engine owns (its KV pool), registered in place. Both are
//!   [`transfer_engine::MemoryKind::Device`]: the host never dereferences them.
//! - [`PinnedHostMemory`]: page-locked host memory (`cuMemHostAlloc`), host-addressable, for staging and DMA.
//! - [`CopyEngine`]: host to device, device to host and device to device in blocks with `cuMemcpy*Async` on
//!   its own stream, up to a window of blocks in flight, each block reported as it completes with the
//!   CRC-32C of its host-side bytes (see [`BlockCopied`] for which moves are checksummed and how).
//! - [`ipc_export`] and [`IpcMapping`]: CUDA IPC, a GPU allocation exported by one process and opened by
//!   another on the same host, for the same-host backend's one-copy GPU path.
//! - [`GpuMover`]: a pool of copy engines per GPU behind one `place` call, for the loopback backend's
//!   placements and for tier moves (GPU to host, host to GPU) with a report per block moved.
//! - `Stager::pinned` ([`crate::staging::Stager`] over [`PinnedSlot`]s): two pinned buffers; the device copy
//!   of unit N+1 runs while unit N is sent (or, receiving, the device copy of unit N runs while unit N+1 is
//!   received), with CRC-32C taken on the host copy. TCP lanes stage GPU regions through it.
//!
//! Who orders access to device bytes: [`transfer_engine::MemoryRegion`]'s shard locks cover host views
//! only, so for GPU regions the caller keeps the rule the region documents for caller-owned memory (no one
//! writes bytes that a live copy or session uses). Host regions are viewed through their locks as usual.

mod copy;
// The only module of the feature that holds `unsafe` (CUDA driver calls, raw device and pinned pointers).
#[allow(unsafe_code)]
mod ffi;
mod mover;
mod stage;

pub use copy::{BlockCopied, CopyEngine, CopyReport, Route};
pub use ffi::{
    CallerDeviceMemory, DeviceMemory, Gpu, IPC_HANDLE_LEN, IpcExport, IpcMapping, PinnedHostMemory,
    PinnedSlot, device_count, driver_present, export as ipc_export,
};
pub use mover::GpuMover;

use transfer_engine::MemoryKind;

/// What went wrong on the GPU side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No CUDA driver library could be loaded: this machine has no NVIDIA driver (or no GPU).
    #[error(
        "no CUDA driver: libcuda could not be loaded on this machine, so no GPU memory can be used"
    )]
    NoDriver,
    /// The driver is there but has no GPU of this ordinal.
    #[error("no GPU {ordinal}: the CUDA driver reports {count} device(s)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// How many GPUs the driver sees.
        count: usize,
    },
    /// A driver call failed.
    #[error("CUDA call {call} failed: {message}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The driver's own description of the error.
        message: String,
    },
    /// A region of the wrong kind for this operation.
    #[error("{what} needs {expected}, got {got}")]
    WrongKind {
        /// Which operand.
        what: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it is.
        got: MemoryKind,
    },
    /// Memory of one GPU used with a stream or copy engine of another.
    #[error("memory of GPU {memory} used with GPU {engine}; copies between GPUs are not supported")]
    OtherDevice {
        /// The memory's GPU.
        memory: u32,
        /// The engine's GPU.
        engine: u32,
    },
    /// A range outside its region, or of the wrong length.
    #[error("bytes {offset}..{offset}+{length} do not fit a region of {len} bytes")]
    Range {
        /// First byte.
        offset: u64,
        /// Length asked for.
        length: u64,
        /// The region's length.
        len: u64,
    },
    /// A request that cannot be carried out as asked.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The host side of a region refused access.
    #[error(transparent)]
    Memory(#[from] transfer_engine::Error),
    /// The copy engine's pinned stager failed (its own misuse, or a driver error it met).
    #[error(transparent)]
    Staging(#[from] crate::staging::StagingError),
}

/// Checks that `offset..offset + length` lies inside `len` bytes.
fn check_range(offset: usize, length: usize, len: usize) -> Result<(), CudaError> {
    match offset.checked_add(length) {
        Some(end) if end <= len => Ok(()),
        _ => Err(CudaError::Range {
            offset: offset as u64,
            length: length as u64,
            len: len as u64,
        }),
    }
}
