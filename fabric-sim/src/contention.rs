//! Contention: a periodic collective and a bulk KV transfer share one link. Measures the collective's
//! latency alone, beside KV under strict priority with the engine's KV cap, and beside KV in one FIFO.

use std::time::{Duration, Instant};

use serde::Serialize;
use transfer_engine::{ShapingConfig, TransferMode};

use crate::SimError;
use crate::collective::{CollectiveFlow, quantile};
use crate::link::LinkConfig;
use crate::pair::{Consumer, Pair, Want};
use crate::qdisc::QueueDiscipline;

/// How KV and the collective share the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharing {
    /// The collective alone: the baseline.
    Alone,
    /// Strict priority at the link (collective first) and the engine's KV cap: the design.
    Priority,
    /// One FIFO queue, KV not capped: what happens without shaping.
    Fifo,
    /// Strict priority, KV not capped (priority alone).
    PriorityUncapped,
    /// One FIFO queue with the engine's KV cap (the cap alone).
    FifoCapped,
}

impl Sharing {
    /// Every way, the design first after the baseline.
    pub const ALL: [Sharing; 5] = [
        Sharing::Alone,
        Sharing::Priority,
        Sharing::Fifo,
        Sharing::PriorityUncapped,
        Sharing::FifoCapped,
    ];

    /// Short name: `alone`, `priority`, `fifo`, `priority_uncapped`, `fifo_capped`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Sharing::Alone => "alone",
            Sharing::Priority => "priority",
            Sharing::Fifo => "fifo",
            Sharing::PriorityUncapped => "priority_uncapped",
            Sharing::FifoCapped => "fifo_capped",
        }
    }

    fn capped(self) -> bool {
        matches!(self, Sharing::Priority | Sharing::FifoCapped)
    }

    fn priority(self) -> bool {
        matches!(self, Sharing::Priority | Sharing::PriorityUncapped)
    }
}

/// A contention run's settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ContentionConfig {
    /// Seed of every generator (engines' access keys and jitter).
    pub seed: u64,
    /// The link, both ways (KV and the collective one way, acknowledgements back).
    pub link: LinkConfig,
    /// The collective. Its `ops` count holds for [`Sharing::Alone`]; beside KV it runs until the KV
    /// transfer completes, and the operations issued before that are measured.
    pub collective: CollectiveFlow,
    /// KV layers.
    pub layers: u32,
    /// KV blocks per layer.
    pub blocks: u32,
    /// Bytes per KV block.
    pub block_bytes: u64,
    /// KV wire mode.
    pub mode: TransferMode,
    /// The engine's KV cap as a share of the link, when capped.
    pub kv_share: f64,
    /// The link's discipline when it is strict priority (a [`QueueDiscipline::Priority`]).
    pub priority: QueueDiscipline,
}

impl Default for ContentionConfig {
    /// A 200 Gb/s link (25 GB/s, 5 us one way, 4 MiB queue per class); the decode all-reduce of
    /// [`CollectiveFlow::all_reduce`] (256 KiB every 500 us) for 200 ops alone; 1 GiB of KV (32 layers x
    /// 128 blocks x 256 KiB) packetized in 64 KiB slices; KV capped at 40% of the link; priority with 4 KiB
    /// segments and a 5 ms starvation limit.
    fn default() -> Self {
        Self {
            seed: 1,
            link: LinkConfig {
                bandwidth: 25_000_000_000,
                ..LinkConfig::default()
            },
            collective: CollectiveFlow::all_reduce(200),
            layers: 32,
            blocks: 128,
            block_bytes: 256 << 10,
            mode: TransferMode::packetized(),
            kv_share: 0.4,
            priority: QueueDiscipline::priority(),
        }
    }
}

/// What one contention run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ContentionReport {
    /// How the link was shared (`alone`, `priority`, `fifo`, ...).
    pub sharing: &'static str,
    /// Collective operations measured.
    pub collective_ops: usize,
    /// Median collective latency, microseconds (issue to last byte at the peer).
    pub collective_p50_us: f64,
    /// 99th percentile collective latency, microseconds.
    pub collective_p99_us: f64,
    /// Worst collective latency, microseconds.
    pub collective_max_us: f64,
    /// KV payload moved, bytes (0 alone).
    pub kv_bytes: u64,
    /// Virtual time until every KV block was delivered, milliseconds.
    pub kv_ms: f64,
    /// KV goodput, GB/s (1e9 bytes per second, as everywhere in te-bench).
    pub kv_gbps: f64,
    /// KV goodput as a share of the link.
    pub kv_link_share: f64,
    /// Every KV byte arrived as sent.
    pub kv_intact: bool,
}

impl ContentionConfig {
    /// KV payload bytes.
    #[must_use]
    pub fn kv_bytes(&self) -> u64 {
        u64::from(self.layers) * u64::from(self.blocks) * self.block_bytes
    }

    /// Runs the collective shared as `sharing` says, in virtual time from `epoch`.
    pub fn run(&self, sharing: Sharing, epoch: Instant) -> Result<ContentionReport, SimError> {
        let deadline = Duration::from_secs(30);
        let layout = (self.layers, self.blocks, self.block_bytes);
        let mut pair = Pair::new(epoch, self.seed, self.link, layout, deadline)?;
        let (a, b) = (pair.a, pair.b);
        if sharing.priority() {
            pair.sim.set_discipline(a, b, self.priority);
        }
        let mut flow = self.collective;
        if sharing != Sharing::Alone {
            flow.ops = u64::MAX;
        }
        let id = pair.sim.add_collective(a, b, flow);
        let limit = deadline * 2;
        let (window_end, kv_done) = if sharing == Sharing::Alone {
            pair.sim.run(limit, &mut |_, _, _: &_, _: &_| {});
            (Duration::MAX, None)
        } else {
            if sharing.capped() {
                let mut shaping = ShapingConfig::default();
                shaping.link_bytes_per_sec = Some(self.link.bandwidth);
                shaping.kv_share = self.kv_share;
                pair.sim.node_mut(a).engine_mut().set_shaping(shaping)?;
            }
            pair.submit(self.mode, None)?;
            let mut consumer = Consumer::new(b);
            consumer.want = Want::Completed;
            let end = pair.sim.run_until(limit, &mut consumer);
            let done = consumer.completed.filter(|_| end.is_none());
            // Let the operations issued before the end finish.
            let settle = pair.sim.now() + self.collective.period * 4 + Duration::from_millis(1);
            pair.sim.run(settle, &mut consumer);
            (done.unwrap_or(pair.sim.now()), done)
        };
        let latencies = pair
            .sim
            .collective(id)
            .latencies(Duration::ZERO..window_end);
        let us = |q: f64| quantile(&latencies, q).map_or(f64::NAN, |d| d.as_secs_f64() * 1e6);
        let (kv_bytes, kv_secs) = match kv_done {
            Some(t) => (self.kv_bytes(), t.as_secs_f64()),
            None => (0, 0.0),
        };
        let rate = if kv_secs > 0.0 {
            kv_bytes as f64 / kv_secs
        } else {
            0.0
        };
        Ok(ContentionReport {
            sharing: sharing.name(),
            collective_ops: latencies.len(),
            collective_p50_us: us(0.5),
            collective_p99_us: us(0.99),
            collective_max_us: us(1.0),
            kv_bytes,
            kv_ms: kv_secs * 1e3,
            kv_gbps: rate / 1e9,
            kv_link_share: rate / self.link.bandwidth as f64,
            kv_intact: sharing == Sharing::Alone || (kv_done.is_some() && pair.intact()),
        })
    }
}
