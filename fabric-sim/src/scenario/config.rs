//! What a scenario runs: the transfer, the link, the faults on it and the crashes planned.

use std::time::Duration;

use serde::Serialize;
use transfer_engine::{
    AUTO_MAX_UNIT_BYTES, Backoff, EngineConfig, HEADER_LEN, RetransmitBudget, TransferMode,
};

use crate::fault::{CorruptTarget, FaultRule, GilbertElliott};
use crate::link::LinkConfig;
use crate::sim::CrossTraffic;

/// Idle time worth one step of a scenario's Gilbert-Elliott chain: about one 64 KiB frame at 100 Gb/s.
pub const BURST_SLOT: Duration = Duration::from_micros(5);

/// Faults applied to both directions of the link (data one way, acknowledgements the other), in the
/// order of the fields. Probabilities are per packet (per frame: a frame is one packet here).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
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
#[non_exhaustive]
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
        let mut cfg = EngineConfig::default();
        cfg.backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(100), 0.25);
        cfg.max_retries = 8;
        cfg.deadline = deadline;
        cfg.retransmit_budget = RetransmitBudget::default();
        cfg
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
