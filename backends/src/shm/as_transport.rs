//! [`ShmNode`] as a [`Transport`]: each call is the node's own, its error made a [`TransportError`].

use super::ShmNode;
use crate::transport::{
    BoxFuture, PeerAddress, PeerInfo, Transport, TransportError, forward_to_node,
};

impl Transport for ShmNode {
    forward_to_node!(ShmNode, "shm");

    fn address(&self) -> Option<PeerAddress> {
        self.socket_path().map(|p| PeerAddress::Shm(p.to_owned()))
    }

    fn connect<'a>(
        &'a self,
        address: &'a PeerAddress,
    ) -> BoxFuture<'a, Result<PeerInfo, TransportError>> {
        Box::pin(async move {
            let PeerAddress::Shm(path) = address else {
                return Err(TransportError::cannot_reach("shm", address));
            };
            Ok(ShmNode::connect(self, path).await?)
        })
    }
}
