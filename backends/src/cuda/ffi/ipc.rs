//! CUDA IPC: a GPU allocation of this process exported as a handle (`cuIpcGetMemHandle`) and a peer's
//! allocation opened from its handle (`cuIpcOpenMemHandle`), so that another process on the same host can
//! copy out of it with one device copy (over NVLink or PCIe, or within one GPU).

use cudarc::driver::sys;
use transfer_engine::{MemoryKind, MemoryRegion};

use super::stream::DeviceSpan;
use super::{Gpu, driver};
use crate::cuda::{CudaError, check_range};

/// Bytes of a CUDA IPC memory handle.
pub const IPC_HANDLE_LEN: usize = 64;

/// What a peer needs to open the GPU allocation that holds a region: the allocation's base address and
/// length in this process, and its IPC handle. The whole allocation is exported (the driver exports
/// allocations, not parts of them): a caching allocator's segment may hold more than the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcExport {
    /// The allocation's first byte, as a device address of this process.
    pub base: u64,
    /// The allocation's length in bytes.
    pub len: u64,
    /// The handle a peer opens it by.
    pub handle: [u8; IPC_HANDLE_LEN],
}

/// Exports the GPU allocation that holds `region` (GPU memory of any ordinal).
pub fn export(region: &MemoryRegion) -> Result<IpcExport, CudaError> {
    let MemoryKind::Device { ordinal } = region.kind() else {
        return Err(CudaError::WrongKind {
            what: "a CUDA IPC export",
            expected: "GPU memory",
            got: region.kind(),
        });
    };
    let gpu = Gpu::open(ordinal)?;
    gpu.bind()?;
    let address = region.address() as sys::CUdeviceptr;
    let (mut base, mut len): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: plain queries on a device address of the bound context, writing into two locals; a pointer
    // that is not in an allocation is an error the driver reports.
    unsafe { sys::cuMemGetAddressRange_v2(&raw mut base, &raw mut len, address).result() }
        .map_err(driver("cuMemGetAddressRange"))?;
    let end = address + region.len() as u64;
    if address < base || end > base + len as u64 {
        return Err(CudaError::Invalid(format!(
            "the region {address:#x}+{} is not inside one GPU allocation",
            region.len()
        )));
    }
    let mut handle = sys::CUipcMemHandle {
        reserved: [0; IPC_HANDLE_LEN],
    };
    // SAFETY: `base` is the start of a live allocation of the bound context (just reported by the
    // driver); the handle is written into a local.
    unsafe { sys::cuIpcGetMemHandle(&raw mut handle, base).result() }
        .map_err(driver("cuIpcGetMemHandle"))?;
    Ok(IpcExport {
        base,
        len: len as u64,
        handle: handle.reserved.map(|c| c as u8),
    })
}

/// A peer's GPU allocation opened here (`cuIpcOpenMemHandle`), closed when dropped. Only read from:
/// the copies below take it as their source. The driver refuses to open a handle in the process that
/// exported it, so both ends of a CUDA IPC copy are different processes.
#[derive(Debug)]
pub struct IpcMapping {
    gpu: Gpu,
    ptr: sys::CUdeviceptr,
    len: usize,
}

// SAFETY: the mapping is a device address range owned by this value until `drop`; the host never
// dereferences it, and copies out of it are driver calls (thread-safe, with the context bound first).
unsafe impl Send for IpcMapping {}
// SAFETY: as for `Send`; `&IpcMapping` only reads through driver copies.
unsafe impl Sync for IpcMapping {}

impl IpcMapping {
    /// Opens the allocation of `len` bytes that `handle` names, in `gpu`'s context (peer access is
    /// enabled lazily when the allocation is on another GPU).
    pub fn open(gpu: &Gpu, handle: &[u8; IPC_HANDLE_LEN], len: usize) -> Result<Self, CudaError> {
        gpu.bind()?;
        let raw = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
        // SAFETY: the driver validates the handle (a forged or stale one is an error) and writes the
        // address into a local; the mapping is closed once, in `drop`.
        unsafe { sys::cuIpcOpenMemHandle_v2(&raw mut ptr, raw, flags).result() }
            .map_err(driver("cuIpcOpenMemHandle"))?;
        Ok(Self {
            gpu: gpu.clone(),
            ptr,
            len,
        })
    }

    /// The allocation's length.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst_range` of `dst` (a GPU region, or host memory through its write lock) from the bytes
    /// at `offset` of the allocation, and waits for the copy.
    pub fn copy_to(
        &self,
        offset: usize,
        dst: &MemoryRegion,
        dst_range: std::ops::Range<usize>,
    ) -> Result<(), CudaError> {
        let len = dst_range.len();
        check_range(offset, len, self.len)?;
        let from = self.ptr + offset as u64;
        self.gpu.bind()?;
        if dst.kind().is_host() {
            let mut to = dst.write(dst_range)?;
            // SAFETY: `from..from + len` lies inside the opened allocation (checked above); `to` is a
            // locked writable host view of `len` bytes that outlives the synchronous copy.
            unsafe { sys::cuMemcpyDtoH_v2(to.as_mut_ptr().cast(), from, len).result() }
                .map_err(driver("cuMemcpyDtoH"))?;
            return Ok(());
        }
        let to = DeviceSpan::of(dst, dst_range)?;
        // SAFETY: both ranges lie inside live allocations (the destination checked by `DeviceSpan::of`
        // against the region's contract, the source above); with unified addressing `cuMemcpy` copies
        // between GPUs too. The context is synchronised below, before either can be dropped.
        unsafe { sys::cuMemcpy(to.ptr(), from, len).result() }.map_err(driver("cuMemcpy"))?;
        self.gpu.synchronize()
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from `cuIpcOpenMemHandle` and is closed only here; no copy out of it is
            // running (each waits before it returns).
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

impl Gpu {
    /// Copies host bytes `src` into `dst_range` of the GPU region `dst`, and waits for the copy.
    pub fn upload(
        &self,
        src: &[u8],
        dst: &MemoryRegion,
        dst_range: std::ops::Range<usize>,
    ) -> Result<(), CudaError> {
        self.check_device("an upload's destination", dst.kind())?;
        let to = DeviceSpan::of(dst, dst_range)?;
        if to.len() != src.len() {
            return Err(CudaError::Invalid(format!(
                "an upload of {} bytes into {}",
                src.len(),
                to.len()
            )));
        }
        self.bind()?;
        // SAFETY: `to` lies inside a live allocation of this GPU; `src` is borrowed for the synchronous
        // copy.
        unsafe { sys::cuMemcpyHtoD_v2(to.ptr(), src.as_ptr().cast(), src.len()).result() }
            .map_err(driver("cuMemcpyHtoD"))
    }
}
