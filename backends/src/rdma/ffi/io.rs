//! Messages, RMA writes and completions on an [`Endpoint`]: posting and reading receive slots, sending
//! from send slots, one-sided writes with remote CQ data, and reading the completion queue.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr;

use super::info::check;
use super::{Completion, Endpoint, KIND_MASK, KIND_RECV, KIND_SEND, KIND_WRITE, MrId, sys};
use crate::TransportError;
use crate::rdma::{own, unknown_registration};

impl Endpoint {
    pub(super) fn post_recv(&mut self, slot: usize) -> Result<(), TransportError> {
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

    /// The bytes of receive slot `slot` after its [`Completion::Received`], until it is reposted.
    pub(crate) fn received(&self, slot: usize, len: usize) -> Result<&[u8], TransportError> {
        if slot >= self.recv.count || !self.recv_out[slot] || len > self.recv.slot_bytes {
            return Err(own(format!(
                "receive slot {slot} ({len} bytes) is not completed"
            )));
        }
        // SAFETY: the slot's receive completed and it is not reposted, so the provider no longer writes
        // it; the slice borrows `self`, so `repost` cannot run while it lives.
        Ok(unsafe { std::slice::from_raw_parts(self.recv.ptr(slot), len) })
    }

    /// Posts receive slot `slot` again after its message was handled.
    pub(crate) fn repost(&mut self, slot: usize) -> Result<(), TransportError> {
        if slot >= self.recv.count || !self.recv_out[slot] {
            return Err(own(format!("receive slot {slot} is already posted")));
        }
        self.post_recv(slot)
    }

    /// Sends `bytes` as one message to `dest`. Returns `false` when no slot is free or the provider asks
    /// to try again (nothing was sent).
    pub(crate) fn send(&mut self, dest: u64, bytes: &[u8]) -> Result<bool, TransportError> {
        if bytes.len() > self.send.slot_bytes {
            return Err(TransportError::config(
                "rdma",
                format!(
                    "a message of {} bytes exceeds the {}-byte slots: raise slot_bytes",
                    bytes.len(),
                    self.send.slot_bytes
                ),
            ));
        }
        self.check_alive(dest)?;
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
    ) -> Result<bool, TransportError> {
        if ctx & KIND_MASK != 0 {
            return Err(own(format!("write context {ctx:#x} is too large")));
        }
        self.check_alive(dest)?;
        let reg = self
            .regs
            .get_mut(&src)
            .ok_or_else(|| unknown_registration(src.0))?;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > reg.memory.len())
        {
            return Err(own(format!(
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
    pub(crate) fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, TransportError> {
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

    fn read_error(&mut self) -> Result<Completion, TransportError> {
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
