//! The data plane under a connector: a TCP node, or one end of an in-process loopback pair. Both offer the
//! same calls; this is the one place that tells them apart.

use std::sync::Arc;
use std::time::Duration;

use backends::board::{Outcome, WaitError};
use backends::loopback::{LoopbackError, LoopbackPair};
use backends::tcp::{TcpError, TcpNode};
use transfer_engine::{
    BlockId, KvLayout, MemoryRegion, RegionHandle, SessionId, ShapingConfig, TransferRequest,
};

use crate::error::ConnectorError;

/// Where a connector's KV travels.
#[derive(Debug, Clone)]
pub(crate) enum Transport {
    /// A TCP node (two processes, or two machines).
    Tcp(Arc<TcpNode>),
    /// The producer end of an in-process loopback pair.
    LoopbackProducer(Arc<LoopbackPair>),
    /// The consumer end of an in-process loopback pair.
    LoopbackConsumer(Arc<LoopbackPair>),
}

/// How waiting for a layer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LayerWait {
    /// The layer arrived whole and verified.
    Arrived,
    /// The session ended without it: these destination blocks must be recomputed.
    Lost(Vec<BlockId>),
}

fn wait_error(e: ConnectorError) -> Option<WaitError> {
    match e {
        ConnectorError::Tcp(TcpError::Wait(w)) => Some(w),
        ConnectorError::Loopback(LoopbackError::Wait(w)) => Some(w),
        _ => None,
    }
}

impl Transport {
    /// Registers `memory` as a KV region of `layout`.
    pub(crate) fn register(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, ConnectorError> {
        Ok(match self {
            Transport::Tcp(n) => n.register_kv_region(layout, memory)?,
            Transport::LoopbackProducer(p) => p.producer().register_kv_region(layout, memory)?,
            Transport::LoopbackConsumer(p) => p.consumer().register_kv_region(layout, memory)?,
        })
    }

    /// Sets this end's traffic shaping (the KV bandwidth cap).
    pub(crate) fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), ConnectorError> {
        match self {
            Transport::Tcp(n) => n.set_shaping(shaping)?,
            Transport::LoopbackProducer(p) => p.producer().set_shaping(shaping)?,
            Transport::LoopbackConsumer(p) => p.consumer().set_shaping(shaping)?,
        }
        Ok(())
    }

    /// Starts a transfer from this end.
    pub(crate) fn submit(&self, req: TransferRequest) -> Result<SessionId, ConnectorError> {
        Ok(match self {
            Transport::Tcp(n) => n.submit(req)?,
            Transport::LoopbackProducer(p) => p.submit(req)?,
            Transport::LoopbackConsumer(_) => {
                return Err(ConnectorError::Role {
                    call: "sending KV",
                    role: "loopback consumer",
                });
            }
        })
    }

    /// The producer has saved every layer below `until` of the blocks sending session `session` carries.
    pub(crate) fn layers_written(
        &self,
        session: SessionId,
        until: u32,
    ) -> Result<(), ConnectorError> {
        match self {
            Transport::Tcp(n) => n.layers_written(session, until)?,
            Transport::LoopbackProducer(p) => p.layers_written(session, until)?,
            Transport::LoopbackConsumer(_) => return Err(Self::not_sending()),
        }
        Ok(())
    }

    /// Stops sending session `session`; its unacknowledged blocks are recomputed.
    pub(crate) fn cancel(&self, session: SessionId) -> Result<(), ConnectorError> {
        match self {
            Transport::Tcp(n) => n.cancel(session)?,
            Transport::LoopbackProducer(p) => p.cancel(session)?,
            Transport::LoopbackConsumer(_) => return Err(Self::not_sending()),
        }
        Ok(())
    }

    fn not_sending() -> ConnectorError {
        ConnectorError::Role {
            call: "sending KV",
            role: "loopback consumer",
        }
    }

    /// Waits until sending session `session` is over.
    pub(crate) async fn wait_sent(
        &self,
        session: SessionId,
        limit: Duration,
    ) -> Result<Outcome, ConnectorError> {
        Ok(match self {
            Transport::Tcp(n) => n.wait(session, limit).await?,
            Transport::LoopbackProducer(p) => {
                match tokio::time::timeout(limit, p.producer().wait(session)).await {
                    Ok(out) => out?,
                    Err(_) => {
                        return Err(ConnectorError::Control {
                            peer: "loopback".into(),
                            message: format!("session {session} did not finish within {limit:?}"),
                        });
                    }
                }
            }
            Transport::LoopbackConsumer(_) => {
                return Err(ConnectorError::Role {
                    call: "sending KV",
                    role: "loopback consumer",
                });
            }
        })
    }

    /// The consumer is about to compute `layer` of `session` (moves the prefetch window).
    pub(crate) fn consume_layer(
        &self,
        session: SessionId,
        layer: u32,
    ) -> Result<bool, ConnectorError> {
        Ok(match self {
            Transport::Tcp(n) => n.consume_layer(session, layer)?,
            Transport::LoopbackConsumer(p) => p.consumer().consume_layer(session, layer)?,
            Transport::LoopbackProducer(_) => {
                return Err(ConnectorError::Role {
                    call: "receiving KV",
                    role: "loopback producer",
                });
            }
        })
    }

    /// Tells the sender the consumer is at `layer` of `session`, then waits until that layer is whole, or
    /// the session ended without it. A session this end has not heard of yet (the producer's answer can
    /// overtake its first frame) is waited for; the caller bounds the wait.
    pub(crate) async fn wait_layer(
        &self,
        session: SessionId,
        layer: u32,
    ) -> Result<LayerWait, ConnectorError> {
        loop {
            let _ = self.consume_layer(session, layer);
            let r: Result<(), ConnectorError> = match self {
                Transport::Tcp(n) => n.wait_layer(session, layer).await.map_err(Into::into),
                Transport::LoopbackConsumer(p) => p
                    .consumer()
                    .wait_layer(session, layer)
                    .await
                    .map_err(Into::into),
                Transport::LoopbackProducer(_) => Err(ConnectorError::Role {
                    call: "receiving KV",
                    role: "loopback producer",
                }),
            };
            return match r {
                Ok(()) => Ok(LayerWait::Arrived),
                Err(e) => match wait_error(e) {
                    Some(WaitError::LayerLost { blocks, .. }) => Ok(LayerWait::Lost(blocks)),
                    Some(WaitError::UnknownSession(_)) => {
                        tokio::time::sleep(Duration::from_micros(200)).await;
                        continue;
                    }
                    Some(other) => Err(ConnectorError::Control {
                        peer: "transport".into(),
                        message: other.to_string(),
                    }),
                    None => Err(ConnectorError::LayerLost { session, layer }),
                },
            };
        }
    }

    /// Destination blocks of receiving session `session` that did not arrive intact, once it is over
    /// (`None` if that is not known within `limit`).
    pub(crate) async fn unfinished_blocks(
        &self,
        session: SessionId,
        limit: Duration,
    ) -> Option<Vec<BlockId>> {
        let wait = async {
            match self {
                Transport::Tcp(n) => n.wait_received(session).await.ok(),
                Transport::LoopbackConsumer(p) => p.consumer().wait_received(session).await.ok(),
                Transport::LoopbackProducer(_) => None,
            }
        };
        tokio::time::timeout(limit, wait)
            .await
            .ok()
            .flatten()
            .map(|r| r.recompute)
    }

    /// Accepts incoming sessions forever (the connector tracks them by id), so their notices never pile
    /// up. Ends when the node shuts down.
    pub(crate) async fn drain_incoming(self) {
        loop {
            let r = match &self {
                Transport::Tcp(n) => n.accept().await.map(drop).map_err(drop),
                Transport::LoopbackConsumer(p) => {
                    p.consumer().accept().await.map(drop).map_err(drop)
                }
                Transport::LoopbackProducer(_) => return,
            };
            if r.is_err() {
                return;
            }
        }
    }

    /// Data frames this end sent again.
    pub(crate) fn retransmits(&self) -> u64 {
        match self {
            Transport::Tcp(n) => n.stats().engine.retransmits,
            Transport::LoopbackProducer(p) => p.producer().stats().retransmits,
            Transport::LoopbackConsumer(p) => p.consumer().stats().retransmits,
        }
    }
}
