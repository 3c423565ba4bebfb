//! The driver thread: owns the endpoint, carries out the engine's transmits (control frames as messages,
//! data units as a header message plus RDMA writes), and hands it what arrives.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use transfer_engine::{BlockId, Body, PeerId, SessionId, Transmit};

use super::ffi::{Completion, Endpoint, MrId};
use super::message::Message;
use super::shared::{PeerInfo, Route, Shared, lock};
use super::units::UnitCopies;
use super::wait::Waiter;
use flight::{Incoming, Outgoing, QueuedWrite};

mod commands;
mod dead_peers;
mod flight;
mod reach;
mod receive;
use super::token;
use crate::TransportError;

/// Longest sleep on the completion queue while nothing is due (commands and submits wake it early).
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// Most received units waiting for their other half (header or writes); beyond it new ones are refused.
const MAX_PENDING: usize = 1 << 16;

struct Driver<'a> {
    ep: Endpoint,
    shared: &'a Shared,
    out: HashMap<u64, Outgoing>,
    queued: VecDeque<QueuedWrite>,
    /// A transmit taken from the engine that could not be posted yet (no send slot).
    stash: Option<Transmit>,
    next_unit: u64,
    counter: u32,
    bytes_out: u64,
    pending: HashMap<u32, Incoming>,
    /// Pending connects by nonce: the tag we gave the dialed peer, and who waits.
    connects: HashMap<
        u64,
        (
            u16,
            tokio::sync::oneshot::Sender<Result<PeerInfo, TransportError>>,
        ),
    >,
    /// Dialed addresses by nonce, until the welcome names the peer.
    dialed: HashMap<u64, u64>,
    next_tag: u16,
    next_nonce: u64,
    completions: Vec<Completion>,
    waiter: Waiter,
    reach: reach::Reach,
    /// Checksums of units on both ends (GPU units through a host copy), and copies to and from mirrors.
    units: UnitCopies,
    /// Registrations to close once their writes in flight have completed or been given up.
    deregister_later: Vec<MrId>,
    /// When silent peers were last looked at for a ping.
    last_ping_check: Instant,
}

/// Runs the driver until the node stops.
pub(crate) fn run(ep: Endpoint, shared: &Shared) {
    let mut d = Driver {
        ep,
        shared,
        out: HashMap::new(),
        queued: VecDeque::new(),
        stash: None,
        next_unit: 0,
        counter: 0,
        bytes_out: 0,
        pending: HashMap::new(),
        connects: HashMap::new(),
        dialed: HashMap::new(),
        next_tag: 1,
        next_nonce: u64::from(shared.engine_id()) << 32,
        completions: Vec::with_capacity(256),
        waiter: Waiter::default(),
        reach: reach::Reach::default(),
        units: UnitCopies::default(),
        deregister_later: Vec::new(),
        last_ping_check: Instant::now(),
    };
    while !shared.stop.load(Ordering::Relaxed) {
        shared.beat.beat();
        if let Err(e) = d.step() {
            shared.failed(None, format!("driver: {e}"));
        }
    }
}

impl Driver<'_> {
    fn step(&mut self) -> Result<(), TransportError> {
        self.commands();
        for mr in std::mem::take(&mut self.deregister_later) {
            self.deregister(mr);
        }
        let now = Instant::now();
        let next = {
            let mut engine = self.shared.core.station.engine();
            if engine.poll_timeout().is_some_and(|t| t <= now) {
                engine.handle_timeout(now);
            }
            self.shared.core.station.drain_events(&mut engine);
            engine.poll_timeout()
        };
        self.abandon_stuck(now);
        let posted = self.pump(now)?;
        self.completions.clear();
        let mut got = self.ep.poll(&mut self.completions)?;
        if posted || got > 0 {
            self.waiter.progressed();
        } else {
            let idle = next.map_or(IDLE_WAIT, |t| {
                t.saturating_duration_since(Instant::now()).min(IDLE_WAIT)
            });
            let busy = !self.out.is_empty()
                || !self.queued.is_empty()
                || self.stash.is_some()
                || !self.pending.is_empty()
                || self.shared.core.station.engine().live_sessions() > 0;
            got = self
                .waiter
                .wait(&mut self.ep, busy, idle, &mut self.completions)?;
        }
        if got > 0 {
            let batch = std::mem::take(&mut self.completions);
            for c in &batch {
                self.completion(c.clone());
            }
            self.completions = batch;
        }
        // Only after reading what arrived: a driver that was not scheduled for a while must not blame its
        // peers for answers waiting in its own queue.
        let now = Instant::now();
        self.ping_silent_senders(now)?;
        self.declare_unreachable(now);
        Ok(())
    }

    /// Sends one message to `peer` at `addr`: sent (and counted), no send slot free now (the caller keeps
    /// the transmit), or the peer's process is gone (dropped, counted as a failed write).
    fn send_message(
        &mut self,
        addr: u64,
        peer: PeerId,
        bytes: &[u8],
    ) -> Result<Sent, TransportError> {
        match self.ep.send(addr, bytes) {
            Ok(true) => {
                self.shared
                    .counters
                    .messages_sent
                    .fetch_add(1, Ordering::Relaxed);
                Ok(Sent::Yes)
            }
            Ok(false) => Ok(Sent::Full),
            Err(TransportError::Unreachable(why)) => {
                self.peer_gone(peer, &why);
                Ok(Sent::PeerGone)
            }
            Err(e) => Err(e),
        }
    }

    fn window_full(&self) -> bool {
        self.out.len() >= self.shared.cfg.window_units
            || self.bytes_out >= self.shared.cfg.window_bytes
    }

    /// Posts queued writes, the stashed transmit and new ones while the window allows. Returns whether
    /// anything was posted.
    fn pump(&mut self, now: Instant) -> Result<bool, TransportError> {
        let mut posted = false;
        while let Some(w) = self.queued.pop_front() {
            if !self.post_write(&w)? {
                self.queued.push_front(w);
                return Ok(posted);
            }
            posted = true;
        }
        loop {
            if self.window_full() || self.ep.free_send_slots() == 0 {
                return Ok(posted);
            }
            let t = match self.stash.take() {
                Some(t) => t,
                None => {
                    let mut engine = self.shared.core.station.engine();
                    match engine.poll_transmit(now) {
                        Some(t) => t,
                        None => return Ok(posted),
                    }
                }
            };
            if !self.transmit(t)? {
                return Ok(posted);
            }
            posted = true;
        }
    }

    fn route(&self, peer: PeerId) -> Option<Route> {
        lock(&self.shared.routes).get(&peer).cloned()
    }

    /// Carries out one transmit; `false` when it was stashed for later.
    fn transmit(&mut self, mut t: Transmit) -> Result<bool, TransportError> {
        let Some(route) = self.route(t.peer) else {
            self.shared.failed(
                Some(t.peer),
                format!("no route to peer {:?}: a frame dropped", t.peer),
            );
            return Ok(true);
        };
        // Frames that ask the peer for an answer count towards its silence from their first send attempt
        // (a send that fails at once, to a dead peer, counts too); a unit this node cannot read does not.
        let asks = !t.header.kind.is_from_receiver();
        let p =
            match &t.body {
                Body::Payload(p) => *p,
                Body::Empty | Body::Control(_) => {
                    let payload = match &t.body {
                        Body::Control(c) => c.as_slice(),
                        _ => &[],
                    };
                    let mut frame = t.header.encode().to_vec();
                    frame.extend_from_slice(payload);
                    let bytes = Message::Frame(frame).encode(self.shared.engine_id());
                    if bytes.len() > self.ep.slot_bytes() {
                        self.shared.failed(None, format!(
                        "a {:?} frame of {} bytes exceeds the {}-byte message slots: dropped",
                        t.header.kind,
                        bytes.len(),
                        self.ep.slot_bytes()
                    ));
                        return Ok(true);
                    }
                    if asks {
                        self.reach.asked(t.peer, Instant::now());
                    }
                    if self.send_message(route.addr, t.peer, &bytes)? == Sent::Full {
                        self.stash = Some(t);
                        return Ok(false);
                    }
                    return Ok(true);
                }
            };
        let session = SessionId(t.header.session);
        let dst = lock(&self.shared.sessions).get(&session).copied();
        let (Some((dst_region, layout)), Some(write_tag)) = (dst, route.write_tag) else {
            self.shared.failed(
                None,
                format!("session {session}: no destination known; a unit dropped"),
            );
            return Ok(true);
        };
        let Some(seg) = route.segments.iter().find(|s| s.handle.id == dst_region) else {
            self.shared.failed(
                None,
                format!(
                    "session {session}: peer {:?} does not offer region {dst_region}",
                    t.peer
                ),
            );
            return Ok(true);
        };
        let (rkey, rbase) = (seg.rkey, seg.rma_base);
        let Some(src) = lock(&self.shared.regions).get(&p.region).copied() else {
            self.shared
                .failed(None, format!("region {} is not registered here", p.region));
            return Ok(true);
        };
        let memory = self.shared.core.station.engine().memory(p.region)?.clone();
        // A staged region's unit is copied to its mirror (which is what is registered) before its writes.
        let mirror = lock(&self.shared.mirrors).get(&p.region).cloned();
        let crc = match mirror {
            Some(mirror) => self.units.stage_out(&memory, &mirror, p.range()),
            None => self.units.crc32c(&memory, p.range()),
        };
        let crc = match crc {
            Ok(crc) => crc,
            Err(e) => {
                // A local fault (a failed GPU copy, say), not the peer's: the session ends at once with its
                // unacknowledged blocks handed back for recompute.
                self.shared.failed(None, format!(
                    "session {session}: a unit could not be read ({e}); the session is cancelled"
                ));
                let mut engine = self.shared.core.station.engine();
                let _ = engine.cancel(session);
                self.shared.core.station.drain_events(&mut engine);
                return Ok(true);
            }
        };
        t.header.crc = crc;
        let Some(dst_offset) = layout.locate(
            BlockId::new(t.header.layer, t.header.block),
            t.header.offset,
            u64::from(p.len),
        ) else {
            self.shared.failed(None, format!(
                "session {session}: a unit does not lie in one chunk of the destination; dropped"
            ));
            return Ok(true);
        };
        let tok = token(write_tag, self.counter);
        let chunk = self
            .shared
            .cfg
            .max_write_bytes
            .min(self.ep.info().max_msg_size)
            .max(1);
        let len = p.len as usize;
        let chunks = u32::try_from(len.div_ceil(chunk).max(1)).unwrap_or(u32::MAX);
        let msg = Message::Data {
            token: tok,
            chunks,
            region: dst_region.0,
            offset: dst_offset,
            header: t.header,
        };
        if asks {
            self.reach.asked(t.peer, Instant::now());
        }
        let bytes = msg.encode(self.shared.engine_id());
        match self.send_message(route.addr, t.peer, &bytes)? {
            Sent::Yes => {}
            Sent::Full => {
                t.header.crc = 0;
                self.stash = Some(t);
                return Ok(false);
            }
            Sent::PeerGone => return Ok(true),
        }
        self.counter = self.counter.wrapping_add(1);
        self.next_unit += 1;
        let unit = self.next_unit;
        self.out.insert(
            unit,
            Outgoing {
                peer: t.peer,
                writes_left: chunks,
                bytes: u64::from(p.len),
                posted: Instant::now(),
            },
        );
        self.bytes_out += u64::from(p.len);
        let mut at = 0;
        loop {
            let n = chunk.min(len - at);
            let w = QueuedWrite {
                dest: route.addr,
                src: src.mr,
                offset: p.offset as usize + at,
                len: n,
                addr: rbase + dst_offset + at as u64,
                key: rkey,
                token: tok,
                unit,
            };
            if self.queued.is_empty() && self.post_write(&w)? {
            } else {
                self.queued.push_back(w);
            }
            at += n;
            if at >= len {
                break;
            }
        }
        Ok(true)
    }

    fn post_write(&mut self, w: &QueuedWrite) -> Result<bool, TransportError> {
        let posted = match self.ep.write(
            w.dest,
            w.src,
            w.offset,
            w.len,
            w.addr,
            w.key,
            Some(u64::from(w.token)),
            w.unit,
            self.shared.cfg.delivery_complete,
        ) {
            Ok(p) => p,
            Err(e) => {
                // Refused at posting (for example a range the provider rejects at once): the unit is
                // lost like one refused at completion; the engine resends or gives it up.
                self.shared
                    .counters
                    .write_errors
                    .fetch_add(1, Ordering::Relaxed);
                self.shared.failed(None, format!("write refused: {e}"));
                if let Some(o) = self.out.get(&w.unit) {
                    self.reach.failed(o.peer, Instant::now(), &e.to_string());
                }
                self.finish_write(w.unit);
                return Ok(true);
            }
        };
        if posted {
            self.shared.counters.writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(posted)
    }

    /// Frees the window of units whose writes have not completed within the configured time (a provider
    /// that drops a refused write silently, a peer that vanished): the engine resends or gives them up.
    fn abandon_stuck(&mut self, now: Instant) {
        let limit = self.shared.cfg.write_timeout;
        let stuck: Vec<u64> = self
            .out
            .iter()
            .filter(|(_, o)| now.saturating_duration_since(o.posted) > limit)
            .map(|(u, _)| *u)
            .collect();
        for unit in stuck {
            if let Some(o) = self.out.remove(&unit) {
                self.bytes_out -= o.bytes;
                self.reach
                    .failed(o.peer, now, "writes that never completed");
                self.shared
                    .counters
                    .write_errors
                    .fetch_add(1, Ordering::Relaxed);
                self.shared.failed(None, format!(
                    "a unit's writes did not complete within {limit:?}: its window share is freed"
                ));
            }
        }
    }

    fn finish_write(&mut self, unit: u64) {
        if let Some(o) = self.out.get_mut(&unit) {
            o.writes_left = o.writes_left.saturating_sub(1);
            if o.writes_left == 0 {
                self.bytes_out -= o.bytes;
                self.out.remove(&unit);
            }
        }
    }
}

/// What became of a message [`Driver::send_message`] tried to send.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    Yes,
    Full,
    PeerGone,
}
