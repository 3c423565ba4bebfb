//! [`TcpNode`] as a [`Transport`]: each call is the node's own, its error made a [`TransportError`].

use std::time::Duration;

use tokio::sync::broadcast;
use transfer_engine::{
    Counters, Event, KvLayout, MemoryRegion, RegionHandle, RegionId, SessionId, ShapingConfig,
    TransferRequest,
};

use super::TcpNode;
use crate::board::{IncomingSession, Outcome, Received};
use crate::transport::{BoxFuture, PeerAddress, PeerInfo, Transport, TransportError};

impl Transport for TcpNode {
    fn backend(&self) -> &'static str {
        "tcp"
    }

    fn engine_id(&self) -> u32 {
        TcpNode::engine_id(self)
    }

    fn address(&self) -> Option<PeerAddress> {
        self.local_addr().map(PeerAddress::Tcp)
    }

    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        Ok(TcpNode::register_kv_region(self, layout, memory)?)
    }

    fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        Ok(TcpNode::unregister_region(self, id)?)
    }

    fn memory(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        Ok(TcpNode::memory(self, id)?)
    }

    fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), TransportError> {
        // Offered in every welcome from now on; a region that is not registered is refused here, as on
        // every backend.
        TcpNode::memory(self, handle.id)?;
        TcpNode::publish_segment(self, name, handle);
        Ok(())
    }

    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>> {
        Box::pin(async move {
            let PeerAddress::Tcp(addr) = address else {
                return Err(TransportError::Unsupported {
                    backend: "tcp",
                    what: format!("reach {address}"),
                });
            };
            Ok(TcpNode::connect(self, *addr, None).await?)
        })
    }

    fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), TransportError> {
        Ok(TcpNode::set_shaping(self, shaping)?)
    }

    fn submit(&self, req: TransferRequest) -> Result<SessionId, TransportError> {
        Ok(TcpNode::submit(self, req)?)
    }

    fn layers_written(&self, session: SessionId, until: u32) -> Result<(), TransportError> {
        Ok(TcpNode::layers_written(self, session, until)?)
    }

    fn cancel(&self, session: SessionId) -> Result<(), TransportError> {
        Ok(TcpNode::cancel(self, session)?)
    }

    fn wait(
        &self,
        session: SessionId,
        limit: Duration,
    ) -> BoxFuture<'_, Result<Outcome, TransportError>> {
        Box::pin(async move { Ok(TcpNode::wait(self, session, limit).await?) })
    }

    fn accept(&self) -> BoxFuture<'_, Result<IncomingSession, TransportError>> {
        Box::pin(async move { Ok(TcpNode::accept(self).await?) })
    }

    fn wait_announced(&self, session: SessionId) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move { Ok(self.board().wait_announced(session).await?) })
    }

    fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, TransportError> {
        Ok(TcpNode::consume_layer(self, session, layer)?)
    }

    fn wait_layer(
        &self,
        session: SessionId,
        layer: u32,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move { Ok(TcpNode::wait_layer(self, session, layer).await?) })
    }

    fn wait_received(&self, session: SessionId) -> BoxFuture<'_, Result<Received, TransportError>> {
        Box::pin(async move { Ok(TcpNode::wait_received(self, session).await?) })
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        TcpNode::subscribe(self)
    }

    fn counters(&self) -> Counters {
        self.stats().engine
    }

    fn live_sessions(&self) -> usize {
        TcpNode::live_sessions(self)
    }

    fn shutdown(&self) {
        TcpNode::shutdown(self);
    }
}
