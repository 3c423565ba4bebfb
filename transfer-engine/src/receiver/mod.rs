//! The receiving end of a session: checks every data header against the plan, tracks verified units,
//! acknowledges selectively, and reports blocks and layers as they complete.

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use crate::config::{EngineConfig, Placement};
use crate::plan::{MAX_COALESCED_SLICES, Plan};
use crate::wire::control::{encode_ranges, to_ranges};
use crate::wire::{FrameKind, Header};
use crate::{
    BlockId, Body, Channel, Counters, Error, Event, KvLayout, PeerId, RegionId, Role, SessionId,
    TrafficClass, Transmit,
};

/// Most ack ranges in one frame.
const MAX_ACK_RANGES: usize = 8192;

/// What a receiver needs to be created (checked by the engine against its regions first).
#[derive(Debug)]
pub(crate) struct ReceiverSpec {
    pub(crate) id: SessionId,
    pub(crate) peer: PeerId,
    pub(crate) dst_region: RegionId,
    pub(crate) dst_layout: KvLayout,
    pub(crate) dst_blocks: Vec<u32>,
    pub(crate) plan: Plan,
    /// After this, whatever has not verified is reported for recompute.
    pub(crate) expires: Instant,
}

/// Where a receiving session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxState {
    /// Slices arrive and are placed.
    Receiving,
    /// Every block is resolved and reported (all delivered): later data is acknowledged, not placed, until
    /// the sender closes.
    Resolved,
    /// The sender closed (everything unresolved was reported for recompute); a CloseAck is due.
    Closing,
    /// Over: closed and acknowledged, expired, or aborted. The engine forgets the session.
    Done,
}

/// The receiving end of one session.
#[derive(Debug)]
pub(crate) struct ReceiverSession {
    spec: ReceiverSpec,
    verified: Vec<bool>,
    slot_units_left: Vec<u32>,
    layer_slots_left: Vec<u32>,
    pending_acks: Vec<u32>,
    pending_nacks: VecDeque<(u32, u16)>,
    /// Which units have a nack in `pending_nacks` (at most one each, however often a peer corrupts one).
    nack_queued: Vec<bool>,
    open_ack_due: bool,
    state: RxState,
    /// The layer the consumer wants next, and whether it is blocked on it.
    consumer_layer: u32,
    consumer_blocked: bool,
    /// A progress frame is due now, or again at this time while the consumer stays blocked.
    progress_due: bool,
    progress_again: Option<Instant>,
    pub(crate) stats: Counters,
}

impl ReceiverSession {
    pub(crate) fn new(spec: ReceiverSpec) -> Self {
        let plan = &spec.plan;
        Self {
            verified: vec![false; plan.units.len()],
            slot_units_left: plan.units_per_slot.clone(),
            layer_slots_left: vec![plan.blocks_per_layer; plan.layers() as usize],
            pending_acks: Vec::new(),
            pending_nacks: VecDeque::new(),
            nack_queued: vec![false; plan.units.len()],
            open_ack_due: true,
            state: RxState::Receiving,
            consumer_layer: spec.plan.layer_start,
            consumer_blocked: false,
            progress_due: false,
            progress_again: None,
            stats: Counters::default(),
            spec,
        }
    }

    pub(crate) fn region(&self) -> RegionId {
        self.spec.dst_region
    }

    /// Whether the session has nothing left to do and can be forgotten.
    pub(crate) fn is_done(&self) -> bool {
        self.state == RxState::Done
    }

    /// Whether a frame is waiting to be sent.
    pub(crate) fn has_output(&self) -> bool {
        self.open_ack_due
            || self.state == RxState::Closing
            || self.progress_due
            || !self.pending_acks.is_empty()
            || !self.pending_nacks.is_empty()
    }

    /// When [`ReceiverSession::handle_timeout`] is next needed: expiry, or resending progress.
    pub(crate) fn next_timeout(&self) -> Instant {
        self.progress_again
            .map_or(self.spec.expires, |t| t.min(self.spec.expires))
    }

    pub(crate) fn handle_timeout(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        events: &mut VecDeque<Event>,
    ) {
        if now >= self.spec.expires {
            self.expire(events);
            self.progress_again = None;
            return;
        }
        if self.progress_again.is_some_and(|t| t <= now) {
            self.schedule_progress(now, cfg.backoff.base);
        }
    }

    /// The consumer is about to compute `layer`. Returns whether it has fully arrived.
    pub(crate) fn want_layer(
        &mut self,
        now: Instant,
        layer: u32,
        cfg: &EngineConfig,
    ) -> Result<bool, Error> {
        let plan = &self.spec.plan;
        let Some(index) = layer
            .checked_sub(plan.layer_start)
            .filter(|i| *i < plan.layers())
        else {
            return Err(Error::LayerOutside {
                session: self.spec.id,
                layer,
                layers: plan.layer_start..plan.layer_start + plan.layers(),
            });
        };
        let complete = self.layer_slots_left[index as usize] == 0;
        self.consumer_layer = self.consumer_layer.max(layer);
        self.consumer_blocked = !complete && !self.is_closed();
        self.schedule_progress(now, cfg.backoff.base);
        Ok(complete)
    }

    /// Queues a progress frame, and another after `every` while the consumer stays blocked (in case it is
    /// lost: without it the sender would wait at its prefetch limit until the deadline).
    fn schedule_progress(&mut self, now: Instant, every: Duration) {
        self.progress_due = true;
        self.progress_again = self.consumer_blocked.then_some(now + every);
    }

    /// The open frame was sent again (our ack was lost): acknowledge it again.
    pub(crate) fn on_duplicate_open(&mut self) {
        self.open_ack_due = true;
    }

    /// Where the payload of this data frame goes, after checking every header field against the plan.
    pub(crate) fn placement(&self, header: &Header) -> Result<Placement, Error> {
        self.frame(header).map(|(placement, _)| placement)
    }

    /// Where a data frame's payload goes, and the units it carries: one, or a coalesced run of following
    /// slices of one block (see [`EngineConfig::coalesce_bytes`]).
    fn frame(&self, header: &Header) -> Result<(Placement, Range<usize>), Error> {
        let mismatch = |reason: String| Error::FrameMismatch {
            session: self.spec.id,
            reason,
        };
        let seq = header.sequence as usize;
        let Some(unit) = self.spec.plan.units.get(seq) else {
            return Err(mismatch(format!(
                "unit {seq} of a session with {} units",
                self.spec.plan.units.len()
            )));
        };
        let block = self.spec.dst_blocks[unit.first as usize];
        let units = self.spec.plan.frame_units(seq, header.length);
        let Some(units) = units.filter(|_| {
            (header.layer, header.block, header.offset) == (unit.layer, block, unit.offset)
        }) else {
            return Err(mismatch(format!(
                "unit {seq} addresses layer {} block {} bytes {}+{}, expected layer {} block {block} bytes {}+{} \
                 (or a run of up to {MAX_COALESCED_SLICES} following slices of its block)",
                header.layer,
                header.block,
                header.offset,
                header.length,
                unit.layer,
                unit.offset,
                unit.len
            )));
        };
        // A frame any of whose units already verified is not placed: a late duplicate must never
        // overwrite what was handed on.
        if units.clone().any(|u| self.verified[u]) || self.is_closed() {
            return Ok((Placement::Discard, units));
        }
        let Some(offset) = self.spec.dst_layout.locate(
            BlockId::new(unit.layer, block),
            unit.offset,
            u64::from(header.length),
        ) else {
            return Err(mismatch(format!(
                "a data frame at offset {} of {} bytes does not lie in one chunk of block {block} of \
                 layer {}",
                header.offset, header.length, unit.layer
            )));
        };
        let placement = Placement::Write {
            region: self.spec.dst_region,
            offset,
            len: header.length,
        };
        Ok((placement, units))
    }

    /// A data frame's payload was placed (or discarded) and its CRC computed.
    pub(crate) fn on_data(
        &mut self,
        header: &Header,
        payload_crc: u32,
        events: &mut VecDeque<Event>,
    ) -> Result<(), Error> {
        let (placement, units) = self.frame(header)?;
        if placement == Placement::Discard {
            if !self.is_closed() {
                self.stats.duplicates += 1;
                // Acknowledged again: the units that verified (the others come again alone).
                let verified = units.filter(|u| self.verified[*u]);
                self.pending_acks.extend(verified.map(|u| u as u32));
            }
            return Ok(());
        }
        if payload_crc != header.crc {
            self.stats.checksum_failures += 1;
            for seq in units {
                if !std::mem::replace(&mut self.nack_queued[seq], true) {
                    self.pending_nacks.push_back((seq as u32, header.attempt));
                }
            }
            return Ok(());
        }
        for seq in units {
            self.verify(seq, events);
        }
        if self.stats.blocks_delivered == self.slot_units_left.len() as u64 {
            self.finish(events);
        }
        Ok(())
    }

    /// Unit `seq` arrived whole: acknowledges it and reports the blocks and layers it completes.
    fn verify(&mut self, seq: usize, events: &mut VecDeque<Event>) {
        let unit = self.spec.plan.units[seq];
        self.verified[seq] = true;
        self.pending_acks.push(seq as u32);
        self.stats.slices_received += 1;
        self.stats.bytes_received += u64::from(unit.len);
        for slot in self.spec.plan.slots(&unit) {
            self.slot_units_left[slot] -= 1;
            if self.slot_units_left[slot] > 0 {
                continue;
            }
            let (layer, index) = self.spec.plan.slot_position(slot);
            self.stats.blocks_delivered += 1;
            let block = BlockId::new(layer, self.spec.dst_blocks[index as usize]);
            events.push_back(Event::BlockDelivered {
                session: self.spec.id,
                block,
            });
            let left = &mut self.layer_slots_left[(layer - self.spec.plan.layer_start) as usize];
            *left -= 1;
            if *left == 0 {
                events.push_back(Event::LayerComplete {
                    session: self.spec.id,
                    layer,
                });
            }
        }
    }

    /// The sender is done: whatever has not verified is to be recomputed.
    pub(crate) fn on_close(&mut self, events: &mut VecDeque<Event>) {
        self.finish(events);
        self.state = RxState::Closing;
    }

    /// The session outlived its deadline without a close from the sender.
    pub(crate) fn expire(&mut self, events: &mut VecDeque<Event>) {
        self.finish(events);
        self.state = RxState::Done;
    }

    /// Whether the sender closed (or the session ended otherwise): no more bytes are placed.
    fn is_closed(&self) -> bool {
        matches!(self.state, RxState::Closing | RxState::Done)
    }

    /// The sender is gone for good: whatever has not verified is to be recomputed, and nothing more is
    /// sent back.
    pub(crate) fn abort(&mut self, events: &mut VecDeque<Event>) {
        self.expire(events);
        self.open_ack_due = false;
        self.progress_due = false;
        self.pending_acks.clear();
        self.pending_nacks.clear();
    }

    fn finish(&mut self, events: &mut VecDeque<Event>) {
        self.consumer_blocked = false;
        self.progress_again = None;
        if self.state != RxState::Receiving {
            return;
        }
        self.state = RxState::Resolved;
        let plan = &self.spec.plan;
        let blocks: Vec<BlockId> = (0..self.slot_units_left.len())
            .filter(|&slot| self.slot_units_left[slot] > 0)
            .map(|slot| {
                let (layer, index) = plan.slot_position(slot);
                BlockId::new(layer, self.spec.dst_blocks[index as usize])
            })
            .collect();
        self.stats.recompute_blocks = blocks.len() as u64;
        if !blocks.is_empty() {
            events.push_back(Event::Recompute {
                session: self.spec.id,
                role: Role::Receiver,
                blocks,
            });
        }
        events.push_back(Event::Completed {
            session: self.spec.id,
            role: Role::Receiver,
            stats: self.stats,
        });
    }

    /// The next control frame to send back to the sender.
    pub(crate) fn poll_transmit(&mut self) -> Option<Transmit> {
        let id = self.spec.id.0;
        let mut header = if std::mem::take(&mut self.open_ack_due) {
            Header::new(FrameKind::OpenAck, id)
        } else if let Some((seq, attempt)) = self.pending_nacks.pop_front() {
            self.nack_queued[seq as usize] = false;
            let mut h = Header::new(FrameKind::Nack, id);
            h.sequence = seq;
            h.attempt = attempt;
            h
        } else if !self.pending_acks.is_empty() {
            let mut ranges = to_ranges(&mut self.pending_acks);
            self.pending_acks.clear();
            if ranges.len() > MAX_ACK_RANGES {
                for r in ranges.drain(MAX_ACK_RANGES..) {
                    self.pending_acks.extend(r);
                }
            }
            let payload = encode_ranges(&ranges);
            let mut h = self.with_progress(Header::new(FrameKind::Ack, id));
            self.progress_due = false;
            h.length = payload.len() as u32;
            h.crc = crate::crc32c(&payload);
            return Some(self.control(h, Body::Control(payload)));
        } else if std::mem::take(&mut self.progress_due) {
            self.with_progress(Header::new(FrameKind::Progress, id))
        } else if self.state == RxState::Closing {
            self.state = RxState::Done;
            Header::new(FrameKind::CloseAck, id)
        } else {
            return None;
        };
        header.crc = crate::crc32c(&[]);
        Some(self.control(header, Body::Empty))
    }

    /// Acks and progress frames carry the consumer's layer and whether it is blocked on it.
    fn with_progress(&self, mut header: Header) -> Header {
        header.set_consumer(self.consumer_layer, self.consumer_blocked);
        header
    }

    fn control(&self, header: Header, body: Body) -> Transmit {
        Transmit {
            peer: self.spec.peer,
            header,
            body,
            channel: Channel::Shared,
            class: TrafficClass::Collective,
        }
    }
}
