//! The engine: many sessions, both roles, one transmit queue, one retransmit budget. Its commands and
//! getters live here, its inputs in [`input`], its outputs in [`output`].

/// The context sessions run in, borrowed field by field from the engine (so its other fields, such as the
/// session tables, stay usable meanwhile).
macro_rules! session_ctx {
    ($engine:expr) => {
        $crate::config::Ctx {
            cfg: &$engine.cfg,
            rng: &mut $engine.rng,
            budget: &mut $engine.budget,
            events: &mut $engine.events,
        }
    };
}

mod input;
mod output;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::config::EngineConfig;
use crate::plan::{BlockShape, Plan};
use crate::policy::{ClassPolicy, FixedClass, FixedMode, ModePolicy};
use crate::receiver::ReceiverSession;
use crate::region::RegionTable;
use crate::scheduler::{Scheduler, ShapingConfig};
use crate::sender::{SenderSession, SenderSpec};
use crate::wire::control::OpenRequest;
use crate::{
    AccessKey, Body, Counters, Error, Event, KvLayout, MemoryRegion, PeerId, RegionHandle,
    RegionId, RetransmitBudget, Role, SessionId, TransferRequest, TransferShape, Transmit,
};

/// How many finished sessions are remembered, so late frames for them are dropped quietly.
const RECENTLY_CLOSED: usize = 4096;

/// Answers to refused frames (Rejects, CloseAcks) the engine holds for one peer at most; more are
/// dropped and counted (`Counters::replies_dropped`). The first answers already tell an honest sender
/// what went wrong; a peer that floods refused frames without reading gets no more queued.
pub const MAX_REPLIES_PER_PEER: usize = 64;

/// A KV transfer engine: the sans-IO state machines of every session on one node.
pub struct Engine {
    cfg: EngineConfig,
    mode_policy: Box<dyn ModePolicy>,
    class_policy: Box<dyn ClassPolicy>,
    rng: ChaCha8Rng,
    budget: RetransmitBudget,
    regions: RegionTable,
    next_session: u32,
    senders: BTreeMap<SessionId, SenderSession>,
    /// Sending sessions in round-robin order.
    ready: VecDeque<SessionId>,
    scheduler: Scheduler,
    /// When a class held back by its bucket may send again.
    shaping_wake: Option<Instant>,
    receivers: BTreeMap<(PeerId, SessionId), ReceiverSession>,
    /// Who sends each receiving session, so a session is found by its id alone without a scan.
    incoming: HashMap<SessionId, PeerId>,
    rx_output: VecDeque<(PeerId, SessionId)>,
    /// Answers to refused frames, at most [`MAX_REPLIES_PER_PEER`] per peer.
    control_out: VecDeque<Transmit>,
    /// How many answers each peer has in `control_out`.
    replies_queued: HashMap<PeerId, usize>,
    replies_dropped: u64,
    closed: BTreeSet<(PeerId, SessionId)>,
    closed_order: VecDeque<(PeerId, SessionId)>,
    events: VecDeque<Event>,
    finished_totals: Counters,
    refused: u64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("engine_id", &self.cfg.engine_id)
            .field("senders", &self.senders.len())
            .field("receivers", &self.receivers.len())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine with the default (fixed) mode and class policies from `cfg`.
    #[must_use]
    pub fn new(cfg: EngineConfig) -> Self {
        let (mode, class) = (FixedMode(cfg.default_mode), FixedClass(cfg.default_class));
        Self::with_policies(cfg, Box::new(mode), Box::new(class))
    }

    /// An engine whose requests without a mode or class are decided by these policies.
    #[must_use]
    pub fn with_policies(
        cfg: EngineConfig,
        mode: Box<dyn ModePolicy>,
        class: Box<dyn ClassPolicy>,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.rng_seed);
        // Session numbers start at a random point, so a restarted engine does not reuse its old ids.
        let next_session = rng.random::<u32>() >> 1;
        Self {
            rng,
            budget: cfg.retransmit_budget,
            mode_policy: mode,
            class_policy: class,
            regions: RegionTable::default(),
            next_session,
            senders: BTreeMap::new(),
            ready: VecDeque::new(),
            scheduler: Scheduler::new(ShapingConfig::default())
                .expect("the default shaping is valid"),
            shaping_wake: None,
            receivers: BTreeMap::new(),
            incoming: HashMap::new(),
            rx_output: VecDeque::new(),
            control_out: VecDeque::new(),
            replies_queued: HashMap::new(),
            replies_dropped: 0,
            closed: BTreeSet::new(),
            closed_order: VecDeque::new(),
            events: VecDeque::new(),
            finished_totals: Counters::default(),
            refused: 0,
            cfg,
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Engine-wide counters: every session, live and finished, plus frames refused.
    #[must_use]
    pub fn stats(&self) -> Counters {
        let mut total = self.finished_totals;
        for s in self.senders.values() {
            total += s.stats;
        }
        for r in self.receivers.values() {
            total += r.stats;
        }
        total.frames_refused += self.refused;
        total.replies_dropped += self.replies_dropped;
        total
    }

    /// A live session's counters (sender or receiver end).
    #[must_use]
    pub fn session_stats(&self, session: SessionId) -> Option<Counters> {
        self.senders.get(&session).map(|s| s.stats).or_else(|| {
            let peer = *self.incoming.get(&session)?;
            self.receivers.get(&(peer, session)).map(|r| r.stats)
        })
    }

    /// A registered region.
    pub fn region(&self, id: RegionId) -> Result<&RegionHandle, Error> {
        self.regions.get(id)
    }

    /// Number of live sessions (both roles).
    #[must_use]
    pub fn live_sessions(&self) -> usize {
        self.senders.len() + self.receivers.len()
    }

    /// Whether any live session (either role) is with `peer`.
    #[must_use]
    pub fn has_sessions_with(&self, peer: PeerId) -> bool {
        self.senders.values().any(|s| s.peer() == peer)
            || self.receiving_from(peer).next().is_some()
    }

    /// The receiving sessions `peer` sends (a range of the table, which is ordered by peer first).
    fn receiving_from(
        &self,
        peer: PeerId,
    ) -> impl Iterator<Item = (&(PeerId, SessionId), &ReceiverSession)> {
        self.receivers
            .range((peer, SessionId(0))..=(peer, SessionId(u64::MAX)))
    }

    /// Registers `memory` as a region and returns its id and a fresh access key. The bytes stay where they
    /// are: sends read them and placements write them in place (see [`MemoryRegion`] for who may touch
    /// which bytes meanwhile).
    pub fn register_region(&mut self, memory: MemoryRegion) -> Result<RegionHandle, Error> {
        let key = AccessKey(self.rng.random());
        let len = memory.len() as u64;
        self.regions.register(memory, len, key, None)
    }

    /// Registers `memory` as a region holding a KV cache of `layout` (its first `layout.total_bytes()`
    /// bytes); incoming transfers must agree with the layout.
    pub fn register_kv_region(
        &mut self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, Error> {
        layout.validate()?;
        let key = AccessKey(self.rng.random());
        self.regions
            .register(memory, layout.total_bytes(), key, Some(layout))
    }

    /// Reserves region `id` for writes from `owner` only (`None` lifts it): an open from any other peer
    /// naming it is refused. A node that allocates a region for one peer reserves it so.
    pub fn set_region_owner(&mut self, id: RegionId, owner: Option<PeerId>) -> Result<(), Error> {
        self.regions.set_owner(id, owner)
    }

    /// The memory behind a registered region.
    pub fn memory(&self, id: RegionId) -> Result<&MemoryRegion, Error> {
        self.regions.memory(id)
    }

    /// The wire bytes of a transmit this engine produced: its header (sealed with the payload's CRC for
    /// data) followed by its payload, read from the region it names. For drivers that move whole frames
    /// as byte strings (the simulator, tests); zero-copy drivers send the header and the region's bytes
    /// without joining them.
    pub fn encode_transmit(&self, t: &mut Transmit) -> Result<Vec<u8>, Error> {
        Ok(match &t.body {
            Body::Payload(p) => {
                let payload = self.regions.memory(p.region)?.read(p.range())?;
                let mut out = Vec::with_capacity(crate::HEADER_LEN + payload.len());
                out.extend_from_slice(&t.seal(&payload));
                out.extend_from_slice(&payload);
                out
            }
            Body::Control(payload) => crate::wire::encode_frame(&t.header, payload),
            Body::Empty => t.header.encode().to_vec(),
        })
    }

    /// Unregisters a region no live session uses and hands back its memory. Drivers may still hold a clone
    /// for a frame they were moving; [`MemoryRegion::holders`] says when the caller's is the last.
    pub fn unregister_region(&mut self, id: RegionId) -> Result<MemoryRegion, Error> {
        let busy = self
            .senders
            .iter()
            .find(|(_, s)| s.src_region() == id)
            .map(|(id, _)| *id)
            .or_else(|| {
                self.receivers
                    .iter()
                    .find(|(_, r)| r.region() == id)
                    .map(|((_, id), _)| *id)
            });
        if let Some(session) = busy {
            return Err(Error::RegionBusy {
                region: id,
                session,
            });
        }
        self.regions.unregister(id)
    }

    /// Starts pushing blocks to a peer. Layouts are checked here, so a block-size mismatch is an error now,
    /// never a silent miss later.
    pub fn submit(&mut self, now: Instant, req: TransferRequest) -> Result<SessionId, Error> {
        req.src_layout.validate()?;
        req.dst_layout.validate()?;
        req.src_layout.check_compatible(&req.dst_layout)?;
        let region = *self.regions.get(req.src_region)?;
        if let Some(registered) = region.layout
            && registered != req.src_layout
        {
            return Err(Error::LayoutDiffers {
                region: req.src_region,
                given: Box::new(req.src_layout),
                registered: Box::new(registered),
            });
        }
        self.regions
            .check_local(req.src_region, 0, req.src_layout.total_bytes())?;
        req.check_blocks()?;
        let shape = TransferShape {
            bytes: u64::from(req.layers.end - req.layers.start)
                * req.src_blocks.len() as u64
                * req.src_layout.block_bytes,
            block_bytes: req.src_layout.block_bytes,
            blocks: req.src_blocks.len() as u32,
            layers: req.layers.end - req.layers.start,
        };
        let mode = req
            .mode
            .unwrap_or_else(|| self.mode_policy.choose_mode(&shape));
        let class = req
            .class
            .unwrap_or_else(|| self.class_policy.choose_class(&shape));
        let plan = Plan::build(
            &BlockShape::between(&req.src_layout, &req.dst_layout),
            req.layers.clone(),
            &req.src_blocks,
            &req.dst_blocks,
            mode,
        )?;
        let deadline = req.deadline.unwrap_or(self.cfg.deadline);
        let open = OpenRequest {
            dst_layout: req.dst_layout,
            src_layout: req.src_layout,
            dst_region: req.dst_region,
            dst_key: req.dst_key,
            mode,
            class,
            layers: req.layers.clone(),
            deadline,
            src_blocks: req.src_blocks.clone(),
            dst_blocks: req.dst_blocks.clone(),
        };
        self.next_session = self.next_session.wrapping_add(1);
        let id = SessionId((u64::from(self.cfg.engine_id) << 32) | u64::from(self.next_session));
        let spec = SenderSpec {
            id,
            peer: req.peer,
            class,
            src_region: req.src_region,
            src_layout: req.src_layout,
            src_blocks: req.src_blocks,
            dst_blocks: req.dst_blocks,
            plan,
            open_payload: open.encode(),
            deadline: now + deadline,
            prefetch_depth: req.prefetch_depth,
            written_until: req.written_until.unwrap_or(u32::MAX),
        };
        self.senders.insert(id, SenderSession::new(spec));
        self.ready.push_back(id);
        Ok(id)
    }

    /// The producer of sending session `session` has written every layer below `until`: those layers may
    /// go out (for requests made [`TransferRequest::with_layers_written`]). Later calls only move it on.
    pub fn layers_written(&mut self, session: SessionId, until: u32) -> Result<(), Error> {
        self.senders
            .get_mut(&session)
            .ok_or(Error::UnknownSession(session))?
            .layers_written(until);
        Ok(())
    }

    /// Stops a session this engine is sending: every block not yet acknowledged is reported for recompute.
    pub fn cancel(&mut self, session: SessionId) -> Result<(), Error> {
        let sender = self
            .senders
            .get_mut(&session)
            .ok_or(Error::UnknownSession(session))?;
        let mut ctx = session_ctx!(self);
        sender.give_up_all(&mut ctx);
        Ok(())
    }

    /// Stops receiving session `session` (the consumer gave up on it: it timed out, say): none of its
    /// bytes is placed from now on, and its blocks not yet verified are reported for recompute, after an
    /// [`Event::Aborted`]. The sender's later frames for it are those of a closed session.
    pub fn abandon_receive(&mut self, session: SessionId) -> Result<(), Error> {
        if self.abort_receivers(|(_, id)| *id == session, "abandoned by the receiver") == 0 {
            return Err(Error::UnknownSession(session));
        }
        self.reap();
        Ok(())
    }

    /// The driver lost `peer` for good (every connection gone and redialing refused): every session with
    /// it ends now, each with an [`Event::Aborted`] carrying `reason`, then its recompute report (the
    /// sender's unacknowledged blocks, the receiver's missing ones) and completion. Returns how many ended.
    pub fn abort_peer(&mut self, peer: PeerId, reason: &str) -> usize {
        let mut ended = 0;
        let mut ctx = session_ctx!(self);
        for (id, sender) in self.senders.iter_mut().filter(|(_, s)| s.peer() == peer) {
            ctx.events.push_back(Event::Aborted {
                session: *id,
                role: Role::Sender,
                reason: reason.to_string(),
            });
            sender.abort(&mut ctx);
            ended += 1;
        }
        ended += self.abort_receivers(|(p, _)| *p == peer, reason);
        self.reap();
        ended
    }

    /// Ends every live receiving session whose key `matches`, each with an [`Event::Aborted`] carrying
    /// `reason`, then its recompute report and completion. Returns how many ended.
    fn abort_receivers(
        &mut self,
        matches: impl Fn(&(PeerId, SessionId)) -> bool,
        reason: &str,
    ) -> usize {
        let mut ended = 0;
        for (key, rx) in self
            .receivers
            .iter_mut()
            .filter(|(k, r)| matches(k) && !r.is_done())
        {
            self.events.push_back(Event::Aborted {
                session: key.1,
                role: Role::Receiver,
                reason: reason.to_string(),
            });
            rx.abort(&mut self.events);
            ended += 1;
        }
        ended
    }

    /// Forgets finished sessions, keeping their counters and remembering their ids.
    fn reap(&mut self) {
        let done: Vec<SessionId> = self
            .senders
            .iter()
            .filter(|(_, s)| s.is_done())
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            self.retire_sender(id);
        }
        let done: Vec<_> = self
            .receivers
            .iter()
            .filter(|(_, r)| r.is_done())
            .map(|(k, _)| *k)
            .collect();
        for key in done {
            self.retire_receiver(key);
        }
    }

    fn retire_sender(&mut self, id: SessionId) {
        if let Some(s) = self.senders.remove(&id) {
            self.finished_totals += s.stats;
            self.remember_closed((s.peer(), id));
        }
    }

    fn retire_receiver(&mut self, key: (PeerId, SessionId)) {
        if let Some(r) = self.receivers.remove(&key) {
            self.incoming.remove(&key.1);
            self.finished_totals += r.stats;
            self.remember_closed(key);
        }
    }

    fn remember_closed(&mut self, key: (PeerId, SessionId)) {
        if self.closed.insert(key) {
            self.closed_order.push_back(key);
        }
        while self.closed_order.len() > RECENTLY_CLOSED {
            if let Some(old) = self.closed_order.pop_front() {
                self.closed.remove(&old);
            }
        }
    }
}
