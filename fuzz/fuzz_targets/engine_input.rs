//! Two engines run a real transfer over a fuzzed network: A sends, B receives, every frame travels as
//! encoded wire bytes. The input is read as a little program of steps (pump an engine's transmits onto the
//! wire, deliver a queued frame with a mutation, inject a forged frame for the live session, advance
//! time, consume a layer, cancel); once it runs out, the network turns clean and the clock runs forward.
//!
//! Invariants, beyond "no panic":
//! - liveness: both engines end every session within a bounded amount of virtual time after the input
//!   is exhausted, and the sender reports exactly one completion;
//! - no stuck timer: an engine whose next timeout is due and that has nothing to send moves it on;
//! - content: every block B reports delivered holds exactly A's bytes for it (blocks a forged, checksum-
//!   valid data frame claimed are exempt: a CRC is not a signature);
//! - accounting: every block the sender does not report for recompute was delivered by B (unless a forged
//!   ack reached A), the receiver's recompute list is exactly its undelivered blocks, a layer is complete
//!   only once all its blocks are delivered, a block is delivered once;
//! - bounded memory: transmits and events per step stay under a fixed bound.
#![no_main]

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use transfer_engine::wire::{self, FrameKind, HEADER_LEN, Header};
use transfer_engine::{
    BlockId, Dtype, Engine, EngineConfig, Event, KvLayout, MemoryRegion, PeerId, Role, SessionId,
    TransferMode, TransferRequest, crc32c,
};

const A_ID: PeerId = PeerId(1);
const B_ID: PeerId = PeerId(2);
/// Most steps one input drives (keeps each execution short).
const MAX_STEPS: usize = 512;
/// Most transmits one engine may produce in one pump, and events in one step: far above what a layout
/// of at most 3 x 4 blocks of 256-byte slices (48 units) can legitimately need.
const MAX_BURST: usize = 4096;
/// Rounds of the clean drain before it is declared a livelock.
const MAX_DRAIN_ROUNDS: usize = 20_000;

/// Set `ENGINE_INPUT_DEBUG=1` to trace frames and events (when reproducing a failure).
fn debug() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ENGINE_INPUT_DEBUG").is_some())
}

/// Reads the input as a stream of small decisions; zeros once exhausted.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }
}

/// A frame on the wire; `mutated` once the harness changed it.
#[derive(Clone)]
struct Frame {
    bytes: Vec<u8>,
    mutated: bool,
}

struct Setup {
    src_layout: KvLayout,
    dst_layout: KvLayout,
    layers: std::ops::Range<u32>,
    src_blocks: Vec<u32>,
    dst_blocks: Vec<u32>,
    mode: TransferMode,
    deadline: Duration,
    max_retries: u32,
    prefetch: Option<u32>,
}

fn setup(inp: &mut Input<'_>) -> Setup {
    let layers = 1 + u32::from(inp.u8() % 3);
    let blocks = 1 + u32::from(inp.u8() % 4);
    let extra = u32::from(inp.u8() % 3);
    let block_bytes = 256 * (1 + u64::from(inp.u8() % 16));
    let src_layout = KvLayout::new(layers, blocks, block_bytes, 16, Dtype::F16).unwrap();
    let dst_layout = KvLayout::new(layers, blocks + extra, block_bytes, 16, Dtype::F16).unwrap();
    let m = inp.u8();
    let slice_bytes = 256u32 << (m / 4 % 5);
    let mode = match m % 4 {
        0 => TransferMode::Exclusive,
        1 | 3 => TransferMode::Packetized { slice_bytes },
        _ => TransferMode::Auto {
            slice_bytes,
            exclusive_min_bytes: [256, 1024, 4096, 1 << 20][usize::from(m / 32 % 4)],
        },
    };
    let shape = inp.u8();
    let first_layer = u32::from(shape % 3).min(layers - 1);
    let layer_end = layers - u32::from(shape / 3 % 3).min(layers - 1 - first_layer);
    // Source blocks: all, or a contiguous subset; destination: shifted and maybe reversed.
    let n = 1 + u32::from(shape / 9 % 4) % blocks;
    let start = u32::from(inp.u8()) % (blocks - n + 1);
    let src_blocks: Vec<u32> = (start..start + n).collect();
    let shift = u32::from(inp.u8()) % (blocks + extra - n + 1);
    let mut dst_blocks: Vec<u32> = (shift..shift + n).collect();
    if shape & 0x80 != 0 {
        dst_blocks.reverse();
    }
    let d = inp.u8();
    Setup {
        src_layout,
        dst_layout,
        layers: first_layer..layer_end,
        src_blocks,
        dst_blocks,
        mode,
        deadline: Duration::from_millis(20 * (1 + u64::from(d % 32))),
        max_retries: 1 + u32::from(d / 32 % 8),
        prefetch: (inp.u8() % 4 == 0).then_some(0),
    }
}

/// Encodes a transmit as the bytes a driver would put on the wire (the engine's one encoder).
fn encode(engine: &Engine, mut t: transfer_engine::Transmit) -> Vec<u8> {
    engine
        .encode_transmit(&mut t)
        .expect("a data transmit names bytes inside a registered region")
}

fn reseal_header(bytes: &mut [u8]) {
    if bytes.len() >= HEADER_LEN {
        let hcrc = crc32c(&bytes[..44]);
        bytes[44..48].copy_from_slice(&hcrc.to_le_bytes());
    }
}

fn reseal_payload(bytes: &mut [u8]) {
    if bytes.len() >= HEADER_LEN {
        let len = (bytes.len() - HEADER_LEN) as u32;
        bytes[32..36].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c(&bytes[HEADER_LEN..]);
        bytes[40..44].copy_from_slice(&crc.to_le_bytes());
        reseal_header(bytes);
    }
}

const KINDS: [FrameKind; 9] = [
    FrameKind::Open,
    FrameKind::OpenAck,
    FrameKind::Reject,
    FrameKind::Data,
    FrameKind::Ack,
    FrameKind::Nack,
    FrameKind::Close,
    FrameKind::CloseAck,
    FrameKind::Progress,
];

struct World {
    a: Engine,
    b: Engine,
    now: Instant,
    start: Instant,
    session: SessionId,
    s: Setup,
    src_mem: MemoryRegion,
    dst_mem: MemoryRegion,
    /// Frames in flight: [0] from A to B, [1] from B to A.
    wire: [VecDeque<Frame>; 2],
    // What the engines reported about the live session.
    a_completed: usize,
    a_recompute: BTreeSet<BlockId>,
    a_refused: bool,
    b_incoming: bool,
    b_completed: usize,
    b_delivered: BTreeSet<BlockId>,
    b_recompute: BTreeSet<BlockId>,
    b_layers_done: BTreeSet<u32>,
    /// The layer the consumer last asked for during the drain.
    consuming: Option<u32>,
    /// Destination blocks a forged (checksum-valid) data frame claimed: their content is not checked.
    tainted: BTreeSet<BlockId>,
    /// A forged, checksum-valid ack reached A: its accounting may be wrong through no fault of its own.
    ack_forged: bool,
    /// A forged, checksum-valid open reached B.
    open_forged: bool,
    /// The transfer B accepted (layers, destination blocks), from its `Incoming` event.
    b_layers: std::ops::Range<u32>,
    b_blocks: Vec<u32>,
}

impl World {
    fn pump(&mut self, dir: usize, limit: usize) -> usize {
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
    fn deliver(&mut self, dir: usize, frame: &Frame) {
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
    fn taint_claim(&mut self, h: &Header) {
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

    fn events(&mut self) {
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

    fn is_dst_block(&self, b: BlockId) -> bool {
        self.b_layers.contains(&b.layer) && self.b_blocks.contains(&b.block)
    }

    fn advance(&mut self, to: Instant) {
        self.now = self.now.max(to);
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
    }

    /// One fuzz-chosen step.
    fn step(&mut self, inp: &mut Input<'_>) {
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

    fn deliver_mutated(&mut self, dir: usize, how: u8, inp: &mut Input<'_>) {
        let Some(mut f) = self.wire[dir].pop_front() else {
            return;
        };
        let repair = how & 0x80 != 0;
        match how % 16 {
            // Dropped.
            0 => return,
            // Duplicated: delivered now and again later.
            1 => self.wire[dir].push_back(f.clone()),
            // Reordered: delivered later.
            2 => {
                let at = usize::from(inp.u8()) % (self.wire[dir].len() + 1);
                self.wire[dir].insert(at, f);
                return;
            }
            // A bit flipped in the header.
            3 => {
                let bit = usize::from(inp.u16()) % (HEADER_LEN.min(f.bytes.len()) * 8).max(1);
                if let Some(b) = f.bytes.get_mut(bit / 8) {
                    *b ^= 1 << (bit % 8);
                }
                f.mutated = true;
                if repair {
                    reseal_header(&mut f.bytes);
                }
            }
            // Bits flipped in the payload.
            4 => {
                let payload_len = f.bytes.len().saturating_sub(HEADER_LEN);
                if payload_len > 0 {
                    let at = HEADER_LEN + usize::from(inp.u16()) % payload_len;
                    f.bytes[at] ^= inp.u8() | 1;
                    f.mutated = true;
                    if repair {
                        reseal_payload(&mut f.bytes);
                    }
                }
            }
            // Truncated (length and checksums repaired some of the time).
            5 => {
                let len = usize::from(inp.u16()) % (f.bytes.len() + 1);
                f.bytes.truncate(len);
                f.mutated = true;
                if repair {
                    reseal_payload(&mut f.bytes);
                } else if how & 0x40 != 0 {
                    reseal_header(&mut f.bytes);
                }
            }
            // A header field set to a fuzz-chosen value.
            6 => {
                if f.bytes.len() >= HEADER_LEN {
                    let field = inp.u8();
                    let v = inp.u32();
                    let (at, width) = [
                        (3, 1),
                        (4, 2),
                        (8, 8),
                        (16, 4),
                        (20, 4),
                        (24, 8),
                        (32, 4),
                        (36, 4),
                    ][usize::from(field % 8)];
                    let old = &mut f.bytes[at..at + width];
                    if field & 0x80 != 0 {
                        // Small delta: stays plausible.
                        old[0] = old[0].wrapping_add((v as u8 % 5).wrapping_sub(2));
                    } else {
                        old.copy_from_slice(&v.to_le_bytes().repeat(2)[..width]);
                    }
                    f.mutated = true;
                    if how & 0x40 != 0 {
                        reseal_header(&mut f.bytes);
                    }
                }
            }
            // Bytes appended.
            7 => {
                let n = 1 + usize::from(inp.u8() % 16);
                f.bytes.extend(inp.bytes(n));
                f.mutated = true;
                if repair {
                    reseal_payload(&mut f.bytes);
                }
            }
            // Delivered to the wrong engine (a reflection).
            8 => {
                let other = 1 - dir;
                self.deliver(other, &Frame { mutated: true, ..f });
                return;
            }
            _ => {}
        }
        self.deliver(dir, &f);
    }

    /// A frame built from the input for the live session (or a neighbour), with valid checksums.
    fn inject(&mut self, inp: &mut Input<'_>) {
        let k = inp.u8();
        let kind = KINDS[usize::from(k % 9)];
        let mut session = self.session.0;
        if k & 0x80 != 0 {
            session ^= u64::from(inp.u8());
        }
        let mut h = Header::new(kind, session);
        h.attempt = u16::from(inp.u8() % 4);
        let small = inp.u8();
        h.layer = u32::from(small % 4);
        h.block = u32::from(small / 4 % 8);
        h.offset = if small & 0x80 != 0 {
            u64::from(inp.u32())
        } else {
            256 * u64::from(inp.u8() % 16)
        };
        h.sequence = if small & 0x40 != 0 {
            inp.u32()
        } else {
            u32::from(inp.u8() % 64)
        };
        let payload = match kind {
            FrameKind::Ack => {
                let n = inp.u8() % 4;
                let mut p = u32::from(n).to_le_bytes().to_vec();
                for _ in 0..n {
                    let s = u32::from(inp.u8() % 64);
                    p.extend_from_slice(&s.to_le_bytes());
                    p.extend_from_slice(&(s + 1 + u32::from(inp.u8() % 8)).to_le_bytes());
                }
                p
            }
            FrameKind::Data => {
                let n = 256 * usize::from(inp.u8() % 17);
                let fill = inp.u8();
                vec![fill; n]
            }
            FrameKind::Open | FrameKind::Reject => {
                let n = usize::from(inp.u8() % 64);
                inp.bytes(n)
            }
            _ => Vec::new(),
        };
        let bytes = wire::encode_frame(&h, &payload);
        let dir = usize::from(kind.is_from_receiver() ^ (k & 0x40 != 0));
        self.deliver(
            dir,
            &Frame {
                bytes,
                mutated: true,
            },
        );
    }

    /// The network turns clean: run both engines until every session has ended.
    fn drain(&mut self) {
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

    fn check(&self) {
        assert_eq!(
            self.a_completed, 1,
            "sender completed {} times",
            self.a_completed
        );
        assert_eq!(self.a.live_sessions(), 0);
        assert_eq!(self.b.live_sessions(), 0);
        if self.b_incoming {
            assert_eq!(
                self.b_completed, 1,
                "receiver accepted the session but never completed it"
            );
        }
        let s = &self.s;
        for layer in s.layers.clone() {
            for (&sb, &db) in s.src_blocks.iter().zip(&s.dst_blocks) {
                let (src, dst) = (BlockId::new(layer, sb), BlockId::new(layer, db));
                let delivered = self.b_delivered.contains(&dst);
                if self.open_forged {
                    continue;
                }
                if !self.ack_forged {
                    assert!(
                        delivered || self.a_recompute.contains(&src),
                        "sender neither recomputes {src:?} nor did the receiver deliver {dst:?}"
                    );
                }
                if self.a_refused {
                    assert!(
                        self.a_recompute.contains(&src),
                        "refused but {src:?} not recomputed"
                    );
                }
                if delivered && !self.tainted.contains(&dst) {
                    let bb = s.src_layout.block_bytes as usize;
                    let so = s.src_layout.block_offset(src) as usize;
                    let doff = s.dst_layout.block_offset(dst) as usize;
                    let want = self.src_mem.read(so..so + bb).unwrap();
                    let got = self.dst_mem.read(doff..doff + bb).unwrap();
                    assert!(
                        *want == *got,
                        "block {dst:?} reported delivered but does not hold source block {src:?}'s bytes"
                    );
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input { data, pos: 0 };
    let s = setup(&mut inp);
    let cfg = |id, seed| EngineConfig {
        engine_id: id,
        rng_seed: seed,
        max_retries: s.max_retries,
        deadline: s.deadline,
        ..EngineConfig::default()
    };
    let seed = u64::from(inp.u8());
    let (mut a, mut b) = (Engine::new(cfg(1, seed)), Engine::new(cfg(2, seed + 1)));
    let src_mem = MemoryRegion::zeroed(s.src_layout.total_bytes() as usize);
    // Distinct bytes everywhere (a block landing in the wrong place shows).
    src_mem
        .fill_with(|off, buf| {
            for (i, b) in buf.iter_mut().enumerate() {
                let x = (off + i) as u32;
                *b = (x.wrapping_mul(0x9E37_79B1) >> 13) as u8 ^ (x >> 8) as u8;
            }
        })
        .unwrap();
    let dst_mem = MemoryRegion::zeroed(s.dst_layout.total_bytes() as usize);
    let src = a.register_kv_region(s.src_layout, src_mem.clone()).unwrap();
    let dst = b.register_kv_region(s.dst_layout, dst_mem.clone()).unwrap();
    let start = Instant::now();
    let mut req = TransferRequest::blocks(
        B_ID,
        &src,
        s.src_blocks.clone(),
        &dst,
        s.dst_blocks.clone(),
        s.layers.clone(),
    )
    .unwrap()
    .with_mode(s.mode);
    if let Some(depth) = s.prefetch {
        req = req.with_prefetch_depth(depth);
    }
    let session = a.submit(start, req).unwrap();
    let mut w = World {
        a,
        b,
        now: start,
        start,
        session,
        s,
        src_mem,
        dst_mem,
        wire: [VecDeque::new(), VecDeque::new()],
        a_completed: 0,
        a_recompute: BTreeSet::new(),
        a_refused: false,
        b_incoming: false,
        b_completed: 0,
        b_delivered: BTreeSet::new(),
        b_recompute: BTreeSet::new(),
        b_layers_done: BTreeSet::new(),
        consuming: None,
        tainted: BTreeSet::new(),
        ack_forged: false,
        open_forged: false,
        b_layers: 0..0,
        b_blocks: Vec::new(),
    };
    for _ in 0..MAX_STEPS {
        if inp.done() {
            break;
        }
        w.step(&mut inp);
    }
    w.drain();
    w.check();
});
