//! [`TcpNode`] as a [`Transport`]: each call is the node's own, its error made a [`TransportError`].

use super::TcpNode;
use crate::transport::{
    BoxFuture, PeerAddress, PeerInfo, Transport, TransportError, forward_to_node,
};

impl Transport for TcpNode {
    forward_to_node!(TcpNode, "tcp");

    fn address(&self) -> Option<PeerAddress> {
        self.local_addr().map(PeerAddress::Tcp)
    }

    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>> {
        Box::pin(async move {
            let PeerAddress::Tcp(addr) = address else {
                return Err(TransportError::cannot_reach("tcp", address));
            };
            Ok(TcpNode::connect(self, *addr, None).await?)
        })
    }
}
