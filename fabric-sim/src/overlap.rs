//! Overlap: a consumer computes layer after layer while their KV streams in over the fabric.
//!
//! The consumer calls [`transfer_engine::Engine::consume_layer`] when it is ready to start layer `L`; if
//! the layer has not fully arrived it waits for its `LayerComplete`, then computes for `layer_compute`
//! (virtual time), then goes on to `L + 1`. The sender keeps `prefetch_depth` layers beyond the consumer's
//! in flight. Compared with the serial schedule (transfer everything, then compute) and with the bound
//! `max(transfer, compute) + one layer of the smaller`.

use std::time::{Duration, Instant};

use serde::Serialize;
use transfer_engine::TransferMode;

use crate::SimError;
use crate::link::LinkConfig;
use crate::pair::{Consumer, Pair, Want};

/// An overlap run's settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OverlapConfig {
    /// Seed of every generator.
    pub seed: u64,
    /// Layers computed (and transferred).
    pub layers: u32,
    /// KV bytes per layer (a whole number of blocks).
    pub layer_bytes: u64,
    /// Bytes per KV block.
    pub block_bytes: u64,
    /// Consumer compute per layer.
    pub layer_compute: Duration,
    /// Layers the sender keeps in flight beyond the one the consumer is computing.
    pub prefetch_depth: u32,
    /// The link, both ways.
    pub link: LinkConfig,
    /// KV wire mode.
    pub mode: TransferMode,
}

impl Default for OverlapConfig {
    /// 32 layers of 16 MiB (a 7B model's KV for 1,024 tokens: 0.5 MiB a token over 32 layers) in 256 KiB
    /// blocks, packetized in 64 KiB slices, 700 us of compute a layer, prefetch depth 2, over a 200 Gb/s
    /// link (25 GB/s: 671 us a layer), 5 us one way, 4 MiB queue.
    fn default() -> Self {
        Self {
            seed: 1,
            layers: 32,
            layer_bytes: 16 << 20,
            block_bytes: 256 << 10,
            layer_compute: Duration::from_micros(700),
            prefetch_depth: 2,
            link: LinkConfig {
                bandwidth: 25_000_000_000,
                ..LinkConfig::default()
            },
            mode: TransferMode::packetized(),
        }
    }
}

/// What an overlap run measured (times in milliseconds of virtual time from the submit).
#[derive(Debug, Clone, Serialize)]
pub struct OverlapReport {
    /// Layers.
    pub layers: u32,
    /// Prefetch depth.
    pub prefetch_depth: u32,
    /// KV bytes per layer.
    pub layer_bytes: u64,
    /// Compute per layer, microseconds.
    pub layer_compute_us: f64,
    /// Every layer transferred with no consumer holding it back.
    pub transfer_ms: f64,
    /// Every layer computed back to back.
    pub compute_ms: f64,
    /// Transfer all, then compute all.
    pub serial_ms: f64,
    /// The consumer's last layer done, streaming at `prefetch_depth`.
    pub pipelined_ms: f64,
    /// `max(transfer, compute) + one layer of the smaller`.
    pub bound_ms: f64,
    /// `pipelined_ms / bound_ms` (1.0 is perfect overlap).
    pub ratio: f64,
    /// `pipelined_ms / serial_ms`.
    pub vs_serial: f64,
    /// Time the consumer spent blocked on layers that had not arrived.
    pub stall_ms: f64,
    /// Every byte arrived as sent (both runs).
    pub intact: bool,
}

/// What one layer-streaming run measured, before it is set against its bound.
#[derive(Debug, Clone, Copy)]
pub struct OverlapRun {
    /// Layers.
    pub layers: u32,
    /// Prefetch depth.
    pub prefetch_depth: u32,
    /// KV bytes per layer.
    pub layer_bytes: u64,
    /// Compute per layer, as configured.
    pub layer_compute: Duration,
    /// Every layer transferred with no consumer holding it back.
    pub transfer: Duration,
    /// Every layer's compute, in all.
    pub compute: Duration,
    /// The consumer's last layer done, streaming at `prefetch_depth`.
    pub pipelined: Duration,
    /// Time the consumer spent blocked on layers that had not arrived.
    pub stall: Duration,
    /// Every byte arrived as sent.
    pub intact: bool,
}

impl From<OverlapRun> for OverlapReport {
    /// Sets a run against serial execution and against the bound
    /// `max(transfer, compute) + one layer of the smaller`.
    fn from(r: OverlapRun) -> Self {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let layers = r.layers.max(1);
        let serial = r.transfer + r.compute;
        let bound = r.transfer.max(r.compute) + (r.transfer / layers).min(r.compute / layers);
        OverlapReport {
            layers: r.layers,
            prefetch_depth: r.prefetch_depth,
            layer_bytes: r.layer_bytes,
            layer_compute_us: r.layer_compute.as_secs_f64() * 1e6,
            transfer_ms: ms(r.transfer),
            compute_ms: ms(r.compute),
            serial_ms: ms(serial),
            pipelined_ms: ms(r.pipelined),
            bound_ms: ms(bound),
            ratio: r.pipelined.as_secs_f64() / bound.as_secs_f64(),
            vs_serial: r.pipelined.as_secs_f64() / serial.as_secs_f64(),
            stall_ms: ms(r.stall),
            intact: r.intact,
        }
    }
}

impl OverlapConfig {
    fn layout(&self) -> Result<(u32, u32, u64), SimError> {
        let blocks = self.layer_bytes / self.block_bytes.max(1);
        if blocks == 0
            || blocks * self.block_bytes != self.layer_bytes
            || blocks > u64::from(u32::MAX)
        {
            return Err(SimError::InvalidConfig(format!(
                "a layer of {} bytes is not a whole number of {}-byte blocks",
                self.layer_bytes, self.block_bytes
            )));
        }
        Ok((self.layers, blocks as u32, self.block_bytes))
    }

    /// A deadline comfortably beyond the serial schedule.
    fn deadline(&self) -> Duration {
        let bytes = self.layer_bytes * u64::from(self.layers);
        let transfer = Duration::from_secs_f64(bytes as f64 / self.link.bandwidth.max(1) as f64);
        (transfer + self.layer_compute * self.layers) * 4 + Duration::from_secs(1)
    }

    /// Time to move every layer with nothing holding the sender back, and whether it arrived intact.
    pub fn transfer_time(&self, epoch: Instant) -> Result<(Duration, bool), SimError> {
        let deadline = self.deadline();
        let mut pair = Pair::new(epoch, self.seed, self.link, self.layout()?, deadline)?;
        pair.submit(self.mode, None)?;
        let mut consumer = Consumer::new(pair.b);
        pair.sim.run(deadline * 2, &mut consumer);
        let last = consumer.layers.values().max().copied();
        match last.filter(|_| consumer.layers.len() == self.layers as usize) {
            Some(t) => Ok((t, pair.intact())),
            None => Err(SimError::Incomplete("the transfer alone")),
        }
    }

    /// Streams at `prefetch_depth` while the consumer computes: the consumer's finish time, the time it
    /// spent blocked, and whether every byte arrived intact.
    pub fn pipelined(&self, epoch: Instant) -> Result<(Duration, Duration, bool), SimError> {
        let deadline = self.deadline();
        let limit = deadline * 2;
        let mut pair = Pair::new(epoch, self.seed, self.link, self.layout()?, deadline)?;
        pair.submit(self.mode, Some(self.prefetch_depth))?;
        let mut consumer = Consumer::new(pair.b);
        consumer.want = Want::Incoming;
        pair.sim.run_until(limit, &mut consumer);
        let session = consumer
            .session
            .ok_or(SimError::Incomplete("the session open"))?;
        // The consumer is ready for layer 0 at once.
        let mut t = Duration::ZERO;
        let mut stall = Duration::ZERO;
        for layer in 0..self.layers {
            if pair.sim.now() < t {
                consumer.want = Want::Nothing;
                pair.sim.run_until(t, &mut consumer);
            }
            let at = pair.sim.instant().max(epoch + t);
            let engine = pair.sim.node_mut(pair.b).engine_mut();
            // A session that has ended delivered everything: nothing to tell it.
            let complete = engine.consume_layer(at, session, layer).unwrap_or(true)
                || consumer.layers.contains_key(&layer);
            if !complete {
                consumer.want = Want::Layer(layer);
                if pair.sim.run_until(limit, &mut consumer).is_some() {
                    return Err(SimError::Incomplete("a layer's arrival"));
                }
                let arrived = consumer.layers[&layer];
                stall += arrived.saturating_sub(t);
                t = t.max(arrived);
            }
            t += self.layer_compute;
        }
        consumer.want = Want::Nothing;
        pair.sim.run(limit, &mut consumer);
        Ok((t, stall, pair.intact()))
    }

    /// Both runs, and the figures: serial, pipelined, bound, ratio.
    pub fn run(&self, epoch: Instant) -> Result<OverlapReport, SimError> {
        let (transfer, intact) = self.transfer_time(epoch)?;
        self.report(transfer, intact, epoch)
    }

    /// The figures, given the transfer time measured by [`OverlapConfig::transfer_time`] (the same for
    /// every depth).
    pub fn report(
        &self,
        transfer: Duration,
        transfer_intact: bool,
        epoch: Instant,
    ) -> Result<OverlapReport, SimError> {
        let (pipelined, stall, intact) = self.pipelined(epoch)?;
        Ok(OverlapRun {
            layers: self.layers,
            prefetch_depth: self.prefetch_depth,
            layer_bytes: self.layer_bytes,
            layer_compute: self.layer_compute,
            transfer,
            compute: self.layer_compute * self.layers,
            pipelined,
            stall,
            intact: intact && transfer_intact,
        }
        .into())
    }
}
