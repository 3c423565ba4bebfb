//! The one module of the package that holds `unsafe`: a region over the bytes of a Python buffer,
//! registered in place.
#![allow(unsafe_code)]

use pyo3::prelude::*;
use transfer_engine::MemoryRegion;

/// A region over `len` bytes at `address`, the writable, C-contiguous memory of a Python buffer that
/// `keepalive` holds exported (a `ctypes` array made `from_buffer`, built in `kv_transfer.__init__`), so
/// the exporter can neither free nor resize it while the region lives.
pub(crate) fn region(address: usize, len: usize, keepalive: Py<PyAny>) -> PyResult<MemoryRegion> {
    if address == 0 && len > 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "a buffer at address 0",
        ));
    }
    // SAFETY: `address..address + len` is the memory of a writable, contiguous buffer export of a Python
    // object; `keepalive` holds that export (and the object) and is dropped only with the last clone of
    // the region, so the memory stays allocated, unmoved and the same size until then. Buffer memory is
    // initialised bytes of no invariant, usable from any thread. The package documents the caller's part
    // of the contract (`register` in `kv_transfer/__init__.py`): Python code keeps off the bytes of a
    // live session, as the engine's region contract asks of every caller.
    Ok(unsafe { MemoryRegion::from_raw_parts(address as *mut u8, len, Some(Box::new(keepalive))) })
}
