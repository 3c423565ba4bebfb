//! What the receiver tells a sending session (open accepted or refused, acks, nacks, close acknowledged),
//! and how units end: acknowledged, or given up for recompute.

use std::ops::Range;
use std::time::Instant;

use super::{SenderSession, SenderState, UnitState};
use crate::config::Ctx;
use crate::{BlockId, Error, Event, Role};

impl SenderSession {
    pub(crate) fn on_open_ack(&mut self) {
        if self.state == SenderState::Opening {
            self.enter(SenderState::Sending);
            self.control_timer = None;
        }
    }
    pub(crate) fn on_reject(&mut self, reason: String, ctx: &mut Ctx<'_>) {
        if self.state != SenderState::Opening {
            return;
        }
        ctx.events.push_back(Event::Refused {
            session: self.spec.id,
            reason,
        });
        for unit in 0..self.units.len() as u32 {
            self.fail(unit, ctx);
        }
        self.enter(SenderState::Done);
    }
    pub(crate) fn on_ack(
        &mut self,
        now: Instant,
        ranges: &[Range<u32>],
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Error> {
        let n = self.units.len() as u32;
        if let Some(bad) = ranges.iter().find(|r| r.end > n) {
            return Err(Error::FrameMismatch {
                session: self.spec.id,
                reason: format!("ack for units {bad:?} of a session with {n} units"),
            });
        }
        for unit in ranges.iter().flat_map(Clone::clone) {
            match self.units[unit as usize] {
                UnitState::InFlight {
                    attempt: 0,
                    sent_at,
                } => {
                    self.rtt.on_sample(now.saturating_duration_since(sent_at));
                    self.acked(unit);
                }
                UnitState::InFlight { .. }
                | UnitState::Resend { .. }
                | UnitState::Parked { .. } => self.acked(unit),
                UnitState::Pending => {
                    return Err(Error::FrameMismatch {
                        session: self.spec.id,
                        reason: format!("ack for unit {unit}, which was never sent"),
                    });
                }
                UnitState::Acked | UnitState::Failed => {}
            }
        }
        self.maybe_finish(ctx);
        Ok(())
    }
    pub(crate) fn on_nack(
        &mut self,
        unit: u32,
        attempt: u16,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Error> {
        match self.units.get(unit as usize) {
            None => Err(Error::FrameMismatch {
                session: self.spec.id,
                reason: format!(
                    "nack for unit {unit} of a session with {} units",
                    self.units.len()
                ),
            }),
            Some(&UnitState::InFlight {
                attempt: current, ..
            }) if current == attempt => {
                self.retry(unit, attempt, ctx);
                self.maybe_finish(ctx);
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }
    pub(crate) fn on_close_ack(&mut self) {
        if self.state == SenderState::Closing {
            self.enter(SenderState::Done);
        }
    }
    /// Gives up every unresolved unit (deadline, cancel).
    pub(crate) fn give_up_all(&mut self, ctx: &mut Ctx<'_>) {
        for unit in 0..self.units.len() as u32 {
            if !matches!(
                self.units[unit as usize],
                UnitState::Acked | UnitState::Failed
            ) {
                self.fail(unit, ctx);
            }
        }
    }
    /// The peer is gone for good: every unresolved unit is given up and the session ends without a close
    /// handshake (there is nobody to answer it).
    pub(crate) fn abort(&mut self, ctx: &mut Ctx<'_>) {
        if self.state == SenderState::Done {
            return;
        }
        self.give_up_all(ctx);
        if self.state == SenderState::Opening {
            self.enter(SenderState::Closing);
        }
        self.enter(SenderState::Done);
    }
    pub(super) fn acked(&mut self, index: u32) {
        let unit = self.spec.plan.units[index as usize];
        if matches!(
            self.units[index as usize],
            UnitState::InFlight { .. } | UnitState::Resend { .. }
        ) {
            self.in_flight_bytes -= u64::from(unit.len);
        }
        self.units[index as usize] = UnitState::Acked;
        self.unresolved -= 1;
        self.layer_units_left[(unit.layer - self.spec.plan.layer_start) as usize] -= 1;
        self.stats.bytes_acked += u64::from(unit.len);
        for slot in self.spec.plan.slots(&unit) {
            self.slot_units_left[slot] -= 1;
            if self.slot_units_left[slot] == 0 && !self.slot_failed[slot] {
                self.stats.blocks_delivered += 1;
            }
        }
    }
    pub(super) fn fail(&mut self, index: u32, ctx: &mut Ctx<'_>) {
        let unit = self.spec.plan.units[index as usize];
        let was = self.units[index as usize];
        self.units[index as usize] = UnitState::Failed;
        self.unresolved -= 1;
        self.layer_units_left[(unit.layer - self.spec.plan.layer_start) as usize] -= 1;
        if matches!(was, UnitState::InFlight { .. } | UnitState::Resend { .. }) {
            self.in_flight_bytes -= u64::from(unit.len);
        }
        for slot in self.spec.plan.slots(&unit) {
            self.slot_failed[slot] = true;
        }
        self.maybe_finish(ctx);
    }
    /// Once every unit is acknowledged or given up: report recompute blocks and completion, then close.
    pub(super) fn maybe_finish(&mut self, ctx: &mut Ctx<'_>) {
        if self.unresolved > 0 || !matches!(self.state, SenderState::Opening | SenderState::Sending)
        {
            return;
        }
        let plan = &self.spec.plan;
        let blocks: Vec<BlockId> = (0..self.slot_failed.len())
            .filter(|&slot| self.slot_failed[slot])
            .map(|slot| {
                let (layer, index) = plan.slot_position(slot);
                BlockId::new(layer, self.spec.src_blocks[index as usize])
            })
            .collect();
        self.stats.recompute_blocks = blocks.len() as u64;
        if !blocks.is_empty() {
            ctx.events.push_back(Event::Recompute {
                session: self.spec.id,
                role: Role::Sender,
                blocks,
            });
        }
        ctx.events.push_back(Event::Completed {
            session: self.spec.id,
            role: Role::Sender,
            stats: self.stats,
        });
        self.enter(SenderState::Closing);
    }
}
