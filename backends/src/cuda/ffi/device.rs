//! The driver, loaded at run time, and one GPU's primary context.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys};
use transfer_engine::{MemoryKind, MemoryRegion};

use super::driver;
use super::stream::DeviceSpan;
use crate::cuda::{CudaError, check_range};

/// Whether a CUDA driver library (`libcuda`) can be loaded on this machine. Checked (once) before any
/// other driver call, so that a machine without a driver gets [`CudaError::NoDriver`] instead of a panic.
#[must_use]
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to load the driver library by its well-known names (running
    // its initialisers, as every CUDA program does) and drops the handle; it calls nothing in it.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Loads the driver and runs `cuInit` once; every entry point goes through here first.
fn init() -> Result<(), CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    let outcome = INIT.get_or_init(|| match result::init().map_err(driver("cuInit")) {
        Ok(()) => Ok(()),
        Err(CudaError::Driver { message, .. }) => Err(message),
        Err(e) => Err(e.to_string()),
    });
    outcome.clone().map_err(|message| CudaError::Driver {
        call: "cuInit",
        message,
    })
}

/// How many GPUs the driver sees; [`CudaError::NoDriver`] without a driver.
pub fn device_count() -> Result<usize, CudaError> {
    init()?;
    let count = result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// One GPU, through its primary context (the one the CUDA runtime and frameworks such as PyTorch share, so
/// device pointers they hand over are valid here). Cloning is cheap; the context is released with the last
/// clone, after every buffer and stream made from it (each holds a clone).
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<Context>,
}

struct Context {
    ordinal: u32,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    name: String,
    total_bytes: usize,
}

// SAFETY: a CUDA context handle may be used from any thread (the driver API is thread-safe; each thread
// makes it current with `cuCtxSetCurrent` before use, which `Gpu::bind` does).
unsafe impl Send for Context {}
// SAFETY: as for `Send`; the handle is never mutated after creation.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `device` came from `cuDeviceGet` and this value holds one retain of its primary context.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// Opens GPU `ordinal`: [`CudaError::NoDriver`] without a driver, [`CudaError::NoDevice`] if it has no
    /// such GPU.
    pub fn open(ordinal: u32) -> Result<Self, CudaError> {
        let count = device_count()?;
        if ordinal as usize >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let device = result::device::get(ordinal as i32).map_err(driver("cuDeviceGet"))?;
        // SAFETY: `device` was returned by `cuDeviceGet`; the retain is released in `Context::drop`.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let context = Context {
            ordinal,
            device,
            ctx,
            name: result::device::get_name(device).unwrap_or_else(|_| "unknown GPU".into()),
            // SAFETY: `device` was returned by `cuDeviceGet`.
            total_bytes: unsafe { result::device::total_mem(device) }.unwrap_or(0),
        };
        let gpu = Self {
            inner: Arc::new(context),
        };
        gpu.bind()?;
        Ok(gpu)
    }

    /// The device's ordinal.
    #[must_use]
    pub fn ordinal(&self) -> u32 {
        self.inner.ordinal
    }

    /// The device's name, as the driver reports it (for example "NVIDIA H200").
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device's memory in bytes.
    #[must_use]
    pub fn total_bytes(&self) -> usize {
        self.inner.total_bytes
    }

    /// Makes this GPU's context current on the calling thread (cheap; done before every driver call).
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: the context handle is alive: this value holds a retain of it.
        unsafe { result::ctx::set_current(self.inner.ctx) }.map_err(driver("cuCtxSetCurrent"))
    }

    /// Checks that `kind` is memory of this GPU.
    pub(crate) fn check_device(
        &self,
        what: &'static str,
        kind: MemoryKind,
    ) -> Result<(), CudaError> {
        match kind {
            MemoryKind::Device { ordinal } if ordinal == self.ordinal() => Ok(()),
            MemoryKind::Device { ordinal } => Err(CudaError::OtherDevice {
                memory: ordinal,
                engine: self.ordinal(),
            }),
            got => Err(CudaError::WrongKind {
                what,
                expected: "GPU memory",
                got,
            }),
        }
    }

    /// Sets `range` of a GPU region of this device to zero and waits for it.
    pub fn zero(&self, region: &MemoryRegion, range: Range<usize>) -> Result<(), CudaError> {
        self.check_device("zero", region.kind())?;
        let span = DeviceSpan::of(region, range)?;
        self.bind()?;
        // SAFETY: `span` lies inside a live device allocation of this GPU (checked by `DeviceSpan::of`
        // against the region's `RawMemory` contract); the region outlives the call, which waits below.
        unsafe { sys::cuMemsetD8_v2(span.ptr(), 0, span.len()).result() }
            .map_err(driver("cuMemsetD8"))?;
        self.synchronize()
    }

    /// Waits for everything queued on this GPU's context.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        result::ctx::synchronize().map_err(driver("cuCtxSynchronize"))
    }

    /// A plain, synchronous `cuMemcpy` of `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`
    /// (host to device, device to host or device to device, chosen by the regions' kinds): the raw limit the
    /// copy engine is measured against. Host regions are viewed through their shard locks for the call.
    pub fn plain_copy(
        &self,
        src: &MemoryRegion,
        src_offset: usize,
        dst: &MemoryRegion,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        check_range(src_offset, len, src.len())?;
        check_range(dst_offset, len, dst.len())?;
        let (src_range, dst_range) = (src_offset..src_offset + len, dst_offset..dst_offset + len);
        self.bind()?;
        match (src.kind().is_host(), dst.kind().is_host()) {
            (true, false) => {
                self.check_device("destination", dst.kind())?;
                let to = DeviceSpan::of(dst, dst_range)?;
                let from = src.read(src_range)?;
                // SAFETY: `to` lies in a live allocation of this GPU; `from` is a locked host view of
                // exactly `len` bytes that lives until the synchronous copy has returned.
                unsafe { result::memcpy_htod_sync(to.ptr(), &from) }
                    .map_err(driver("cuMemcpyHtoD"))?;
            }
            (false, true) => {
                self.check_device("source", src.kind())?;
                let from = DeviceSpan::of(src, src_range)?;
                let mut to = dst.write(dst_range)?;
                // SAFETY: as above, with a locked writable host view that the synchronous copy fills.
                unsafe { result::memcpy_dtoh_sync(&mut to, from.ptr()) }
                    .map_err(driver("cuMemcpyDtoH"))?;
            }
            (false, false) => {
                self.check_device("source", src.kind())?;
                self.check_device("destination", dst.kind())?;
                let from = DeviceSpan::of(src, src_range)?;
                let to = DeviceSpan::of(dst, dst_range)?;
                if from.overlaps(&to) {
                    return Err(CudaError::Invalid("source and destination overlap".into()));
                }
                // SAFETY: both spans lie in live allocations of this GPU and do not overlap; the context
                // is synchronised below, before the regions can be dropped.
                unsafe { result::memcpy_dtod_sync(to.ptr(), from.ptr(), len) }
                    .map_err(driver("cuMemcpyDtoD"))?;
            }
            (true, true) => {
                return Err(CudaError::Invalid(
                    "plain_copy moves bytes to or from a GPU; both regions are host memory".into(),
                ));
            }
        }
        self.synchronize()
    }
}
