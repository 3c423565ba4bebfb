//! Whether peers' NICs reach a node's host regions in place or through mirrors: [`HostMemoryAccess`].
//!
//! A NIC writes registered memory with no lock, and reads it with none until its write completes. Between
//! host regions that the caller also reads and writes through [`transfer_engine::MemoryRegion`]'s safe
//! views, that would let a safe view race with the NIC, so by default a node registers a host mirror of
//! each host region and copies units between region and mirror under the region's shard locks (the safe
//! API's contract holds on RDMA as on every backend). Registering the caller's memory itself, zero-copy, is
//! a promise only the caller can make: [`InPlace::granted`] is `unsafe`, and this module exists to hold it.
#![allow(unsafe_code)]

/// How a node lets NICs at its host regions (GPU regions follow [`super::RdmaConfig::gpu_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostMemoryAccess {
    /// Through a host mirror of each region, the size of the region: a unit is copied from its region
    /// into the mirror before its writes are posted, and from the mirror into its region (CRC-32C taken in
    /// the same pass) before the engine hears of it. Costs a copy at each end and the mirror's memory; no
    /// safe view of the region can race with a NIC.
    #[default]
    Mirrored,
    /// The caller's memory registered as it is (zero-copy), under the promise [`InPlace::granted`] makes.
    InPlace(InPlace),
}

/// The caller's permission to register its host regions in place; see [`InPlace::granted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InPlace {
    _promised: (),
}

impl InPlace {
    /// Permission for a node to register host regions in place: peers' NICs then write into them, and
    /// this node's NIC reads from them, outside the regions' shard locks.
    ///
    /// # Safety
    /// While a node with this permission holds such a region (registered, and after unregistering it
    /// until the node's driver has deregistered it: until the node is shut down, to be sure), the caller
    /// (and every clone of its `MemoryRegion`) must not:
    /// - read, through a safe view or otherwise, a destination block of a live receiving session before it
    ///   is reported delivered, nor a delivered one while its sender may still resend it (until the
    ///   session is over at both ends);
    /// - write a source block of a live sending session, nor any byte a peer may be writing;
    /// - let a peer that does not follow the protocol hold the region's key (a peer with the key can write
    ///   any byte of the region at any time).
    ///
    /// Breaking these is a data race between the NIC and the caller's own accesses.
    #[must_use]
    pub unsafe fn granted() -> Self {
        InPlace { _promised: () }
    }
}
