//! A ready-made KV transfer through the simulated fabric, and its report.
//!
//! A producer pushes `layers x blocks` KV blocks of `block_bytes` to a consumer, through links with the
//! faults of a [`FaultSpec`]. The report counts blocks from the consumer's side: a block is delivered when
//! the receiving engine says so (and its bytes are then compared with the source's, so
//! `corrupt_delivered` is measured, not assumed), and reported for recompute when either engine says so.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::Serialize;
use transfer_engine::{
    AUTO_MAX_UNIT_BYTES, Backoff, BlockId, Dtype, EngineConfig, Event, HEADER_LEN, KvLayout,
    RegionId, RetransmitBudget, Role, TransferMode, TransferRequest,
};

use crate::SimError;
use crate::fault::{CorruptTarget, FaultRule, GilbertElliott};
use crate::link::LinkConfig;
use crate::node::{Node, NodeId};
use crate::sim::{CrossTraffic, RunEnd, Sim};

/// Idle time worth one step of a scenario's Gilbert-Elliott chain: about one 64 KiB frame at 100 Gb/s.
pub const BURST_SLOT: Duration = Duration::from_micros(5);

/// Faults applied to both directions of the link (data one way, acknowledgements the other), in the
/// order of the fields. Probabilities are per packet (per frame: a frame is one packet here).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultSpec {
    /// Random loss probability.
    pub loss: f64,
    /// Gilbert-Elliott bursty loss: (enter, exit) transition probabilities per step (a packet, or
    /// [`BURST_SLOT`] of idle link); every packet in the bad state is lost, so the mean loss is
    /// `enter / (enter + exit)` and a burst lasts `1 / exit` steps on average.
    pub burst_loss: Option<(f64, f64)>,
    /// Probability of one flipped bit anywhere in a frame (payload or header).
    pub corrupt: f64,
    /// Probability of one flipped bit in a frame's header only.
    pub corrupt_header: f64,
    /// Probability that a frame arrives twice.
    pub duplicate: f64,
    /// Probability that a frame is held back (by up to [`FaultSpec::reorder_hold`]) and overtaken.
    pub reorder: f64,
    /// Longest hold of a reordered frame, and longest extra delay of a duplicate.
    pub reorder_hold: Duration,
    /// Uniform extra delay of every frame, up to this.
    pub jitter: Duration,
    /// Both directions cut from the first time until the second (`None`: never heals).
    pub partition: Option<(Duration, Option<Duration>)>,
}

impl FaultSpec {
    /// The rules, in order (the partition is placed first by the scenario).
    #[must_use]
    pub fn rules(&self) -> Vec<FaultRule> {
        let hold = if self.reorder_hold.is_zero() {
            Duration::from_micros(50)
        } else {
            self.reorder_hold
        };
        let mut rules = Vec::new();
        if self.loss > 0.0 {
            rules.push(FaultRule::Loss { p: self.loss });
        }
        if let Some((enter, exit)) = self.burst_loss {
            rules.push(FaultRule::BurstLoss(
                GilbertElliott::new(enter, exit).with_slot(BURST_SLOT),
            ));
        }
        if self.corrupt > 0.0 {
            rules.push(FaultRule::Corrupt {
                p: self.corrupt,
                target: CorruptTarget::Any,
            });
        }
        if self.corrupt_header > 0.0 {
            rules.push(FaultRule::Corrupt {
                p: self.corrupt_header,
                target: CorruptTarget::Header,
            });
        }
        if self.duplicate > 0.0 {
            rules.push(FaultRule::Duplicate {
                p: self.duplicate,
                spread: hold,
            });
        }
        if self.reorder > 0.0 {
            rules.push(FaultRule::Reorder {
                p: self.reorder,
                hold,
            });
        }
        if !self.jitter.is_zero() {
            rules.push(FaultRule::Jitter { max: self.jitter });
        }
        rules
    }
}

/// Which end of the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Side {
    /// The producer (sending engine).
    Sender,
    /// The consumer (receiving engine).
    Receiver,
}

/// A crash of one end, and maybe its restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashPlan {
    /// Which end crashes.
    pub side: Side,
    /// When (virtual time since the start).
    pub at: Duration,
    /// When it comes back with a fresh engine (`None`: never).
    pub restart_at: Option<Duration>,
}

/// Everything a scenario run depends on. One value (seed included) gives one run, exactly.
#[derive(Debug, Clone)]
pub struct ScenarioConfig {
    /// Seed of every generator: faults, engines, background traffic.
    pub seed: u64,
    /// Layers transferred.
    pub layers: u32,
    /// Blocks per layer transferred.
    pub blocks: u32,
    /// Bytes per block.
    pub block_bytes: u64,
    /// Wire mode.
    pub mode: TransferMode,
    /// Destination block `i + dst_shift` receives source block `i` (so a mix-up of blocks shows).
    pub dst_shift: u32,
    /// Reverse the destination blocks (no contiguous runs: auto mode falls back to packetized).
    pub reverse_blocks: bool,
    /// Both links. Their queue is raised to hold at least one largest frame of the transfer (a NIC
    /// segments a frame; this simulator carries it whole).
    pub link: LinkConfig,
    /// Faults on both links.
    pub faults: FaultSpec,
    /// Extra rules appended to both links after those of `faults`.
    pub extra_rules: Vec<FaultRule>,
    /// A crash, if any.
    pub crash: Option<CrashPlan>,
    /// Background traffic on the data link, if any.
    pub cross_traffic: Option<CrossTraffic>,
    /// Engine template for both ends (`engine_id` and `rng_seed` are set by the scenario).
    pub engine: EngineConfig,
    /// Session deadline.
    pub deadline: Duration,
    /// Virtual time after which the run stops even if sessions are still alive (a hang).
    pub limit: Duration,
}

impl Default for ScenarioConfig {
    /// 4 layers x 8 blocks x 16 KiB, packetized with 4 KiB slices, a clean 100 Gb/s link, 1 s deadline.
    fn default() -> Self {
        let deadline = Duration::from_secs(1);
        Self {
            seed: 0,
            layers: 4,
            blocks: 8,
            block_bytes: 16 << 10,
            mode: TransferMode::Packetized { slice_bytes: 4096 },
            dst_shift: 3,
            reverse_blocks: false,
            link: LinkConfig::default(),
            faults: FaultSpec::default(),
            extra_rules: Vec::new(),
            crash: None,
            cross_traffic: None,
            engine: Self::engine_defaults(deadline),
            deadline,
            limit: deadline * 4,
        }
    }
}

impl ScenarioConfig {
    /// The engine settings scenarios use: data-centre retransmit timing (1 ms floor, 100 ms cap), 8 retries,
    /// the default engine-wide budget.
    #[must_use]
    pub fn engine_defaults(deadline: Duration) -> EngineConfig {
        EngineConfig {
            backoff: Backoff {
                base: Duration::from_millis(1),
                max: Duration::from_millis(100),
                jitter: 0.25,
            },
            max_retries: 8,
            deadline,
            retransmit_budget: RetransmitBudget::default(),
            ..EngineConfig::default()
        }
    }

    /// Sets the deadline, and the run limit to four times it.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self.engine.deadline = deadline;
        self.limit = deadline * 4;
        self
    }

    /// Total payload bytes of the transfer.
    #[must_use]
    pub fn payload_bytes(&self) -> u64 {
        u64::from(self.layers) * u64::from(self.blocks) * self.block_bytes
    }

    /// The largest frame the transfer can put on the wire.
    #[must_use]
    pub fn largest_frame(&self) -> u64 {
        let unit = match self.mode {
            TransferMode::Exclusive => self.block_bytes,
            TransferMode::Packetized { slice_bytes } => {
                self.block_bytes.min(u64::from(slice_bytes))
            }
            TransferMode::Auto { slice_bytes, .. } => {
                let per_unit = (AUTO_MAX_UNIT_BYTES / self.block_bytes).max(1);
                let run = u64::from(self.blocks).min(per_unit) * self.block_bytes;
                run.max(self.block_bytes.min(u64::from(slice_bytes)))
            }
        };
        unit + HEADER_LEN as u64
    }
}

/// What a scenario run measured. Block counts are from the consumer's side.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    /// The seed (replays the run exactly).
    pub seed: u64,
    /// Wire mode.
    pub mode: String,
    /// Blocks in the transfer (layers x blocks).
    pub blocks_total: u64,
    /// Blocks the receiving engine delivered.
    pub blocks_delivered: u64,
    /// Blocks not delivered and reported for recompute by either engine (or lost with a crashed sender).
    pub blocks_recompute: u64,
    /// Blocks neither delivered nor reported (must be 0 when `finished`).
    pub blocks_unresolved: u64,
    /// Delivered blocks whose bytes differ from the source block's (must always be 0).
    pub corrupt_delivered: u64,
    /// Extra `BlockDelivered` events for a block already delivered (must be 0).
    pub duplicate_deliveries: u64,
    /// Blocks the sender reported for recompute although the receiver delivered them (its ack was lost):
    /// wasted work, never wrong data.
    pub recompute_but_delivered: u64,
    /// Blocks the receiving engine itself reported for recompute.
    pub receiver_recompute: u64,
    /// Blocks still undelivered when a crashed sender took its session with it (counted in recompute).
    pub lost_with_sender: u64,
    /// Data frames sent again.
    pub retransmits: u64,
    /// Payload bytes sent again.
    pub retransmit_bytes: u64,
    /// Payload bytes of the transfer.
    pub payload_bytes: u64,
    /// `retransmit_bytes / payload_bytes`.
    pub retransmit_overhead: f64,
    /// Data frames sent for the first time.
    pub first_sends: u64,
    /// Most retransmits the engine-wide budget allows for this many first sends over this much time
    /// (burst + ratio x sends + refill per second x seconds).
    pub retransmit_budget_limit: f64,
    /// Resends parked because the budget was spent (each refusal counts).
    pub budget_exhausted: u64,
    /// Data frames the receiver refused for a bad payload checksum.
    pub checksum_failures: u64,
    /// Frames either engine refused (corrupted headers, unknown sessions).
    pub frames_refused: u64,
    /// Frames lost to full queues.
    pub tail_drops: u64,
    /// Frames lost to fault rules.
    pub fault_drops: u64,
    /// Frames delivered corrupted.
    pub frames_corrupted: u64,
    /// Frames delivered twice.
    pub frames_duplicated: u64,
    /// Virtual time until every block was resolved (delivered or recompute), or until the run stopped.
    pub virtual_ms: f64,
    /// Delivered payload over `virtual_ms`, in GB/s (1e9 bytes per second, as everywhere in te-bench).
    pub goodput_gbps: f64,
    /// Every block delivered or reported for recompute no later than the session deadline.
    pub finished: bool,
    /// Every session on both engines ended (nothing hangs) before the run limit.
    pub idle: bool,
    /// How the run ended.
    pub end: RunEnd,
    /// Sessions alive on either engine when the run stopped.
    pub live_sessions: usize,
    /// Session deadline, in ms.
    pub deadline_ms: f64,
}

impl ScenarioReport {
    /// The invariants every run must keep, whatever the faults; the first broken one, described.
    pub fn check_invariants(&self) -> Result<(), String> {
        let seed = self.seed;
        let fail = |what: String| Err(format!("seed {seed}: {what}; report: {self:?}"));
        if self.corrupt_delivered != 0 {
            return fail(format!(
                "{} corrupt blocks delivered",
                self.corrupt_delivered
            ));
        }
        if self.duplicate_deliveries != 0 {
            return fail(format!(
                "{} blocks delivered twice",
                self.duplicate_deliveries
            ));
        }
        if self.blocks_delivered + self.blocks_recompute != self.blocks_total {
            return fail(format!(
                "delivered {} + recompute {} != total {}",
                self.blocks_delivered, self.blocks_recompute, self.blocks_total
            ));
        }
        if !self.finished {
            return fail("not every block was resolved by the deadline".into());
        }
        if !self.idle {
            return fail(format!(
                "sessions still alive at the run limit ({:?}, {} live)",
                self.end, self.live_sessions
            ));
        }
        Ok(())
    }
}

/// A configured scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    cfg: ScenarioConfig,
}

/// What the observer tracks during a run.
struct Tracker {
    seed: u64,
    layout_src: KvLayout,
    layout_dst: KvLayout,
    receiver: NodeId,
    /// The consumer's region (the same id in every incarnation).
    dst_region: RegionId,
    /// Destination block -> source block index, per layer alike.
    dst_to_src: BTreeMap<u32, u32>,
    src_to_dst: BTreeMap<u32, u32>,
    delivered: BTreeMap<BlockId, Duration>,
    recompute: BTreeMap<BlockId, Duration>,
    sender_recompute: BTreeSet<BlockId>,
    receiver_recompute: BTreeSet<BlockId>,
    corrupt: u64,
    duplicates: u64,
}

impl Tracker {
    fn on_event(&mut self, at: Duration, node: NodeId, event: &Event, host: &Node) {
        match event {
            Event::BlockDelivered { block, .. } if node == self.receiver => {
                if self.delivered.insert(*block, at).is_some() {
                    self.duplicates += 1;
                }
                if !self.block_intact(*block, host) {
                    self.corrupt += 1;
                }
            }
            Event::Recompute { role, blocks, .. } => {
                for b in blocks {
                    let dst = match role {
                        Role::Receiver => {
                            self.receiver_recompute.insert(*b);
                            *b
                        }
                        Role::Sender => {
                            let Some(&d) = self.src_to_dst.get(&b.block) else {
                                continue;
                            };
                            let dst = BlockId::new(b.layer, d);
                            self.sender_recompute.insert(dst);
                            dst
                        }
                    };
                    self.recompute.entry(dst).or_insert(at);
                }
            }
            _ => {}
        }
    }

    /// Whether destination block `block` on `host` holds exactly the source block's bytes.
    fn block_intact(&self, block: BlockId, host: &Node) -> bool {
        let Some(&src) = self.dst_to_src.get(&block.block) else {
            return false;
        };
        let off = self.layout_dst.block_offset(block) as usize;
        let len = self.layout_dst.block_bytes as usize;
        let Ok(got) = host
            .memory(self.dst_region)
            .and_then(|m| m.read(off..off + len))
        else {
            return false;
        };
        let mut want = vec![0; len];
        fill_block(
            self.seed,
            &self.layout_src,
            BlockId::new(block.layer, src),
            &mut want,
        );
        *got == *want.as_slice()
    }
}

/// The bytes of source block `block`: a pattern unique to (seed, layer, block).
pub fn fill_block(seed: u64, layout: &KvLayout, block: BlockId, out: &mut [u8]) {
    let mut x = crate::mix(seed, layout.block_offset(block)) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

impl Scenario {
    /// A scenario.
    #[must_use]
    pub fn new(cfg: ScenarioConfig) -> Self {
        Self { cfg }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &ScenarioConfig {
        &self.cfg
    }

    /// Runs the transfer in virtual time starting at `epoch` (any instant: only durations since it
    /// matter) and reports.
    pub fn run(&self, epoch: Instant) -> Result<ScenarioReport, SimError> {
        let cfg = &self.cfg;
        let mut sim = Sim::new(epoch, cfg.seed);
        let mut engine = cfg.engine.clone();
        engine.deadline = cfg.deadline;
        let a = sim.add_node(EngineConfig {
            engine_id: 1,
            rng_seed: crate::mix(cfg.seed, 1),
            ..engine.clone()
        });
        let b = sim.add_node(EngineConfig {
            engine_id: 2,
            rng_seed: crate::mix(cfg.seed, 2),
            ..engine
        });
        let link = LinkConfig {
            queue_bytes: cfg.link.queue_bytes.max(cfg.largest_frame()),
            ..cfg.link
        };
        sim.connect(a, b, link);
        let mut rules = cfg.faults.rules();
        rules.extend(cfg.extra_rules.iter().cloned());
        for rule in rules {
            sim.add_fault_both(a, b, rule);
        }
        if let Some((start, end)) = cfg.faults.partition {
            sim.schedule_partition(a, b, start, end);
        }
        if let Some(traffic) = cfg.cross_traffic {
            sim.add_cross_traffic(a, b, traffic);
        }

        let src_layout = KvLayout::new(cfg.layers, cfg.blocks, cfg.block_bytes, 16, Dtype::F16)?;
        let dst_layout = KvLayout::new(
            cfg.layers,
            cfg.blocks + cfg.dst_shift,
            cfg.block_bytes,
            16,
            Dtype::F16,
        )?;
        let src = sim.node_mut(a).register_kv_region(src_layout)?;
        let dst = sim.node_mut(b).register_kv_region(dst_layout)?;
        {
            let memory = sim.node(a).memory(src.id)?.clone();
            let mut mem = memory.write(0..memory.len())?;
            for layer in 0..cfg.layers {
                for block in 0..cfg.blocks {
                    let id = BlockId::new(layer, block);
                    let off = src_layout.block_offset(id) as usize;
                    let out = &mut mem[off..off + cfg.block_bytes as usize];
                    fill_block(cfg.seed, &src_layout, id, out);
                }
            }
        }
        let src_blocks: Vec<u32> = (0..cfg.blocks).collect();
        let dst_blocks: Vec<u32> = if cfg.reverse_blocks {
            (0..cfg.blocks).rev().map(|i| i + cfg.dst_shift).collect()
        } else {
            (0..cfg.blocks).map(|i| i + cfg.dst_shift).collect()
        };
        // Built from `whole` so fields added to requests later keep their defaults here.
        let request = TransferRequest {
            layers: 0..cfg.layers,
            src_blocks: src_blocks.clone(),
            dst_blocks: dst_blocks.clone(),
            mode: Some(cfg.mode),
            deadline: Some(cfg.deadline),
            ..TransferRequest::whole(b.peer(), &src, &dst)?
        };
        let now = sim.instant();
        sim.node_mut(a).engine_mut().submit(now, request)?;

        if let Some(crash) = cfg.crash {
            let node = match crash.side {
                Side::Sender => a,
                Side::Receiver => b,
            };
            sim.schedule_crash(node, crash.at);
            if let Some(at) = crash.restart_at {
                sim.schedule_restart(node, at);
            }
        }

        let mut tracker = Tracker {
            seed: cfg.seed,
            layout_src: src_layout,
            layout_dst: dst_layout,
            receiver: b,
            dst_region: dst.id,
            dst_to_src: dst_blocks
                .iter()
                .copied()
                .zip(src_blocks.iter().copied())
                .collect(),
            src_to_dst: src_blocks
                .iter()
                .copied()
                .zip(dst_blocks.iter().copied())
                .collect(),
            delivered: BTreeMap::new(),
            recompute: BTreeMap::new(),
            sender_recompute: BTreeSet::new(),
            receiver_recompute: BTreeSet::new(),
            corrupt: 0,
            duplicates: 0,
        };
        let end = sim.run(cfg.limit, &mut |at, node, event: &Event, host: &Node| {
            tracker.on_event(at, node, event, host);
        });
        Ok(self.report(&sim, a, b, end, &mut tracker))
    }

    fn report(
        &self,
        sim: &Sim,
        a: NodeId,
        b: NodeId,
        end: RunEnd,
        tracker: &mut Tracker,
    ) -> ScenarioReport {
        let cfg = &self.cfg;
        // A crashed sender that never came back took its session (and its recompute report) with it:
        // the orchestrator learns of the crash and recomputes whatever had not arrived.
        let mut lost_with_sender = 0;
        if let Some(crash) = cfg.crash.filter(|c| c.side == Side::Sender) {
            for layer in 0..cfg.layers {
                for &d in tracker.src_to_dst.values() {
                    let block = BlockId::new(layer, d);
                    if !tracker.delivered.contains_key(&block) {
                        let at = tracker.recompute.entry(block).or_insert(crash.at);
                        *at = (*at).min(crash.at);
                        lost_with_sender += 1;
                    }
                }
            }
        }
        // Delivered blocks must still hold the right bytes at the end (a late frame must never overwrite).
        let host = sim.node(b);
        let late_corrupt = tracker
            .delivered
            .keys()
            .filter(|blk| !tracker.block_intact(**blk, host))
            .count() as u64;
        let blocks_total = u64::from(cfg.layers) * u64::from(cfg.blocks);
        let delivered = tracker.delivered.len() as u64;
        let recompute_only: Vec<Duration> = tracker
            .recompute
            .iter()
            .filter(|(blk, _)| !tracker.delivered.contains_key(blk))
            .map(|(_, t)| *t)
            .collect();
        let blocks_recompute = recompute_only.len() as u64;
        let resolved = delivered + blocks_recompute;
        let last = tracker
            .delivered
            .values()
            .chain(recompute_only.iter())
            .max()
            .copied()
            .unwrap_or(Duration::ZERO);
        let finished = resolved == blocks_total && last <= cfg.deadline;
        let elapsed = if resolved == blocks_total {
            last
        } else {
            sim.now()
        };
        let sender = sim.node(a).stats();
        let receiver = sim.node(b).stats();
        let links = sim.link_stats();
        let sum = |f: fn(&crate::LinkStats) -> u64| links.values().map(f).sum::<u64>();
        let payload_bytes = cfg.payload_bytes();
        let first_sends = sender.slices_sent - sender.retransmits;
        let budget = cfg.engine.retransmit_budget;
        let delivered_bytes = delivered * cfg.block_bytes;
        let secs = elapsed.as_secs_f64();
        ScenarioReport {
            seed: cfg.seed,
            mode: cfg.mode.name().to_string(),
            blocks_total,
            blocks_delivered: delivered,
            blocks_recompute,
            blocks_unresolved: blocks_total - resolved,
            corrupt_delivered: tracker.corrupt.max(late_corrupt),
            duplicate_deliveries: tracker.duplicates,
            recompute_but_delivered: tracker
                .sender_recompute
                .iter()
                .filter(|blk| tracker.delivered.contains_key(blk))
                .count() as u64,
            receiver_recompute: tracker.receiver_recompute.len() as u64,
            lost_with_sender,
            retransmits: sender.retransmits,
            retransmit_bytes: sender.retransmit_bytes,
            payload_bytes,
            retransmit_overhead: sender.retransmit_bytes as f64 / payload_bytes as f64,
            first_sends,
            retransmit_budget_limit: budget.burst
                + budget.ratio * first_sends as f64
                + budget.per_second * secs,
            budget_exhausted: sender.budget_exhausted,
            checksum_failures: receiver.checksum_failures,
            frames_refused: sim.node(a).refused() + sim.node(b).refused(),
            tail_drops: sum(|s| s.tail_drops),
            fault_drops: sum(|s| s.fault_drops),
            frames_corrupted: sum(|s| s.corrupted),
            frames_duplicated: sum(|s| s.duplicated),
            virtual_ms: secs * 1e3,
            goodput_gbps: if secs > 0.0 {
                delivered_bytes as f64 / secs / 1e9
            } else {
                0.0
            },
            finished,
            idle: end == RunEnd::Idle,
            end,
            live_sessions: sim.nodes().iter().map(|n| n.engine().live_sessions()).sum(),
            deadline_ms: cfg.deadline.as_secs_f64() * 1e3,
        }
    }
}
