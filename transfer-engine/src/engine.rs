//! The engine: many sessions, both roles, one transmit queue, one retransmit budget.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::control::{OpenRequest, decode_ranges};
use crate::plan::Plan;
use crate::policy::{ClassPolicy, FixedClass, FixedMode, ModePolicy};
use crate::receiver::{ReceiverSession, ReceiverSpec};
use crate::region::RegionTable;
use crate::scheduler::{Scheduler, ShapingConfig};
use crate::sender::{SenderSession, SenderSpec};
use crate::transmit::{check_blocks, check_distinct};
use crate::wire::{FrameKind, Header, WireError};
use crate::{
    AccessKey, Backoff, Body, Counters, Error, Event, KvLayout, Lane, MemoryRegion, PeerId,
    RegionHandle, RegionId, RetransmitBudget, Role, SessionId, TrafficClass, TransferMode,
    TransferRequest, TransferShape, Transmit,
};

/// How many finished sessions are remembered, so late frames for them are dropped quietly.
const RECENTLY_CLOSED: usize = 4096;

/// Engine settings. Time and randomness come from outside: `rng_seed` seeds every random choice.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// This engine's id; session ids start with it, so engines that talk must have distinct ids.
    pub engine_id: u32,
    /// Seed of the generator behind access keys and retransmit jitter.
    pub rng_seed: u64,
    /// Retransmit timing.
    pub backoff: Backoff,
    /// Retransmits of one unit before it is given up (its blocks go to recompute).
    pub max_retries: u32,
    /// Default time a session has before undelivered blocks are handed back for recompute.
    pub deadline: Duration,
    /// Most unacknowledged payload bytes per session (at least one unit is always allowed).
    pub window_bytes: u64,
    /// The engine-wide retransmit budget.
    pub retransmit_budget: RetransmitBudget,
    /// Mode used when a request names none (through the default mode policy).
    pub default_mode: TransferMode,
    /// Class used when a request names none (through the default class policy).
    pub default_class: TrafficClass,
    /// Most sessions one peer may have open towards this engine at once; more opens are refused (each
    /// holds receiver state proportional to its plan).
    pub max_incoming_per_peer: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            engine_id: 1,
            rng_seed: 0,
            backoff: Backoff::default(),
            max_retries: 8,
            deadline: Duration::from_secs(10),
            window_bytes: 64 << 20,
            retransmit_budget: RetransmitBudget::default(),
            default_mode: TransferMode::auto(),
            default_class: TrafficClass::BulkKv,
            max_incoming_per_peer: 256,
        }
    }
}

/// Where the payload of a received data frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Copy the payload to `offset..offset + len` of local region `region`, then call
    /// [`Engine::handle_data`] with its CRC.
    Write {
        /// Local region.
        region: RegionId,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// Do not place it (the slice already verified: a late duplicate must never overwrite it); still call
    /// [`Engine::handle_data`] so the slice is acknowledged again.
    Discard,
}

/// What sessions need from the engine while they run.
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a EngineConfig,
    pub(crate) rng: &'a mut ChaCha8Rng,
    pub(crate) budget: &'a mut RetransmitBudget,
    pub(crate) events: &'a mut VecDeque<Event>,
}

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
    rx_output: VecDeque<(PeerId, SessionId)>,
    control_out: VecDeque<Transmit>,
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
            rx_output: VecDeque::new(),
            control_out: VecDeque::new(),
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

    // ---- getters ----

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
        total
    }

    /// A live session's counters (sender or receiver end).
    #[must_use]
    pub fn session_stats(&self, session: SessionId) -> Option<Counters> {
        self.senders.get(&session).map(|s| s.stats).or_else(|| {
            self.receivers
                .iter()
                .find(|((_, id), _)| *id == session)
                .map(|(_, r)| r.stats)
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
            || self.receivers.keys().any(|(p, _)| *p == peer)
    }

    // ---- commands ----

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
            return Err(Error::InvalidRequest(format!(
                "source layout {:?} differs from the layout region {} was registered with ({registered:?})",
                req.src_layout, req.src_region
            )));
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
            req.src_layout.block_bytes,
            req.layers.clone(),
            &req.src_blocks,
            &req.dst_blocks,
            mode,
        )?;
        let deadline = req.deadline.unwrap_or(self.cfg.deadline);
        let open = OpenRequest {
            dst_layout: req.dst_layout,
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
        };
        self.senders.insert(id, SenderSession::new(spec));
        self.ready.push_back(id);
        Ok(id)
    }

    /// Stops a session this engine is sending: every block not yet acknowledged is reported for recompute.
    pub fn cancel(&mut self, session: SessionId) -> Result<(), Error> {
        let sender = self
            .senders
            .get_mut(&session)
            .ok_or(Error::UnknownSession(session))?;
        let mut ctx = Ctx {
            cfg: &self.cfg,
            rng: &mut self.rng,
            budget: &mut self.budget,
            events: &mut self.events,
        };
        sender.give_up_all(&mut ctx);
        Ok(())
    }

    /// The driver lost `peer` for good (every connection gone and redialing refused): every session with
    /// it ends now, each with an [`Event::Aborted`] carrying `reason`, then its recompute report (the
    /// sender's unacknowledged blocks, the receiver's missing ones) and completion. Returns how many ended.
    pub fn abort_peer(&mut self, peer: PeerId, reason: &str) -> usize {
        let mut ended = 0;
        let mut ctx = Ctx {
            cfg: &self.cfg,
            rng: &mut self.rng,
            budget: &mut self.budget,
            events: &mut self.events,
        };
        for (id, sender) in self.senders.iter_mut().filter(|(_, s)| s.peer() == peer) {
            ctx.events.push_back(Event::Aborted {
                session: *id,
                role: Role::Sender,
                reason: reason.to_string(),
            });
            sender.abort(&mut ctx);
            ended += 1;
        }
        for ((_, id), rx) in self
            .receivers
            .iter_mut()
            .filter(|((p, _), r)| *p == peer && !r.is_done())
        {
            self.events.push_back(Event::Aborted {
                session: *id,
                role: Role::Receiver,
                reason: reason.to_string(),
            });
            rx.abort(&mut self.events);
            ended += 1;
        }
        self.reap();
        ended
    }

    // ---- inputs ----

    /// Handles a control frame (anything but data) from `from`, its payload already read.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        from: PeerId,
        header: &Header,
        payload: &[u8],
    ) -> Result<(), Error> {
        let result = self.dispatch_control(now, from, header, payload);
        if result.is_err() {
            self.refused += 1;
        }
        result
    }

    /// Where the payload of data frame `header` from `from` should be placed; call before reading it.
    pub fn placement(&mut self, from: PeerId, header: &Header) -> Result<Placement, Error> {
        let result = self.placement_inner(from, header);
        if result.is_err() {
            self.refused += 1;
        }
        result
    }

    /// A data frame's payload was placed as [`Engine::placement`] said (or discarded), and its CRC-32C is
    /// `payload_crc`. Only a matching CRC marks the slice delivered.
    pub fn handle_data(
        &mut self,
        _now: Instant,
        from: PeerId,
        header: &Header,
        payload_crc: u32,
    ) -> Result<(), Error> {
        let key = (from, SessionId(header.session));
        let result = match self.receivers.get_mut(&key) {
            Some(rx) => {
                let r = rx.on_data(header, payload_crc, &mut self.events);
                if rx.has_output() {
                    self.rx_output.push_back(key);
                }
                r
            }
            None if self.closed.contains(&key) => Ok(()),
            None => Err(Error::UnknownSession(key.1)),
        };
        if result.is_err() {
            self.refused += 1;
        }
        result
    }

    /// Handles a whole frame held in memory: decodes it and, for data, places the payload into the
    /// destination region's memory, verifies it there and hands it on. For in-process drivers (simulation,
    /// tests); the payload is copied once, from `bytes` into its place.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        from: PeerId,
        bytes: &[u8],
    ) -> Result<(), Error> {
        let (header, payload) =
            crate::wire::decode_frame(bytes).inspect_err(|_| self.refused += 1)?;
        if header.kind != FrameKind::Data {
            return self.handle_frame(now, from, &header, payload);
        }
        let crc = match self.placement(from, &header)? {
            Placement::Write {
                region,
                offset,
                len,
            } => {
                let range = offset as usize..offset as usize + len as usize;
                let mut dst = self.regions.memory(region)?.write(range)?;
                crate::copy_and_crc32c(&mut dst, payload)
            }
            Placement::Discard => header.crc,
        };
        self.handle_data(now, from, &header, crc)
    }

    /// Advances timers: retransmits, deadlines, expiries.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut ctx = Ctx {
            cfg: &self.cfg,
            rng: &mut self.rng,
            budget: &mut self.budget,
            events: &mut self.events,
        };
        for sender in self.senders.values_mut() {
            if sender.next_timeout().is_some_and(|t| t <= now) {
                sender.handle_timeout(now, &mut ctx);
            }
        }
        for (key, rx) in &mut self.receivers {
            if rx.next_timeout() <= now {
                rx.handle_timeout(now, &self.cfg, &mut self.events);
                if rx.has_output() {
                    self.rx_output.push_back(*key);
                }
            }
        }
        if self.shaping_wake.is_some_and(|t| t <= now) {
            self.shaping_wake = None;
        }
        self.reap();
    }

    // ---- outputs ----

    /// The next frame to send: control frames first, then data by traffic class (strict priority),
    /// round-robin between sessions of a class so packetized transfers interleave.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if let Some(t) = self.control_out.pop_front() {
            return Some(t);
        }
        while let Some(key) = self.rx_output.pop_front() {
            if let Some(rx) = self.receivers.get_mut(&key)
                && let Some(t) = rx.poll_transmit()
            {
                if rx.has_output() {
                    self.rx_output.push_front(key);
                } else if rx.is_done() {
                    self.retire_receiver(key);
                }
                return Some(t);
            }
        }
        self.shaping_wake = None;
        for class in self.scheduler.order(now) {
            if !self.senders.values().any(|s| s.class() == class) {
                self.scheduler.mark_idle(class);
                continue;
            }
            if let Some(at) = self.scheduler.ready_at(now, class) {
                self.scheduler.mark_waiting(now, class);
                self.shaping_wake = Some(self.shaping_wake.map_or(at, |w| w.min(at)));
                continue;
            }
            if let Some(t) = self.poll_class(now, class) {
                if let Body::Payload(p) = &t.body {
                    self.scheduler.charge(now, class, u64::from(p.len));
                }
                for lower in TrafficClass::ALL.into_iter().filter(|c| *c > class) {
                    self.scheduler.mark_waiting(now, lower);
                }
                return Some(t);
            }
            self.scheduler.mark_idle(class);
        }
        None
    }

    /// Offers a turn to each sending session of `class`, round-robin, until one has a frame.
    fn poll_class(&mut self, now: Instant, class: TrafficClass) -> Option<Transmit> {
        let mut ctx = Ctx {
            cfg: &self.cfg,
            rng: &mut self.rng,
            budget: &mut self.budget,
            events: &mut self.events,
        };
        let mut found = None;
        let mut done = None;
        for _ in 0..self.ready.len() {
            let Some(id) = self.ready.pop_front() else {
                break;
            };
            let Some(sender) = self.senders.get_mut(&id) else {
                continue;
            };
            self.ready.push_back(id);
            if sender.class() != class {
                continue;
            }
            found = sender.poll_transmit(now, &mut ctx);
            if sender.is_done() {
                done = Some(id);
            }
            if found.is_some() {
                break;
            }
        }
        if let Some(id) = done {
            self.retire_sender(id);
        }
        found
    }

    /// Changes traffic shaping at run time: link rate, KV share, per-class rates, bursts, starvation limit.
    pub fn set_shaping(&mut self, cfg: ShapingConfig) -> Result<(), Error> {
        self.scheduler = Scheduler::new(cfg)?;
        Ok(())
    }

    /// The shaping in force.
    #[must_use]
    pub fn shaping(&self) -> &ShapingConfig {
        self.scheduler.config()
    }

    /// The consumer of an incoming session is about to compute `layer` (layers are consumed in order):
    /// the sender keeps at most its prefetch depth of layers beyond it in flight, and if the layer has not
    /// fully arrived the consumer is blocked on it and its remaining bytes become urgent. Returns whether
    /// the layer is already complete.
    pub fn consume_layer(
        &mut self,
        now: Instant,
        session: SessionId,
        layer: u32,
    ) -> Result<bool, Error> {
        let (key, rx) = self
            .receivers
            .iter_mut()
            .find(|((_, id), _)| *id == session)
            .ok_or(Error::UnknownSession(session))?;
        let complete = rx.want_layer(now, layer, &self.cfg)?;
        self.rx_output.push_back(*key);
        Ok(complete)
    }

    /// When [`Engine::handle_timeout`] should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let senders = self
            .senders
            .values()
            .filter_map(SenderSession::next_timeout);
        let receivers = self.receivers.values().map(ReceiverSession::next_timeout);
        senders.chain(receivers).chain(self.shaping_wake).min()
    }

    /// The next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ---- internals ----

    fn dispatch_control(
        &mut self,
        now: Instant,
        from: PeerId,
        header: &Header,
        payload: &[u8],
    ) -> Result<(), Error> {
        if payload.len() != header.length as usize {
            return Err(WireError::Truncated {
                needed: header.length as usize,
                got: payload.len(),
            }
            .into());
        }
        if !header.payload_verifies(payload) {
            return Err(WireError::PayloadChecksum.into());
        }
        let session = SessionId(header.session);
        if header.kind == FrameKind::Data {
            return Err(Error::InvalidRequest(
                "data frames go through Engine::placement and Engine::handle_data".into(),
            ));
        }
        if !header.kind.is_from_receiver() {
            return self.receiver_control(now, from, header, payload);
        }
        let Some(sender) = self.senders.get_mut(&session).filter(|s| s.peer() == from) else {
            return if self.closed.contains(&(from, session)) {
                Ok(())
            } else {
                Err(Error::UnknownSession(session))
            };
        };
        let mut ctx = Ctx {
            cfg: &self.cfg,
            rng: &mut self.rng,
            budget: &mut self.budget,
            events: &mut self.events,
        };
        let result = match header.kind {
            FrameKind::OpenAck => {
                sender.on_open_ack();
                Ok(())
            }
            FrameKind::Reject => {
                sender.on_reject(String::from_utf8_lossy(payload).into_owned(), &mut ctx);
                Ok(())
            }
            FrameKind::Ack => {
                sender.on_progress(header.layer, header.offset == 1);
                sender.on_ack(now, &decode_ranges(payload)?, &mut ctx)
            }
            FrameKind::Progress => {
                sender.on_progress(header.layer, header.offset == 1);
                Ok(())
            }
            FrameKind::Nack => sender.on_nack(header.sequence, header.attempt, &mut ctx),
            FrameKind::CloseAck => {
                sender.on_close_ack();
                Ok(())
            }
            FrameKind::Open | FrameKind::Data | FrameKind::Close => {
                unreachable!("routed to the receiver")
            }
        };
        if sender.is_done() {
            self.retire_sender(session);
        }
        result
    }

    fn receiver_control(
        &mut self,
        now: Instant,
        from: PeerId,
        header: &Header,
        payload: &[u8],
    ) -> Result<(), Error> {
        let key = (from, SessionId(header.session));
        match header.kind {
            FrameKind::Open => {
                if let Some(rx) = self.receivers.get_mut(&key) {
                    rx.on_duplicate_open();
                    self.rx_output.push_back(key);
                    return Ok(());
                }
                if self.closed.contains(&key) {
                    // Either a stale duplicate (its sender is gone and ignores the answer) or a peer that
                    // restarted and reused a session id: refuse, so the sender learns at once.
                    let err = Error::InvalidRequest(format!(
                        "session {} was already used and closed here: a restarted peer reused its session \
                         ids (seed each engine process's rng_seed differently)",
                        key.1
                    ));
                    self.refuse_open(from, key.1, &err);
                    return Err(err);
                }
                match self.accept(now, key, payload) {
                    Ok(()) => Ok(()),
                    Err(err) => {
                        self.refuse_open(from, key.1, &err);
                        Err(err)
                    }
                }
            }
            FrameKind::Close => {
                if let Some(rx) = self.receivers.get_mut(&key) {
                    rx.on_close(&mut self.events);
                    self.rx_output.push_back(key);
                } else if self.closed.contains(&key) {
                    self.control_out.push_back(Transmit {
                        peer: from,
                        header: Header::new(FrameKind::CloseAck, key.1.0),
                        body: Body::Empty,
                        lane: Lane::Shared,
                        class: TrafficClass::Collective,
                    });
                } else {
                    return Err(Error::UnknownSession(key.1));
                }
                Ok(())
            }
            _ => Err(Error::UnknownSession(key.1)),
        }
    }

    /// Answers an open with a reject carrying `err`'s message.
    fn refuse_open(&mut self, to: PeerId, session: SessionId, err: &Error) {
        let reason = err.to_string().into_bytes();
        let mut h = Header::new(FrameKind::Reject, session.0);
        h.length = reason.len() as u32;
        h.crc = crate::crc32c(&reason);
        self.control_out.push_back(Transmit {
            peer: to,
            header: h,
            body: Body::Control(reason),
            lane: Lane::Shared,
            class: TrafficClass::Collective,
        });
    }

    /// Checks an open request against our regions and creates the receiving end.
    fn accept(
        &mut self,
        now: Instant,
        key: (PeerId, SessionId),
        payload: &[u8],
    ) -> Result<(), Error> {
        let live = self.receivers.keys().filter(|(p, _)| *p == key.0).count();
        if live >= self.cfg.max_incoming_per_peer {
            return Err(Error::InvalidRequest(format!(
                "peer {} already has {live} sessions open here, the most allowed: wait for some to finish",
                key.0.0
            )));
        }
        let open = OpenRequest::decode(payload)?;
        open.dst_layout.validate()?;
        let region = *self.regions.get(open.dst_region)?;
        self.regions.check_writer(open.dst_region, key.0)?;
        self.regions.check_remote(
            open.dst_region,
            open.dst_key,
            0,
            open.dst_layout.total_bytes(),
        )?;
        if let Some(registered) = region.layout {
            registered.check_compatible(&open.dst_layout)?;
            if registered != open.dst_layout {
                return Err(Error::InvalidRequest(format!(
                    "the transfer describes region {} as {:?}, but it holds {registered:?}",
                    open.dst_region, open.dst_layout
                )));
            }
        }
        check_blocks(
            &open.dst_layout,
            &open.layers,
            &open.dst_blocks,
            "destination",
        )?;
        check_distinct(&open.dst_blocks)?;
        let plan = Plan::build(
            open.dst_layout.block_bytes,
            open.layers.clone(),
            &open.src_blocks,
            &open.dst_blocks,
            open.mode,
        )?;
        let spec = ReceiverSpec {
            id: key.1,
            peer: key.0,
            dst_region: open.dst_region,
            dst_layout: open.dst_layout,
            dst_blocks: open.dst_blocks.clone(),
            plan,
            expires: now + open.deadline.saturating_mul(2),
        };
        self.receivers.insert(key, ReceiverSession::new(spec));
        self.rx_output.push_back(key);
        self.events.push_back(Event::Incoming {
            session: key.1,
            peer: key.0,
            region: open.dst_region,
            layers: open.layers.clone(),
            blocks: open.dst_blocks.clone(),
        });
        Ok(())
    }

    fn placement_inner(&self, from: PeerId, header: &Header) -> Result<Placement, Error> {
        if header.kind != FrameKind::Data {
            return Err(Error::InvalidRequest(format!(
                "{:?} frames carry no KV payload",
                header.kind
            )));
        }
        let key = (from, SessionId(header.session));
        match self.receivers.get(&key) {
            Some(rx) => rx.placement(header),
            None if self.closed.contains(&key) => Ok(Placement::Discard),
            None => Err(Error::UnknownSession(key.1)),
        }
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
