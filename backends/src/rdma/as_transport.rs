//! [`RdmaNode`] as a [`Transport`]: each call is the node's own, its error made a [`TransportError`].

use std::time::Duration;

use tokio::sync::broadcast;
use transfer_engine::{
    Counters, Event, KvLayout, MemoryRegion, RegionHandle, RegionId, SessionId, ShapingConfig,
    TransferRequest,
};

use super::RdmaNode;
use crate::board::{IncomingSession, Outcome, Received};
use crate::transport::{BoxFuture, PeerAddress, PeerInfo, Transport, TransportError};

impl Transport for RdmaNode {
    fn backend(&self) -> &'static str {
        "rdma"
    }

    fn engine_id(&self) -> u32 {
        RdmaNode::engine_id(self)
    }

    fn address(&self) -> Option<PeerAddress> {
        Some(PeerAddress::Rdma(RdmaNode::address(self).to_vec()))
    }

    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        Ok(RdmaNode::register_kv_region(self, layout, memory)?)
    }

    fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        Ok(RdmaNode::unregister_region(self, id)?)
    }

    fn memory(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        Ok(RdmaNode::memory(self, id)?)
    }

    fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), TransportError> {
        Ok(RdmaNode::publish_segment(self, name, handle)?)
    }

    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>> {
        Box::pin(async move {
            let PeerAddress::Rdma(name) = address else {
                return Err(TransportError::Unsupported {
                    backend: "rdma",
                    what: format!("reach {address}"),
                });
            };
            Ok(RdmaNode::connect(self, name).await?)
        })
    }

    fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), TransportError> {
        Ok(RdmaNode::set_shaping(self, shaping)?)
    }

    fn submit(&self, req: TransferRequest) -> Result<SessionId, TransportError> {
        Ok(RdmaNode::submit(self, req)?)
    }

    fn layers_written(&self, session: SessionId, until: u32) -> Result<(), TransportError> {
        Ok(RdmaNode::layers_written(self, session, until)?)
    }

    fn cancel(&self, session: SessionId) -> Result<(), TransportError> {
        Ok(RdmaNode::cancel(self, session)?)
    }

    fn wait(
        &self,
        session: SessionId,
        limit: Duration,
    ) -> BoxFuture<'_, Result<Outcome, TransportError>> {
        Box::pin(async move { Ok(RdmaNode::wait(self, session, limit).await?) })
    }

    fn accept(&self) -> BoxFuture<'_, Result<IncomingSession, TransportError>> {
        Box::pin(async move { Ok(RdmaNode::accept(self).await?) })
    }

    fn wait_announced(&self, session: SessionId) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move { Ok(self.board().wait_announced(session).await?) })
    }

    fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, TransportError> {
        Ok(RdmaNode::consume_layer(self, session, layer)?)
    }

    fn wait_layer(
        &self,
        session: SessionId,
        layer: u32,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move { Ok(RdmaNode::wait_layer(self, session, layer).await?) })
    }

    fn wait_received(&self, session: SessionId) -> BoxFuture<'_, Result<Received, TransportError>> {
        Box::pin(async move { Ok(RdmaNode::wait_received(self, session).await?) })
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        RdmaNode::subscribe(self)
    }

    fn counters(&self) -> Counters {
        self.stats().engine
    }

    fn live_sessions(&self) -> usize {
        RdmaNode::live_sessions(self)
    }

    fn shutdown(&self) {
        RdmaNode::shutdown(self);
    }
}
