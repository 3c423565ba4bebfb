//! [`RdmaNode`] as a [`Transport`]: each call is the node's own, its error made a [`TransportError`].

use super::RdmaNode;
use crate::transport::{
    BoxFuture, PeerAddress, PeerInfo, Transport, TransportError, forward_to_node,
};

impl Transport for RdmaNode {
    forward_to_node!(RdmaNode, "rdma");

    fn address(&self) -> Option<PeerAddress> {
        Some(PeerAddress::Rdma(RdmaNode::address(self).to_vec()))
    }

    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>> {
        Box::pin(async move {
            let PeerAddress::Rdma(name) = address else {
                return Err(TransportError::cannot_reach("rdma", address));
            };
            Ok(RdmaNode::connect(self, name).await?)
        })
    }
}
