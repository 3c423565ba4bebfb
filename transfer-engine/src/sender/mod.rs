//! The sending end of a session: opens it, sends units, retransmits with backoff, gives up with recompute.

mod feedback;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use crate::config::Ctx;
use crate::plan::Plan;
use crate::rtt::RttEstimator;
use crate::wire::{FrameKind, Header, MAX_PAYLOAD};
use crate::{
    BlockId, Body, Channel, Counters, PayloadRef, PeerId, RegionId, SessionId, TrafficClass,
    Transmit,
};

/// Where a sender is in its life. Changes only through [`SenderSession::enter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SenderState {
    /// Waiting for the receiver to accept the open.
    Opening,
    /// Sending and retransmitting units.
    Sending,
    /// Every unit is acknowledged or given up; telling the receiver.
    Closing,
    /// Finished.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnitState {
    Pending,
    InFlight {
        attempt: u16,
        sent_at: Instant,
    },
    Resend {
        attempt: u16,
        last_sent: Instant,
    },
    /// Due for resending as `attempt` but refused by the retransmit budget: out of the window, waiting.
    Parked {
        attempt: u16,
        last_sent: Instant,
    },
    Acked,
    Failed,
}

/// What a sender needs to be created.
#[derive(Debug)]
pub(crate) struct SenderSpec {
    pub(crate) id: SessionId,
    pub(crate) peer: PeerId,
    pub(crate) class: TrafficClass,
    pub(crate) src_region: RegionId,
    /// Byte offset of each source block of each layer is computed from this layout.
    pub(crate) src_layout: crate::KvLayout,
    pub(crate) src_blocks: Vec<u32>,
    pub(crate) dst_blocks: Vec<u32>,
    pub(crate) plan: Plan,
    pub(crate) open_payload: Vec<u8>,
    pub(crate) deadline: Instant,
    /// Layers sent ahead of the consumer's current one; `None`: no limit.
    pub(crate) prefetch_depth: Option<u32>,
    /// Layers below this one are written by the producer (`u32::MAX`: all of them).
    pub(crate) written_until: u32,
}

/// The sending end of one session.
#[derive(Debug)]
pub(crate) struct SenderSession {
    spec: SenderSpec,
    state: SenderState,
    units: Vec<UnitState>,
    next_new: usize,
    resend: VecDeque<u32>,
    /// Retransmit timers: at this time, the units `first..first + count` sent as `attempt` are due
    /// again unless acknowledged (one entry covers all the slices of a coalesced frame).
    timers: BinaryHeap<Reverse<(Instant, u32, u16, u32)>>,
    control_due: bool,
    control_attempt: u32,
    control_timer: Option<Instant>,
    in_flight_bytes: u64,
    unresolved: usize,
    slot_units_left: Vec<u32>,
    slot_failed: Vec<bool>,
    rtt: RttEstimator,
    /// The layer the consumer is computing (or about to).
    consumer_layer: u32,
    /// Whether the consumer is blocked on `consumer_layer`.
    consumer_blocked: bool,
    /// Units not yet acknowledged or given up, per layer of the transfer.
    layer_units_left: Vec<u32>,
    pub(crate) stats: Counters,
}

impl SenderSession {
    pub(crate) fn new(spec: SenderSpec) -> Self {
        let n = spec.plan.units.len();
        Self {
            state: SenderState::Opening,
            units: vec![UnitState::Pending; n],
            next_new: 0,
            resend: VecDeque::new(),
            timers: BinaryHeap::new(),
            control_due: true,
            control_attempt: 0,
            control_timer: None,
            in_flight_bytes: 0,
            unresolved: n,
            slot_units_left: spec.plan.units_per_slot.clone(),
            slot_failed: vec![false; spec.plan.units_per_slot.len()],
            rtt: RttEstimator::default(),
            consumer_layer: spec.plan.layer_start,
            consumer_blocked: false,
            layer_units_left: layer_units(&spec.plan),
            stats: Counters::default(),
            spec,
        }
    }
    pub(crate) fn peer(&self) -> PeerId {
        self.spec.peer
    }
    /// The class this session sends in now: urgent while the consumer is blocked on one of its layers.
    pub(crate) fn class(&self) -> TrafficClass {
        let blocked_here = self.consumer_blocked
            && self
                .layer_index(self.consumer_layer)
                .is_some_and(|i| self.layer_units_left[i] > 0);
        if blocked_here && self.spec.class > TrafficClass::UrgentKv {
            TrafficClass::UrgentKv
        } else {
            self.spec.class
        }
    }
    fn layer_index(&self, layer: u32) -> Option<usize> {
        let i = layer.checked_sub(self.spec.plan.layer_start)? as usize;
        (i < self.layer_units_left.len()).then_some(i)
    }
    /// The receiver reports the consumer's position (piggybacked on acks, or in a progress frame).
    pub(crate) fn on_progress(&mut self, layer: u32, blocked: bool) {
        if layer > self.consumer_layer || (layer == self.consumer_layer && blocked) {
            self.consumer_layer = layer;
            self.consumer_blocked = blocked;
        } else if layer == self.consumer_layer {
            self.consumer_blocked = false;
        }
    }
    /// The producer has written every layer below `until` (never moves back).
    pub(crate) fn layers_written(&mut self, until: u32) {
        self.spec.written_until = self.spec.written_until.max(until);
    }
    pub(crate) fn src_region(&self) -> RegionId {
        self.spec.src_region
    }
    pub(crate) fn is_done(&self) -> bool {
        self.state == SenderState::Done
    }
    /// The one place the state changes. Every caller asks only for transitions its own guard allows, so
    /// an impossible one is a bug in this file: it panics in debug builds (every test runs them) and is
    /// refused in release builds, leaving the state as it was.
    fn enter(&mut self, next: SenderState) {
        use SenderState::*;
        let ok = matches!(
            (self.state, next),
            (Opening, Sending) | (Opening | Sending, Closing) | (Opening | Closing, Done)
        );
        debug_assert!(
            ok,
            "session {}: cannot go from {:?} to {next:?}",
            self.spec.id, self.state
        );
        if !ok {
            return;
        }
        self.state = next;
        if next == Closing {
            self.control_due = true;
            self.control_attempt = 0;
            self.control_timer = None;
        }
    }
    /// The next frame to send, if any is due.
    pub(crate) fn poll_transmit(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Option<Transmit> {
        match self.state {
            SenderState::Opening | SenderState::Closing if self.control_due => {
                self.control_due = false;
                self.control_timer = Some(now + self.retransmit_delay(self.control_attempt, ctx));
                self.control_attempt += 1;
                Some(self.control_transmit())
            }
            SenderState::Sending => self.poll_data(now, ctx),
            _ => None,
        }
    }
    fn control_transmit(&self) -> Transmit {
        let (kind, body) = if self.state == SenderState::Opening {
            (
                FrameKind::Open,
                Body::Control(self.spec.open_payload.clone()),
            )
        } else {
            (FrameKind::Close, Body::Empty)
        };
        let mut header = Header::new(kind, self.spec.id.0);
        if let Body::Control(payload) = &body {
            header.length = payload.len() as u32;
            header.crc = crate::crc32c(payload);
        }
        Transmit {
            peer: self.spec.peer,
            header,
            body,
            channel: Channel::Shared,
            class: TrafficClass::Collective,
        }
    }
    fn poll_data(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Option<Transmit> {
        ctx.budget.refill(now);
        while let Some(unit) = self.resend.pop_front() {
            let UnitState::Resend { attempt, last_sent } = self.units[unit as usize] else {
                continue;
            };
            if !ctx.budget.try_take() {
                // Storm guard: park it. Its place in the window goes to first sends (which earn budget);
                // it is offered again after another backoff, and the deadline ends the wait.
                self.stats.budget_exhausted += 1;
                self.units[unit as usize] = UnitState::Parked { attempt, last_sent };
                self.in_flight_bytes -= u64::from(self.spec.plan.units[unit as usize].len);
                let delay = self.retransmit_delay(u32::from(attempt), ctx);
                self.timers.push(Reverse((now + delay, unit, attempt, 1)));
                continue;
            }
            let len = u64::from(self.spec.plan.units[unit as usize].len);
            self.stats.retransmits += 1;
            self.stats.retransmit_bytes += len;
            return Some(self.send_units(unit, 1, attempt, now, ctx));
        }
        let unit = self.next_new;
        let next = self.spec.plan.units.get(unit)?;
        if next.layer >= self.spec.written_until {
            return None;
        }
        if let Some(depth) = self.spec.prefetch_depth
            && next.layer > self.consumer_layer.saturating_add(depth)
        {
            return None;
        }
        let len = u64::from(next.len);
        if self.in_flight_bytes > 0 && self.in_flight_bytes + len > ctx.cfg.window_bytes {
            return None;
        }
        let count = self.coalesced(unit, ctx);
        for i in unit..unit + count {
            self.in_flight_bytes += u64::from(self.spec.plan.units[i].len);
            ctx.budget.on_first_send();
        }
        self.next_new += count;
        Some(self.send_units(unit as u32, count as u32, 0, now, ctx))
    }
    /// How many units from `first` (sent for the first time) go out in one frame: the following slices of
    /// its block, within the coalescing limit and the window.
    fn coalesced(&self, first: usize, ctx: &Ctx<'_>) -> usize {
        let limit = u64::from(ctx.cfg.coalesce_bytes.min(MAX_PAYLOAD));
        let (mut bytes, mut count) = (0u64, 0);
        for len in self.spec.plan.coalescible(first) {
            let more = bytes + u64::from(len);
            // The first unit always goes (the window let it through already).
            if count > 0 && (more > limit || self.in_flight_bytes + more > ctx.cfg.window_bytes) {
                break;
            }
            bytes = more;
            count += 1;
        }
        count
    }
    /// Sends units `index..index + count` (one unit, or following slices of one block) as `attempt`, in
    /// one frame.
    fn send_units(
        &mut self,
        index: u32,
        count: u32,
        attempt: u16,
        now: Instant,
        ctx: &mut Ctx<'_>,
    ) -> Transmit {
        let unit = self.spec.plan.units[index as usize];
        let mut len = 0u32;
        for i in index..index + count {
            self.units[i as usize] = UnitState::InFlight {
                attempt,
                sent_at: now,
            };
            len += self.spec.plan.units[i as usize].len;
        }
        let delay = self.retransmit_delay(u32::from(attempt), ctx);
        self.timers
            .push(Reverse((now + delay, index, attempt, count)));
        self.stats.slices_sent += u64::from(count);
        self.stats.bytes_sent += u64::from(len);
        let layout = &self.spec.src_layout;
        let src_block = BlockId::new(unit.layer, self.spec.src_blocks[unit.first as usize]);
        let mut header = Header::new(FrameKind::Data, self.spec.id.0);
        header.attempt = attempt;
        header.layer = unit.layer;
        header.block = self.spec.dst_blocks[unit.first as usize];
        header.offset = unit.offset;
        header.length = len;
        header.sequence = index;
        let payload = PayloadRef {
            region: self.spec.src_region,
            offset: layout
                .locate(src_block, unit.offset, u64::from(len))
                .expect("the plan cuts units at every chunk boundary of the source layout"),
            len,
        };
        let channel = if unit.exclusive {
            Channel::Exclusive
        } else {
            Channel::Shared
        };
        Transmit {
            peer: self.spec.peer,
            header,
            body: Body::Payload(payload),
            channel,
            class: self.class(),
        }
    }
    /// How long to wait for the ack of send number `attempt`: the backoff schedule, starting from the
    /// measured retransmit timeout once there is one.
    fn retransmit_delay(&self, attempt: u32, ctx: &mut Ctx<'_>) -> Duration {
        let base = self.rtt.rto(ctx.cfg.backoff.base).min(ctx.cfg.backoff.max);
        crate::Backoff {
            base,
            ..ctx.cfg.backoff
        }
        .delay(attempt, ctx.rng)
    }
    /// When this session next needs [`SenderSession::handle_timeout`].
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        let unit = match self.state {
            SenderState::Sending => self.timers.peek().map(|Reverse((t, ..))| *t),
            _ => None,
        };
        let control = match self.state {
            SenderState::Opening | SenderState::Closing if !self.control_due => self.control_timer,
            _ => None,
        };
        let deadline = matches!(self.state, SenderState::Opening | SenderState::Sending)
            .then_some(self.spec.deadline);
        [unit, control, deadline].into_iter().flatten().min()
    }
    pub(crate) fn handle_timeout(&mut self, now: Instant, ctx: &mut Ctx<'_>) {
        if matches!(self.state, SenderState::Opening | SenderState::Sending)
            && now >= self.spec.deadline
        {
            self.give_up_all(ctx);
            return;
        }
        if self.control_timer.is_some_and(|t| t <= now) && !self.control_due {
            if self.control_attempt > ctx.cfg.max_retries {
                match self.state {
                    SenderState::Opening => self.give_up_all(ctx),
                    SenderState::Closing => {
                        self.enter(SenderState::Done);
                    }
                    _ => {}
                }
            } else if matches!(self.state, SenderState::Opening | SenderState::Closing) {
                self.control_due = true;
            }
        }
        while let Some(&Reverse((t, first, attempt, count))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            for unit in first..first + count {
                self.on_timer(unit, attempt, ctx);
            }
        }
    }
    /// The retransmit timer of `unit`, sent as `attempt`, went off.
    fn on_timer(&mut self, unit: u32, attempt: u16, ctx: &mut Ctx<'_>) {
        match self.units[unit as usize] {
            UnitState::InFlight { attempt: a, .. } if a == attempt => {
                self.retry(unit, attempt, ctx)
            }
            UnitState::Parked {
                attempt: a,
                last_sent,
            } if a == attempt => {
                // A refused resend counts as a try: a unit the budget keeps refusing is handed back
                // after max_retries, not only at the deadline.
                if u32::from(attempt) >= ctx.cfg.max_retries {
                    self.fail(unit, ctx);
                } else {
                    let attempt = attempt + 1;
                    self.units[unit as usize] = UnitState::Resend { attempt, last_sent };
                    self.in_flight_bytes += u64::from(self.spec.plan.units[unit as usize].len);
                    self.resend.push_back(unit);
                }
            }
            _ => {}
        }
    }
    /// Schedules `unit` (last sent as `attempt`) for resending, or gives it up if it has no tries left.
    fn retry(&mut self, unit: u32, attempt: u16, ctx: &mut Ctx<'_>) {
        let UnitState::InFlight { sent_at, .. } = self.units[unit as usize] else {
            return;
        };
        if u32::from(attempt) >= ctx.cfg.max_retries {
            self.fail(unit, ctx);
        } else {
            self.units[unit as usize] = UnitState::Resend {
                attempt: attempt + 1,
                last_sent: sent_at,
            };
            self.resend.push_back(unit);
        }
    }
}

/// Number of units of each layer of the plan.
fn layer_units(plan: &Plan) -> Vec<u32> {
    let mut left = vec![0; plan.layers() as usize];
    for unit in &plan.units {
        left[(unit.layer - plan.layer_start) as usize] += 1;
    }
    left
}
