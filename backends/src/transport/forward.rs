//! The [`super::Transport`] methods that a node type (TCP's and RDMA's) implements as inherent methods
//! of the same names and shapes, forwarded in one place: each backend's impl adds only what differs
//! (its address and connecting).

/// Expands, inside `impl Transport for $node`, to the methods that call `$node`'s own of the same name,
/// their errors made [`super::TransportError`]s. `$node` has a `board()` and a `stats()` with an `engine`
/// field.
macro_rules! forward_to_node {
    ($node:ident, $backend:literal) => {
        fn backend(&self) -> &'static str {
            $backend
        }

        fn engine_id(&self) -> u32 {
            $node::engine_id(self)
        }

        fn register_kv_region(
            &self,
            layout: transfer_engine::KvLayout,
            memory: transfer_engine::MemoryRegion,
        ) -> Result<transfer_engine::RegionHandle, TransportError> {
            Ok($node::register_kv_region(self, layout, memory)?)
        }

        fn unregister_region(
            &self,
            id: transfer_engine::RegionId,
        ) -> Result<transfer_engine::MemoryRegion, TransportError> {
            Ok($node::unregister_region(self, id)?)
        }

        fn memory(
            &self,
            id: transfer_engine::RegionId,
        ) -> Result<transfer_engine::MemoryRegion, TransportError> {
            Ok($node::memory(self, id)?)
        }

        fn publish_segment(
            &self,
            name: &str,
            handle: transfer_engine::RegionHandle,
        ) -> Result<(), TransportError> {
            Ok($node::publish_segment(self, name, handle)?)
        }

        fn set_shaping(
            &self,
            shaping: transfer_engine::ShapingConfig,
        ) -> Result<(), TransportError> {
            Ok($node::set_shaping(self, shaping)?)
        }

        fn submit(
            &self,
            req: transfer_engine::TransferRequest,
        ) -> Result<transfer_engine::SessionId, TransportError> {
            Ok($node::submit(self, req)?)
        }

        fn layers_written(
            &self,
            session: transfer_engine::SessionId,
            until: u32,
        ) -> Result<(), TransportError> {
            Ok($node::layers_written(self, session, until)?)
        }

        fn cancel(&self, session: transfer_engine::SessionId) -> Result<(), TransportError> {
            Ok($node::cancel(self, session)?)
        }

        fn wait(
            &self,
            session: transfer_engine::SessionId,
            limit: std::time::Duration,
        ) -> BoxFuture<'_, Result<crate::board::Outcome, TransportError>> {
            Box::pin(async move { Ok($node::wait(self, session, limit).await?) })
        }

        fn next_incoming(
            &self,
        ) -> BoxFuture<'_, Result<crate::board::IncomingSession, TransportError>> {
            Box::pin(async move { Ok($node::next_incoming(self).await?) })
        }

        fn wait_announced(
            &self,
            session: transfer_engine::SessionId,
        ) -> BoxFuture<'_, Result<(), TransportError>> {
            Box::pin(async move { Ok(self.board().wait_announced(session).await?) })
        }

        fn consume_layer(
            &self,
            session: transfer_engine::SessionId,
            layer: u32,
        ) -> Result<bool, TransportError> {
            Ok($node::consume_layer(self, session, layer)?)
        }

        fn abandon_receive(
            &self,
            session: transfer_engine::SessionId,
        ) -> Result<(), TransportError> {
            Ok($node::abandon_receive(self, session)?)
        }

        fn wait_layer(
            &self,
            session: transfer_engine::SessionId,
            layer: u32,
        ) -> BoxFuture<'_, Result<(), TransportError>> {
            Box::pin(async move { Ok($node::wait_layer(self, session, layer).await?) })
        }

        fn wait_received(
            &self,
            session: transfer_engine::SessionId,
        ) -> BoxFuture<'_, Result<crate::board::Received, TransportError>> {
            Box::pin(async move { Ok($node::wait_received(self, session).await?) })
        }

        fn subscribe(&self) -> tokio::sync::broadcast::Receiver<transfer_engine::Event> {
            $node::subscribe(self)
        }

        fn counters(&self) -> transfer_engine::Counters {
            self.stats().engine
        }

        fn live_sessions(&self) -> usize {
            $node::live_sessions(self)
        }

        fn shutdown(&self) {
            $node::shutdown(self);
        }
    };
}

pub(crate) use forward_to_node;
