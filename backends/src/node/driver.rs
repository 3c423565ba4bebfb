//! [`Driver`]: what a backend supplies to a [`super::Node`].

use std::fmt;
use std::time::Instant;

use transfer_engine::{
    KvLayout, MemoryRegion, PeerId, RegionHandle, RegionId, SessionId, TransferRequest,
};

use super::core::NodeCore;
use super::reach::Verdict;
use crate::transport::{BoxFuture, PeerAddress, PeerInfo, TransportError};

mod sealed {
    /// Only this crate's backends drive a node.
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// What a call asks of a node: to send, or to receive (a loopback end does only one of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sending sessions: submit, layers written, cancel, wait.
    Send,
    /// Receiving sessions: incoming notices, layers, abandoning.
    Receive,
}

/// How one backend moves bytes: everything a [`super::Node`] cannot do the same way for every backend.
/// The node owns the rest through the driver's [`NodeCore`]: the engine and its board, the log, the
/// segments offered and the dead-peer verdicts. Sealed: this crate's backends (`loopback`, `tcp`, `rdma`,
/// `shm`) are its only implementations, so its methods are not part of the public API.
pub trait Driver: Sealed + Send + Sync + fmt::Debug + Sized + 'static {
    /// The backend's name (`tcp`, `rdma`, `shm`, `loopback`), for messages and metrics.
    const BACKEND: &'static str;

    /// What the node and this driver's tasks share.
    #[doc(hidden)]
    fn core(&self) -> &NodeCore;

    /// Wakes the backend's I/O after a command changed the engine (a driver that polls needs nothing).
    #[doc(hidden)]
    fn wake(&self) {}

    /// Where peers reach this node; `None` for one that only dials.
    #[doc(hidden)]
    fn address(&self) -> Option<PeerAddress>;

    /// Reaches the node at `address` (an address of another backend is refused).
    #[doc(hidden)]
    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>>;

    /// Registers `memory` as a KV region of `layout` with the engine and whatever the backend's I/O
    /// needs of it (a provider registration, an IPC export), or refuses memory it cannot move.
    #[doc(hidden)]
    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError>;

    /// Region `id` left the engine: the backend lets go of what it registered for it.
    #[doc(hidden)]
    fn region_unregistered(&self, id: RegionId) {
        let _ = id;
    }

    /// Refuses a session the backend has no route for (a peer never reached, a region it does not
    /// offer, an I/O path that is stuck).
    #[doc(hidden)]
    fn check_route(&self, req: &TransferRequest) -> Result<(), TransportError>;

    /// Starts the session in the engine (after [`Driver::check_route`], with the peer admitted); a
    /// backend that keeps its own record of a session makes it here.
    #[doc(hidden)]
    fn start_session(&self, req: TransferRequest) -> Result<SessionId, TransportError> {
        Ok(self.core().station.submit(req)?)
    }

    /// Whether `verdict` on `peer` still refuses new sessions at `now`. By default a verdict holds until
    /// the peer is heard from again.
    #[doc(hidden)]
    fn verdict_holds(&self, peer: PeerId, verdict: &Verdict, now: Instant) -> bool {
        let _ = (peer, verdict, now);
        true
    }

    /// A verdict on `peer` was cleared for a new session (its hold ended): the backend may try the peer
    /// afresh.
    #[doc(hidden)]
    fn verdict_cleared(&self, peer: PeerId, now: Instant) {
        let _ = (peer, now);
    }

    /// Refuses a call this node cannot make (a loopback producer does not receive); every other node
    /// makes both.
    #[doc(hidden)]
    fn check_role(&self, role: Role) -> Result<(), TransportError> {
        let _ = role;
        Ok(())
    }

    /// Stops the backend's tasks or threads, closes its connections and wakes every waiter with
    /// [`crate::WaitError::Closed`]. Idempotent.
    #[doc(hidden)]
    fn shutdown(&self);

    /// The node is dropped: shuts it down, unless something else still holds what it drives (a loopback
    /// pair lives while either end does).
    #[doc(hidden)]
    fn release(&self) {
        self.shutdown();
    }
}
