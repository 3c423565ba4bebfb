//! The in-process loopback backend: a producer engine and a consumer engine in one process.
//!
//! Every frame goes through the real wire codec; a data frame's payload is copied exactly once, from the
//! producer's registered region straight into the place the consumer's engine names, and checksummed on
//! both sides.

use std::time::{Duration, Instant};

use transfer_engine::wire::Header;
use transfer_engine::{
    Body, Engine, EngineConfig, Error, Event, HostMemory, KvLayout, PeerId, Placement, RegionHandle, Role,
    SessionId, TransferRequest, Transmit,
};

/// The producer's peer id, as the consumer sees it.
pub const PRODUCER: PeerId = PeerId(1);
/// The consumer's peer id, as the producer sees it.
pub const CONSUMER: PeerId = PeerId(2);

/// Errors of the loopback driver itself (the engines' refusals are recorded, not raised).
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    /// The engine refused a command.
    #[error(transparent)]
    Engine(#[from] Error),
    /// A transfer did not finish within the time allowed.
    #[error("session {session} did not finish within {waited:?}")]
    Stalled {
        /// The session.
        session: SessionId,
        /// How long we waited.
        waited: Duration,
    },
}

/// Which engine of the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The engine that sends.
    Producer,
    /// The engine that receives.
    Consumer,
}

/// What a finished transfer reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The session.
    pub session: SessionId,
    /// Blocks the producer was told to recompute (source ids).
    pub recompute: Vec<transfer_engine::BlockId>,
    /// Wall time from submit to completion on both ends.
    pub elapsed: Duration,
}

/// A producer and a consumer engine with their host memory, wired back to back.
#[derive(Debug)]
pub struct LoopbackPair {
    /// The sending engine.
    pub producer: Engine,
    /// The receiving engine.
    pub consumer: Engine,
    /// The producer's region bytes.
    pub producer_mem: HostMemory,
    /// The consumer's region bytes.
    pub consumer_mem: HostMemory,
    /// Every event either engine emitted, in order.
    pub events: Vec<(Side, Event)>,
    /// Every frame either engine refused, with the reason. Refusals never stop the pair.
    pub refused: Vec<(Side, Error)>,
}

impl LoopbackPair {
    /// Two engines with these configurations (their engine ids must differ).
    #[must_use]
    pub fn new(producer: EngineConfig, consumer: EngineConfig) -> Self {
        Self {
            producer: Engine::new(producer),
            consumer: Engine::new(consumer),
            producer_mem: HostMemory::default(),
            consumer_mem: HostMemory::default(),
            events: Vec::new(),
            refused: Vec::new(),
        }
    }

    /// A pair with default settings and engine ids 1 and 2.
    #[must_use]
    pub fn with_defaults() -> Self {
        Self::new(
            EngineConfig { engine_id: 1, ..EngineConfig::default() },
            EngineConfig { engine_id: 2, rng_seed: 1, ..EngineConfig::default() },
        )
    }

    /// Registers and allocates a KV region on one side.
    pub fn kv_region(&mut self, side: Side, layout: KvLayout) -> Result<RegionHandle, LoopbackError> {
        let (engine, mem) = match side {
            Side::Producer => (&mut self.producer, &mut self.producer_mem),
            Side::Consumer => (&mut self.consumer, &mut self.consumer_mem),
        };
        let handle = engine.register_kv_region(layout)?;
        mem.alloc(&handle)?;
        Ok(handle)
    }

    /// Moves every pending frame in both directions once; returns how many moved.
    pub fn step(&mut self, now: Instant) -> usize {
        let mut moved = 0;
        while let Some(t) = self.producer.poll_transmit(now) {
            moved += 1;
            if let Err(e) = deliver(t, now, PRODUCER, &self.producer_mem, &mut self.consumer, &mut self.consumer_mem) {
                self.refused.push((Side::Consumer, e));
            }
            if moved % 64 == 0 {
                moved += self.pump_consumer(now);
            }
        }
        moved += self.pump_consumer(now);
        for (side, engine) in [(Side::Producer, &mut self.producer), (Side::Consumer, &mut self.consumer)] {
            if engine.poll_timeout().is_some_and(|t| t <= now) {
                engine.handle_timeout(now);
            }
            while let Some(event) = engine.poll_event() {
                self.events.push((side, event));
            }
        }
        moved
    }

    fn pump_consumer(&mut self, now: Instant) -> usize {
        let mut moved = 0;
        while let Some(t) = self.consumer.poll_transmit(now) {
            moved += 1;
            if let Err(e) = deliver(t, now, CONSUMER, &self.consumer_mem, &mut self.producer, &mut self.producer_mem) {
                self.refused.push((Side::Producer, e));
            }
        }
        moved
    }

    /// Submits `req` on the producer and drives both engines on the real clock until both ends report
    /// completion, or `limit` passes.
    pub fn transfer(&mut self, req: TransferRequest, limit: Duration) -> Result<Outcome, LoopbackError> {
        let start = Instant::now();
        let session = self.producer.submit(start, req)?;
        let first_event = self.events.len();
        let (mut sent, mut received) = (false, false);
        let mut recompute = Vec::new();
        while !(sent && received) {
            let now = Instant::now();
            if now.duration_since(start) > limit {
                return Err(LoopbackError::Stalled { session, waited: limit });
            }
            let seen = self.events.len();
            if self.step(now) == 0 && self.events.len() == seen {
                std::thread::yield_now();
            }
            for (side, event) in &self.events[seen.max(first_event)..] {
                match event {
                    Event::Completed { session: s, role: Role::Sender, .. } if *s == session => sent = true,
                    Event::Completed { session: s, role: Role::Receiver, .. } if *s == session => received = true,
                    Event::Recompute { session: s, blocks, .. } if *s == session && *side == Side::Producer => {
                        recompute.clone_from(blocks);
                    }
                    _ => {}
                }
            }
        }
        let elapsed = start.elapsed();
        // Let the close handshake finish so both engines forget the session.
        self.step(Instant::now());
        Ok(Outcome { session, recompute, elapsed })
    }
}

/// Carries one transmit from `from` into `engine`, moving payload bytes from `src_mem` to `dst_mem`.
fn deliver(
    mut t: Transmit,
    now: Instant,
    from: PeerId,
    src_mem: &HostMemory,
    engine: &mut Engine,
    dst_mem: &mut HostMemory,
) -> Result<(), Error> {
    match t.body {
        Body::Payload(p) => {
            let payload = src_mem.read(p.region, p.range())?;
            let header = Header::decode(&t.seal(payload))?;
            let crc = match engine.placement(from, &header)? {
                Placement::Write { region, offset, len } => {
                    let dst = dst_mem.write(region, offset as usize..offset as usize + len as usize)?;
                    dst.copy_from_slice(payload);
                    transfer_engine::crc32c(dst)
                }
                Placement::Discard => header.crc,
            };
            engine.handle_data(now, from, &header, crc)
        }
        Body::Control(ref payload) => {
            let header = Header::decode(&t.header.encode())?;
            engine.handle_frame(now, from, &header, payload)
        }
        Body::Empty => {
            let header = Header::decode(&t.header.encode())?;
            engine.handle_frame(now, from, &header, &[])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::{Dtype, TransferMode};

    fn fill(mem: &mut HostMemory, region: &RegionHandle, seed: u8) {
        for (i, b) in mem.region_mut(region.id).unwrap().iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8;
        }
    }

    #[test]
    fn small_transfer_arrives_in_each_mode() {
        for mode in [TransferMode::Exclusive, TransferMode::Packetized { slice_bytes: 1024 }, TransferMode::auto()] {
            let mut pair = LoopbackPair::with_defaults();
            let layout = KvLayout::new(4, 8, 4096, 16, Dtype::F16).unwrap();
            let src = pair.kv_region(Side::Producer, layout).unwrap();
            let dst = pair.kv_region(Side::Consumer, layout).unwrap();
            fill(&mut pair.producer_mem, &src, 7);
            let req = TransferRequest::whole(CONSUMER, &src, &dst).unwrap().with_mode(mode);
            let out = pair.transfer(req, Duration::from_secs(10)).unwrap();
            assert!(out.recompute.is_empty(), "{mode:?}");
            assert_eq!(pair.producer_mem.region(src.id).unwrap(), pair.consumer_mem.region(dst.id).unwrap());
            assert!(pair.refused.is_empty(), "{:?}", pair.refused);
            assert_eq!(pair.producer.live_sessions() + pair.consumer.live_sessions(), 0);
        }
    }
}
