//! A ready-made KV transfer through the simulated fabric, and its report.
//!
//! A producer pushes `layers x blocks` KV blocks of `block_bytes` to a consumer, through links with the
//! faults of a [`FaultSpec`]. The report counts blocks from the consumer's side: a block is delivered when
//! the receiving engine says so (and its bytes are then compared with the source's, so
//! `corrupt_delivered` is measured, not assumed), and reported for recompute when either engine says so.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use transfer_engine::{BlockId, Dtype, Event, KvLayout, RegionId, Role, TransferRequest};

use crate::SimError;
use crate::link::LinkConfig;
use crate::node::{Node, NodeId};
use crate::sim::{RunEnd, Sim};

mod config;
mod report;

pub use config::{BURST_SLOT, CrashPlan, FaultSpec, ScenarioConfig, Side};
pub use report::ScenarioReport;

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
        let a = sim.add_node({
            let mut config = engine.clone();
            config.engine_id = 1;
            config.rng_seed = crate::mix(cfg.seed, 1);
            config
        });
        let b = sim.add_node({
            let mut config = engine;
            config.engine_id = 2;
            config.rng_seed = crate::mix(cfg.seed, 2);
            config
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
