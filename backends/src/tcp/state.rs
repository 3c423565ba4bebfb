//! A node's state behind its handle: the lane tasks' context (with the node's core), the links to its
//! peers, its listen address and the regions it serves. The handle, the driver, the acceptor and the dialer
//! hold it; lane tasks hold only the [`Context`] inside.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use transfer_engine::PeerId;

use super::context::{Context, lock};
use super::handshake::Hello;
use super::peer_link::PeerLink;
use super::served_region::ServedRegion;
use crate::TransportError;

/// A peer reached by [`super::TcpNode::connect`]; its segments include `served` if a region was asked for.
pub use crate::transport::PeerInfo;

/// The node's state behind its handle.
pub(crate) struct NodeState {
    pub(crate) ctx: Arc<Context>,
    pub(crate) links: Mutex<BTreeMap<PeerId, Arc<PeerLink>>>,
    pub(crate) listen: Option<SocketAddr>,
    /// Regions allocated for peers that asked in their handshake, with the peer each belongs to.
    pub(crate) served: Mutex<Vec<ServedRegion>>,
    pub(crate) shutdown: watch::Sender<bool>,
    /// Inbound connections held per address.
    pub(crate) admission: Arc<super::admission::Admission>,
}

impl NodeState {
    pub(crate) fn new(ctx: Context, listen: Option<SocketAddr>) -> Self {
        let admission = super::admission::Admission::new(
            ctx.cfg.limits.max_handshakes_per_address,
            ctx.cfg.limits.control_frames_per_sec_per_address,
            ctx.cfg.limits.data_bytes_per_sec_per_address,
        );
        Self {
            ctx: Arc::new(ctx),
            links: Mutex::new(BTreeMap::new()),
            listen,
            served: Mutex::new(Vec::new()),
            shutdown: watch::Sender::new(false),
            admission: Arc::new(admission),
        }
    }

    pub(crate) fn hello(&self) -> Result<Hello, TransportError> {
        let cfg = &self.ctx.cfg;
        let mut h = Hello::new(cfg.engine.engine_id, cfg.namespace.clone())?;
        h.listen = self.listen.map(|a| a.to_string());
        h.authenticated = cfg.security.secret.is_some();
        Ok(h)
    }

    /// The link whose dial address is `addr`, if any.
    pub(crate) fn link_at(&self, addr: SocketAddr) -> Option<Arc<PeerLink>> {
        lock(&self.links)
            .values()
            .find(|l| l.addr() == Some(addr))
            .cloned()
    }

    /// The link to `peer`, created if needed.
    pub(crate) fn link(&self, peer: PeerId) -> Arc<PeerLink> {
        lock(&self.links)
            .entry(peer)
            .or_insert_with(|| {
                Arc::new(PeerLink::new(
                    peer,
                    self.ctx.cfg.limits.data_bytes_per_sec_per_peer,
                ))
            })
            .clone()
    }

    /// Every link, for a pass over them without holding the map.
    pub(crate) fn all_links(&self) -> Vec<Arc<PeerLink>> {
        lock(&self.links).values().cloned().collect()
    }
}
