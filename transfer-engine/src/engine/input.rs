//! The engine's inputs: frames, data, timeouts and the consumer's progress.

use std::ops::Range;
use std::time::Instant;

use crate::config::Placement;
use crate::plan::{BlockShape, Plan};
use crate::receiver::{ReceiverSession, ReceiverSpec};
use crate::transmit::{check_blocks, check_distinct};
use crate::wire::control::{OpenRequest, decode_ranges};
use crate::wire::{FrameKind, Header, WireError};
use crate::{Body, Channel, Error, Event, MemoryRegion, PeerId, SessionId, TrafficClass, Transmit};

use super::Engine;

impl Engine {
    /// Handles a control frame (anything but data) from `from`, its payload already read. An error is
    /// [`Error::Refused`]: the frame is dropped and counted.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        from: PeerId,
        header: &Header,
        payload: &[u8],
    ) -> Result<(), Error> {
        let result = self.dispatch_control(now, from, header, payload);
        self.refusing(from, result)
    }

    /// Where the payload of data frame `header` from `from` should be placed; call before reading it. An
    /// error is [`Error::Refused`].
    pub fn placement(&mut self, from: PeerId, header: &Header) -> Result<Placement, Error> {
        let result = self.placement_inner(from, header);
        self.refusing(from, result)
    }

    /// Counts a refused frame from `from` and says so in its error.
    fn refusing<T>(&mut self, from: PeerId, result: Result<T, Error>) -> Result<T, Error> {
        result.map_err(|e| {
            if !matches!(e, Error::Refused { .. }) {
                self.refused += 1;
            }
            e.refused_from(from)
        })
    }

    /// [`Engine::placement`] resolved to memory: the region memory and byte range the payload goes to, or
    /// `None` when it is to be discarded. Every driver that places bytes itself calls this.
    pub fn destination(
        &mut self,
        from: PeerId,
        header: &Header,
    ) -> Result<Option<(MemoryRegion, Range<usize>)>, Error> {
        match self.placement(from, header)? {
            Placement::Write {
                region,
                offset,
                len,
            } => {
                // The engine checked the range against the region, and a region is never longer than
                // its memory.
                let range = offset as usize..offset as usize + len as usize;
                let memory = self.regions.memory(region).cloned();
                self.refusing(from, memory).map(|m| Some((m, range)))
            }
            Placement::Discard => Ok(None),
        }
    }

    /// A data frame's payload was placed as [`Engine::placement`] said (or discarded), and its CRC-32C is
    /// `payload_crc`. Only a matching CRC marks the unit delivered.
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
        self.refusing(from, result)
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
        let decoded = crate::wire::decode_frame(bytes).map_err(Error::from);
        let (header, payload) = self.refusing(from, decoded)?;
        if header.kind != FrameKind::Data {
            return self.handle_frame(now, from, &header, payload);
        }
        let crc = match self.destination(from, &header)? {
            Some((memory, range)) => {
                let view = memory.write(range);
                crate::copy_and_crc32c(&mut self.refusing(from, view)?, payload)
            }
            None => header.crc,
        };
        self.handle_data(now, from, &header, crc)
    }

    /// Advances timers: retransmits, deadlines, expiries.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut ctx = session_ctx!(self);
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
        let key = self
            .incoming
            .get(&session)
            .map(|peer| (*peer, session))
            .ok_or(Error::UnknownSession(session))?;
        let rx = self
            .receivers
            .get_mut(&key)
            .ok_or(Error::UnknownSession(session))?;
        let complete = rx.want_layer(now, layer, &self.cfg)?;
        self.rx_output.push_back(key);
        Ok(complete)
    }

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
            return Err(Error::WrongInput(header.kind));
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
        let mut ctx = session_ctx!(self);
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
                let (layer, blocked) = header.consumer();
                sender.on_progress(layer, blocked);
                sender.on_ack(now, &decode_ranges(payload)?, &mut ctx)
            }
            FrameKind::Progress => {
                let (layer, blocked) = header.consumer();
                sender.on_progress(layer, blocked);
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
                    let err = Error::SessionReused(key.1);
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
                    self.queue_reply(Transmit {
                        peer: from,
                        header: Header::new(FrameKind::CloseAck, key.1.0),
                        body: Body::Empty,
                        channel: Channel::Shared,
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
        self.queue_reply(Transmit {
            peer: to,
            header: h,
            body: Body::Control(reason),
            channel: Channel::Shared,
            class: TrafficClass::Collective,
        });
    }

    /// Queues an answer to a refused frame, unless its peer already has
    /// [`super::MAX_REPLIES_PER_PEER`] waiting (then it is dropped and counted).
    fn queue_reply(&mut self, t: Transmit) {
        let queued = self.replies_queued.entry(t.peer).or_insert(0);
        if *queued >= super::MAX_REPLIES_PER_PEER {
            self.replies_dropped += 1;
            return;
        }
        *queued += 1;
        self.control_out.push_back(t);
    }

    /// Checks an open request against our regions and creates the receiving end.
    fn accept(
        &mut self,
        now: Instant,
        key: (PeerId, SessionId),
        payload: &[u8],
    ) -> Result<(), Error> {
        if let Some(other) = self.incoming.get(&key.1) {
            return Err(Error::SessionTaken {
                session: key.1,
                other: *other,
            });
        }
        let live = self.receiving_from(key.0).count();
        if live >= self.cfg.max_incoming_per_peer {
            return Err(Error::TooManySessions { peer: key.0, live });
        }
        let open = OpenRequest::decode(payload)?;
        open.dst_layout.validate()?;
        open.src_layout.validate()?;
        open.src_layout.check_compatible(&open.dst_layout)?;
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
                return Err(Error::LayoutDiffers {
                    region: open.dst_region,
                    given: Box::new(open.dst_layout),
                    registered: Box::new(registered),
                });
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
            &BlockShape::between(&open.src_layout, &open.dst_layout),
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
        self.incoming.insert(key.1, key.0);
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
            return Err(Error::WrongInput(header.kind));
        }
        let key = (from, SessionId(header.session));
        match self.receivers.get(&key) {
            Some(rx) => rx.placement(header),
            None if self.closed.contains(&key) => Ok(Placement::Discard),
            None => Err(Error::UnknownSession(key.1)),
        }
    }
}
