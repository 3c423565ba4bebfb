//! The one module of the package that holds `unsafe`: a region over the bytes of a Python buffer, or over
//! the GPU memory of a CUDA array (`__cuda_array_interface__`), registered in place.
#![allow(unsafe_code)]

use pyo3::prelude::*;
use transfer_engine::MemoryRegion;

/// A region over `len` bytes at `address`, registered in place. `device` is `None` for host memory: the
/// writable, C-contiguous memory of a Python buffer that `keepalive` holds exported (a `ctypes` array made
/// `from_buffer`, built in `kv_transfer.__init__`), so the exporter can neither free nor resize it while
/// the region lives. `Some(ordinal)` is memory of that CUDA GPU, a contiguous CUDA array (a torch CUDA
/// tensor's storage, say) that `keepalive` holds, so its allocator does not free it while the region lives.
pub(crate) fn region(
    address: usize,
    len: usize,
    keepalive: Py<PyAny>,
    device: Option<u32>,
) -> PyResult<MemoryRegion> {
    if address == 0 && len > 0 {
        return Err(crate::errors::config("a buffer at address 0"));
    }
    if let Some(ordinal) = device {
        return gpu_region(ordinal, address, len, keepalive);
    }
    // SAFETY: `address..address + len` is the memory of a writable, contiguous buffer export of a Python
    // object; `keepalive` holds that export (and the object) and is dropped only with the last clone of
    // the region, so the memory stays allocated, unmoved and the same size until then. Buffer memory is
    // initialised bytes of no invariant, usable from any thread. The package documents the caller's part
    // of the contract (`register` in `kv_transfer/__init__.py`): Python code keeps off the bytes of a
    // live session, as the engine's region contract asks of every caller.
    Ok(unsafe { MemoryRegion::from_raw_parts(address as *mut u8, len, Some(Box::new(keepalive))) })
}

/// GPU memory of a CUDA array, registered in place (the package's feature `cuda`).
#[cfg(feature = "cuda")]
fn gpu_region(
    ordinal: u32,
    address: usize,
    len: usize,
    keepalive: Py<PyAny>,
) -> PyResult<MemoryRegion> {
    use backends::cuda::{CallerDeviceMemory, Gpu};
    let gpu = Gpu::open(ordinal).map_err(crate::err)?;
    // SAFETY: `address..address + len` is the memory of a contiguous CUDA array on GPU `ordinal` (the
    // driver checks that it lies inside one of that GPU's allocations); `keepalive` holds the array (for
    // torch, the tensor and its storage), so the caching allocator neither frees nor reuses the memory
    // until the last clone of the region drops it. The package documents the caller's part of the
    // contract (`register` in `kv_transfer/__init__.py`): kernels keep off the bytes of a live session,
    // and the caller's stream has finished writing what a save reads before it is saved.
    let memory =
        unsafe { CallerDeviceMemory::new(&gpu, address as u64, len, Some(Box::new(keepalive))) }
            .map_err(crate::err)?;
    Ok(memory.into_region())
}

/// Without the feature, GPU memory is refused with the way to get it.
#[cfg(not(feature = "cuda"))]
fn gpu_region(
    ordinal: u32,
    _address: usize,
    _len: usize,
    _keepalive: Py<PyAny>,
) -> PyResult<MemoryRegion> {
    Err(crate::errors::config(format!(
        "memory of CUDA GPU {ordinal}: this build of kv_transfer has no GPU support; build it with \
         MATURIN_PEP517_ARGS=\"--features cuda\" pip install ./python"
    )))
}
