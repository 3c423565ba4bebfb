//! The driver's receiving half: completions, messages from peers, and units handed to the engine once
//! their header and their writes are both in.

use std::sync::atomic::Ordering;
use std::time::Instant;

use transfer_engine::wire::decode_frame;
use transfer_engine::{FrameKind, MemoryRegion, PeerId, Placement, RegionId};

use super::super::ffi::Completion;
use super::super::message::Message;
use super::super::shared::{Route, lock, peer_info};
use super::super::token_tag;
use super::{Driver, Incoming, MAX_PENDING};
use crate::TransportError;

impl Driver<'_> {
    pub(super) fn completion(&mut self, c: Completion) {
        match c {
            Completion::Sent { error: None } => {}
            Completion::Sent { error: Some(e) } => {
                self.shared.failed(None, format!("send failed: {e}"))
            }
            Completion::Written { ctx, error } => {
                let peer = self.out.get(&ctx).map(|o| o.peer);
                if let Some(e) = error {
                    self.shared
                        .counters
                        .write_errors
                        .fetch_add(1, Ordering::Relaxed);
                    self.shared
                        .failed(peer, format!("write refused by the provider: {e}"));
                    if let Some(peer) = peer {
                        self.reach.failed(peer, Instant::now(), &e);
                    }
                } else if let Some(peer) = peer {
                    self.reach.succeeded(peer);
                }
                self.finish_write(ctx);
            }
            Completion::RemoteWrite { data } => {
                self.shared
                    .counters
                    .remote_writes
                    .fetch_add(1, Ordering::Relaxed);
                let token = u32::try_from(data & u64::from(u32::MAX)).unwrap_or(0);
                self.landed(token);
            }
            Completion::Received { slot, len, error } => {
                let msg = match error {
                    Some(e) => Err(crate::rdma::own(format!("a receive failed: {e}"))),
                    None => self.ep.received(slot, len).and_then(Message::decode),
                };
                if let Err(e) = self.ep.repost(slot) {
                    self.shared
                        .failed(None, format!("reposting a receive: {e}"));
                }
                self.shared
                    .counters
                    .messages_received
                    .fetch_add(1, Ordering::Relaxed);
                match msg {
                    Ok((from, msg)) => {
                        if let Err(e) = self.message(from, msg) {
                            self.shared.refused(
                                Some(PeerId(u64::from(from))),
                                format!("from engine {from}: {e}"),
                            );
                        }
                    }
                    Err(e) => self.shared.refused(None, format!("a message refused: {e}")),
                }
            }
        }
    }

    fn message(&mut self, from: u32, msg: Message) -> Result<(), TransportError> {
        let peer = PeerId(u64::from(from));
        self.reach.heard_from(peer, Instant::now());
        self.shared.core.reachable_again(peer);
        match msg {
            Message::Ping => {
                // Answered while a send slot is free; a peer that gets no pong pings again.
                if let Some(route) = self.route(peer) {
                    let pong = Message::Pong.encode(self.shared.engine_id());
                    self.ep.send(route.addr, &pong)?;
                }
                Ok(())
            }
            Message::Pong => Ok(()),
            Message::Hello {
                nonce,
                tag,
                name,
                segments,
            } => {
                let addr = self.ep.insert(&name)?;
                let existing = self.route(peer).map(|r| r.our_tag);
                let our_tag = match existing {
                    Some(t) => t,
                    None => self.assign_tag()?,
                };
                lock(&self.shared.routes).insert(
                    peer,
                    Route {
                        addr,
                        write_tag: Some(tag),
                        our_tag,
                        segments,
                    },
                );
                let welcome = Message::Welcome {
                    nonce,
                    tag: our_tag,
                    segments: self.shared.offered(),
                };
                self.send_now(addr, &welcome)
            }
            Message::Welcome {
                nonce,
                tag,
                segments,
            } => {
                let (Some(addr), Some((our_tag, reply))) =
                    (self.dialed.remove(&nonce), self.connects.remove(&nonce))
                else {
                    return Err(TransportError::protocol(
                        "rdma",
                        format!("a welcome for an unknown hello {nonce:#x}"),
                    ));
                };
                lock(&self.shared.routes).insert(
                    peer,
                    Route {
                        addr,
                        write_tag: Some(tag),
                        our_tag,
                        segments: segments.clone(),
                    },
                );
                let _ = reply.send(Ok(peer_info(peer, &segments)));
                Ok(())
            }
            Message::Frame(bytes) => {
                let (header, payload) = decode_frame(&bytes)
                    .map_err(|e| TransportError::protocol("rdma", e.to_string()))?;
                let mut engine = self.shared.core.station.engine();
                let result = engine.handle_frame(Instant::now(), peer, &header, payload);
                self.shared.core.station.drain_events(&mut engine);
                drop(engine);
                if header.kind == FrameKind::CloseAck {
                    self.forget_finished();
                }
                result.map_err(TransportError::from)
            }
            Message::Data {
                token,
                chunks,
                region,
                offset,
                header,
            } => {
                let expected = self.route(peer).map(|r| r.our_tag);
                if expected != Some(token_tag(token)) {
                    return Err(TransportError::protocol(
                        "rdma",
                        format!(
                            "a data header with tag {} from a peer given tag {expected:?}",
                            token_tag(token)
                        ),
                    ));
                }
                if header.kind != FrameKind::Data || chunks == 0 {
                    return Err(TransportError::protocol("rdma", "a malformed data header"));
                }
                if !self.pending.contains_key(&token) && self.pending.len() >= MAX_PENDING {
                    return Err(TransportError::protocol(
                        "rdma",
                        "too many units half-arrived: a header refused",
                    ));
                }
                let entry = self.pending.entry(token).or_default();
                entry.header = Some((from, chunks, region, offset, header));
                self.try_deliver(token);
                Ok(())
            }
        }
    }

    fn landed(&mut self, token: u32) {
        if !self.pending.contains_key(&token) && self.pending.len() >= MAX_PENDING {
            self.shared.refused(
                None,
                "too many units half-arrived: a write's completion dropped".into(),
            );
            return;
        }
        self.pending.entry(token).or_default().landed += 1;
        self.try_deliver(token);
    }

    /// Hands a unit to the engine once its header and every write are in: checks where the bytes landed
    /// against the engine's placement, verifies the CRC in place.
    fn try_deliver(&mut self, token: u32) {
        let ready = self
            .pending
            .get(&token)
            .is_some_and(|e| e.header.is_some_and(|(_, chunks, ..)| e.landed >= chunks));
        if !ready {
            return;
        }
        let Some(Incoming {
            header: Some((from, _, region, offset, header)),
            ..
        }) = self.pending.remove(&token)
        else {
            return;
        };
        let peer = PeerId(u64::from(from));
        let now = Instant::now();
        let placed = {
            let mut engine = self.shared.core.station.engine();
            match engine.placement(peer, &header) {
                Ok(Placement::Write {
                    region: r,
                    offset: o,
                    len,
                }) if r.0 == region && o == offset => engine
                    .memory(r)
                    .map(|m| Some((m.clone(), o as usize..o as usize + len as usize))),
                Ok(Placement::Write {
                    region: r,
                    offset: o,
                    ..
                }) => Err(transfer_engine::Error::FrameMismatch {
                    session: transfer_engine::SessionId(header.session),
                    reason: format!(
                        "a unit written to region {region} at {offset}, where the plan says region {r} \
                         at {o}"
                    ),
                }
                .refused_from(peer)),
                Ok(Placement::Discard) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let crc = match placed {
            Ok(Some((memory, range))) => match self.verify(region, &memory, range) {
                Ok(c) => c,
                Err(e) => {
                    // The unit could not be read or copied where it belongs: reported as arrived corrupt
                    // (a CRC that cannot match), so the sender resends it now rather than at its deadline.
                    self.shared.failed(None, format!("verifying a unit: {e}"));
                    !header.crc
                }
            },
            Ok(None) => header.crc,
            Err(e) => {
                self.shared.refused(
                    Some(PeerId(u64::from(from))),
                    format!("a unit from engine {from} refused: {e}"),
                );
                return;
            }
        };
        let mut engine = self.shared.core.station.engine();
        if let Err(e) = engine.handle_data(now, peer, &header, crc) {
            self.shared.refused(
                Some(PeerId(u64::from(from))),
                format!("a unit from engine {from} refused: {e}"),
            );
        }
        self.shared.core.station.drain_events(&mut engine);
    }

    /// The CRC-32C of a unit that landed in `range` of region `region`: taken in place, or in the region's
    /// mirror, from which the unit is then copied into `memory`.
    fn verify(
        &mut self,
        region: u32,
        memory: &MemoryRegion,
        range: std::ops::Range<usize>,
    ) -> Result<u32, TransportError> {
        let mirror = lock(&self.shared.mirrors).get(&RegionId(region)).cloned();
        match mirror {
            Some(mirror) => self.units.stage_in(&mirror, memory, range),
            None => self.units.crc32c(memory, range),
        }
    }

    /// Drops the destinations of sending sessions the engine no longer holds.
    fn forget_finished(&mut self) {
        let mut sessions = lock(&self.shared.sessions);
        if sessions.is_empty() {
            return;
        }
        let engine = self.shared.core.station.engine();
        sessions.retain(|id, _| engine.session_stats(*id).is_some());
    }
}
