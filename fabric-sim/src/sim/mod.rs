//! The event loop: nodes, links and scheduled actions in virtual time.
//!
//! Nothing sleeps. The loop jumps from one instant to the next: the earliest scheduled action (a packet
//! arriving, a sender woken by its link, a crash, a restart, a background packet) or the earliest engine
//! timer. Actions at the same instant run in the order they were scheduled, so one seed gives one run.
//!
//! A FIFO link knows a packet's arrival when it is queued. A strict-priority link
//! ([`crate::QueueDiscipline::Priority`]) does not (a later packet of a higher class may overtake it): its
//! packets wait in the link's class queues under an id, and a tick scheduled at the queue's next event
//! releases the ones that finished.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use transfer_engine::{EngineConfig, Event, TrafficClass};

use crate::collective::{CollectiveFlow, CollectiveId, CollectiveStats, FlowState};
use crate::fault::{FaultRule, PacketInfo, Verdict};
use crate::link::{Link, LinkConfig, LinkStats, Offer};
use crate::node::{Frame, Node, NodeId};
use crate::qdisc::{Enqueue, QueueDiscipline};

mod run;

/// Most actions handled at one virtual instant before the run is declared stalled (a busy loop in an
/// engine that never lets time advance).
const STALL_STEPS: u64 = 10_000_000;

/// Watches what engines report, with the reporting node's memory at that very moment (so a delivered
/// block's bytes can be checked before anything else could touch them).
pub trait Observer {
    /// An engine emitted `event` at virtual time `at`.
    fn on_event(&mut self, at: Duration, node: NodeId, event: &Event, host: &Node);

    /// Whether [`Sim::run_until`] should return now (checked after every batch of events); [`Sim::run`]
    /// never asks.
    fn stop_requested(&mut self) -> bool {
        false
    }
}

impl<F: FnMut(Duration, NodeId, &Event, &Node)> Observer for F {
    fn on_event(&mut self, at: Duration, node: NodeId, event: &Event, host: &Node) {
        self(at, node, event, host);
    }
}

/// Traffic that shares a link with the engines and never waits: when the queue is full it is tail dropped
/// (collective all-reduce bursts, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrossTraffic {
    /// Offered load, in bytes per second.
    pub rate: u64,
    /// Bytes per packet.
    pub packet_bytes: u64,
    /// When it starts (virtual time since the epoch).
    pub start: Duration,
    /// When it stops.
    pub end: Duration,
}

/// Why [`Sim::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RunEnd {
    /// Nothing scheduled and no engine timer pending: every session has ended.
    Idle,
    /// The time limit came first.
    TimeLimit,
    /// Virtual time stopped advancing (an engine asked to be woken in the past over and over).
    Stalled,
}

/// Simulation-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SimStats {
    /// Frames that arrived at a node (duplicates included).
    pub frames_delivered: u64,
    /// Frames lost because their destination was down or partitioned away by [`Sim::partition`].
    pub frames_lost_down: u64,
    /// Frames addressed to a node with no link from the sender.
    pub frames_unroutable: u64,
    /// Background packets sent and lost (to a full queue).
    pub cross_sent: u64,
    /// Background packets lost to a full queue.
    pub cross_dropped: u64,
}

#[derive(Debug, Clone)]
enum Action {
    Arrive {
        from: NodeId,
        to: NodeId,
        bytes: Vec<u8>,
    },
    Wake(NodeId),
    Crash(NodeId),
    Restart(NodeId),
    Cross {
        from: NodeId,
        to: NodeId,
        traffic: CrossTraffic,
    },
    /// A priority link's queue has an event (a departure, a starvation deadline); stale unless `generation`
    /// is the link's latest.
    LinkTick {
        from: NodeId,
        to: NodeId,
        generation: u64,
    },
    CollectiveIssue(CollectiveId),
    CollectiveWake(CollectiveId),
    CollectiveArrive {
        flow: CollectiveId,
        op: u64,
    },
}

/// What rides a link.
#[derive(Debug, Clone)]
enum Packet {
    Frame(Frame),
    Cross,
    Collective { flow: CollectiveId, op: u64 },
}

/// A deterministic simulated fabric.
///
/// Methods come in the usual kinds: setup ([`Sim::add_node`], [`Sim::connect`], [`Sim::add_fault`]),
/// faults as commands ([`Sim::partition`], [`Sim::heal`], [`Sim::crash`], [`Sim::restart`] and their
/// scheduled forms), the loop ([`Sim::run`]) and getters.
#[derive(Debug)]
pub struct Sim {
    epoch: Instant,
    now: Duration,
    seed: u64,
    nodes: Vec<Node>,
    links: BTreeMap<(NodeId, NodeId), Link>,
    partitioned: BTreeSet<(NodeId, NodeId)>,
    actions: BTreeMap<(Duration, u64), Action>,
    next_seq: u64,
    stats: SimStats,
    /// Packets waiting in priority links' class queues, by id.
    queued: BTreeMap<u64, (NodeId, NodeId, Packet)>,
    next_packet: u64,
    collectives: Vec<FlowState>,
}

impl Sim {
    /// An empty simulation whose virtual time starts at `epoch`; `seed` derives every generator in it.
    #[must_use]
    pub fn new(epoch: Instant, seed: u64) -> Self {
        Self {
            epoch,
            now: Duration::ZERO,
            seed,
            nodes: Vec::new(),
            links: BTreeMap::new(),
            partitioned: BTreeSet::new(),
            actions: BTreeMap::new(),
            next_seq: 0,
            stats: SimStats::default(),
            queued: BTreeMap::new(),
            next_packet: 0,
            collectives: Vec::new(),
        }
    }

    /// The seed.
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Virtual time since the epoch.
    #[must_use]
    pub fn now(&self) -> Duration {
        self.now
    }

    /// The current virtual time as an `Instant` (what engines are given).
    #[must_use]
    pub fn instant(&self) -> Instant {
        self.epoch + self.now
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> SimStats {
        self.stats
    }

    /// Adds a node running an engine with `cfg`.
    pub fn add_node(&mut self, cfg: EngineConfig) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node::new(id, cfg));
        id
    }

    /// A node.
    ///
    /// # Panics
    /// If `id` was not returned by [`Sim::add_node`].
    #[must_use]
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    /// A node, writable (to register regions, fill memory, submit transfers).
    ///
    /// # Panics
    /// If `id` was not returned by [`Sim::add_node`].
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.0 as usize]
    }

    /// Every node.
    #[must_use]
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Connects `a` and `b` with one link each way, both with `cfg` and their own generators.
    pub fn connect(&mut self, a: NodeId, b: NodeId, cfg: LinkConfig) {
        for (from, to) in [(a, b), (b, a)] {
            let rng = ChaCha8Rng::seed_from_u64(crate::mix(
                self.seed,
                (u64::from(from.0) << 32) | u64::from(to.0),
            ));
            self.links.insert((from, to), Link::new(cfg, rng));
        }
    }

    /// Sets the queue discipline of the link from `from` to `to` (no-op if there is none). Set it before
    /// the run: packets already waiting are forgotten.
    pub fn set_discipline(&mut self, from: NodeId, to: NodeId, discipline: QueueDiscipline) {
        if let Some(link) = self.links.get_mut(&(from, to)) {
            link.set_discipline(discipline);
        }
    }

    /// Adds a periodic collective flow from `from` to `to` (see [`CollectiveFlow`]).
    pub fn add_collective(
        &mut self,
        from: NodeId,
        to: NodeId,
        flow: CollectiveFlow,
    ) -> CollectiveId {
        let id = CollectiveId(self.collectives.len());
        self.collectives.push(FlowState::new(from, to, flow));
        if flow.ops > 0 {
            self.schedule(flow.start, Action::CollectiveIssue(id));
        }
        id
    }

    /// What collective flow `id` measured so far.
    ///
    /// # Panics
    /// If `id` was not returned by [`Sim::add_collective`].
    #[must_use]
    pub fn collective(&self, id: CollectiveId) -> &CollectiveStats {
        &self.collectives[id.0].stats
    }

    /// The link from `from` to `to`.
    #[must_use]
    pub fn link(&self, from: NodeId, to: NodeId) -> Option<&Link> {
        self.links.get(&(from, to))
    }

    /// The link from `from` to `to`, writable.
    pub fn link_mut(&mut self, from: NodeId, to: NodeId) -> Option<&mut Link> {
        self.links.get_mut(&(from, to))
    }

    /// Counters of every link, keyed by (from, to).
    #[must_use]
    pub fn link_stats(&self) -> BTreeMap<(NodeId, NodeId), LinkStats> {
        self.links.iter().map(|(k, l)| (*k, l.stats())).collect()
    }

    /// Appends `rule` to the link from `from` to `to` (no-op if there is none).
    pub fn add_fault(&mut self, from: NodeId, to: NodeId, rule: FaultRule) {
        if let Some(link) = self.links.get_mut(&(from, to)) {
            link.add_fault(rule);
        }
    }

    /// Appends `rule` to both links between `a` and `b`; each keeps its own copy (and state).
    pub fn add_fault_both(&mut self, a: NodeId, b: NodeId, rule: FaultRule) {
        self.add_fault(a, b, rule.clone());
        self.add_fault(b, a, rule);
    }

    /// Cuts `a` and `b` apart, both ways, from now until [`Sim::heal`].
    pub fn partition(&mut self, a: NodeId, b: NodeId) {
        self.partitioned.insert((a, b));
        self.partitioned.insert((b, a));
    }

    /// Ends a partition made by [`Sim::partition`].
    pub fn heal(&mut self, a: NodeId, b: NodeId) {
        self.partitioned.remove(&(a, b));
        self.partitioned.remove(&(b, a));
    }

    /// Partitions `a` and `b` from `start` until `end` (`None`: for ever), as fault rules on both links
    /// placed before every other rule.
    pub fn schedule_partition(
        &mut self,
        a: NodeId,
        b: NodeId,
        start: Duration,
        end: Option<Duration>,
    ) {
        for key in [(a, b), (b, a)] {
            if let Some(link) = self.links.get_mut(&key) {
                let mut rules = vec![FaultRule::Partition { start, end }];
                rules.extend_from_slice(link.faults());
                link.clear_faults();
                for r in rules {
                    link.add_fault(r);
                }
            }
        }
    }

    /// Crashes `node` now: its engine state is lost and frames to it are dropped.
    pub fn crash(&mut self, node: NodeId) {
        self.nodes[node.0 as usize].crash();
    }

    /// Restarts a crashed `node` with a fresh engine and its regions registered again.
    pub fn restart(&mut self, node: NodeId) -> Result<(), transfer_engine::Error> {
        self.nodes[node.0 as usize].restart()
    }

    /// Crashes `node` at virtual time `at`.
    pub fn schedule_crash(&mut self, node: NodeId, at: Duration) {
        self.schedule(at, Action::Crash(node));
    }

    /// Restarts `node` at virtual time `at`.
    pub fn schedule_restart(&mut self, node: NodeId, at: Duration) {
        self.schedule(at, Action::Restart(node));
    }

    /// Adds background traffic on the link from `from` to `to`.
    pub fn add_cross_traffic(&mut self, from: NodeId, to: NodeId, traffic: CrossTraffic) {
        if traffic.rate > 0 && traffic.packet_bytes > 0 && traffic.start < traffic.end {
            self.schedule(traffic.start, Action::Cross { from, to, traffic });
        }
    }

    /// Queues `action` at virtual time `at` (after those already queued for the same instant).
    fn schedule(&mut self, at: Duration, action: Action) {
        self.next_seq += 1;
        self.actions.insert((at, self.next_seq), action);
    }
}
