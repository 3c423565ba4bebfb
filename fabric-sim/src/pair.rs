//! Two engines joined by a link, a KV region on each, the source filled: the setup the shaping scenarios
//! share.

use std::time::{Duration, Instant};

use transfer_engine::{
    Dtype, Event, KvLayout, RegionHandle, SessionId, TransferMode, TransferRequest,
};

use crate::link::LinkConfig;
use crate::node::{Node, NodeId};
use crate::scenario::ScenarioConfig;
use crate::sim::{Observer, Sim};
use crate::{SimError, mix};

/// A producer `a` and a consumer `b` with a KV region each (`src` filled with a pattern of the seed).
pub(crate) struct Pair {
    pub(crate) sim: Sim,
    pub(crate) a: NodeId,
    pub(crate) b: NodeId,
    pub(crate) src: RegionHandle,
    pub(crate) dst: RegionHandle,
}

impl Pair {
    /// Sets up `layers x blocks x block_bytes` of KV over `link` (both directions), engines with the
    /// scenarios' retransmit timing and a `deadline`.
    pub(crate) fn new(
        epoch: Instant,
        seed: u64,
        link: LinkConfig,
        layout: (u32, u32, u64),
        deadline: Duration,
    ) -> Result<Self, SimError> {
        let mut sim = Sim::new(epoch, seed);
        let engine = ScenarioConfig::engine_defaults(deadline);
        let a = sim.add_node({
            let mut cfg = engine.clone();
            cfg.engine_id = 1;
            cfg.rng_seed = mix(seed, 1);
            cfg
        });
        let b = sim.add_node({
            let mut cfg = engine;
            cfg.engine_id = 2;
            cfg.rng_seed = mix(seed, 2);
            cfg
        });
        sim.connect(a, b, link);
        let (layers, blocks, block_bytes) = layout;
        let layout = KvLayout::new(layers, blocks, block_bytes, 16, Dtype::F16)?;
        let src = sim.node_mut(a).register_kv_region(layout)?;
        let dst = sim.node_mut(b).register_kv_region(layout)?;
        let mut x = mix(seed, 0x5eed) | 1;
        let memory = sim.node(a).memory(src.id)?.clone();
        for chunk in memory.write(0..memory.len())?.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        Ok(Self {
            sim,
            a,
            b,
            src,
            dst,
        })
    }

    /// Submits the whole region from `a` to `b` in `mode`, streamed `prefetch_depth` layers ahead when
    /// given.
    pub(crate) fn submit(
        &mut self,
        mode: TransferMode,
        prefetch_depth: Option<u32>,
    ) -> Result<SessionId, SimError> {
        let mut req = TransferRequest::whole(self.b.peer(), &self.src, &self.dst)?.with_mode(mode);
        if let Some(d) = prefetch_depth {
            req = req.with_prefetch_depth(d);
        }
        let now = self.sim.instant();
        Ok(self.sim.node_mut(self.a).engine_mut().submit(now, req)?)
    }

    /// Whether the consumer's region holds exactly the producer's bytes.
    pub(crate) fn intact(&self) -> bool {
        let bytes = |node, id| self.sim.node(node).memory(id).and_then(|m| m.to_vec());
        matches!((bytes(self.a, self.src.id), bytes(self.b, self.dst.id)), (Ok(s), Ok(d)) if s == d)
    }
}

/// What the consumer side waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// Nothing: run on.
    Nothing,
    /// The incoming session.
    Incoming,
    /// Layer `n` complete.
    Layer(u32),
    /// Every block delivered (the receiver's `Completed`).
    Completed,
}

/// Watches the consumer's events and stops a [`Sim::run_until`] when what it wants happened.
#[derive(Debug)]
pub(crate) struct Consumer {
    pub(crate) node: NodeId,
    pub(crate) want: Want,
    pub(crate) session: Option<SessionId>,
    pub(crate) layers: std::collections::BTreeMap<u32, Duration>,
    pub(crate) completed: Option<Duration>,
}

impl Consumer {
    pub(crate) fn new(node: NodeId) -> Self {
        Self {
            node,
            want: Want::Nothing,
            session: None,
            layers: std::collections::BTreeMap::new(),
            completed: None,
        }
    }
}

impl Observer for Consumer {
    fn on_event(&mut self, at: Duration, node: NodeId, event: &Event, _host: &Node) {
        if node != self.node {
            return;
        }
        match event {
            Event::Incoming { session, .. } => self.session = Some(*session),
            Event::LayerComplete { layer, .. } => {
                self.layers.entry(*layer).or_insert(at);
            }
            Event::Completed { .. } => self.completed = Some(at),
            _ => {}
        }
    }

    fn stop_requested(&mut self) -> bool {
        match self.want {
            Want::Nothing => false,
            Want::Incoming => self.session.is_some(),
            Want::Layer(n) => self.layers.contains_key(&n),
            Want::Completed => self.completed.is_some(),
        }
    }
}
