//! libfabric resources behind safe owners: the backend's `unsafe` code lives in the files of this module
//! that call libfabric or hold memory it writes (`endpoint.rs`, `io.rs`, `registration.rs`, `info.rs`,
//! `slots.rs`, `dma.rs`), each allowing it for itself; `keeper.rs` and `process.rs` hold none.
//!
//! [`Endpoint`] owns one reliable-datagram endpoint and everything under it (fabric, domain, address vector,
//! completion queue), the memory registrations made through it, and two pools of registered message slots
//! (sends and pre-posted receives). Every buffer the provider may touch is owned or kept alive by the
//! endpoint until the operation's completion is read or the endpoint is closed, so the safe methods cannot
//! hand the provider a dangling pointer. Teardown closes in dependency order: registrations, endpoint,
//! address vector, completion queue, domain, fabric; only then are buffers and region memory released. On
//! providers that map in-process peers' memory directly (`shm`), the objects stay open, unpolled, until no
//! open endpoint of this process can reach them ([`keeper`]).
//!
//! The declarations come from bindgen over `csrc/rdma_shim.h` (see build.rs); the shim turns libfabric's
//! `static inline` calls into plain functions.

use std::collections::HashMap;
use std::ffi::c_void;

use transfer_engine::MemoryRegion;

#[allow(
    unsafe_code,
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

mod dma;
mod endpoint;
mod info;
mod io;
mod keeper;
mod process;
mod registration;
mod slots;

pub(crate) use dma::DmaBuffer;
pub use info::ProviderInfo;
pub(crate) use info::providers;
pub use keeper::parked_endpoints;
pub(crate) use slots::guarded_region;

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
    /// The registered memory, kept alive until the registration is closed.
    memory: Registered,
    key: u64,
    desc: *mut c_void,
    in_flight: usize,
}

/// What a registration covers, kept alive with it.
#[derive(Debug)]
enum Registered {
    /// A region's memory, registered in place.
    Region(MemoryRegion),
    /// A mirror that peers write into ([`DmaBuffer`]).
    Dma(std::sync::Arc<DmaBuffer>),
    /// One of the endpoint's own message pools (which the endpoint keeps alive itself).
    Pool {
        /// Where it starts.
        address: usize,
        /// Its length.
        len: usize,
    },
}

impl Registered {
    fn address(&self) -> usize {
        match self {
            Registered::Region(m) => m.address(),
            Registered::Dma(d) => d.address() as usize,
            Registered::Pool { address, .. } => *address,
        }
    }

    fn len(&self) -> usize {
        match self {
            Registered::Region(m) => m.len(),
            Registered::Dma(d) => d.len(),
            Registered::Pool { len, .. } => *len,
        }
    }
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
    /// Set when the provider maps in-process peers' memory directly (see [`keeper`]).
    kept: Option<keeper::KeptId>,
    /// The processes of peers inserted on a provider that maps their memory, by address handle (see
    /// [`process`]).
    processes: HashMap<u64, process::PeerProcess>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// The libfabric objects under one endpoint.
pub(super) struct Objects {
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    av: *mut sys::fid_av,
    cq: *mut sys::fid_cq,
    ep: *mut sys::fid_ep,
}
