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

    /// Runs until every session has ended ([`RunEnd::Idle`]) or virtual time reaches `limit`, telling
    /// `observer` every engine event as it happens.
    pub fn run(&mut self, limit: Duration, observer: &mut impl Observer) -> RunEnd {
        self.run_inner(limit, observer, false)
            .expect("stop requests are not checked")
    }

    /// Like [`Sim::run`], but returns `None` as soon as `observer` asks to stop
    /// ([`Observer::stop_requested`]), with virtual time at the event that made it ask. Call it again to
    /// go on.
    pub fn run_until(&mut self, limit: Duration, observer: &mut impl Observer) -> Option<RunEnd> {
        self.run_inner(limit, observer, true)
    }

    fn run_inner(
        &mut self,
        limit: Duration,
        observer: &mut impl Observer,
        stoppable: bool,
    ) -> Option<RunEnd> {
        let mut steps_here = 0u64;
        loop {
            for i in 0..self.nodes.len() {
                self.pump(NodeId(i as u32), observer);
            }
            if stoppable && observer.stop_requested() {
                return None;
            }
            let next_action = self.actions.first_key_value().map(|((t, _), _)| *t);
            let next_timer = self
                .nodes
                .iter()
                .filter(|n| n.is_up())
                .filter_map(|n| n.engine().poll_timeout())
                .map(|t| t.saturating_duration_since(self.epoch))
                .min();
            let Some(next) = [next_action, next_timer].into_iter().flatten().min() else {
                return Some(RunEnd::Idle);
            };
            if next > limit {
                self.now = self.now.max(limit);
                return Some(RunEnd::TimeLimit);
            }
            if next <= self.now {
                steps_here += 1;
                if steps_here > STALL_STEPS {
                    return Some(RunEnd::Stalled);
                }
            } else {
                steps_here = 0;
                self.now = next;
            }
            while let Some(entry) = self.actions.first_entry() {
                if entry.key().0 > self.now {
                    break;
                }
                let action = entry.remove();
                self.act(action, observer);
            }
            let now = self.instant();
            for i in 0..self.nodes.len() {
                let node = &mut self.nodes[i];
                if node.is_up() && node.engine().poll_timeout().is_some_and(|t| t <= now) {
                    node.engine_mut().handle_timeout(now);
                    self.drain(NodeId(i as u32), observer);
                }
            }
        }
    }

    fn schedule(&mut self, at: Duration, action: Action) {
        self.next_seq += 1;
        self.actions.insert((at, self.next_seq), action);
    }

    fn act(&mut self, action: Action, observer: &mut impl Observer) {
        match action {
            Action::Arrive { from, to, bytes } => {
                let now = self.instant();
                let node = &mut self.nodes[to.0 as usize];
                if !node.is_up() {
                    self.stats.frames_lost_down += 1;
                    return;
                }
                self.stats.frames_delivered += 1;
                node.receive(now, from, &bytes);
                self.drain(to, observer);
            }
            Action::Wake(node) => self.nodes[node.0 as usize].waiting = false,
            Action::Crash(node) => self.crash(node),
            Action::Restart(node) => {
                // Re-registering regions that registered once cannot fail.
                let _ = self.restart(node);
            }
            Action::Cross { from, to, traffic } => {
                if self.links.contains_key(&(from, to)) {
                    self.stats.cross_sent += 1;
                    let sent = self.put(
                        from,
                        to,
                        traffic.packet_bytes,
                        TrafficClass::Collective,
                        Packet::Cross,
                    );
                    if sent.is_err() {
                        if let Some(link) = self.links.get_mut(&(from, to)) {
                            link.tail_drop();
                        }
                        self.stats.cross_dropped += 1;
                    }
                }
                let gap = Duration::from_nanos(
                    (u128::from(traffic.packet_bytes) * 1_000_000_000 / u128::from(traffic.rate))
                        .max(1) as u64,
                );
                if self.now + gap < traffic.end {
                    self.schedule(self.now + gap, Action::Cross { from, to, traffic });
                }
            }
            Action::LinkTick {
                from,
                to,
                generation,
            } => {
                let current = self
                    .links
                    .get(&(from, to))
                    .and_then(|l| l.tick)
                    .is_some_and(|(_, g)| g == generation);
                if current {
                    if let Some(link) = self.links.get_mut(&(from, to)) {
                        link.tick = None;
                    }
                    self.serve(from, to);
                }
            }
            Action::CollectiveIssue(id) => {
                if let Some(next) = self.collectives[id.0].issue(self.now) {
                    self.schedule(next, Action::CollectiveIssue(id));
                }
                self.feed(id);
            }
            Action::CollectiveWake(id) => {
                self.collectives[id.0].waiting = false;
                self.feed(id);
            }
            Action::CollectiveArrive { flow, op } => self.collectives[flow.0].arrived(op, self.now),
        }
    }

    /// Offers collective flow `id`'s backlog to its link, in order, until the link is full.
    fn feed(&mut self, id: CollectiveId) {
        let (from, to) = (self.collectives[id.0].from, self.collectives[id.0].to);
        if self.collectives[id.0].waiting || !self.links.contains_key(&(from, to)) {
            return;
        }
        while let Some(&(op, len)) = self.collectives[id.0].backlog.front() {
            let packet = Packet::Collective { flow: id, op };
            match self.put(from, to, len, TrafficClass::Collective, packet) {
                Ok(()) => {
                    self.collectives[id.0].backlog.pop_front();
                }
                Err((retry_at, _)) => {
                    self.collectives[id.0].waiting = true;
                    self.schedule(retry_at, Action::CollectiveWake(id));
                    break;
                }
            }
        }
    }

    /// Puts `packet` (`len` bytes in `class`) on the link from `from` to `to` now. A full queue hands it
    /// back with the time to try again; a packet that can never fit is dropped (and counted by the link).
    fn put(
        &mut self,
        from: NodeId,
        to: NodeId,
        len: u64,
        class: TrafficClass,
        packet: Packet,
    ) -> Result<(), (Duration, Packet)> {
        let Some(link) = self.links.get_mut(&(from, to)) else {
            return Ok(());
        };
        if !link.is_priority() {
            return match link.offer(self.now, len) {
                Offer::Queued { arrives, .. } => {
                    self.depart(from, to, arrives, packet);
                    Ok(())
                }
                Offer::Full { retry_at } => Err((retry_at, packet)),
                Offer::TooLarge => Ok(()),
            };
        }
        self.serve(from, to);
        let id = self.next_packet;
        let link = self.links.get_mut(&(from, to)).expect("checked above");
        match link.enqueue(self.now, id, len, class) {
            Enqueue::Queued => {
                self.next_packet += 1;
                self.queued.insert(id, (from, to, packet));
                self.retick(from, to);
                Ok(())
            }
            Enqueue::Full { retry_at } => Err((retry_at, packet)),
            Enqueue::TooLarge => Ok(()),
        }
    }

    /// Releases the frames a priority link finished by now, and schedules its next tick.
    fn serve(&mut self, from: NodeId, to: NodeId) {
        let Some(link) = self.links.get_mut(&(from, to)) else {
            return;
        };
        let delay = link.config().delay;
        for (id, done) in link.advance(self.now) {
            if let Some((from, to, packet)) = self.queued.remove(&id) {
                self.depart(from, to, done + delay, packet);
            }
        }
        self.retick(from, to);
    }

    fn retick(&mut self, from: NodeId, to: NodeId) {
        let Some(link) = self.links.get_mut(&(from, to)) else {
            return;
        };
        let Some(at) = link.next_event() else {
            return;
        };
        if link.tick.is_some_and(|(t, _)| t == at) {
            return;
        }
        // Unique across the run: a stale tick can never pass for a later one.
        let generation = self.next_seq;
        link.tick = Some((at, generation));
        self.schedule(
            at,
            Action::LinkTick {
                from,
                to,
                generation,
            },
        );
    }

    /// A packet left the link and arrives (before faults) at `arrives`.
    fn depart(&mut self, from: NodeId, to: NodeId, arrives: Duration, packet: Packet) {
        match packet {
            Packet::Frame(frame) => self.transmit(from, to, arrives, frame),
            Packet::Cross => {}
            Packet::Collective { flow, op } => {
                self.schedule(arrives, Action::CollectiveArrive { flow, op });
            }
        }
    }

    /// Sends what `node` has to send while its links have room (backpressure: a node never polls its
    /// engine while a frame it already took is waiting for queue space).
    fn pump(&mut self, id: NodeId, observer: &mut impl Observer) {
        let now = self.instant();
        loop {
            let node = &mut self.nodes[id.0 as usize];
            if !node.is_up() || node.waiting {
                break;
            }
            let frame = match node.held.take() {
                Some(f) => f,
                None => match node.poll_frame(now) {
                    Some(f) => f,
                    None => break,
                },
            };
            let Some(to) =
                NodeId::from_peer(frame.to).filter(|to| self.links.contains_key(&(id, *to)))
            else {
                self.stats.frames_unroutable += 1;
                continue;
            };
            let (len, class) = (frame.bytes.len() as u64, frame.class);
            if let Err((retry_at, packet)) = self.put(id, to, len, class, Packet::Frame(frame)) {
                let node = &mut self.nodes[id.0 as usize];
                if let Packet::Frame(frame) = packet {
                    node.held = Some(frame);
                }
                node.waiting = true;
                self.schedule(retry_at, Action::Wake(id));
                break;
            }
        }
        self.drain(id, observer);
    }

    /// A frame left `from` for `to`: the fault rules decide what arrives, and when.
    fn transmit(&mut self, from: NodeId, to: NodeId, arrives: Duration, frame: Frame) {
        let info = PacketInfo {
            from,
            to,
            at: self.now,
            len: frame.bytes.len(),
            data: frame.data,
        };
        if self.partitioned.contains(&(from, to)) {
            self.stats.frames_lost_down += 1;
            return;
        }
        let link = self
            .links
            .get_mut(&(from, to))
            .expect("routed frames have a link");
        let mut bytes = frame.bytes;
        match link.judge(&info) {
            Verdict::Pass => self.schedule(arrives, Action::Arrive { from, to, bytes }),
            Verdict::Deliver(extra) => {
                self.schedule(arrives + extra, Action::Arrive { from, to, bytes });
            }
            Verdict::Drop => {}
            Verdict::Corrupt { offset, mask } => {
                if let Some(b) = bytes.get_mut(offset) {
                    *b ^= mask.max(1);
                }
                self.schedule(arrives, Action::Arrive { from, to, bytes });
            }
            Verdict::Duplicate(extra) => {
                let copy = bytes.clone();
                self.schedule(arrives, Action::Arrive { from, to, bytes });
                self.schedule(
                    arrives + extra,
                    Action::Arrive {
                        from,
                        to,
                        bytes: copy,
                    },
                );
            }
        }
    }

    fn drain(&mut self, id: NodeId, observer: &mut impl Observer) {
        let at = self.now;
        let node = &mut self.nodes[id.0 as usize];
        while let Some(event) = node.poll_event() {
            observer.on_event(at, id, &event, node);
        }
    }
}
