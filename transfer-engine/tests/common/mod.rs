//! A hand-stepped pair of engines: virtual time advanced by the test, frames moved as real encoded bytes,
//! and a filter that can drop or corrupt chosen frames.

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use transfer_engine::wire::{FrameKind, HEADER_LEN, Header};
use transfer_engine::{
    Dtype, Engine, EngineConfig, Error, Event, KvLayout, MemoryRegion, PeerId, RegionHandle,
    RegionId,
};

pub const A: PeerId = PeerId(1);
pub const B: PeerId = PeerId(2);

/// What to do with a frame on its way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Pass,
    Drop,
    /// Flip one bit of the payload (or of the header when there is no payload).
    Corrupt,
}

pub type Filter = Box<dyn FnMut(&Header, PeerId) -> Action>;

pub struct Pair {
    pub a: Engine,
    pub b: Engine,
    pub now: Instant,
    pub start: Instant,
    pub filter: Filter,
    pub events_a: Vec<(Duration, Event)>,
    pub events_b: Vec<(Duration, Event)>,
    pub refused_a: Vec<Error>,
    pub refused_b: Vec<Error>,
    /// Data frames sent by A: (virtual time, sequence, attempt).
    pub data_log: Vec<(Duration, u32, u16)>,
    /// Every frame sent, by either side: (virtual time, sender, header).
    pub frames: Vec<(Duration, PeerId, Header)>,
}

/// The cause of a frame's refusal, after checking that it is one (the peer's fault) naming `from`.
pub fn refusal(e: Error, from: PeerId) -> Error {
    assert_eq!(e.fault(), transfer_engine::Fault::Peer, "{e}");
    match e {
        Error::Refused { peer, cause } if peer == from => *cause,
        other => panic!("not a refusal of a frame from {from:?}: {other}"),
    }
}

/// A whole frame handed to an engine, its refusal unwrapped by [`refusal`].
pub trait Offer {
    /// [`Engine::handle_datagram`], answering the cause of a refusal.
    fn offer(&mut self, now: Instant, from: PeerId, bytes: &[u8]) -> Result<(), Error>;
}

impl Offer for Engine {
    fn offer(&mut self, now: Instant, from: PeerId, bytes: &[u8]) -> Result<(), Error> {
        self.handle_datagram(now, from, bytes)
            .map_err(|e| refusal(e, from))
    }
}

pub fn config(engine_id: u32) -> EngineConfig {
    let mut cfg = EngineConfig::default();
    cfg.engine_id = engine_id;
    cfg.rng_seed = u64::from(engine_id);
    cfg
}

pub fn layout(layers: u32, blocks: u32, block_bytes: u64) -> KvLayout {
    KvLayout::new(layers, blocks, block_bytes, 16, Dtype::F16).unwrap()
}

pub fn fill(bytes: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in bytes.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// Registers a KV region over zeroed host memory.
pub trait KvZeroed {
    fn kv_zeroed(&mut self, layout: KvLayout) -> Result<RegionHandle, Error>;
}

impl KvZeroed for Engine {
    fn kv_zeroed(&mut self, layout: KvLayout) -> Result<RegionHandle, Error> {
        self.register_kv_region(layout, MemoryRegion::zeroed(layout.total_bytes() as usize))
    }
}

impl Pair {
    pub fn new() -> Self {
        Self::with_configs(config(1), config(2))
    }

    pub fn with_configs(a: EngineConfig, b: EngineConfig) -> Self {
        #[expect(
            clippy::disallowed_methods,
            reason = "virtual time needs one real epoch to start from"
        )]
        let start = Instant::now();
        Self {
            a: Engine::new(a),
            b: Engine::new(b),
            now: start,
            start,
            filter: Box::new(|_, _| Action::Pass),
            events_a: Vec::new(),
            events_b: Vec::new(),
            refused_a: Vec::new(),
            refused_b: Vec::new(),
            data_log: Vec::new(),
            frames: Vec::new(),
        }
    }

    /// A source region on A (filled with `seed`'s pattern) and a destination region on B.
    pub fn regions(&mut self, layout: KvLayout, seed: u64) -> (RegionHandle, RegionHandle) {
        let mut bytes = vec![0; layout.total_bytes() as usize];
        fill(&mut bytes, seed);
        let src = self
            .a
            .register_kv_region(layout, MemoryRegion::from_vec(bytes))
            .unwrap();
        let dst = self.b.kv_zeroed(layout).unwrap();
        (src, dst)
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// A copy of the bytes of A's region `id`.
    pub fn bytes_a(&self, id: RegionId) -> Vec<u8> {
        self.a.memory(id).unwrap().to_vec().unwrap()
    }

    /// A copy of the bytes of B's region `id`.
    pub fn bytes_b(&self, id: RegionId) -> Vec<u8> {
        self.b.memory(id).unwrap().to_vec().unwrap()
    }

    /// Moves every pending frame once in each direction; returns how many were sent.
    pub fn step(&mut self) -> usize {
        let mut moved = 0;
        while let Some(mut t) = self.a.poll_transmit(self.now) {
            moved += 1;
            if t.header.kind == FrameKind::Data {
                self.data_log
                    .push((self.elapsed(), t.header.sequence, t.header.attempt));
            }
            let bytes = self.a.encode_transmit(&mut t).unwrap();
            self.frames.push((self.elapsed(), A, t.header));
            if let Some(bytes) = apply((self.filter)(&t.header, A), bytes)
                && let Err(e) = self.b.handle_datagram(self.now, A, &bytes)
            {
                self.refused_b.push(refusal(e, A));
            }
        }
        while let Some(mut t) = self.b.poll_transmit(self.now) {
            moved += 1;
            let bytes = self.b.encode_transmit(&mut t).unwrap();
            self.frames.push((self.elapsed(), B, t.header));
            if let Some(bytes) = apply((self.filter)(&t.header, B), bytes)
                && let Err(e) = self.a.handle_datagram(self.now, B, &bytes)
            {
                self.refused_a.push(refusal(e, B));
            }
        }
        self.collect();
        moved
    }

    pub fn collect(&mut self) {
        let at = self.elapsed();
        while let Some(e) = self.a.poll_event() {
            self.events_a.push((at, e));
        }
        while let Some(e) = self.b.poll_event() {
            self.events_b.push((at, e));
        }
    }

    /// Steps until neither engine has a frame to send; returns the earliest timer then pending.
    fn step_until_quiet(&mut self) -> Option<Instant> {
        while self.step() > 0 {}
        [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Jumps virtual time to `at` (if later) and fires both engines' timers.
    fn advance_to(&mut self, at: Instant) {
        self.now = self.now.max(at);
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
    }

    /// Steps for `span` of virtual time (or until both engines are idle with no timer pending).
    pub fn run_for(&mut self, span: Duration) {
        let until = self.now + span;
        loop {
            match self.step_until_quiet() {
                Some(next) if next <= until => self.advance_to(next),
                next => {
                    self.now = self.now.max(until.min(next.unwrap_or(until)));
                    return;
                }
            }
        }
    }

    /// Steps until neither engine has anything to send or any timer pending, jumping virtual time to
    /// the next timer whenever the pair is quiet. Panics if `limit` of virtual time passes.
    pub fn run(&mut self, limit: Duration) {
        while let Some(next) = self.step_until_quiet() {
            assert!(
                next - self.start <= limit,
                "still busy after {limit:?} of virtual time"
            );
            self.advance_to(next);
        }
    }
}

fn apply(action: Action, mut bytes: Vec<u8>) -> Option<Vec<u8>> {
    match action {
        Action::Pass => Some(bytes),
        Action::Drop => None,
        Action::Corrupt => {
            let at = if bytes.len() > HEADER_LEN {
                HEADER_LEN + (bytes.len() - HEADER_LEN) / 2
            } else {
                20
            };
            bytes[at] ^= 0x10;
            Some(bytes)
        }
    }
}
