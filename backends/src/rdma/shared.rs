//! State the node's API and its driver thread share: the engine's station, regions, routes, commands for
//! the driver, counters and the log; and the peer and statistics types both hand out.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use tokio::sync::oneshot;
use transfer_engine::{KvLayout, MemoryRegion, PeerId, RegionId, SessionId};

use super::RdmaConfig;
use super::ffi::{DmaBuffer, MrId, ProviderInfo};
use super::message::RdmaSegment;
use crate::TransportError;
use crate::node::{LogKind, NodeCore};

/// A peer reached by [`RdmaNode::connect`](super::RdmaNode::connect) (or that connected to this node).
pub use crate::transport::PeerInfo;

/// The peer-facing view of segments a peer offers (names and handles; their keys stay in the route).
pub(crate) fn peer_info(peer: PeerId, segments: &[RdmaSegment]) -> PeerInfo {
    PeerInfo {
        peer,
        segments: segments
            .iter()
            .map(|s| crate::transport::Segment {
                name: s.name.clone(),
                handle: s.handle,
            })
            .collect(),
    }
}

/// Data-path counters of a node, beside the engine's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// The engine's counters.
    pub engine: transfer_engine::Counters,
    /// RDMA writes posted.
    pub writes: u64,
    /// Writes the provider completed with an error (a refused key or range, a lost peer).
    pub write_errors: u64,
    /// Peers' writes that landed here.
    pub remote_writes: u64,
    /// Messages sent.
    pub messages_sent: u64,
    /// Messages received.
    pub messages_received: u64,
    /// Frames, messages or units refused (see [`RdmaNode::log`](super::RdmaNode::log)).
    pub refused: u64,
}

/// What the driver reports back through the node.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) writes: AtomicU64,
    pub(crate) write_errors: AtomicU64,
    pub(crate) remote_writes: AtomicU64,
    pub(crate) messages_sent: AtomicU64,
    pub(crate) messages_received: AtomicU64,
    pub(crate) refused: AtomicU64,
}

/// A region registered with both the engine and the endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalRegion {
    pub(crate) mr: MrId,
    pub(crate) rkey: u64,
    pub(crate) rma_base: u64,
}

/// A peer as the driver reaches it.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// Its address-vector handle.
    pub(crate) addr: u64,
    /// The tag it asked us to use in our writes to it (None until its welcome or hello arrives).
    pub(crate) write_tag: Option<u16>,
    /// The tag we gave it for its writes to us.
    pub(crate) our_tag: u16,
    /// What it offers.
    pub(crate) segments: Vec<RdmaSegment>,
}

/// What a region is registered with the provider as.
pub(crate) enum ToRegister {
    /// The caller's memory itself (GPU memory on a provider with `FI_HMEM`, or host memory granted in
    /// place).
    InPlace(MemoryRegion),
    /// A mirror of it (see `units.rs`).
    Mirror(Arc<DmaBuffer>),
}

/// What API calls ask of the driver thread (which alone touches the endpoint).
pub(crate) enum Command {
    Register(
        ToRegister,
        mpsc::Sender<Result<LocalRegion, TransportError>>,
    ),
    Deregister(MrId),
    Connect(Vec<u8>, oneshot::Sender<Result<PeerInfo, TransportError>>),
}

/// State shared by the API and the driver thread.
pub(crate) struct Shared {
    /// The engine and board, log, published segments and dead-peer verdicts.
    pub(crate) core: NodeCore,
    pub(crate) cfg: RdmaConfig,
    pub(crate) info: ProviderInfo,
    pub(crate) name: Vec<u8>,
    pub(crate) commands: Mutex<VecDeque<Command>>,
    pub(crate) stop: AtomicBool,
    pub(crate) regions: Mutex<HashMap<RegionId, LocalRegion>>,
    /// The host mirror registered in place of each staged region (see `units.rs`).
    pub(crate) mirrors: Mutex<HashMap<RegionId, Arc<DmaBuffer>>>,
    pub(crate) routes: Mutex<HashMap<PeerId, Route>>,
    /// Each sending session's destination: its region and layout (for the remote offsets).
    pub(crate) sessions: Mutex<HashMap<SessionId, (RegionId, KvLayout)>>,
    pub(crate) counters: Counters,
    /// When the driver last started a step (see `stuck.rs`).
    pub(crate) beat: super::beat::Beat,
}

impl Shared {
    /// Counts and logs a frame, message or unit refused (from `peer`, when known).
    pub(crate) fn refused(&self, peer: Option<PeerId>, text: String) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        self.core.log.note(LogKind::Refused, peer, text);
    }

    /// Logs something this node failed to do (a provider call, a frame it could not send).
    pub(crate) fn failed(&self, peer: Option<PeerId>, text: String) {
        self.core.log.note(LogKind::Failed, peer, text);
    }

    /// This node's engine id.
    pub(crate) fn engine_id(&self) -> u32 {
        self.core.engine_id()
    }

    /// The segments offered, with what the provider needs to write them (regions this node no longer
    /// holds with the provider are left out).
    pub(crate) fn offered(&self) -> Vec<RdmaSegment> {
        let regions = lock(&self.regions);
        self.core
            .segments
            .list()
            .into_iter()
            .filter_map(|s| {
                let local = regions.get(&s.handle.id)?;
                Some(RdmaSegment {
                    name: s.name,
                    handle: s.handle,
                    rma_base: local.rma_base,
                    rkey: local.rkey,
                })
            })
            .collect()
    }

    pub(crate) fn command(&self, cmd: Command) {
        let mut commands = lock(&self.commands);
        // A stopped node's driver takes no more commands: this one is dropped, and whoever waits on its
        // answer sees the node closed instead of waiting forever.
        if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // The driver sees it within its idle nap (1 ms) or at once when busy.
        commands.push_back(cmd);
    }
}

pub(crate) use crate::lock::lock;
