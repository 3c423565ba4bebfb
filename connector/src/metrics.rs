//! Metrics with stable names, rendered as Prometheus text.
//!
//! Written by hand rather than through a metrics crate: the set is small and fixed, the counters are plain
//! atomics updated on the hot path, and the text format for counters, gauges and one histogram is a few
//! lines. Names never change between releases (dashboards depend on them):
//!
//! | name | type | what |
//! | --- | --- | --- |
//! | `kv_cache_hit_rate` | gauge | blocks found loadable / blocks looked up |
//! | `kv_lookup_blocks_total` | counter | blocks looked up (scheduler side) |
//! | `kv_lookup_hit_blocks_total` | counter | of which loadable |
//! | `kv_transfer_bytes_total{direction,class}` | counter | KV bytes loaded (`in`) or served (`out`) |
//! | `kv_local_tier_bytes_total` | counter | KV bytes copied from this instance's own tier store |
//! | `kv_retransmits_total` | counter | data frames sent again by the engine |
//! | `kv_recompute_blocks_total` | counter | blocks a load could not deliver (recomputed) |
//! | `kv_saved_blocks_total` | counter | blocks saved whole into the local tier store |
//! | `kv_save_dropped_blocks_total` | counter | blocks a save could not store (no free slot, or evicted while being saved) |
//! | `kv_stale_lookups_total` | counter | lookups for a namespace other than the current one |
//! | `kv_streamed_loads_total` | counter | loads served while some of their layers were still being saved |
//! | `kv_abandoned_blocks_total` | counter | blocks whose save ended before their last layer (never served) |
//! | `kv_same_host_loads_total` | counter | loads a producer served over its same-host transport |
//! | `kv_same_host_fallbacks_total` | counter | loads whose consumer named this host but was not reachable there (main transport instead) |
//! | `kv_transfer_latency_seconds` | histogram | a load, from start to its last layer |
//! | `kv_tier_blocks{tier}` | gauge | blocks resident in the local tier store (`host`, `disk`) |
//! | `kv_tier_capacity_blocks{tier}` | gauge | the store's capacity (`host`, `disk`) |
//! | `kv_held_blocks` | gauge | blocks held in the store for a decode that has not loaded them yet |
//! | `kv_hold_expired_blocks_total` | counter | holds that ran out before a decode loaded the block |
//! | `kv_disk_demoted_blocks_total` | counter | blocks moved from host memory to the disk tier |
//! | `kv_disk_demote_dropped_blocks_total` | counter | host victims admitted to disk that it could not take (queue full, no slot) |
//! | `kv_disk_promoted_blocks_total` | counter | disk blocks read back into host memory for a use |
//! | `kv_disk_promote_failed_blocks_total` | counter | disk blocks that could not be read back (recomputed) |
//! | `kv_disk_corrupt_blocks_total` | counter | disk records that failed their check (never served) |
//! | `kv_disk_write_failures_total` | counter | disk writes that failed (a full disk included) |

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use transfer_engine::TrafficClass;

/// Upper bounds of the latency histogram's buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0,
];

/// Which way KV bytes moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Loaded into this instance.
    In,
    /// Served to another instance.
    Out,
}

/// The connector's counters (all atomics: any thread may update them).
#[derive(Debug, Default)]
pub struct Metrics {
    lookup_blocks: AtomicU64,
    lookup_hits: AtomicU64,
    bytes: [[AtomicU64; 3]; 2],
    pub(crate) retransmits: AtomicU64,
    local_tier_bytes: AtomicU64,
    recompute_blocks: AtomicU64,
    saved_blocks: AtomicU64,
    save_dropped: AtomicU64,
    stale_lookups: AtomicU64,
    streamed_loads: AtomicU64,
    abandoned_blocks: AtomicU64,
    same_host_loads: AtomicU64,
    same_host_fallbacks: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
    pub(crate) tier_blocks: AtomicU64,
    pub(crate) tier_capacity: AtomicU64,
    pub(crate) held_blocks: AtomicU64,
    pub(crate) hold_expired: AtomicU64,
    pub(crate) disk: DiskGauges,
}

/// The disk tier's figures, copied from the store when metrics are read.
#[derive(Debug, Default)]
pub(crate) struct DiskGauges {
    blocks: AtomicU64,
    capacity: AtomicU64,
    demoted: AtomicU64,
    demote_dropped: AtomicU64,
    promoted: AtomicU64,
    promote_failed: AtomicU64,
    corrupt: AtomicU64,
    write_failures: AtomicU64,
}

impl DiskGauges {
    /// Takes the store's disk figures.
    pub(crate) fn set(&self, s: &crate::store::DiskTierStats) {
        let put = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        put(&self.blocks, s.disk.blocks as u64);
        put(&self.capacity, u64::from(s.capacity_blocks));
        put(&self.demoted, s.demoted);
        put(&self.demote_dropped, s.demote_dropped);
        put(&self.promoted, s.promoted);
        put(&self.promote_failed, s.promote_failed);
        put(&self.corrupt, s.disk.corrupt);
        put(&self.write_failures, s.disk.write_errors + s.disk.disk_full);
    }
}

/// A snapshot of [`Metrics`], for programs that read figures rather than text.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Blocks looked up.
    pub lookup_blocks: u64,
    /// Blocks found loadable.
    pub lookup_hits: u64,
    /// Bytes loaded.
    pub bytes_in: u64,
    /// Bytes served.
    pub bytes_out: u64,
    /// Retransmitted frames.
    pub retransmits: u64,
    /// Blocks handed back for recompute.
    pub recompute_blocks: u64,
    /// Blocks saved whole.
    pub saved_blocks: u64,
    /// Blocks a save could not store.
    pub save_dropped: u64,
    /// Loads timed.
    pub loads: u64,
    /// Their total time, in microseconds.
    pub latency_sum_us: u64,
    /// Bytes copied from this instance's own tier store.
    pub local_tier_bytes: u64,
    /// Loads served while some of their layers were still being saved.
    pub streamed_loads: u64,
    /// Blocks whose save ended before their last layer.
    pub abandoned_blocks: u64,
    /// Blocks resident in the store.
    pub tier_blocks: u64,
    /// Blocks held in the store for a decode that has not loaded them yet.
    pub held_blocks: u64,
    /// Holds that ran out before a decode loaded their block.
    pub hold_expired_blocks: u64,
    /// Loads this producer served over its same-host transport.
    pub same_host_loads: u64,
    /// Loads whose consumer named this host but could not be reached there (served over the main
    /// transport instead).
    pub same_host_fallbacks: u64,
}

impl MetricsSnapshot {
    /// Hits over lookups (0 when nothing was looked up).
    #[must_use]
    pub fn hit_rate(&self) -> f64 {
        if self.lookup_blocks == 0 {
            0.0
        } else {
            self.lookup_hits as f64 / self.lookup_blocks as f64
        }
    }
}

const CLASSES: [(&str, TrafficClass); 3] = [
    ("collective", TrafficClass::Collective),
    ("urgent", TrafficClass::UrgentKv),
    ("bulk", TrafficClass::BulkKv),
];

impl Metrics {
    pub(crate) fn lookup(&self, asked: usize, hits: usize) {
        self.lookup_blocks
            .fetch_add(asked as u64, Ordering::Relaxed);
        self.lookup_hits.fetch_add(hits as u64, Ordering::Relaxed);
    }

    pub(crate) fn bytes(&self, dir: Direction, class: TrafficClass, n: u64) {
        self.bytes[dir as usize][class.index()].fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn local_tier_bytes(&self, n: u64) {
        self.local_tier_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn recompute(&self, blocks: usize) {
        self.recompute_blocks
            .fetch_add(blocks as u64, Ordering::Relaxed);
    }

    pub(crate) fn saved(&self, blocks: usize) {
        self.saved_blocks
            .fetch_add(blocks as u64, Ordering::Relaxed);
    }

    pub(crate) fn save_dropped(&self, blocks: usize) {
        self.save_dropped
            .fetch_add(blocks as u64, Ordering::Relaxed);
    }

    pub(crate) fn stale_lookup(&self) {
        self.stale_lookups.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn streamed_load(&self) {
        self.streamed_loads.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn same_host_load(&self) {
        self.same_host_loads.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn same_host_fallback(&self) {
        self.same_host_fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn abandoned(&self, blocks: usize) {
        self.abandoned_blocks
            .fetch_add(blocks as u64, Ordering::Relaxed);
    }

    pub(crate) fn latency(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            if s <= *le {
                self.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// A snapshot of the counters.
    #[must_use]
    pub fn snapshot(&self) -> MetricsSnapshot {
        let sum = |d: usize| {
            self.bytes[d]
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .sum()
        };
        MetricsSnapshot {
            lookup_blocks: self.lookup_blocks.load(Ordering::Relaxed),
            lookup_hits: self.lookup_hits.load(Ordering::Relaxed),
            bytes_in: sum(0),
            bytes_out: sum(1),
            retransmits: self.retransmits.load(Ordering::Relaxed),
            recompute_blocks: self.recompute_blocks.load(Ordering::Relaxed),
            saved_blocks: self.saved_blocks.load(Ordering::Relaxed),
            save_dropped: self.save_dropped.load(Ordering::Relaxed),
            loads: self.latency_count.load(Ordering::Relaxed),
            latency_sum_us: self.latency_sum_us.load(Ordering::Relaxed),
            local_tier_bytes: self.local_tier_bytes.load(Ordering::Relaxed),
            streamed_loads: self.streamed_loads.load(Ordering::Relaxed),
            abandoned_blocks: self.abandoned_blocks.load(Ordering::Relaxed),
            tier_blocks: self.tier_blocks.load(Ordering::Relaxed),
            held_blocks: self.held_blocks.load(Ordering::Relaxed),
            hold_expired_blocks: self.hold_expired.load(Ordering::Relaxed),
            same_host_loads: self.same_host_loads.load(Ordering::Relaxed),
            same_host_fallbacks: self.same_host_fallbacks.load(Ordering::Relaxed),
        }
    }

    /// Every metric in Prometheus text exposition format (version 0.0.4).
    #[must_use]
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let snap = self.snapshot();
        let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, String)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in lines {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let one = |v: String| vec![(String::new(), v)];
        metric(
            "kv_cache_hit_rate",
            "gauge",
            "Blocks found loadable over blocks looked up.",
            &one(format!("{}", snap.hit_rate())),
        );
        metric(
            "kv_lookup_blocks_total",
            "counter",
            "Blocks looked up by the scheduler side.",
            &one(snap.lookup_blocks.to_string()),
        );
        metric(
            "kv_lookup_hit_blocks_total",
            "counter",
            "Blocks looked up that were loadable.",
            &one(snap.lookup_hits.to_string()),
        );
        let mut bytes = Vec::new();
        for (d, dir) in ["in", "out"].iter().enumerate() {
            for (name, class) in CLASSES {
                bytes.push((
                    format!("{{direction=\"{dir}\",class=\"{name}\"}}"),
                    load(&self.bytes[d][class.index()]).to_string(),
                ));
            }
        }
        metric(
            "kv_transfer_bytes_total",
            "counter",
            "KV bytes loaded (in) or served (out), by traffic class.",
            &bytes,
        );
        metric(
            "kv_local_tier_bytes_total",
            "counter",
            "KV bytes copied from this instance's own tier store into its KV caches.",
            &one(load(&self.local_tier_bytes).to_string()),
        );
        metric(
            "kv_retransmits_total",
            "counter",
            "Data frames the transfer engine sent again.",
            &one(snap.retransmits.to_string()),
        );
        metric(
            "kv_recompute_blocks_total",
            "counter",
            "Blocks a load could not deliver intact; the engine recomputes them.",
            &one(snap.recompute_blocks.to_string()),
        );
        metric(
            "kv_saved_blocks_total",
            "counter",
            "Blocks saved whole (every layer) into the local tier store.",
            &one(snap.saved_blocks.to_string()),
        );
        metric(
            "kv_save_dropped_blocks_total",
            "counter",
            "Blocks a save could not store (no free slot, or evicted while being saved).",
            &one(snap.save_dropped.to_string()),
        );
        metric(
            "kv_stale_lookups_total",
            "counter",
            "Lookups that named a namespace other than the producer's current one.",
            &one(load(&self.stale_lookups).to_string()),
        );
        metric(
            "kv_streamed_loads_total",
            "counter",
            "Loads served while some of their layers were still being saved (streamed as saved).",
            &one(snap.streamed_loads.to_string()),
        );
        metric(
            "kv_abandoned_blocks_total",
            "counter",
            "Blocks whose save ended before their last layer; never served.",
            &one(snap.abandoned_blocks.to_string()),
        );
        metric(
            "kv_same_host_loads_total",
            "counter",
            "Loads served over the same-host transport (shared memory) rather than the main one.",
            &one(snap.same_host_loads.to_string()),
        );
        metric(
            "kv_same_host_fallbacks_total",
            "counter",
            "Loads whose consumer named this host but was not reachable there; served over the main transport.",
            &one(snap.same_host_fallbacks.to_string()),
        );
        let mut hist: Vec<(String, String)> = LATENCY_BUCKETS
            .iter()
            .zip(&self.latency_buckets)
            .map(|(le, n)| (format!("_bucket{{le=\"{le}\"}}"), load(n).to_string()))
            .collect();
        hist.push((
            "_bucket{le=\"+Inf\"}".into(),
            load(&self.latency_count).to_string(),
        ));
        hist.push((
            "_sum".into(),
            format!("{}", load(&self.latency_sum_us) as f64 / 1e6),
        ));
        hist.push(("_count".into(), load(&self.latency_count).to_string()));
        metric(
            "kv_transfer_latency_seconds",
            "histogram",
            "Time from starting a load to its last layer arriving.",
            &hist,
        );
        let d = &self.disk;
        metric(
            "kv_tier_blocks",
            "gauge",
            "Blocks resident in the local tier store.",
            &[
                ("{tier=\"host\"}".into(), snap.tier_blocks.to_string()),
                ("{tier=\"disk\"}".into(), load(&d.blocks).to_string()),
            ],
        );
        metric(
            "kv_tier_capacity_blocks",
            "gauge",
            "Blocks the local tier store can hold.",
            &[
                (
                    "{tier=\"host\"}".into(),
                    load(&self.tier_capacity).to_string(),
                ),
                ("{tier=\"disk\"}".into(), load(&d.capacity).to_string()),
            ],
        );
        metric(
            "kv_held_blocks",
            "gauge",
            "Blocks held in the store for a decode that has not loaded them yet.",
            &one(snap.held_blocks.to_string()),
        );
        metric(
            "kv_hold_expired_blocks_total",
            "counter",
            "Holds that ran out before a decode loaded their block (no decode came in time).",
            &one(snap.hold_expired_blocks.to_string()),
        );
        for (name, help, value) in [
            (
                "kv_disk_demoted_blocks_total",
                "Blocks moved from host memory to the disk tier.",
                &d.demoted,
            ),
            (
                "kv_disk_demote_dropped_blocks_total",
                "Host victims admitted to disk that it could not take (write-back queue full, no slot).",
                &d.demote_dropped,
            ),
            (
                "kv_disk_promoted_blocks_total",
                "Disk blocks read back into host memory for a use.",
                &d.promoted,
            ),
            (
                "kv_disk_promote_failed_blocks_total",
                "Disk blocks that could not be read back (damaged, an I/O error); recomputed.",
                &d.promote_failed,
            ),
            (
                "kv_disk_corrupt_blocks_total",
                "Disk records that failed their check on read; never served.",
                &d.corrupt,
            ),
            (
                "kv_disk_write_failures_total",
                "Disk writes that failed (a full disk included).",
                &d.write_failures,
            ),
        ] {
            metric(name, "counter", help, &one(load(value).to_string()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_has_every_stable_name_and_counts() {
        let m = Metrics::default();
        m.lookup(4, 3);
        m.bytes(Direction::In, TrafficClass::UrgentKv, 100);
        m.latency(Duration::from_millis(3));
        m.recompute(2);
        m.same_host_load();
        let text = m.prometheus();
        for name in [
            "kv_cache_hit_rate 0.75",
            "kv_transfer_bytes_total{direction=\"in\",class=\"urgent\"} 100",
            "kv_transfer_bytes_total{direction=\"out\",class=\"bulk\"} 0",
            "kv_retransmits_total 0",
            "kv_recompute_blocks_total 2",
            "kv_transfer_latency_seconds_bucket{le=\"0.002\"} 0",
            "kv_transfer_latency_seconds_bucket{le=\"0.005\"} 1",
            "kv_transfer_latency_seconds_count 1",
            "kv_tier_blocks{tier=\"host\"} 0",
            "kv_same_host_loads_total 1",
            "kv_same_host_fallbacks_total 0",
            "kv_tier_blocks{tier=\"disk\"} 0",
            "kv_disk_demoted_blocks_total 0",
            "kv_disk_corrupt_blocks_total 0",
            "kv_held_blocks 0",
            "kv_hold_expired_blocks_total 0",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
