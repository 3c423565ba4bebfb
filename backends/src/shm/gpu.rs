//! GPU memory on the same-host backend, through CUDA IPC (feature `cuda`).
//!
//! A node that registers GPU memory exports the allocation holding it (`cuIpcGetMemHandle`) and grants
//! the handle to every peer it links to, as it grants its shared memory. A receiver opens a granted
//! allocation on first use (`cuIpcOpenMemHandle`, in the context of the destination's GPU, or of GPU 0
//! for a host destination) and moves each unit with one device copy: GPU to GPU over NVLink or PCIe (or
//! within one GPU), GPU to host straight into the destination under its write lock. A unit from host
//! memory to a GPU region is copied out of the sender (shared mapping or cross-memory attach) into a
//! bounce buffer, checksummed there, and uploaded piece by piece.
//!
//! Checksums: units whose source is GPU memory are copied by the device and not checksummed (the
//! sender seals them with a zero CRC, and the receiver places them as such); host-sourced units keep
//! CRC-32C end to end, GPU destination or not.
//!
//! Built without the `cuda` feature, a node still records the grants it is given, so that a unit from a
//! peer's GPU memory is refused with that reason instead of failing as an unmapped host address.

use std::collections::BTreeMap;

use transfer_engine::MemoryRegion;

use crate::TransportError;

use super::wire::GPU_HANDLE_LEN;

/// GPU allocations one peer may grant this node (more are refused).
const MAX_GPU_GRANTS: usize = 1024;

/// One granted allocation: its length, its handle, and (once opened) its mapping here.
#[derive(Debug)]
struct GpuGrant {
    len: u64,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    handle: Box<[u8; GPU_HANDLE_LEN]>,
    #[cfg(feature = "cuda")]
    mapping: Option<crate::cuda::IpcMapping>,
}

/// The GPU allocations a peer granted, by their device address in the peer.
#[derive(Debug, Default)]
pub(crate) struct GpuGrants {
    grants: BTreeMap<u64, GpuGrant>,
    /// GPUs opened here, by ordinal (copies bind their context).
    #[cfg(feature = "cuda")]
    gpus: BTreeMap<u32, crate::cuda::Gpu>,
}

impl GpuGrants {
    /// Records a grant (replacing an earlier one at the same address, and its mapping).
    pub(crate) fn add(
        &mut self,
        address: u64,
        len: u64,
        handle: Box<[u8; GPU_HANDLE_LEN]>,
    ) -> Result<(), TransportError> {
        if self.grants.len() >= MAX_GPU_GRANTS && !self.grants.contains_key(&address) {
            return Err(broken(format!(
                "a GPU grant beyond the {MAX_GPU_GRANTS} a peer may make"
            )));
        }
        if len == 0 || address.checked_add(len).is_none() {
            return Err(broken(format!(
                "a GPU grant of {len} bytes at {address:#x}"
            )));
        }
        self.grants.insert(
            address,
            GpuGrant {
                len,
                handle,
                #[cfg(feature = "cuda")]
                mapping: None,
            },
        );
        Ok(())
    }

    /// The grant holding `len` bytes at `address`, and the offset of `address` in it.
    fn find(&self, address: u64, len: usize) -> Option<(u64, usize)> {
        let (&start, grant) = self.grants.range(..=address).next_back()?;
        let offset = address - start;
        (offset.checked_add(len as u64)? <= grant.len)
            .then_some((start, usize::try_from(offset).ok()?))
    }

    /// Whether `len` bytes at `address` lie in a granted GPU allocation.
    pub(crate) fn holds(&self, address: u64, len: usize) -> bool {
        self.find(address, len).is_some()
    }
}

#[cfg(not(feature = "cuda"))]
impl GpuGrants {
    /// Without the `cuda` feature no GPU unit can be placed: refused with the reason.
    pub(crate) fn copy_from_gpu(
        &mut self,
        _address: u64,
        _dst: &MemoryRegion,
        _range: std::ops::Range<usize>,
    ) -> Result<(), TransportError> {
        Err(no_cuda())
    }

    /// Without the `cuda` feature no GPU region exists here to upload into.
    pub(crate) fn upload(
        &mut self,
        _src: &[u8],
        _dst: &MemoryRegion,
        _range: std::ops::Range<usize>,
    ) -> Result<(), TransportError> {
        Err(no_cuda())
    }
}

#[cfg(not(feature = "cuda"))]
fn no_cuda() -> TransportError {
    TransportError::Unsupported {
        backend: "shm",
        what: format!(
            "place a unit from or to GPU memory: {}",
            crate::NO_GPU_SUPPORT
        ),
    }
}

/// A grant or unit the peer should not have sent.
fn broken(message: String) -> TransportError {
    TransportError::protocol("shm", message)
}

/// A GPU grant this node holds but cannot use.
#[cfg(feature = "cuda")]
fn own(message: &str) -> TransportError {
    TransportError::Io {
        backend: "shm",
        message: message.into(),
    }
}

#[cfg(feature = "cuda")]
impl GpuGrants {
    /// The GPU of `ordinal`, opened once.
    fn gpu(&mut self, ordinal: u32) -> Result<crate::cuda::Gpu, TransportError> {
        if let Some(gpu) = self.gpus.get(&ordinal) {
            return Ok(gpu.clone());
        }
        let gpu = crate::cuda::Gpu::open(ordinal).map_err(cuda_refusal)?;
        self.gpus.insert(ordinal, gpu.clone());
        Ok(gpu)
    }

    /// Copies `range` of `dst` from the granted GPU bytes at `address` with one device copy (opening
    /// the grant on first use), and waits for it.
    pub(crate) fn copy_from_gpu(
        &mut self,
        address: u64,
        dst: &MemoryRegion,
        range: std::ops::Range<usize>,
    ) -> Result<(), TransportError> {
        let (start, offset) = self.find(address, range.len()).ok_or_else(|| {
            broken(format!(
                "{} bytes at {address:#x} are not in GPU memory the peer granted",
                range.len()
            ))
        })?;
        let ordinal = match dst.kind() {
            transfer_engine::MemoryKind::Device { ordinal } => ordinal,
            _ => 0,
        };
        let gpu = self.gpu(ordinal)?;
        let grant = self
            .grants
            .get_mut(&start)
            .ok_or_else(|| own("a GPU grant vanished"))?;
        if grant.mapping.is_none() {
            let len = usize::try_from(grant.len)
                .map_err(|_| broken("a GPU grant longer than memory".into()))?;
            let mapping =
                crate::cuda::IpcMapping::open(&gpu, &grant.handle, len).map_err(cuda_refusal)?;
            grant.mapping = Some(mapping);
        }
        let mapping = grant
            .mapping
            .as_ref()
            .ok_or_else(|| own("a GPU grant could not be opened"))?;
        mapping.copy_to(offset, dst, range).map_err(cuda_refusal)
    }

    /// Uploads host bytes `src` into `range` of the GPU region `dst`.
    pub(crate) fn upload(
        &mut self,
        src: &[u8],
        dst: &MemoryRegion,
        range: std::ops::Range<usize>,
    ) -> Result<(), TransportError> {
        let transfer_engine::MemoryKind::Device { ordinal } = dst.kind() else {
            return Err(own("an upload into memory that is not a GPU's"));
        };
        self.gpu(ordinal)?
            .upload(src, dst, range)
            .map_err(cuda_refusal)
    }
}

/// A CUDA failure: the unit is not placed (the engine never hears of it, so it is resent, and in the end
/// handed back for recompute).
#[cfg(feature = "cuda")]
fn cuda_refusal(e: crate::cuda::CudaError) -> TransportError {
    TransportError::Device {
        backend: "shm",
        message: format!("a GPU copy failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_bounded_and_found_by_address() {
        let mut grants = GpuGrants::default();
        grants.add(0x1000, 0x1000, Box::new([1; 64])).unwrap();
        assert!(grants.holds(0x1800, 0x800));
        assert!(!grants.holds(0x1800, 0x801));
        assert!(!grants.holds(0xfff, 1));
        assert!(grants.add(u64::MAX - 4, 8, Box::new([0; 64])).is_err());
        assert!(grants.add(0x9000, 0, Box::new([0; 64])).is_err());
        for i in 1..MAX_GPU_GRANTS as u64 {
            grants.add(0x10_0000 * i, 16, Box::new([0; 64])).unwrap();
        }
        let over = grants.add(1 << 50, 16, Box::new([0; 64])).unwrap_err();
        assert!(over.to_string().contains("beyond"), "{over}");
        // Replacing a grant at a known address is allowed at the limit.
        grants.add(0x1000, 0x2000, Box::new([2; 64])).unwrap();
        assert!(grants.holds(0x2800, 0x800));
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn without_a_driver_a_gpu_unit_is_refused_with_the_reason() {
        if crate::cuda::driver_present() {
            eprintln!("not run: a CUDA driver is present (scripts/gpu-check.sh covers this path)");
            return;
        }
        let mut grants = GpuGrants::default();
        grants.add(0x1000, 0x1000, Box::new([1; 64])).unwrap();
        let e = grants
            .copy_from_gpu(0x1000, &MemoryRegion::zeroed(16), 0..16)
            .unwrap_err();
        assert!(e.to_string().contains("no CUDA driver"), "{e}");
        let e = grants
            .copy_from_gpu(0x9000, &MemoryRegion::zeroed(16), 0..16)
            .unwrap_err();
        assert!(
            e.to_string().contains("not in GPU memory the peer granted"),
            "{e}"
        );
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_cuda_feature_a_gpu_unit_is_refused_with_the_reason() {
        let mut grants = GpuGrants::default();
        grants.add(0x1000, 0x1000, Box::new([1; 64])).unwrap();
        let e = grants
            .copy_from_gpu(0x1000, &MemoryRegion::zeroed(16), 0..16)
            .unwrap_err();
        assert!(e.to_string().contains(crate::NO_GPU_SUPPORT), "{e}");
        assert!(matches!(e, TransportError::Unsupported { .. }), "{e:?}");
    }
}
