//! What `fi_getinfo` offers, and libfabric's error codes.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char};
use std::ptr;

use super::sys;
use crate::TransportError;

/// What one provider offers, as `fi_getinfo` described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    /// Provider name, e.g. `tcp;ofi_rxm`, `shm`, `verbs;ofi_rxm`, `efa`.
    pub provider: String,
    /// Domain (device or interface) name, e.g. `lo`, `mlx5_0`.
    pub domain: String,
    /// Memory registration mode bits (`FI_MR_*`).
    pub mr_mode: u64,
    /// Bytes of remote CQ data a write may carry.
    pub cq_data_size: usize,
    /// Largest message or RMA transfer.
    pub max_msg_size: usize,
    /// Whether it registers device (GPU) memory (`FI_HMEM`), so writes go straight from and into it.
    pub hmem: bool,
}

impl ProviderInfo {
    /// Whether remote addresses are virtual addresses (`FI_MR_VIRT_ADDR`) rather than offsets into the
    /// registration.
    #[must_use]
    pub fn virt_addr(&self) -> bool {
        self.mr_mode & u64::from(sys::FI_MR_VIRT_ADDR) != 0
    }

    /// Whether local buffers need a registration descriptor (`FI_MR_LOCAL`).
    #[must_use]
    pub fn mr_local(&self) -> bool {
        self.mr_mode & u64::from(sys::FI_MR_LOCAL) != 0
    }
}

/// The libfabric error text for `code` (a positive `FI_E*` number).
pub(super) fn strerror(code: i64) -> String {
    let code = i32::try_from(code.unsigned_abs()).unwrap_or(i32::MAX);
    // SAFETY: fi_strerror takes any integer and returns a pointer to a static, NUL-terminated string.
    let text = unsafe { sys::fi_strerror(code) };
    if text.is_null() {
        return format!("error {code}");
    }
    // SAFETY: non-null and NUL-terminated, static for the life of the library (checked above).
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

pub(super) fn check(call: &'static str, ret: i64) -> Result<(), TransportError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(TransportError::Fabric {
            call,
            code: ret,
            message: strerror(ret),
        })
    }
}

fn c_string(s: Option<&str>) -> Result<Option<CString>, TransportError> {
    s.map(|s| {
        CString::new(s)
            .map_err(|_| TransportError::config("rdma", format!("{s:?} contains a NUL byte")))
    })
    .transpose()
}

fn owned(s: *const c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's attribute strings are NUL-terminated and live as long as the info list, which
    // the caller holds while this runs.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// An `fi_info` list from `fi_getinfo`, freed on drop.
pub(super) struct InfoList(*mut sys::fi_info);

impl InfoList {
    /// The providers offering what the backend needs (and, with `hmem`, device memory registration).
    pub(super) fn get(
        provider: Option<&str>,
        domain: Option<&str>,
        hmem: bool,
    ) -> Result<Self, TransportError> {
        let (prov, dom) = (c_string(provider)?, c_string(domain)?);
        let mut out = ptr::null_mut();
        // SAFETY: the strings are valid NUL-terminated strings or null (both allowed); `out` is a valid
        // place for the list head, which we own afterwards.
        let ret = unsafe {
            sys::te_getinfo(
                prov.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
                dom.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
                i32::from(hmem),
                &mut out,
            )
        };
        if ret == -(sys::FI_ENODATA as i32) {
            return Ok(Self(ptr::null_mut()));
        }
        check("fi_getinfo", ret.into())?;
        Ok(Self(out))
    }

    /// Each entry with what it offers.
    pub(super) fn entries(&self) -> Vec<(*mut sys::fi_info, ProviderInfo)> {
        let mut out = Vec::new();
        let mut at = self.0;
        while !at.is_null() {
            // SAFETY: `at` is an entry of the list this value owns; the accessors only read its fields.
            let info = unsafe {
                ProviderInfo {
                    provider: owned(sys::te_info_prov(at)),
                    domain: owned(sys::te_info_domain(at)),
                    mr_mode: sys::te_info_mr_mode(at),
                    cq_data_size: sys::te_info_cq_data_size(at),
                    max_msg_size: sys::te_info_max_msg_size(at),
                    hmem: sys::te_info_caps(at) & sys::FI_HMEM != 0,
                }
            };
            out.push((at, info));
            // SAFETY: as above; the next pointer is null at the end of the list.
            at = unsafe { sys::te_info_next(at) };
        }
        out
    }
}

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the list came from fi_getinfo and is freed once, here.
            unsafe { sys::te_freeinfo(self.0) };
        }
    }
}

/// Every provider and domain that offers reliable datagram endpoints with messages and RMA writes, optionally
/// only those of `provider` and `domain`.
pub(crate) fn providers(
    provider: Option<&str>,
    domain: Option<&str>,
    hmem: bool,
) -> Result<Vec<ProviderInfo>, TransportError> {
    Ok(InfoList::get(provider, domain, hmem)?
        .entries()
        .into_iter()
        .map(|(_, i)| i)
        .collect())
}
