//! A blocking handle on a [`TcpNode`] for programs without their own async runtime (te-bench).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;
use transfer_engine::{KvLayout, MemoryRegion, RegionHandle, TransferRequest};

use super::TcpConfig;
use super::node::TcpNode;
use super::state::PeerInfo;
use crate::board::Outcome;
use crate::transport::TransportError;

/// A [`TcpNode`] with the runtime it runs on; every method blocks the calling thread.
#[derive(Debug)]
pub struct BlockingNode {
    node: Option<TcpNode>,
    rt: Arc<Runtime>,
}

impl BlockingNode {
    /// Starts a node on a new multi-threaded runtime (one worker per core).
    pub fn start(cfg: TcpConfig) -> Result<Self, TransportError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| TransportError::io("tcp", &e))?;
        Self::start_on(Arc::new(rt), cfg)
    }

    /// Starts a node on the runtime of `other` (nodes in one process share their worker threads).
    pub fn start_beside(other: &BlockingNode, cfg: TcpConfig) -> Result<Self, TransportError> {
        Self::start_on(other.rt.clone(), cfg)
    }

    fn start_on(rt: Arc<Runtime>, cfg: TcpConfig) -> Result<Self, TransportError> {
        let node = rt.block_on(TcpNode::start(cfg))?;
        Ok(Self {
            node: Some(node),
            rt,
        })
    }

    /// The node, for its non-async methods.
    #[must_use]
    pub fn node(&self) -> &TcpNode {
        self.node
            .as_ref()
            .expect("the node lives as long as its handle")
    }

    /// Runs `f` on the node's runtime and waits for it.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// See [`TcpNode::register_kv_region`].
    pub fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        self.node().register_kv_region(layout, memory)
    }

    /// See [`TcpNode::kv_region`].
    pub fn kv_region(&self, layout: KvLayout) -> Result<RegionHandle, TransportError> {
        self.node().kv_region(layout)
    }

    /// See [`TcpNode::connect`].
    pub fn connect(
        &self,
        addr: std::net::SocketAddr,
        want: Option<KvLayout>,
    ) -> Result<PeerInfo, TransportError> {
        self.rt.block_on(self.node().connect(addr, want))
    }

    /// See [`TcpNode::transfer`].
    pub fn transfer(
        &self,
        req: TransferRequest,
        limit: Duration,
    ) -> Result<Outcome, TransportError> {
        self.rt.block_on(self.node().transfer(req, limit))
    }
}

impl Drop for BlockingNode {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            let _guard = self.rt.enter();
            drop(node);
        }
    }
}
