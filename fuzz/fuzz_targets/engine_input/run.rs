//! Running the two engines: pumping transmits onto the wire, delivering frames, recording events, stepping
//! through the fuzzed program, and draining once the input is exhausted.

use super::*;

impl World {
    pub(super) fn pump(&mut self, dir: usize, limit: usize) -> usize {
        let mut n = 0;
        while n < limit {
            let engine = if dir == 0 { &mut self.a } else { &mut self.b };
            let Some(t) = engine.poll_transmit(self.now) else {
                break;
            };
            let expect = if dir == 0 { B_ID } else { A_ID };
            assert_eq!(
                t.peer, expect,
                "transmit addressed to a peer nobody talks to"
            );
            let bytes = encode(engine, t);
            self.wire[dir].push_back(Frame {
                bytes,
                mutated: false,
            });
            n += 1;
        }
        assert!(
            self.wire[dir].len() <= 4 * MAX_BURST,
            "unbounded transmit queue: {} frames in flight",
            self.wire[dir].len()
        );
        n
    }

    /// Hands `frame` to the engine at the far end of `dir`, noting what a forgery may have compromised.
    pub(super) fn deliver(&mut self, dir: usize, frame: &Frame) {
        if frame.mutated
            && let Ok((h, payload)) = wire::decode_frame(&frame.bytes)
            && crc32c(payload) == h.crc
        {
            if dir == 0 && h.kind == FrameKind::Data {
                self.taint_claim(&h);
            }
            if dir == 0 && h.kind == FrameKind::Open {
                // B may have accepted a transfer other than the one A sends: nothing relates them.
                self.open_forged = true;
            }
            if dir == 1 && h.kind == FrameKind::Ack {
                self.ack_forged = true;
            }
        }
        if debug() {
            let h = Header::decode(&frame.bytes);
            eprintln!(
                "{:?} {} {} bytes{}: {h:?}",
                self.now - self.start,
                ["A->B", "B->A"][dir],
                frame.bytes.len(),
                if frame.mutated { " (mutated)" } else { "" }
            );
        }
        let (engine, from) = if dir == 0 {
            (&mut self.b, A_ID)
        } else {
            (&mut self.a, B_ID)
        };
        let _ = engine.handle_datagram(self.now, from, &frame.bytes);
    }

    /// Marks the destination blocks a data header claims to write.
    pub(super) fn taint_claim(&mut self, h: &Header) {
        let l = self.s.dst_layout;
        if h.layer >= l.layers || h.block >= l.blocks_per_layer {
            return;
        }
        let start =
            u128::from(l.block_offset(BlockId::new(h.layer, h.block))) + u128::from(h.offset);
        let end = start + u128::from(h.length.max(1));
        let bb = u128::from(l.block_bytes);
        let total = u128::from(l.total_bytes());
        let mut i = start / bb;
        while i * bb < end.min(total) {
            let layer = (i / u128::from(l.blocks_per_layer)) as u32;
            let block = (i % u128::from(l.blocks_per_layer)) as u32;
            self.tainted.insert(BlockId::new(layer, block));
            i += 1;
        }
    }

    pub(super) fn events(&mut self) {
        let mut n = 0;
        while let Some(e) = self.a.poll_event() {
            n += 1;
            if debug() {
                eprintln!("{:?} A {e:?}", self.now - self.start);
            }
            match e {
                Event::Completed {
                    session,
                    role: Role::Sender,
                    stats,
                } if session == self.session => {
                    self.a_completed += 1;
                    assert_eq!(
                        stats.recompute_blocks as usize,
                        self.a_recompute.len(),
                        "sender's completion counts a different number of recompute blocks than it reported"
                    );
                }
                Event::Recompute {
                    session,
                    role: Role::Sender,
                    blocks,
                } if session == self.session => {
                    assert_eq!(
                        self.a_completed, 0,
                        "sender reported recompute after completing"
                    );
                    for b in blocks {
                        assert!(
                            self.a_recompute.insert(b),
                            "sender reported block {b:?} for recompute twice"
                        );
                    }
                }
                Event::Refused { session, .. } if session == self.session => self.a_refused = true,
                Event::BlockDelivered { .. }
                | Event::LayerComplete { .. }
                | Event::Incoming { .. } => {
                    panic!("the sending engine reported a receiver event: {e:?}")
                }
                _ => {}
            }
        }
        while let Some(e) = self.b.poll_event() {
            n += 1;
            if debug() {
                eprintln!("{:?} B {e:?}", self.now - self.start);
            }
            match e {
                Event::Incoming {
                    session,
                    layers,
                    blocks,
                    ..
                } if session == self.session => {
                    assert!(!self.b_incoming, "receiver accepted the same session twice");
                    self.b_incoming = true;
                    self.b_layers = layers;
                    self.b_blocks = blocks;
                }
                Event::BlockDelivered { session, block } if session == self.session => {
                    assert!(
                        self.is_dst_block(block),
                        "receiver delivered block {block:?}, not part of the transfer"
                    );
                    assert!(
                        self.b_delivered.insert(block),
                        "block {block:?} delivered twice"
                    );
                    assert_eq!(
                        self.b_completed, 0,
                        "block delivered after the receiver completed"
                    );
                }
                Event::LayerComplete { session, layer } if session == self.session => {
                    for &d in &self.b_blocks {
                        assert!(
                            self.b_delivered.contains(&BlockId::new(layer, d)),
                            "layer {layer} reported complete but block {d} of it was not delivered"
                        );
                    }
                    self.b_layers_done.insert(layer);
                }
                Event::Recompute {
                    session,
                    role: Role::Receiver,
                    blocks,
                } if session == self.session => {
                    for b in blocks {
                        assert!(
                            self.is_dst_block(b),
                            "receiver recompute names foreign block {b:?}"
                        );
                        assert!(
                            !self.b_delivered.contains(&b),
                            "receiver reports delivered block {b:?} for recompute"
                        );
                        assert!(
                            self.b_recompute.insert(b),
                            "receiver recompute names {b:?} twice"
                        );
                    }
                }
                Event::Completed {
                    session,
                    role: Role::Receiver,
                    ..
                } if session == self.session => {
                    self.b_completed += 1;
                    assert_eq!(self.b_completed, 1, "receiver completed twice");
                    let all = self.b_layers.len() * self.b_blocks.len();
                    assert_eq!(
                        self.b_delivered.len() + self.b_recompute.len(),
                        all,
                        "receiver completed with blocks neither delivered nor reported for recompute"
                    );
                }
                Event::Completed {
                    role: Role::Sender, ..
                }
                | Event::Refused { .. } => {
                    panic!("the receiving engine reported a sender event: {e:?}")
                }
                _ => {}
            }
        }
        assert!(n <= MAX_BURST, "{n} events in one step");
    }

    pub(super) fn is_dst_block(&self, b: BlockId) -> bool {
        self.b_layers.contains(&b.layer) && self.b_blocks.contains(&b.block)
    }

    pub(super) fn advance(&mut self, to: Instant) {
        self.now = self.now.max(to);
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
    }

    /// One fuzz-chosen step.
    pub(super) fn step(&mut self, inp: &mut Input<'_>) {
        let op = inp.u8();
        match op % 16 {
            // Pump transmits onto the wire.
            0..=2 => {
                let limit = 1 + usize::from(inp.u8());
                self.pump(0, limit);
            }
            3..=4 => {
                let limit = 1 + usize::from(inp.u8());
                self.pump(1, limit);
            }
            // Deliver the next frame of one direction, mutated or not.
            5..=9 => {
                let dir = usize::from(op >> 7);
                let how = inp.u8();
                self.deliver_mutated(dir, how, inp);
            }
            // Deliver everything queued one way, untouched.
            10 => {
                let dir = usize::from(op >> 7);
                while let Some(f) = self.wire[dir].pop_front() {
                    self.deliver(dir, &f);
                }
            }
            // Inject a forged frame.
            11 => self.inject(inp),
            // Advance time by a fuzz-chosen amount, or to the next timer.
            12..=13 => {
                let t = inp.u8();
                let to = if t < 32 {
                    [self.a.poll_timeout(), self.b.poll_timeout()]
                        .into_iter()
                        .flatten()
                        .min()
                        .unwrap_or(self.now)
                } else {
                    self.now + Duration::from_micros(1u64 << (t % 26))
                };
                self.advance(to);
            }
            14 => {
                let layer = u32::from(inp.u8() % 4);
                let _ = self.b.consume_layer(self.now, self.session, layer);
            }
            _ => {
                if op == 0xFF && inp.u8() == 0xFF {
                    let _ = self.a.cancel(self.session);
                }
            }
        }
        self.events();
    }

    /// The network turns clean: run both engines until every session has ended.
    pub(super) fn drain(&mut self) {
        let input_end = self.now;
        let bound = input_end
            + self.s.deadline * 3
            + Duration::from_secs(1) * (self.s.max_retries + 2)
            + Duration::from_secs(1);
        let mut idle_rounds = 0;
        for _ in 0..MAX_DRAIN_ROUNDS {
            // A consumer computes the layers in order (a streamed transfer waits for it).
            if self.b_incoming && self.b_completed == 0 {
                let next = self
                    .b_layers
                    .clone()
                    .find(|l| !self.b_layers_done.contains(l));
                if next.is_some() && next != self.consuming {
                    self.consuming = next;
                    let _ = self.b.consume_layer(self.now, self.session, next.unwrap());
                }
            }
            let moved = self.pump(0, MAX_BURST) + self.pump(1, MAX_BURST);
            let queued = self.wire[0].len() + self.wire[1].len();
            for dir in 0..2 {
                while let Some(f) = self.wire[dir].pop_front() {
                    self.deliver(dir, &f);
                }
            }
            self.events();
            if self.a.live_sessions() == 0 && self.b.live_sessions() == 0 && queued == 0 {
                return;
            }
            if moved > 0 || queued > 0 {
                idle_rounds = 0;
                continue;
            }
            let next = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(next) = next else {
                panic!(
                    "live sessions (A {}, B {}) with nothing to send and no timer: stuck forever",
                    self.a.live_sessions(),
                    self.b.live_sessions()
                );
            };
            if next <= self.now {
                idle_rounds += 1;
                assert!(
                    idle_rounds < 8,
                    "timer due at {:?} stays due after handle_timeout with nothing to send (busy loop)",
                    next - self.start
                );
            }
            if next > bound && self.open_forged {
                // A forged open may carry any deadline: the driver gives up on the peer instead.
                self.a
                    .abort_peer(B_ID, "fuzz: forged open outlived the bound");
                self.b
                    .abort_peer(A_ID, "fuzz: forged open outlived the bound");
                continue;
            }
            assert!(
                next <= bound,
                "sessions still live {:?} after the input ended (A {}, B {}); next timer at {:?}",
                bound - input_end,
                self.a.live_sessions(),
                self.b.live_sessions(),
                next - self.start
            );
            self.advance(next);
        }
        panic!("livelock: {MAX_DRAIN_ROUNDS} rounds of traffic without the sessions ending");
    }
}
