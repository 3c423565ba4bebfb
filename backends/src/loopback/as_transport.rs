//! One end of a loopback pair as a [`Transport`]: [`LoopbackNode`]. The producer end sends and the
//! consumer end receives; a call for the other role is refused with [`TransportError::Unsupported`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use transfer_engine::{
    Counters, Event, KvLayout, MemoryRegion, RegionHandle, RegionId, SessionId, ShapingConfig,
    TransferRequest,
};

use super::{LoopbackEnd, LoopbackError, LoopbackPair};
use crate::board::{IncomingSession, Outcome, Received};
use crate::lock::lock;
use crate::transport::{BoxFuture, PeerAddress, PeerInfo, Segment, Transport, TransportError};

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

/// One end of a [`LoopbackPair`], usable wherever a [`Transport`] is: the pair lives while either end does.
#[derive(Debug, Clone)]
pub struct LoopbackNode {
    pair: Arc<LoopbackPair>,
    side: Side,
}

impl LoopbackPair {
    /// The pair's two ends as transports: the producer, then the consumer.
    #[must_use]
    pub fn into_nodes(self) -> (LoopbackNode, LoopbackNode) {
        let pair = Arc::new(self);
        let producer = LoopbackNode {
            pair: pair.clone(),
            side: Side::Producer,
        };
        (
            producer,
            LoopbackNode {
                pair,
                side: Side::Consumer,
            },
        )
    }
}

impl LoopbackNode {
    /// Which end this is.
    #[must_use]
    pub fn side(&self) -> Side {
        self.side
    }

    /// The pair both ends share.
    #[must_use]
    pub fn pair(&self) -> &Arc<LoopbackPair> {
        &self.pair
    }

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
        Err(LoopbackError::Unsupported {
            end: self.side,
            what,
        }
        .into())
    }
}

impl Transport for LoopbackNode {
    fn backend(&self) -> &'static str {
        "loopback"
    }

    fn engine_id(&self) -> u32 {
        self.end().station.engine().config().engine_id
    }

    fn address(&self) -> Option<PeerAddress> {
        Some(PeerAddress::Loopback)
    }

    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        Ok(self.end().register_kv_region(layout, memory)?)
    }

    fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        let memory = self.end().unregister_region(id)?;
        lock(&self.end().segments).retain(|s| s.handle.id != id);
        Ok(memory)
    }

    fn memory(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        Ok(self.end().memory(id)?)
    }

    fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), TransportError> {
        self.end().memory(handle.id)?;
        let mut segments = lock(&self.end().segments);
        segments.retain(|s| s.name != name);
        segments.push(Segment {
            name: name.to_owned(),
            handle,
        });
        Ok(())
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

    fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), TransportError> {
        Ok(self.end().set_shaping(shaping)?)
    }

    fn submit(&self, req: TransferRequest) -> Result<SessionId, TransportError> {
        self.only(Side::Producer, "send")?;
        Ok(self.pair.submit(req)?)
    }

    fn layers_written(&self, session: SessionId, until: u32) -> Result<(), TransportError> {
        self.only(Side::Producer, "send")?;
        Ok(self.pair.layers_written(session, until)?)
    }

    fn cancel(&self, session: SessionId) -> Result<(), TransportError> {
        self.only(Side::Producer, "send")?;
        Ok(self.pair.cancel(session)?)
    }

    fn wait(
        &self,
        session: SessionId,
        limit: Duration,
    ) -> BoxFuture<'_, Result<Outcome, TransportError>> {
        Box::pin(async move {
            self.only(Side::Producer, "send")?;
            match tokio::time::timeout(limit, self.end().wait(session)).await {
                Ok(outcome) => Ok(outcome?),
                Err(_) => Err(TransportError::Timeout {
                    what: format!("session {session}"),
                    waited: limit,
                }),
            }
        })
    }

    fn next_incoming(&self) -> BoxFuture<'_, Result<IncomingSession, TransportError>> {
        Box::pin(async move {
            self.only(Side::Consumer, "receive")?;
            Ok(self.end().next_incoming().await?)
        })
    }

    fn wait_announced(&self, session: SessionId) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            self.only(Side::Consumer, "receive")?;
            Ok(self.end().station.board.wait_announced(session).await?)
        })
    }

    fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, TransportError> {
        self.only(Side::Consumer, "receive")?;
        Ok(self.end().consume_layer(session, layer)?)
    }

    fn abandon_receive(&self, session: SessionId) -> Result<(), TransportError> {
        self.only(Side::Consumer, "receive")?;
        Ok(self.end().abandon_receive(session)?)
    }

    fn wait_layer(
        &self,
        session: SessionId,
        layer: u32,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            self.only(Side::Consumer, "receive")?;
            Ok(self.end().wait_layer(session, layer).await?)
        })
    }

    fn wait_received(&self, session: SessionId) -> BoxFuture<'_, Result<Received, TransportError>> {
        Box::pin(async move {
            self.only(Side::Consumer, "receive")?;
            Ok(self.end().wait_received(session).await?)
        })
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.end().subscribe()
    }

    fn counters(&self) -> Counters {
        self.end().stats()
    }

    fn live_sessions(&self) -> usize {
        self.end().live_sessions()
    }

    fn shutdown(&self) {
        self.pair.shutdown(self.side);
    }
}
