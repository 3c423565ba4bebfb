//! One node, many drivers: [`Node`] is written once (the engine's calls, waits, events and the
//! [`Transport`] implementation), and each backend supplies only a [`Driver`]: how it starts, how it
//! reaches a peer, what registering memory and routing a session cost it, how its I/O is woken, and how it
//! stops. `LoopbackNode`, `TcpNode`, `ShmNode` and `RdmaNode` are `Node`s of their backend's driver; each adds the calls
//! only its backend has (a TCP node's lanes, an RDMA node's provider, ...) in an `impl Node<ItsDriver>`.
//!
//! What every node shares lives once, in its driver's [`NodeCore`]: the engine and its board (events,
//! incoming sessions, waits), the [`log`], the segments offered to peers and the dead-peer rule's
//! verdicts. Every call answers with [`TransportError`], whose [`TransportError::fault`] says
//! who must act.

mod calls;
pub(crate) mod core;
pub(crate) mod driver;
pub mod handshake;
mod liveness;
pub mod log;
pub(crate) mod reach;
pub(crate) mod station;
mod transport;

use std::fmt;

pub use core::NodeCore;
pub use driver::Driver;
pub(crate) use driver::Role;
pub use liveness::Liveness;
pub use log::{KEEP_LINES, LogEntry, LogKind};

#[cfg(doc)]
use crate::transport::{Transport, TransportError};

/// One engine and its I/O, whatever moves the bytes; see the [module docs](self). Dropping it shuts it
/// down.
pub struct Node<D: Driver> {
    driver: D,
}

impl<D: Driver> Node<D> {
    /// A node driven by `driver`.
    pub(crate) fn from_driver(driver: D) -> Self {
        Self { driver }
    }

    /// The backend's driver.
    pub(crate) fn driver(&self) -> &D {
        &self.driver
    }
}

impl<D: Driver> fmt::Debug for Node<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("backend", &D::BACKEND)
            .field("driver", &self.driver)
            .finish()
    }
}

impl<D: Driver> Drop for Node<D> {
    fn drop(&mut self) {
        self.driver.release();
    }
}
