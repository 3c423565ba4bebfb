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

#[path = "engine_input/attack.rs"]
mod attack;
#[path = "engine_input/check.rs"]
mod check;
#[path = "engine_input/run.rs"]
mod run;

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
    /// The sender's `coalesce_bytes` (0: one slice a frame).
    coalesce_bytes: u32,
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
        coalesce_bytes: 256 * u32::from(inp.u8() % 8),
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

fuzz_target!(|data: &[u8]| {
    let mut inp = Input { data, pos: 0 };
    let s = setup(&mut inp);
    let cfg = |id, seed| { let mut cfg = EngineConfig::default(); cfg.engine_id = id; cfg.rng_seed = seed; cfg.max_retries = s.max_retries; cfg.deadline = s.deadline; cfg.coalesce_bytes = s.coalesce_bytes; cfg };
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
