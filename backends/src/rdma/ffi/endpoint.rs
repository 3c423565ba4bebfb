//! Opening an [`Endpoint`] and closing it: the objects under it, opened in order and closed in
//! dependency order (or parked, see `keeper.rs`).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ptr;

use super::info::{InfoList, check};
use super::slots::Slots;
use super::{
    Access, Endpoint, Objects, ProviderInfo, Registered, Registration, keeper, process, sys,
};
use crate::TransportError;
use crate::rdma::no_provider;

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
        hmem: bool,
    ) -> Result<Self, TransportError> {
        let list = InfoList::get(Some(provider), domain, hmem)?;
        // Some layered providers list every domain whatever the hint names: take the one asked for.
        let Some((raw, info)) = list
            .entries()
            .into_iter()
            .find(|(_, i)| domain.is_none_or(|d| i.domain == d))
        else {
            return Err(no_provider(format!(
                "provider {provider:?}{} offers no reliable datagram endpoint with RMA{}",
                domain
                    .map(|d| format!(" on domain {d:?}"))
                    .unwrap_or_default(),
                if hmem {
                    " and device memory registration (FI_HMEM)"
                } else {
                    ""
                }
            )));
        };
        if info.cq_data_size < 4 {
            return Err(no_provider(format!(
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
            kept: None,
            processes: HashMap::new(),
        };
        if keeper::maps_peers_in_process(&ep.info.provider) {
            keeper::clear_stale_names();
        }
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
        let pool = |base: *mut u8, slots: usize| Registered::Pool {
            address: base as usize,
            len: slots * bytes,
        };
        let (send_pool, recv_pool) = (pool(send_ptr, send_slots), pool(recv_ptr, recv_slots));
        ep.send.mr =
            Some(ep.register_raw(send_ptr, send_slots * bytes, Access::Messages, send_pool)?);
        ep.recv.mr =
            Some(ep.register_raw(recv_ptr, recv_slots * bytes, Access::Messages, recv_pool)?);
        for slot in 0..recv_slots {
            ep.post_recv(slot)?;
        }
        if keeper::maps_peers_in_process(&ep.info.provider) {
            ep.kept = Some(keeper::open(&ep.name()?));
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
    pub(crate) fn name(&self) -> Result<Vec<u8>, TransportError> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: `buf` is writable for `len` bytes; the provider writes at most that and updates `len`.
        let ret = unsafe { sys::te_getname(self.ep, buf.as_mut_ptr().cast(), &mut len) };
        check("fi_getname", ret.into())?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Inserts a peer's address (from its [`Endpoint::name`]) and returns its handle.
    pub(crate) fn insert(&mut self, name: &[u8]) -> Result<u64, TransportError> {
        if name.is_empty() || name.len() > 256 {
            return Err(TransportError::config(
                "rdma",
                format!("an endpoint address of {} bytes", name.len()),
            ));
        }
        // Linked before the insert, so the peer cannot be closed in between; a failed insert only keeps
        // the link (the peer stays open a little longer than it must).
        if let Some(id) = self.kept {
            keeper::link(id, name)?;
        }
        let mut addr = 0;
        let mut padded = [0u8; 256];
        padded[..name.len()].copy_from_slice(name);
        // SAFETY: the provider reads at most its address length (well under 256 bytes) from `padded`, which
        // holds the peer's address followed by zeroes, so even a short or foreign one reads no further; an
        // invalid address is refused by the provider with an error.
        let ret = unsafe { sys::te_av_insert(self.av, padded.as_ptr().cast(), &mut addr) };
        check("fi_av_insert", ret.into())?;
        if keeper::maps_peers_in_process(&self.info.provider) {
            match process::of_address(name) {
                Some(p) => self.processes.insert(addr, p),
                None => self.processes.remove(&addr),
            };
        }
        Ok(addr)
    }

    /// Refuses a call towards `dest` when its process is known to have exited: on `shm` such a call can
    /// spin forever on a lock the dead process held (see [`process`]).
    pub(super) fn check_alive(&self, dest: u64) -> Result<(), TransportError> {
        match self.processes.get(&dest) {
            Some(p) if !p.alive() => Err(TransportError::Unreachable(format!(
                "its process ({}) has exited",
                p.pid()
            ))),
            _ => Ok(()),
        }
    }
}

// SAFETY: the objects are owned by this value alone (taken out of their endpoint, which no longer uses
// them) and the domain is opened with FI_THREAD_SAFE, so they may be closed from any thread.
unsafe impl Send for Objects {}

impl Objects {
    /// Closes each object once, in dependency order: endpoint (after which the provider starts no access
    /// to any buffer), then `registrations` (made through it, not closed yet), address vector, queue,
    /// domain, fabric. Null ones (never opened) are skipped.
    pub(super) fn close(self, registrations: &[Registration]) {
        // SAFETY: each object was opened by one endpoint, taken from it by `Endpoint::take_objects` (which
        // leaves nulls behind), and is closed once, here; so is each registration, which its owner drained
        // from the endpoint and closes nowhere else.
        unsafe {
            if !self.ep.is_null() {
                sys::te_close_ep(self.ep);
            }
            for reg in registrations {
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
    }
}

impl Endpoint {
    fn take_objects(&mut self) -> Objects {
        Objects {
            fabric: std::mem::replace(&mut self.fabric, ptr::null_mut()),
            domain: std::mem::replace(&mut self.domain, ptr::null_mut()),
            av: std::mem::replace(&mut self.av, ptr::null_mut()),
            cq: std::mem::replace(&mut self.cq, ptr::null_mut()),
            ep: std::mem::replace(&mut self.ep, ptr::null_mut()),
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let regs: Vec<Registration> = self.regs.drain().map(|(_, r)| r).collect();
        let objects = self.take_objects();
        match self.kept {
            // Parked: its registrations close now (so its region memory can go), its objects later. The
            // pools stay with the parked objects: the provider may still hold posted receives.
            Some(id) => {
                for reg in &regs {
                    // SAFETY: each registration was opened by this endpoint and is closed once, here; no
                    // write from it is in flight that the provider would still read (nobody polls a
                    // parked endpoint again, and its peers' writes into it wait for that polling).
                    unsafe { sys::te_close_mr(reg.mr) };
                }
                keeper::close(
                    id,
                    keeper::Parked {
                        objects,
                        pools: [
                            std::mem::replace(&mut self.send, Slots::new(0, 0)),
                            std::mem::replace(&mut self.recv, Slots::new(0, 0)),
                        ],
                    },
                );
            }
            None => objects.close(&regs),
        }
        // Region memory is released only now, after its registration (and, when not kept, every object)
        // is closed; the pools drop with the fields.
        drop(regs);
    }
}
