//! Memory registration through an [`Endpoint`]: a region's memory registered once, its key and remote
//! base address, and deregistration once no write reads from it.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr;

use transfer_engine::{MemoryKind, MemoryRegion};

use super::info::check;
use super::{Access, DmaBuffer, Endpoint, MrId, Registered, Registration, sys};
use crate::TransportError;
use crate::rdma::unknown_registration;

impl Endpoint {
    pub(super) fn register_raw(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        memory: Registered,
    ) -> Result<MrId, TransportError> {
        self.next_mr += 1;
        let id = MrId(self.next_mr);
        let flags = match access {
            Access::Region => sys::FI_WRITE | sys::FI_REMOTE_WRITE,
            Access::Messages => sys::FI_SEND | sys::FI_RECV,
        };
        let bind = if self.info.mr_mode & u64::from(sys::FI_MR_ENDPOINT) != 0 {
            self.ep
        } else {
            ptr::null_mut()
        };
        let mut mr = ptr::null_mut();
        let device = match &memory {
            Registered::Region(m) => match m.kind() {
                MemoryKind::Device { ordinal } => Some(ordinal),
                _ => None,
            },
            Registered::Dma(_) | Registered::Pool { .. } => None,
        };
        let device =
            match device {
                Some(ordinal) => Some(i32::try_from(ordinal).map_err(|_| {
                    TransportError::config("rdma", format!("GPU ordinal {ordinal}"))
                })?),
                _ => None,
            };
        // SAFETY: `ptr..ptr + len` is memory this endpoint keeps alive until the registration is closed
        // (its own pools, or a region or mirror whose owner is stored with the registration): host
        // memory, or device memory of GPU `device` that the provider only reaches through its CUDA
        // interface; the domain and endpoint are open.
        let ret = unsafe {
            match device {
                None => sys::te_mr_reg(
                    self.domain,
                    bind,
                    ptr.cast(),
                    len,
                    u64::from(flags),
                    u64::from(id.0),
                    &mut mr,
                ),
                Some(device) => sys::te_mr_reg_cuda(
                    self.domain,
                    bind,
                    ptr.cast(),
                    len,
                    u64::from(flags),
                    u64::from(id.0),
                    device,
                    &mut mr,
                ),
            }
        };
        check(
            if device.is_some() {
                "fi_mr_regattr(FI_HMEM_CUDA)"
            } else {
                "fi_mr_reg"
            },
            ret.into(),
        )?;
        // SAFETY: `mr` was just opened successfully.
        let (key, desc) = unsafe { (sys::te_mr_key(mr), sys::te_mr_desc(mr)) };
        self.regs.insert(
            id,
            Registration {
                mr,
                memory,
                key,
                desc,
                in_flight: 0,
            },
        );
        Ok(id)
    }

    /// Registers region memory (host, or GPU memory where the provider was opened with `FI_HMEM`) for
    /// local writes from it and peers' writes into it; returns the registration and its remote key. The
    /// memory is kept alive until [`Endpoint::deregister`].
    pub(crate) fn register(
        &mut self,
        memory: &MemoryRegion,
    ) -> Result<(MrId, u64), TransportError> {
        if memory.is_empty() {
            return Err(TransportError::config(
                "rdma",
                "an empty region cannot be registered",
            ));
        }
        if !memory.kind().is_host() && !self.info.hmem {
            return Err(TransportError::config(
                "rdma",
                format!(
                    "{} cannot be registered with provider {}: it was not opened for device memory (FI_HMEM)",
                    memory.kind(),
                    self.info.provider
                ),
            ));
        }
        let ptr = memory.address() as *mut u8;
        let id = self.register_raw(
            ptr,
            memory.len(),
            Access::Region,
            Registered::Region(memory.clone()),
        )?;
        Ok((id, self.regs[&id].key))
    }

    /// Registers a mirror ([`DmaBuffer`]) for local writes from it and peers' writes into it; returns the
    /// registration and its remote key. The buffer is kept alive until [`Endpoint::deregister`].
    pub(crate) fn register_dma(
        &mut self,
        buffer: &std::sync::Arc<DmaBuffer>,
    ) -> Result<(MrId, u64), TransportError> {
        if buffer.len() == 0 {
            return Err(TransportError::config(
                "rdma",
                "an empty region cannot be registered",
            ));
        }
        let id = self.register_raw(
            buffer.address(),
            buffer.len(),
            Access::Region,
            Registered::Dma(buffer.clone()),
        )?;
        Ok((id, self.regs[&id].key))
    }

    /// The address peers write to for byte `offset` of registration `id`: the virtual address under
    /// `FI_MR_VIRT_ADDR`, the offset otherwise.
    pub(crate) fn remote_base(&self, id: MrId) -> Result<u64, TransportError> {
        let reg = self
            .regs
            .get(&id)
            .ok_or_else(|| unknown_registration(id.0))?;
        Ok(if self.info.virt_addr() {
            reg.memory.address() as u64
        } else {
            0
        })
    }

    /// Whether registration `id` is open.
    pub(crate) fn is_registered(&self, id: MrId) -> bool {
        self.regs.contains_key(&id)
    }

    /// Closes registration `id`; refused while writes from it are in flight.
    pub(crate) fn deregister(&mut self, id: MrId) -> Result<(), TransportError> {
        let reg = self
            .regs
            .get(&id)
            .ok_or_else(|| unknown_registration(id.0))?;
        if reg.in_flight > 0 {
            return Err(TransportError::config(
                "rdma",
                format!(
                    "registration {} has {} writes in flight",
                    id.0, reg.in_flight
                ),
            ));
        }
        let reg = self
            .regs
            .remove(&id)
            .ok_or_else(|| unknown_registration(id.0))?;
        // SAFETY: the registration was opened by this endpoint and is closed once, here.
        let ret = unsafe { sys::te_close_mr(reg.mr) };
        check("fi_close(mr)", ret.into())
    }

    pub(super) fn desc(&self, mr: Option<MrId>) -> *mut c_void {
        mr.and_then(|m| self.regs.get(&m))
            .map_or(ptr::null_mut(), |r| r.desc)
    }
}
