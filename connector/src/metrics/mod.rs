//! Metrics with stable names, rendered as Prometheus text (format 0.0.4) by `prometheus-client`.
//!
//! Each metric is a `prometheus-client` counter, gauge or histogram registered once; the hot path adds to
//! an atomic (labelled counters are looked up once, at start, not per update). Figures copied from the
//! tier store (its blocks, its disk tier's totals) are set when the text is made. Names never change
//! between releases (dashboards depend on them):
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
//! | `kv_index_lookups_total` | counter | cluster-index lookups answered (scheduler side) |
//! | `kv_index_lookup_failures_total` | counter | cluster-index lookups that failed or timed out (peers asked instead) |
//! | `kv_index_stale_entries_total` | counter | index entries lookups skipped: their instance's lease lapsed, or an old epoch |
//! | `kv_index_published_total` | counter | block events this instance published to the index |
//! | `kv_index_publish_dropped_total` | counter | block events dropped (queue full, Redis failing); a re-sync repairs them |
//! | `kv_index_lease_renewal_failures_total` | counter | lease renewals that failed (past the lease, the index stops naming this instance) |
//! | `kv_index_resyncs_total` | counter | full re-syncs of this instance's holdings into the index |
//! | `kv_events_dropped_total` | counter | KV events (for the engine's event stream) dropped, not taken in time |

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use transfer_engine::TrafficClass;

mod register;

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

/// One label (name, value), the label set of every labelled metric here.
type Labels = [(&'static str, &'static str); 1];
/// The label set of `kv_transfer_bytes_total`.
type ByteLabels = [(&'static str, &'static str); 2];

const CLASSES: [(&str, TrafficClass); 3] = [
    ("collective", TrafficClass::Collective),
    ("urgent", TrafficClass::UrgentKv),
    ("bulk", TrafficClass::BulkKv),
];

/// The connector's metrics (any thread may update them).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    hit_rate: Gauge<f64, AtomicU64>,
    lookup_blocks: Counter,
    lookup_hits: Counter,
    /// `kv_transfer_bytes_total`'s counters by direction and class, looked up once.
    bytes: [[Counter; 3]; 2],
    retransmits: Counter,
    local_tier_bytes: Counter,
    recompute_blocks: Counter,
    saved_blocks: Counter,
    save_dropped: Counter,
    stale_lookups: Counter,
    streamed_loads: Counter,
    abandoned_blocks: Counter,
    same_host_loads: Counter,
    same_host_fallbacks: Counter,
    latency: Histogram,
    /// Loads timed, and their total time in microseconds (for the snapshot).
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
    tier_blocks: [Gauge; 2],
    tier_capacity: [Gauge; 2],
    held_blocks: Gauge,
    hold_expired: Counter,
    disk: DiskCounters,
    index: IndexCounters,
    kv_events_dropped: Counter,
}

/// The cluster index client's totals, copied from its counters when metrics are read: the lookups from
/// the scheduler half's client, the publishing from the worker's.
#[derive(Debug, Default)]
struct IndexCounters {
    lookups: Counter,
    lookup_failures: Counter,
    stale_entries: Counter,
    published: Counter,
    dropped: Counter,
    renew_failures: Counter,
    resyncs: Counter,
}

/// The disk tier's totals, copied from the store when metrics are read.
#[derive(Debug, Default)]
struct DiskCounters {
    demoted: Counter,
    demote_dropped: Counter,
    promoted: Counter,
    promote_failed: Counter,
    corrupt: Counter,
    write_failures: Counter,
}

/// The tier store's figures, as the connector copies them in before metrics are read.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StoreFigures {
    /// Blocks resident in host memory.
    pub(crate) host_blocks: u64,
    /// Blocks held for a decode, and holds that ran out.
    pub(crate) held_blocks: u64,
    pub(crate) hold_expired: u64,
}

/// Host and disk, in the order of the `tier` label's values.
const TIERS: [&str; 2] = ["host", "disk"];

/// Sets a counter to a total kept elsewhere (the store's, the engine's): they only grow.
fn copy_total(counter: &Counter, total: u64) {
    counter.inner().store(total, Ordering::Relaxed);
}

/// A gauge's value as a count (gauges here are never negative).
fn count(gauge: &Gauge) -> u64 {
    u64::try_from(gauge.get()).unwrap_or(0)
}

/// A count as a gauge's value.
fn level(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
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
    /// Cluster-index lookups answered, and those that failed (the peers were asked instead).
    pub index_lookups: u64,
    /// See [`MetricsSnapshot::index_lookups`].
    pub index_lookup_failures: u64,
    /// Index entries lookups skipped as stale (their instance's lease lapsed, or an old epoch).
    pub index_stale_entries: u64,
    /// Block events published to the index, and those dropped (a re-sync repairs them).
    pub index_published: u64,
    /// See [`MetricsSnapshot::index_published`].
    pub index_publish_dropped: u64,
    /// Lease renewals that failed.
    pub index_renew_failures: u64,
    /// Full re-syncs into the index.
    pub index_resyncs: u64,
    /// KV events dropped because the engine did not take them in time.
    pub kv_events_dropped: u64,
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

impl Metrics {
    pub(crate) fn lookup(&self, asked: usize, hits: usize) {
        self.lookup_blocks.inc_by(asked as u64);
        self.lookup_hits.inc_by(hits as u64);
    }

    pub(crate) fn bytes(&self, dir: Direction, class: TrafficClass, n: u64) {
        self.bytes[dir as usize][class.index()].inc_by(n);
    }

    pub(crate) fn local_tier_bytes(&self, n: u64) {
        self.local_tier_bytes.inc_by(n);
    }

    pub(crate) fn recompute(&self, blocks: usize) {
        self.recompute_blocks.inc_by(blocks as u64);
    }

    pub(crate) fn saved(&self, blocks: usize) {
        self.saved_blocks.inc_by(blocks as u64);
    }

    pub(crate) fn save_dropped(&self, blocks: usize) {
        self.save_dropped.inc_by(blocks as u64);
    }

    pub(crate) fn stale_lookup(&self) {
        self.stale_lookups.inc();
    }

    pub(crate) fn streamed_load(&self) {
        self.streamed_loads.inc();
    }

    pub(crate) fn same_host_load(&self) {
        self.same_host_loads.inc();
    }

    pub(crate) fn same_host_fallback(&self) {
        self.same_host_fallbacks.inc();
    }

    pub(crate) fn abandoned(&self, blocks: usize) {
        self.abandoned_blocks.inc_by(blocks as u64);
    }

    pub(crate) fn latency(&self, d: Duration) {
        self.latency.observe(d.as_secs_f64());
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// The engine's retransmit total (the transport counts them; a smaller total read late is ignored).
    pub(crate) fn set_retransmits(&self, total: u64) {
        self.retransmits.inner().fetch_max(total, Ordering::Relaxed);
    }

    /// The store's host-tier capacity, set once.
    pub(crate) fn set_host_capacity(&self, blocks: u64) {
        self.tier_capacity[0].set(level(blocks));
    }

    /// The store's figures, copied in before the metrics are read.
    pub(crate) fn set_store(&self, f: StoreFigures) {
        self.tier_blocks[0].set(level(f.host_blocks));
        self.held_blocks.set(level(f.held_blocks));
        copy_total(&self.hold_expired, f.hold_expired);
    }

    /// The disk tier's figures, copied in before the metrics are read.
    pub(crate) fn set_disk(&self, s: &crate::store::DiskTierStats) {
        self.tier_blocks[1].set(level(s.disk.blocks as u64));
        self.tier_capacity[1].set(level(u64::from(s.capacity_blocks)));
        let d = &self.disk;
        copy_total(&d.demoted, s.demoted);
        copy_total(&d.demote_dropped, s.demote_dropped);
        copy_total(&d.promoted, s.promoted);
        copy_total(&d.promote_failed, s.promote_failed);
        copy_total(&d.corrupt, s.disk.corrupt);
        copy_total(&d.write_failures, s.disk.write_errors + s.disk.disk_full);
    }

    /// The scheduler half's index lookups, copied in before the metrics are read.
    pub(crate) fn set_index_lookups(&self, c: &cluster::IndexCounts) {
        copy_total(&self.index.lookups, c.lookups);
        copy_total(&self.index.lookup_failures, c.lookup_failures);
        copy_total(&self.index.stale_entries, c.stale_entries);
    }

    /// The worker's publishing to the index, copied in before the metrics are read.
    pub(crate) fn set_index_publishing(&self, c: &cluster::IndexCounts) {
        copy_total(&self.index.published, c.published);
        copy_total(&self.index.dropped, c.dropped);
        copy_total(&self.index.renew_failures, c.renew_failures);
        copy_total(&self.index.resyncs, c.resyncs);
    }

    /// The store's dropped KV events, copied in before the metrics are read.
    pub(crate) fn set_kv_events_dropped(&self, total: u64) {
        copy_total(&self.kv_events_dropped, total);
    }

    /// A snapshot of the counters.
    #[must_use]
    pub fn snapshot(&self) -> MetricsSnapshot {
        let sum = |d: usize| self.bytes[d].iter().map(Counter::get).sum();
        MetricsSnapshot {
            lookup_blocks: self.lookup_blocks.get(),
            lookup_hits: self.lookup_hits.get(),
            bytes_in: sum(0),
            bytes_out: sum(1),
            retransmits: self.retransmits.get(),
            recompute_blocks: self.recompute_blocks.get(),
            saved_blocks: self.saved_blocks.get(),
            save_dropped: self.save_dropped.get(),
            loads: self.latency_count.load(Ordering::Relaxed),
            latency_sum_us: self.latency_sum_us.load(Ordering::Relaxed),
            local_tier_bytes: self.local_tier_bytes.get(),
            streamed_loads: self.streamed_loads.get(),
            abandoned_blocks: self.abandoned_blocks.get(),
            tier_blocks: count(&self.tier_blocks[0]),
            held_blocks: count(&self.held_blocks),
            hold_expired_blocks: self.hold_expired.get(),
            same_host_loads: self.same_host_loads.get(),
            same_host_fallbacks: self.same_host_fallbacks.get(),
            index_lookups: self.index.lookups.get(),
            index_lookup_failures: self.index.lookup_failures.get(),
            index_stale_entries: self.index.stale_entries.get(),
            index_published: self.index.published.get(),
            index_publish_dropped: self.index.dropped.get(),
            index_renew_failures: self.index.renew_failures.get(),
            index_resyncs: self.index.resyncs.get(),
            kv_events_dropped: self.kv_events_dropped.get(),
        }
    }

    /// Every metric in Prometheus text exposition format (version 0.0.4).
    #[must_use]
    pub fn prometheus(&self) -> String {
        self.hit_rate.set(self.snapshot().hit_rate());
        let mut out = String::new();
        // Writing into a String cannot fail, and every metric here encodes.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests;
