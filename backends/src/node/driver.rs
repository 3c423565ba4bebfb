//! [`Driver`]: what a backend supplies to a [`super::Node`].

use std::fmt;

use transfer_engine::{KvLayout, MemoryRegion, RegionHandle, RegionId, SessionId, TransferRequest};

use super::log::Log;
use super::station::Station;
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
/// Sealed: this crate's backends (`loopback`, `tcp`, `rdma`, `shm`) are its only implementations, so its methods are
/// not part of the public API.
pub trait Driver: Sealed + Send + Sync + fmt::Debug + Sized + 'static {
    /// The backend's name (`tcp`, `rdma`, `shm`), for messages and metrics.
    const BACKEND: &'static str;

    /// The engine and its board.
    #[doc(hidden)]
    fn station(&self) -> &Station;

    /// This node's engine id.
    #[doc(hidden)]
    fn engine_id(&self) -> u32;

    /// The node's log.
    #[doc(hidden)]
    fn log(&self) -> &Log;

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

    /// Unregisters region `id` (no live session uses it) from the engine and the backend's I/O, and
    /// stops offering it.
    #[doc(hidden)]
    fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TransportError>;

    /// Offers registered region `handle` to peers under `name`.
    #[doc(hidden)]
    fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), TransportError>;

    /// Starts a transfer once the backend has a route to its peer (and the peer is not held
    /// unreachable).
    #[doc(hidden)]
    fn submit(&self, req: TransferRequest) -> Result<SessionId, TransportError>;

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
