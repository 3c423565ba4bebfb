//! GPU and pinned host memory as [`RawMemory`], the memory abstraction regions are registered over.

use std::any::Any;
use std::ptr::NonNull;

use cudarc::driver::{result, sys};
use transfer_engine::{MemoryKind, MemoryRegion, RawMemory};

use super::{Gpu, driver};
use crate::cuda::CudaError;

/// GPU memory the engine allocates (`cuMemAlloc`), zeroed, freed when the last clone of its region drops.
#[derive(Debug)]
pub struct DeviceMemory {
    gpu: Gpu,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceMemory {
    /// Allocates `len` zeroed bytes on `gpu`.
    pub fn alloc(gpu: &Gpu, len: usize) -> Result<Self, CudaError> {
        if len == 0 {
            return Err(CudaError::Invalid("a GPU allocation of 0 bytes".into()));
        }
        gpu.bind()?;
        // SAFETY: plain allocation in the bound context; the pointer is freed once, in `drop`.
        let ptr = unsafe { result::malloc_sync(len) }.map_err(driver("cuMemAlloc"))?;
        let memory = Self {
            gpu: gpu.clone(),
            ptr,
            len,
        };
        // SAFETY: `ptr..ptr + len` was just allocated on this context and nothing else refers to it yet.
        unsafe { result::memset_d8_sync(ptr, 0, len) }.map_err(driver("cuMemsetD8"))?;
        // The memset runs on the legacy default stream, which the engine's non-blocking streams do not
        // wait for: finish it before the memory is handed out.
        gpu.synchronize()?;
        Ok(memory)
    }

    /// The memory as a region (the region owns it from now on).
    #[must_use]
    pub fn into_region(self) -> MemoryRegion {
        MemoryRegion::from_raw_memory(self)
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // Nothing can be using the memory now: every copy that reads or writes it holds a clone of its
        // region (or borrows it) until the copy has completed.
        if self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from `cuMemAlloc` on this context and is freed only here.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

// SAFETY: `ptr..ptr + len` is one `cuMemAlloc` allocation that stays valid until `drop`; the kind is
// `Device`, so the host never dereferences it.
unsafe impl RawMemory for DeviceMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device {
            ordinal: self.gpu.ordinal(),
        }
    }
}

/// GPU memory the serving engine owns (its KV pool), registered in place: a device pointer and a length.
pub struct CallerDeviceMemory {
    gpu: Gpu,
    ptr: sys::CUdeviceptr,
    len: usize,
    /// Dropped with the last clone of the region: the caller's way to learn the memory is free again.
    _owner: Option<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for CallerDeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerDeviceMemory")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl CallerDeviceMemory {
    /// `len` bytes of `gpu`'s memory at device address `ptr`. The driver is asked where the allocation
    /// holding `ptr` starts and ends; a range that is not inside one allocation of this GPU is refused.
    /// `owner`, if given, is dropped when the last clone of the region drops, and may free the memory then.
    ///
    /// # Safety
    /// Until the last clone of the region made from it (and of every engine or region it is registered
    /// with) has been dropped:
    /// - `ptr..ptr + len` stays allocated on `gpu` (not freed, not remapped);
    /// - the caller's own kernels and copies do not write bytes that a live copy or session reads or
    ///   writes, nor read bytes a live copy or session writes, until it reports them complete.
    pub unsafe fn new(
        gpu: &Gpu,
        ptr: u64,
        len: usize,
        owner: Option<Box<dyn Any + Send + Sync>>,
    ) -> Result<Self, CudaError> {
        if len == 0 {
            return Err(CudaError::Invalid("a GPU range of 0 bytes".into()));
        }
        gpu.bind()?;
        let (mut base, mut size) = (0 as sys::CUdeviceptr, 0usize);
        // SAFETY: a query only: the driver writes the two out-parameters, which live on this stack frame.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr).result() }
            .map_err(driver("cuMemGetAddressRange"))?;
        let end = ptr.checked_add(len as u64);
        if end.is_none_or(|end| end > base + size as u64) {
            return Err(CudaError::Invalid(format!(
                "device range {ptr:#x}+{len} is not inside one allocation of GPU {} \
                 (the allocation holding it is {base:#x}+{size})",
                gpu.ordinal()
            )));
        }
        Ok(Self {
            gpu: gpu.clone(),
            ptr,
            len,
            _owner: owner,
        })
    }

    /// The memory as a region.
    #[must_use]
    pub fn into_region(self) -> MemoryRegion {
        MemoryRegion::from_raw_memory(self)
    }
}

// SAFETY: the caller of `CallerDeviceMemory::new` promised the range stays allocated while this value
// lives; the driver confirmed it lies in one allocation. The kind is `Device`: never dereferenced by the host.
unsafe impl RawMemory for CallerDeviceMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device {
            ordinal: self.gpu.ordinal(),
        }
    }
}

/// Page-locked host memory (`cuMemHostAlloc`, portable to every context), zeroed: host-addressable like
/// ordinary memory, and a DMA source and target the GPU copies to and from at full speed, asynchronously.
pub struct PinnedHostMemory {
    gpu: Gpu,
    ptr: NonNull<u8>,
    len: usize,
}

impl std::fmt::Debug for PinnedHostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedHostMemory")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl PinnedHostMemory {
    /// Allocates `len` zeroed bytes of pinned host memory through `gpu`'s context.
    pub fn alloc(gpu: &Gpu, len: usize) -> Result<Self, CudaError> {
        if len == 0 {
            return Err(CudaError::Invalid("a pinned allocation of 0 bytes".into()));
        }
        gpu.bind()?;
        // SAFETY: plain allocation in the bound context; freed once, in `drop`.
        let raw = unsafe { result::malloc_host(len, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(driver("cuMemHostAlloc"))?;
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| CudaError::Invalid("cuMemHostAlloc returned a null pointer".into()))?;
        // SAFETY: `ptr..ptr + len` was just allocated for us and nothing else refers to it yet; zeroing it
        // makes every byte initialised, as `RawMemory` requires of host-addressable memory.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(Self {
            gpu: gpu.clone(),
            ptr,
            len,
        })
    }

    /// The memory as a region (host-addressable: readable and writable through the region's views).
    #[must_use]
    pub fn into_region(self) -> MemoryRegion {
        MemoryRegion::from_raw_memory(self)
    }

    /// Bytes in the buffer (no view of them is made, so this is safe while a copy is in flight).
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The bytes, as a slice.
    ///
    /// # Safety
    /// No DMA that writes this buffer may be in flight, nor start, while the returned slice lives: the
    /// caller must have waited for the completion of every copy queued into it (as
    /// [`super::PinnedSlot::bytes`] does with its event) and queue none until the slice is dropped. The
    /// buffer must not be reachable as a [`MemoryRegion`] either (a region hands out its own views), which
    /// holds for a buffer its slot owns.
    pub(super) unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: a live allocation of `len` bytes, initialised when it was zeroed in `alloc`; `&self`
        // rules out `bytes_mut` meanwhile, and the caller promised that no DMA writes the buffer while the
        // slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, as a writable slice.
    ///
    /// # Safety
    /// As for [`Self::bytes`], and no DMA may read the buffer either while the slice lives (a host-to-device
    /// copy of it would race the writes).
    pub(super) unsafe fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only reference, and the caller promised that
        // no DMA reads or writes the buffer while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The first byte's address, for DMA.
    pub(super) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for PinnedHostMemory {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: `ptr` came from `cuMemHostAlloc` and is freed only here; no copy uses it any more (its
        // users hold the region or the slot, which wait for their copies before dropping it).
        let _ = unsafe { result::free_host(self.ptr.as_ptr().cast()) };
    }
}

// SAFETY: `ptr..ptr + len` is one pinned allocation, valid until `drop`, zeroed at allocation so every byte
// is initialised; the kind is host-addressable pinned memory.
unsafe impl RawMemory for PinnedHostMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::PinnedHost
    }
}

// SAFETY: a uniquely owned heap allocation, like `Box<[u8]>`; the raw pointer only hides that from the
// compiler. Access is ordered by the region's locks or by the owning slot's `&mut self`.
unsafe impl Send for PinnedHostMemory {}
// SAFETY: as for `Send`.
unsafe impl Sync for PinnedHostMemory {}
