//! The data plane under a connector: any [`Transport`] (loopback, TCP, RDMA), and the few waits the
//! connector builds from its calls.

use std::sync::Arc;
use std::time::Duration;

use backends::board::Outcome;
use backends::{PeerAddress, PeerInfo, Transport, TransportError, WaitError};
use transfer_engine::{
    BlockId, KvLayout, MemoryRegion, RegionHandle, SessionId, ShapingConfig, TransferRequest,
};

use crate::error::ConnectorError;

/// Where a connector's KV travels: one transport, shared by the connector's halves.
#[derive(Debug, Clone)]
pub(crate) struct DataPlane(Arc<dyn Transport>);

/// How waiting for a layer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LayerWait {
    /// The layer arrived whole and verified.
    Arrived,
    /// The session ended without it: these destination blocks must be recomputed.
    Lost(Vec<BlockId>),
}

impl DataPlane {
    pub(crate) fn new(transport: Arc<dyn Transport>) -> Self {
        Self(transport)
    }

    /// Registers `memory` as a KV region of `layout`.
    pub(crate) fn register(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, ConnectorError> {
        Ok(self.0.register_kv_region(layout, memory)?)
    }

    /// Offers a registered region to producers under `name`.
    pub(crate) fn publish(&self, name: &str, handle: RegionHandle) -> Result<(), ConnectorError> {
        Ok(self.0.publish_segment(name, handle)?)
    }

    /// Where producers reach this end.
    pub(crate) fn address(&self) -> Option<PeerAddress> {
        self.0.address()
    }

    /// Reaches a consumer's node.
    pub(crate) async fn connect(&self, address: &PeerAddress) -> Result<PeerInfo, TransportError> {
        self.0.connect(address).await
    }

    /// Sets this end's traffic shaping (the KV bandwidth cap).
    pub(crate) fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), ConnectorError> {
        Ok(self.0.set_shaping(shaping)?)
    }

    /// Starts a transfer from this end.
    pub(crate) fn submit(&self, req: TransferRequest) -> Result<SessionId, ConnectorError> {
        Ok(self.0.submit(req)?)
    }

    /// The producer has saved every layer below `until` of the blocks sending session `session` carries.
    pub(crate) fn layers_written(
        &self,
        session: SessionId,
        until: u32,
    ) -> Result<(), ConnectorError> {
        Ok(self.0.layers_written(session, until)?)
    }

    /// Stops sending session `session`; its unacknowledged blocks are recomputed.
    pub(crate) fn cancel(&self, session: SessionId) -> Result<(), ConnectorError> {
        Ok(self.0.cancel(session)?)
    }

    /// Waits until sending session `session` is over.
    pub(crate) async fn wait_sent(
        &self,
        session: SessionId,
        limit: Duration,
    ) -> Result<Outcome, ConnectorError> {
        Ok(self.0.wait(session, limit).await?)
    }

    /// Tells the sender the consumer is at `layer` of `session`, then waits until that layer is whole, or
    /// the session ended without it. A session this end has not heard of yet (the producer's answer can
    /// overtake its first frame) is waited for until it is announced; the caller bounds the wait.
    pub(crate) async fn wait_layer(
        &self,
        session: SessionId,
        layer: u32,
    ) -> Result<LayerWait, ConnectorError> {
        self.0.wait_announced(session).await?;
        // Moves the prefetch window; a session that already finished answers from the board.
        let _ = self.0.consume_layer(session, layer);
        match self.0.wait_layer(session, layer).await {
            Ok(()) => Ok(LayerWait::Arrived),
            Err(TransportError::Wait(WaitError::LayerLost { blocks, .. })) => {
                Ok(LayerWait::Lost(blocks))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Opens the whole prefetch window of receiving session `session` (whose last layer is `last`: no
    /// compute runs alongside), then waits until it is over; returns its destination blocks that did not
    /// arrive intact. The caller bounds the wait.
    pub(crate) async fn wait_whole(
        &self,
        session: SessionId,
        last: u32,
    ) -> Result<Vec<BlockId>, ConnectorError> {
        self.0.wait_announced(session).await?;
        let _ = self.0.consume_layer(session, last);
        Ok(self.0.wait_received(session).await?.recompute)
    }

    /// Stops placing the bytes of receiving session `session`: its blocks are recomputed instead.
    pub(crate) fn abandon(&self, session: SessionId) -> Result<(), ConnectorError> {
        Ok(self.0.abandon_receive(session)?)
    }

    /// Destination blocks of receiving session `session` that did not arrive intact, once it is over
    /// (`None` if that is not known within `limit`).
    pub(crate) async fn unfinished_blocks(
        &self,
        session: SessionId,
        limit: Duration,
    ) -> Option<Vec<BlockId>> {
        tokio::time::timeout(limit, self.0.wait_received(session))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|r| r.recompute)
    }

    /// Accepts incoming sessions forever (the connector tracks them by id), so their notices never pile
    /// up. Ends when the node shuts down.
    pub(crate) async fn drain_incoming(self) {
        while self.0.accept().await.is_ok() {}
    }

    /// Data frames this end sent again.
    pub(crate) fn retransmits(&self) -> u64 {
        self.0.counters().retransmits
    }

    /// Stops the transport.
    pub(crate) fn shutdown(&self) {
        self.0.shutdown();
    }
}
