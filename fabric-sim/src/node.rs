//! A simulated host: one engine, the host memory behind its regions, and what survives a crash.

use std::time::Instant;

use transfer_engine::{
    Body, Counters, Engine, EngineConfig, Error, Event, KvLayout, MemoryRegion, PeerId,
    RegionHandle, RegionId, TrafficClass,
};

/// A node of the simulation. Its engine's peer id is `PeerId(u64::from(id.0))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct NodeId(pub u32);

impl NodeId {
    /// How engines name this node.
    #[must_use]
    pub fn peer(self) -> PeerId {
        PeerId(u64::from(self.0))
    }

    /// The node an engine's peer id names, if it can be one.
    #[must_use]
    pub fn from_peer(peer: PeerId) -> Option<Self> {
        u32::try_from(peer.0).ok().map(NodeId)
    }
}

/// One frame ready for the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) to: PeerId,
    pub(crate) bytes: Vec<u8>,
    pub(crate) data: bool,
    /// The class the engine gave it (what a priority link orders by).
    pub(crate) class: TrafficClass,
}

/// A host running one [`Engine`] over host memory ([`MemoryRegion`]s it keeps across crashes).
///
/// A crash throws the engine away (every session, timer and counter it held); the bytes in its regions
/// survive, like a KV pool that outlives the serving process. A restart builds a fresh engine from the same
/// configuration (its generator reseeded, so access keys change) and registers the same regions again, in
/// the same order, so they get the same ids.
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    cfg: EngineConfig,
    engine: Engine,
    memories: Vec<MemoryRegion>,
    layouts: Vec<KvLayout>,
    handles: Vec<RegionHandle>,
    up: bool,
    incarnation: u32,
    earlier: Counters,
    refused: u64,
    pub(crate) held: Option<Frame>,
    pub(crate) waiting: bool,
}

impl Node {
    pub(crate) fn new(id: NodeId, cfg: EngineConfig) -> Self {
        Self {
            id,
            engine: Engine::new(cfg.clone()),
            cfg,
            memories: Vec::new(),
            layouts: Vec::new(),
            handles: Vec::new(),
            up: true,
            incarnation: 0,
            earlier: Counters::default(),
            refused: 0,
            held: None,
            waiting: false,
        }
    }

    /// This node's id.
    #[must_use]
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The engine of the current incarnation.
    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, for commands (`submit`, `cancel`).
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// The bytes of region `id` of this incarnation (they survive crashes; a restart registers them again).
    pub fn memory(&self, id: RegionId) -> Result<&MemoryRegion, Error> {
        self.handles
            .iter()
            .position(|h| h.id == id)
            .map(|i| &self.memories[i])
            .ok_or(Error::UnknownRegion(id))
    }

    /// Registers a KV region over zeroed host memory; it is registered again after every restart.
    pub fn register_kv_region(&mut self, layout: KvLayout) -> Result<RegionHandle, Error> {
        let memory = MemoryRegion::zeroed(layout.total_bytes() as usize);
        let handle = self.engine.register_kv_region(layout, memory.clone())?;
        self.memories.push(memory);
        self.layouts.push(layout);
        self.handles.push(handle);
        Ok(handle)
    }

    /// The handles of this incarnation's regions, in registration order.
    #[must_use]
    pub fn regions(&self) -> &[RegionHandle] {
        &self.handles
    }

    /// Whether the node is running.
    #[must_use]
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Restarts so far.
    #[must_use]
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// Counters summed over every incarnation, the current one included.
    #[must_use]
    pub fn stats(&self) -> Counters {
        let mut total = self.earlier;
        total += self.engine.stats();
        total
    }

    /// Frames this node's engine refused (corrupted headers, unknown sessions, ...), all incarnations.
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Stops the node: its engine state is lost and nothing reaches it until [`Node::restart`].
    pub(crate) fn crash(&mut self) {
        if !self.up {
            return;
        }
        self.up = false;
        self.held = None;
        self.earlier += self.engine.stats();
        self.engine = Engine::new(self.cfg.clone());
    }

    /// Starts a fresh engine with the same configuration (reseeded) and registers the regions again.
    pub(crate) fn restart(&mut self) -> Result<(), Error> {
        if self.up {
            return Ok(());
        }
        self.incarnation += 1;
        let mut cfg = self.cfg.clone();
        cfg.rng_seed = crate::mix(cfg.rng_seed, u64::from(self.incarnation));
        self.engine = Engine::new(cfg);
        self.handles.clear();
        for (layout, memory) in self.layouts.iter().zip(&self.memories) {
            let handle = self.engine.register_kv_region(*layout, memory.clone())?;
            self.handles.push(handle);
        }
        self.up = true;
        Ok(())
    }

    /// The next frame the engine wants sent, as bytes: header sealed with the payload's CRC, then the
    /// payload read from the region the transmit names (exactly what a real driver puts on the wire).
    pub(crate) fn poll_frame(&mut self, now: Instant) -> Option<Frame> {
        let mut t = self.engine.poll_transmit(now)?;
        let data = matches!(t.body, Body::Payload(_));
        let bytes = match self.engine.encode_transmit(&mut t) {
            Ok(bytes) => bytes,
            Err(_) => {
                // The engine named bytes outside its own regions: a core bug. Count it and send nothing.
                self.refused += 1;
                return self.poll_frame(now);
            }
        };
        Some(Frame {
            to: t.peer,
            bytes,
            data,
            class: t.class,
        })
    }

    /// Hands a frame that arrived from `from` to the engine.
    pub(crate) fn receive(&mut self, now: Instant, from: NodeId, bytes: &[u8]) {
        if self
            .engine
            .handle_datagram(now, from.peer(), bytes)
            .is_err()
        {
            self.refused += 1;
        }
    }

    /// The engine's next event.
    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.engine.poll_event()
    }
}
