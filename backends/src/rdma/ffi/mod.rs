//! The backend's only `unsafe` code: libfabric resources behind safe owners.
//!
//! [`Endpoint`] owns one reliable-datagram endpoint and everything under it (fabric, domain, address vector,
//! completion queue), the memory registrations made through it, and two pools of registered message slots
//! (sends and pre-posted receives). Every buffer the provider may touch is owned or kept alive by the
//! endpoint until the operation's completion is read or the endpoint is closed, so the safe methods cannot
//! hand the provider a dangling pointer. Teardown closes in dependency order: registrations, endpoint,
//! address vector, completion queue, domain, fabric; only then are buffers and region memory released.
//!
//! The declarations come from bindgen over `csrc/rdma_shim.h` (see build.rs); the shim turns libfabric's
//! `static inline` calls into plain functions.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr;

use transfer_engine::MemoryRegion;

use super::RdmaError;

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/fabric.rs"));
}

mod info;
mod slots;

pub use info::ProviderInfo;
pub(crate) use info::providers;
pub(crate) use slots::guarded_region;

use info::{InfoList, check};
use slots::Slots;

/// What a registration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// A source of local writes and a target of the peer's writes.
    Region,
    /// Message buffers.
    Messages,
}

/// A registration made through an [`Endpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct MrId(pub u32);

struct Registration {
    mr: *mut sys::fid_mr,
    memory: MemoryRegion,
    key: u64,
    desc: *mut c_void,
    in_flight: usize,
}

/// A completion read from the endpoint's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Completion {
    /// A message send finished (its slot is free again).
    Sent {
        /// The provider's error, if it failed.
        error: Option<String>,
    },
    /// A message arrived in receive slot `slot`; read it with [`Endpoint::received`], then
    /// [`Endpoint::repost`] it.
    Received {
        /// The slot.
        slot: usize,
        /// Bytes received.
        len: usize,
        /// The provider's error, if the receive failed (the slot must still be reposted).
        error: Option<String>,
    },
    /// A local RMA write finished.
    Written {
        /// The context given to [`Endpoint::write`].
        ctx: u64,
        /// The provider's error (a refused key or range, a lost peer), if it failed.
        error: Option<String>,
    },
    /// A peer's write with remote CQ data landed in one of our registrations.
    RemoteWrite {
        /// The CQ data the peer attached.
        data: u64,
    },
}

const KIND_SEND: u64 = 1 << 60;
const KIND_RECV: u64 = 2 << 60;
const KIND_WRITE: u64 = 3 << 60;
const KIND_MASK: u64 = 0xF << 60;

/// One reliable-datagram endpoint and everything it owns.
pub(crate) struct Endpoint {
    info: ProviderInfo,
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    av: *mut sys::fid_av,
    cq: *mut sys::fid_cq,
    ep: *mut sys::fid_ep,
    regs: HashMap<MrId, Registration>,
    next_mr: u32,
    /// The registration each write in flight reads from, by context.
    write_src: HashMap<u64, MrId>,
    send: Slots,
    free_send: Vec<usize>,
    recv: Slots,
    /// Receive slots that completed and were not reposted yet.
    recv_out: Vec<bool>,
    scratch: Vec<sys::fi_cq_data_entry>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

// SAFETY: the endpoint exclusively owns its libfabric objects and buffers; the domain is opened with
// FI_THREAD_SAFE, so moving the owner to another thread (the driver thread) is allowed. It is not Sync:
// every call goes through `&mut self` on one thread at a time.
unsafe impl Send for Endpoint {}

impl Endpoint {
    /// Opens an endpoint on `provider` (exact name) and `domain`, with `send_slots` and `recv_slots`
    /// message slots of `slot_bytes` each; receives are posted at once.
    pub(crate) fn open(
        provider: &str,
        domain: Option<&str>,
        send_slots: usize,
        recv_slots: usize,
        slot_bytes: usize,
    ) -> Result<Self, RdmaError> {
        let list = InfoList::get(Some(provider), domain)?;
        // Some layered providers list every domain whatever the hint names: take the one asked for.
        let Some((raw, info)) = list
            .entries()
            .into_iter()
            .find(|(_, i)| domain.is_none_or(|d| i.domain == d))
        else {
            return Err(RdmaError::NoProvider(format!(
                "provider {provider:?}{} offers no reliable datagram endpoint with RMA",
                domain
                    .map(|d| format!(" on domain {d:?}"))
                    .unwrap_or_default()
            )));
        };
        if info.cq_data_size < 4 {
            return Err(RdmaError::NoProvider(format!(
                "provider {provider:?} carries {} bytes of remote CQ data, 4 are needed",
                info.cq_data_size
            )));
        }
        let mut ep = Self {
            info,
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            av: ptr::null_mut(),
            cq: ptr::null_mut(),
            ep: ptr::null_mut(),
            regs: HashMap::new(),
            next_mr: 0,
            write_src: HashMap::new(),
            send: Slots::new(send_slots, slot_bytes),
            free_send: (0..send_slots).rev().collect(),
            recv: Slots::new(recv_slots, slot_bytes),
            recv_out: vec![false; recv_slots],
            scratch: Vec::with_capacity(64),
        };
        // SAFETY: each call gets a valid entry of `list` (alive until the end of this function: libfabric
        // copies what it keeps) or objects opened just before, and a valid place for its result; every
        // object opened is recorded in `ep` at once, so an early return closes it in `Drop`.
        unsafe {
            check("fi_fabric", sys::te_fabric(raw, &mut ep.fabric).into())?;
            check(
                "fi_domain",
                sys::te_domain(ep.fabric, raw, &mut ep.domain).into(),
            )?;
            check("fi_av_open", sys::te_av_open(ep.domain, &mut ep.av).into())?;
            let size = (send_slots + recv_slots).max(1024);
            check(
                "fi_cq_open",
                sys::te_cq_open(ep.domain, size, 0, &mut ep.cq).into(),
            )?;
            check(
                "fi_endpoint",
                sys::te_endpoint(ep.domain, raw, &mut ep.ep).into(),
            )?;
            check("fi_ep_bind", sys::te_ep_setup(ep.ep, ep.av, ep.cq).into())?;
        }
        let (send_ptr, recv_ptr, bytes) = (ep.send.base, ep.recv.base, slot_bytes);
        ep.send.mr = Some(ep.register_raw(send_ptr, send_slots * bytes, Access::Messages, None)?);
        ep.recv.mr = Some(ep.register_raw(recv_ptr, recv_slots * bytes, Access::Messages, None)?);
        for slot in 0..recv_slots {
            ep.post_recv(slot)?;
        }
        Ok(ep)
    }

    /// What the provider offers.
    #[must_use]
    pub(crate) fn info(&self) -> &ProviderInfo {
        &self.info
    }

    /// Bytes one message slot holds.
    #[must_use]
    pub(crate) fn slot_bytes(&self) -> usize {
        self.send.slot_bytes
    }

    /// Free send slots.
    #[must_use]
    pub(crate) fn free_send_slots(&self) -> usize {
        self.free_send.len()
    }

    /// This endpoint's address, to hand to peers.
    pub(crate) fn name(&self) -> Result<Vec<u8>, RdmaError> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: `buf` is writable for `len` bytes; the provider writes at most that and updates `len`.
        let ret = unsafe { sys::te_getname(self.ep, buf.as_mut_ptr().cast(), &mut len) };
        check("fi_getname", ret.into())?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Inserts a peer's address (from its [`Endpoint::name`]) and returns its handle.
    pub(crate) fn insert(&mut self, name: &[u8]) -> Result<u64, RdmaError> {
        if name.is_empty() || name.len() > 256 {
            return Err(RdmaError::Protocol(format!(
                "an endpoint address of {} bytes",
                name.len()
            )));
        }
        let mut addr = 0;
        let mut padded = [0u8; 256];
        padded[..name.len()].copy_from_slice(name);
        // SAFETY: the provider reads at most its address length (well under 256 bytes) from `padded`, which
        // holds the peer's address followed by zeroes, so even a short or foreign one reads no further; an
        // invalid address is refused by the provider with an error.
        let ret = unsafe { sys::te_av_insert(self.av, padded.as_ptr().cast(), &mut addr) };
        check("fi_av_insert", ret.into())?;
        Ok(addr)
    }

    fn register_raw(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        memory: Option<MemoryRegion>,
    ) -> Result<MrId, RdmaError> {
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
        // SAFETY: `ptr..ptr + len` is memory this endpoint keeps alive until the registration is closed
        // (its own pools, or a region whose `MemoryRegion` clone is stored with the registration); the
        // domain and endpoint are open.
        let ret = unsafe {
            sys::te_mr_reg(
                self.domain,
                bind,
                ptr.cast(),
                len,
                u64::from(flags),
                u64::from(id.0),
                &mut mr,
            )
        };
        check("fi_mr_reg", ret.into())?;
        // SAFETY: `mr` was just opened successfully.
        let (key, desc) = unsafe { (sys::te_mr_key(mr), sys::te_mr_desc(mr)) };
        let memory = memory.unwrap_or_else(|| MemoryRegion::zeroed(0));
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

    /// Registers host region memory for local writes from it and peers' writes into it; returns the
    /// registration and its remote key. The memory is kept alive until [`Endpoint::deregister`].
    pub(crate) fn register(&mut self, memory: &MemoryRegion) -> Result<(MrId, u64), RdmaError> {
        if !memory.kind().is_host() || memory.is_empty() {
            return Err(RdmaError::Config(format!(
                "only non-empty host memory can be registered here, not {} of {} bytes",
                memory.kind(),
                memory.len()
            )));
        }
        let ptr = memory.address() as *mut u8;
        let id = self.register_raw(ptr, memory.len(), Access::Region, Some(memory.clone()))?;
        Ok((id, self.regs[&id].key))
    }

    /// The address peers write to for byte `offset` of registration `id`: the virtual address under
    /// `FI_MR_VIRT_ADDR`, the offset otherwise.
    pub(crate) fn remote_base(&self, id: MrId) -> Result<u64, RdmaError> {
        let reg = self
            .regs
            .get(&id)
            .ok_or(RdmaError::UnknownRegistration(id.0))?;
        Ok(if self.info.virt_addr() {
            reg.memory.address() as u64
        } else {
            0
        })
    }

    /// Closes registration `id`; refused while writes from it are in flight.
    pub(crate) fn deregister(&mut self, id: MrId) -> Result<(), RdmaError> {
        let reg = self
            .regs
            .get(&id)
            .ok_or(RdmaError::UnknownRegistration(id.0))?;
        if reg.in_flight > 0 {
            return Err(RdmaError::Config(format!(
                "registration {} has {} writes in flight",
                id.0, reg.in_flight
            )));
        }
        let reg = self
            .regs
            .remove(&id)
            .ok_or(RdmaError::UnknownRegistration(id.0))?;
        // SAFETY: the registration was opened by this endpoint and is closed once, here.
        let ret = unsafe { sys::te_close_mr(reg.mr) };
        check("fi_close(mr)", ret.into())
    }

    fn post_recv(&mut self, slot: usize) -> Result<(), RdmaError> {
        let desc = self.desc(self.recv.mr);
        // SAFETY: the slot lies inside the receive pool, which outlives the endpoint's objects; it is not
        // read by us until its completion arrives (`recv_out` tracks that).
        let ret = unsafe {
            sys::te_recv(
                self.ep,
                self.recv.ptr(slot).cast(),
                self.recv.slot_bytes,
                desc,
                (KIND_RECV | slot as u64) as *mut c_void,
            )
        };
        check("fi_recv", ret as i64)?;
        self.recv_out[slot] = false;
        Ok(())
    }

    fn desc(&self, mr: Option<MrId>) -> *mut c_void {
        mr.and_then(|m| self.regs.get(&m))
            .map_or(ptr::null_mut(), |r| r.desc)
    }

    /// The bytes of receive slot `slot` after its [`Completion::Received`], until it is reposted.
    pub(crate) fn received(&self, slot: usize, len: usize) -> Result<&[u8], RdmaError> {
        if slot >= self.recv.count || !self.recv_out[slot] || len > self.recv.slot_bytes {
            return Err(RdmaError::Protocol(format!(
                "receive slot {slot} ({len} bytes) is not completed"
            )));
        }
        // SAFETY: the slot's receive completed and it is not reposted, so the provider no longer writes
        // it; the slice borrows `self`, so `repost` cannot run while it lives.
        Ok(unsafe { std::slice::from_raw_parts(self.recv.ptr(slot), len) })
    }

    /// Posts receive slot `slot` again after its message was handled.
    pub(crate) fn repost(&mut self, slot: usize) -> Result<(), RdmaError> {
        if slot >= self.recv.count || !self.recv_out[slot] {
            return Err(RdmaError::Protocol(format!(
                "receive slot {slot} is already posted"
            )));
        }
        self.post_recv(slot)
    }

    /// Sends `bytes` as one message to `dest`. Returns `false` when no slot is free or the provider asks
    /// to try again (nothing was sent).
    pub(crate) fn send(&mut self, dest: u64, bytes: &[u8]) -> Result<bool, RdmaError> {
        if bytes.len() > self.send.slot_bytes {
            return Err(RdmaError::Protocol(format!(
                "a message of {} bytes exceeds the {}-byte slots",
                bytes.len(),
                self.send.slot_bytes
            )));
        }
        let Some(slot) = self.free_send.pop() else {
            return Ok(false);
        };
        let at = self.send.ptr(slot);
        // SAFETY: the slot is free (not handed to the provider), lies inside the send pool, and holds at
        // least `bytes.len()` bytes (checked above); the pool and `bytes` do not overlap.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len()) };
        let desc = self.desc(self.send.mr);
        // SAFETY: the slot stays allocated and untouched by us until its completion frees it.
        let ret = unsafe {
            sys::te_send(
                self.ep,
                at.cast(),
                bytes.len(),
                desc,
                dest,
                (KIND_SEND | slot as u64) as *mut c_void,
            )
        };
        if ret == -(sys::FI_EAGAIN as isize) {
            self.free_send.push(slot);
            return Ok(false);
        }
        if let Err(e) = check("fi_send", ret as i64) {
            self.free_send.push(slot);
            return Err(e);
        }
        Ok(true)
    }

    /// Writes `len` bytes at `offset` of local registration `src` to `dest`'s registration with key `key`
    /// at remote address `addr`, with remote CQ data `data` when given. `ctx` comes back in the
    /// [`Completion::Written`]; with `delivery_complete` that completion waits until the bytes are placed
    /// at the target (so a refusal there comes back as an error), otherwise until they left. Returns
    /// `false` when the provider asks to try again (nothing was posted).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write(
        &mut self,
        dest: u64,
        src: MrId,
        offset: usize,
        len: usize,
        addr: u64,
        key: u64,
        data: Option<u64>,
        ctx: u64,
        delivery_complete: bool,
    ) -> Result<bool, RdmaError> {
        if ctx & KIND_MASK != 0 {
            return Err(RdmaError::Config(format!(
                "write context {ctx:#x} is too large"
            )));
        }
        let reg = self
            .regs
            .get_mut(&src)
            .ok_or(RdmaError::UnknownRegistration(src.0))?;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > reg.memory.len())
        {
            return Err(RdmaError::Config(format!(
                "bytes {offset}+{len} lie outside a registration of {} bytes",
                reg.memory.len()
            )));
        }
        let buf = (reg.memory.address() as *const u8).wrapping_add(offset);
        let context = (KIND_WRITE | ctx) as *mut c_void;
        // SAFETY: the source range lies inside registered host memory that the registration keeps alive
        // (a `MemoryRegion` clone), and the registration cannot be closed while `in_flight` counts this
        // write. The provider only reads it. What the peer's registration accepts is checked by the peer's
        // provider against its key and bounds.
        let ret = unsafe {
            match data {
                _ if delivery_complete => {
                    let flags = u64::from(sys::FI_DELIVERY_COMPLETE)
                        | data.map_or(0, |_| u64::from(sys::FI_REMOTE_CQ_DATA));
                    sys::te_writemsg(
                        self.ep,
                        buf.cast(),
                        len,
                        reg.desc,
                        data.unwrap_or(0),
                        dest,
                        addr,
                        key,
                        context,
                        flags,
                    )
                }
                Some(data) => sys::te_writedata(
                    self.ep,
                    buf.cast(),
                    len,
                    reg.desc,
                    data,
                    dest,
                    addr,
                    key,
                    context,
                ),
                None => sys::te_write(self.ep, buf.cast(), len, reg.desc, dest, addr, key, context),
            }
        };
        if ret == -(sys::FI_EAGAIN as isize) {
            return Ok(false);
        }
        check("fi_writedata", ret as i64)?;
        reg.in_flight += 1;
        // The completion names the context only; remember which registration it drew from.
        self.write_src.insert(ctx, src);
        Ok(true)
    }

    /// Reads available completions into `out` (appending); returns how many.
    pub(crate) fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, RdmaError> {
        let mut n = 0;
        loop {
            self.scratch.clear();
            let cap = self.scratch.capacity();
            // SAFETY: `scratch` has room for `cap` entries; the provider initialises the first `ret`.
            let ret = unsafe { sys::te_cq_read(self.cq, self.scratch.as_mut_ptr(), cap) };
            if ret == -(sys::FI_EAGAIN as isize) {
                return Ok(n);
            }
            if ret == -(sys::FI_EAVAIL as isize) {
                out.push(self.read_error()?);
                n += 1;
                continue;
            }
            check("fi_cq_read", (ret as i64).min(0))?;
            let got = usize::try_from(ret).unwrap_or(0).min(cap);
            // SAFETY: the provider wrote `got` entries (at most the capacity).
            unsafe { self.scratch.set_len(got) };
            for i in 0..got {
                let e = self.scratch[i];
                let c = self.classify(e.op_context as u64, e.flags, e.len, e.data, None);
                out.push(c);
            }
            n += got;
            if got < cap {
                return Ok(n);
            }
        }
    }

    fn read_error(&mut self) -> Result<Completion, RdmaError> {
        let mut ctx = ptr::null_mut();
        let (mut err, mut prov) = (0, 0);
        let mut msg = [0u8; 256];
        // SAFETY: every out-pointer is valid; `msg` is writable for its length and the shim NUL-terminates.
        let ret = unsafe {
            sys::te_cq_readerr(
                self.cq,
                &mut ctx,
                &mut err,
                &mut prov,
                msg.as_mut_ptr().cast(),
                msg.len(),
            )
        };
        check("fi_cq_readerr", ret.min(0) as i64)?;
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = format!(
            "{} (provider error {prov})",
            String::from_utf8_lossy(&msg[..end])
        );
        Ok(self.classify(ctx as u64, 0, 0, 0, Some(text)))
    }

    fn classify(
        &mut self,
        ctx: u64,
        flags: u64,
        len: usize,
        data: u64,
        error: Option<String>,
    ) -> Completion {
        let id = ctx & !KIND_MASK;
        match ctx & KIND_MASK {
            KIND_SEND => {
                self.free_send.push(id as usize);
                Completion::Sent { error }
            }
            KIND_RECV => {
                let slot = id as usize;
                if slot < self.recv_out.len() {
                    self.recv_out[slot] = true;
                }
                Completion::Received { slot, len, error }
            }
            KIND_WRITE => {
                if let Some(src) = self.write_src.remove(&id)
                    && let Some(reg) = self.regs.get_mut(&src)
                {
                    reg.in_flight -= 1;
                }
                Completion::Written { ctx: id, error }
            }
            _ if flags & u64::from(sys::FI_REMOTE_CQ_DATA) != 0 => Completion::RemoteWrite { data },
            _ => Completion::Sent {
                error: Some(error.unwrap_or_else(|| format!("a completion with flags {flags:#x}"))),
            },
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let mut regs: Vec<Registration> = self.regs.drain().map(|(_, r)| r).collect();
        // SAFETY: each object was opened by this endpoint (or is null and skipped) and is closed once, in
        // dependency order: endpoint (after which the provider starts no access to any buffer),
        // registrations, address vector, queue, domain, fabric. Buffers and region memory are released
        // only after that (`regs` at the end of this function, the pools when the fields drop).
        unsafe {
            if !self.ep.is_null() {
                sys::te_close_ep(self.ep);
            }
            for reg in &mut regs {
                sys::te_close_mr(reg.mr);
            }
            if !self.av.is_null() {
                sys::te_close_av(self.av);
            }
            if !self.cq.is_null() {
                sys::te_close_cq(self.cq);
            }
            if !self.domain.is_null() {
                sys::te_close_domain(self.domain);
            }
            if !self.fabric.is_null() {
                sys::te_close_fabric(self.fabric);
            }
        }
        drop(regs);
    }
}
