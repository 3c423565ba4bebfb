//! [`Node`] as a [`Transport`]: each call is the node's own.

use std::time::Duration;

use tokio::sync::broadcast;
use transfer_engine::{
    Counters, Event, KvLayout, MemoryRegion, RegionHandle, RegionId, SessionId, ShapingConfig,
    TransferRequest,
};

use super::{Driver, Node};
use crate::board::{IncomingSession, Outcome, Received};
use crate::transport::{BoxFuture, PeerAddress, PeerInfo, Transport, TransportError};

impl<D: Driver> Transport for Node<D> {
    fn backend(&self) -> &'static str {
        D::BACKEND
    }

    fn engine_id(&self) -> u32 {
        Node::engine_id(self)
    }

    fn address(&self) -> Option<PeerAddress> {
        self.driver().address()
    }

    fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        Node::register_kv_region(self, layout, memory)
    }

    fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        Node::unregister_region(self, id)
    }

    fn memory(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        Node::memory(self, id)
    }

    fn publish_segment(&self, name: &str, handle: RegionHandle) -> Result<(), TransportError> {
        Node::publish_segment(self, name, handle)
    }

    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>> {
        self.driver().connect(address)
    }

    fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), TransportError> {
        Node::set_shaping(self, shaping)
    }

    fn submit(&self, req: TransferRequest) -> Result<SessionId, TransportError> {
        Node::submit(self, req)
    }

    fn layers_written(&self, session: SessionId, until: u32) -> Result<(), TransportError> {
        Node::layers_written(self, session, until)
    }

    fn cancel(&self, session: SessionId) -> Result<(), TransportError> {
        Node::cancel(self, session)
    }

    fn wait(
        &self,
        session: SessionId,
        limit: Duration,
    ) -> BoxFuture<'_, Result<Outcome, TransportError>> {
        Box::pin(Node::wait(self, session, limit))
    }

    fn next_incoming(&self) -> BoxFuture<'_, Result<IncomingSession, TransportError>> {
        Box::pin(Node::next_incoming(self))
    }

    fn wait_announced(&self, session: SessionId) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(Node::wait_announced(self, session))
    }

    fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, TransportError> {
        Node::consume_layer(self, session, layer)
    }

    fn abandon_receive(&self, session: SessionId) -> Result<(), TransportError> {
        Node::abandon_receive(self, session)
    }

    fn wait_layer(
        &self,
        session: SessionId,
        layer: u32,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(Node::wait_layer(self, session, layer))
    }

    fn wait_received(&self, session: SessionId) -> BoxFuture<'_, Result<Received, TransportError>> {
        Box::pin(Node::wait_received(self, session))
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        Node::subscribe(self)
    }

    fn counters(&self) -> Counters {
        Node::counters(self)
    }

    fn live_sessions(&self) -> usize {
        Node::live_sessions(self)
    }

    fn shutdown(&self) {
        Node::shutdown(self);
    }
}
