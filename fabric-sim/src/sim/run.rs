//! Running the simulation: the event loop that jumps from one scheduled action or engine timer to the
//! next, and what each action does to links, nodes and collectives.

use super::*;

impl Sim {
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
