//! One end of a loopback pair as a node: [`LoopbackNode`], a [`Node`] of [`LoopbackDriver`]. The producer
//! end sends and the consumer end receives; a call for the other role is refused with
//! [`TransportError::Unsupported`]. Both ends share [`Ends`]: the two ends' state and threads, stopped
//! when the last end is dropped.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use transfer_engine::{Error, KvLayout, MemoryRegion, RegionHandle, TransferRequest};

use super::{CONSUMER, LoopbackEnd};
use crate::lock::lock;
use crate::node::{Driver, Node, NodeCore, Role, driver::Sealed};
use crate::transport::{BoxFuture, PeerAddress, PeerInfo, TransportError};

/// Which end of a loopback pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The sending end.
    Producer,
    /// The receiving end.
    Consumer,
}

impl Side {
    fn index(self) -> usize {
        match self {
            Side::Producer => 0,
            Side::Consumer => 1,
        }
    }
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Producer => "producer",
            Side::Consumer => "consumer",
        })
    }
}

/// One end of a [`super::LoopbackPair`], usable wherever a [`crate::Transport`] is: the pair's threads run
/// while either end lives (dropping one end does not stop them; [`Node::shutdown`] does).
pub type LoopbackNode = Node<LoopbackDriver>;

/// One end's stop flag and thread (taken when it is joined).
type EndThread = (Arc<AtomicBool>, std::sync::Mutex<Option<JoinHandle<()>>>);

/// The two ends of a pair and their threads, shared by both ends' drivers.
#[derive(Debug)]
pub(crate) struct Ends {
    ends: [Arc<LoopbackEnd>; 2],
    threads: [EndThread; 2],
}

impl Ends {
    pub(crate) fn new(
        ends: [Arc<LoopbackEnd>; 2],
        stops: [Arc<AtomicBool>; 2],
        threads: [JoinHandle<()>; 2],
    ) -> Self {
        let [p_stop, c_stop] = stops;
        let [p_thread, c_thread] = threads;
        Self {
            ends,
            threads: [
                (p_stop, std::sync::Mutex::new(Some(p_thread))),
                (c_stop, std::sync::Mutex::new(Some(c_thread))),
            ],
        }
    }

    fn end(&self, side: Side) -> &LoopbackEnd {
        &self.ends[side.index()]
    }

    fn other(&self, side: Side) -> &LoopbackEnd {
        &self.ends[1 - side.index()]
    }

    /// Stops one end, as a process exiting would: its thread ends, its waiters are woken, and the other
    /// end declares it unreachable at once (its sessions with it end with recompute; new ones are
    /// refused). Idempotent.
    pub(crate) fn shutdown(&self, side: Side) {
        let (this, other) = (self.end(side), self.other(side));
        let (stop, thread) = &self.threads[side.index()];
        stop.store(true, Ordering::Relaxed);
        this.wake();
        let Some(thread) = lock(thread).take() else {
            return;
        };
        let _ = thread.join();
        this.core.station.board.close();
        other.core.declare_unreachable(
            this.peer_id(),
            format!("the loopback {side} was shut down"),
            Instant::now(),
        );
    }
}

impl Drop for Ends {
    fn drop(&mut self) {
        self.shutdown(Side::Producer);
        self.shutdown(Side::Consumer);
    }
}

/// One end of a shared pair: what a [`LoopbackNode`] drives.
#[derive(Debug)]
pub struct LoopbackDriver {
    ends: Arc<Ends>,
    side: Side,
}

impl LoopbackDriver {
    pub(crate) fn new(ends: Arc<Ends>, side: Side) -> Self {
        Self { ends, side }
    }

    pub(crate) fn ends(&self) -> &Ends {
        &self.ends
    }

    fn end(&self) -> &LoopbackEnd {
        self.ends.end(self.side)
    }

    fn other(&self) -> &LoopbackEnd {
        self.ends.other(self.side)
    }

    fn only(&self, side: Side, what: &'static str) -> Result<(), TransportError> {
        if self.side == side {
            return Ok(());
        }
        Err(TransportError::Unsupported {
            backend: "loopback",
            what: format!("{what} from its {} end", self.side),
        })
    }
}

impl Node<LoopbackDriver> {
    /// Which end this is.
    #[must_use]
    pub fn side(&self) -> Side {
        self.driver().side
    }

    /// The engine's counters (a loopback end has no counters of its own beside them).
    #[must_use]
    pub fn stats(&self) -> transfer_engine::Counters {
        self.counters()
    }
}

impl Sealed for LoopbackDriver {}

impl Driver for LoopbackDriver {
    const BACKEND: &'static str = "loopback";

    fn core(&self) -> &NodeCore {
        &self.end().core
    }

    fn wake(&self) {
        self.end().wake();
    }

    fn address(&self) -> Option<PeerAddress> {
        Some(PeerAddress::Loopback)
    }

    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>> {
        Box::pin(async move {
            if *address != PeerAddress::Loopback {
                return Err(TransportError::cannot_reach("loopback", address));
            }
            let peer = self.other().peer_id();
            if let Some(verdict) = self.core().verdict(peer) {
                return Err(TransportError::Unreachable(verdict.reason));
            }
            Ok(PeerInfo {
                peer,
                segments: self.other().core.segments.list(),
            })
        })
    }

    /// Transfers read from the memory or place into it in place.
    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        Ok(self.core().station.register_kv_region(layout, memory)?)
    }

    /// A producer sends only to its consumer, never from the memory it places into.
    fn check_route(&self, req: &TransferRequest) -> Result<(), TransportError> {
        if req.peer != CONSUMER {
            return Err(TransportError::NoRoute {
                peer: req.peer,
                why: format!("a loopback producer sends only to its consumer ({CONSUMER:?})"),
            });
        }
        let src = self.core().station.engine().memory(req.src_region)?.clone();
        let dst = self
            .other()
            .core
            .station
            .engine()
            .memory(req.dst_region)
            .cloned();
        if let Ok(dst) = dst
            && src.same_memory(&dst)
        {
            return Err(Error::SameRegion.into());
        }
        Ok(())
    }

    fn check_role(&self, role: Role) -> Result<(), TransportError> {
        match role {
            Role::Send => self.only(Side::Producer, "send"),
            Role::Receive => self.only(Side::Consumer, "receive"),
        }
    }

    /// Stops this end, as a process exiting would (see [`super::LoopbackPair::shutdown`]).
    fn shutdown(&self) {
        self.ends.shutdown(self.side);
    }

    /// Nothing: the pair stops when its last end is dropped.
    fn release(&self) {}
}
