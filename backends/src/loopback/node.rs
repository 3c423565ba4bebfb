//! One end of a loopback pair as a node: [`LoopbackNode`], a [`Node`] of [`LoopbackDriver`]. The producer
//! end sends and the consumer end receives; a call for the other role is refused with
//! [`TransportError::Unsupported`].

use std::fmt;
use std::sync::Arc;

use transfer_engine::{KvLayout, MemoryRegion, RegionHandle, RegionId, SessionId, TransferRequest};

use super::{LoopbackEnd, LoopbackPair};
use crate::lock::lock;
use crate::node::log::Log;
use crate::node::station::Station;
use crate::node::{Driver, Node, Role, driver::Sealed};
use crate::transport::{BoxFuture, PeerAddress, PeerInfo, Segment, TransportError};

/// Which end of a loopback pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The sending end.
    Producer,
    /// The receiving end.
    Consumer,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Producer => "producer",
            Side::Consumer => "consumer",
        })
    }
}

/// One end of a [`LoopbackPair`], usable wherever a [`crate::Transport`] is: the pair lives while either
/// end does (dropping one end does not shut it down; [`Node::shutdown`] does).
pub type LoopbackNode = Node<LoopbackDriver>;

/// One end of a shared [`LoopbackPair`]: what a [`LoopbackNode`] drives.
#[derive(Debug)]
pub struct LoopbackDriver {
    pair: Arc<LoopbackPair>,
    side: Side,
}

impl LoopbackPair {
    /// The pair's two ends as transports: the producer, then the consumer.
    #[must_use]
    pub fn into_nodes(self) -> (LoopbackNode, LoopbackNode) {
        let pair = Arc::new(self);
        let producer = Node::from_driver(LoopbackDriver {
            pair: pair.clone(),
            side: Side::Producer,
        });
        let consumer = Node::from_driver(LoopbackDriver {
            pair,
            side: Side::Consumer,
        });
        (producer, consumer)
    }
}

impl Node<LoopbackDriver> {
    /// Which end this is.
    #[must_use]
    pub fn side(&self) -> Side {
        self.driver().side
    }

    /// The pair both ends share.
    #[must_use]
    pub fn pair(&self) -> &Arc<LoopbackPair> {
        &self.driver().pair
    }
}

impl LoopbackDriver {
    fn end(&self) -> &LoopbackEnd {
        match self.side {
            Side::Producer => self.pair.producer(),
            Side::Consumer => self.pair.consumer(),
        }
    }

    fn other(&self) -> &LoopbackEnd {
        match self.side {
            Side::Producer => self.pair.consumer(),
            Side::Consumer => self.pair.producer(),
        }
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

impl Sealed for LoopbackDriver {}

impl Driver for LoopbackDriver {
    const BACKEND: &'static str = "loopback";

    fn station(&self) -> &Station {
        &self.end().station
    }

    fn engine_id(&self) -> u32 {
        self.end().station.engine().config().engine_id
    }

    fn log(&self) -> &Log {
        &self.end().refused.lines
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
            if let Some(reason) = lock(&self.end().peer_gone).clone() {
                return Err(TransportError::Unreachable(reason));
            }
            Ok(PeerInfo {
                peer: self.other().peer_id(),
                segments: lock(&self.other().segments).clone(),
            })
        })
    }

    /// Transfers read from the memory or place into it in place.
    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        self.end().register_kv_region(layout, memory)
    }

    fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        let memory = self.end().unregister_region(id)?;
        lock(&self.end().segments).retain(|s| s.handle.id != id);
        Ok(memory)
    }

    fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), TransportError> {
        self.end().memory(handle.id)?;
        Segment::offer(&mut lock(&self.end().segments), name, handle);
        Ok(())
    }

    fn submit(&self, req: TransferRequest) -> Result<SessionId, TransportError> {
        self.only(Side::Producer, "send")?;
        self.pair.submit(req)
    }

    fn check_role(&self, role: Role) -> Result<(), TransportError> {
        match role {
            Role::Send => self.only(Side::Producer, "send"),
            Role::Receive => self.only(Side::Consumer, "receive"),
        }
    }

    /// Stops this end, as a process exiting would (see [`LoopbackPair::shutdown`]).
    fn shutdown(&self) {
        self.pair.shutdown(self.side);
    }

    /// Nothing: the pair stops when its last holder drops it.
    fn release(&self) {}
}
