//! Every metric registered once, under its stable name: what [`Metrics::default`] builds.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{
    ByteLabels, CLASSES, DiskCounters, IndexCounters, LATENCY_BUCKETS, Labels, Metrics, TIERS,
};

/// Registers a labelled family and returns it with the counters or gauges of each label value, created
/// now so the hot path never looks one up.
fn family_of<M, const N: usize>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    label: &'static str,
    values: [&'static str; N],
) -> [M; N]
where
    M: prometheus_client::metrics::TypedMetric
        + prometheus_client::encoding::EncodeMetric
        + Clone
        + Default
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let family = Family::<Labels, M>::default();
    registry.register(name, help, family.clone());
    values.map(|v| family.get_or_create_owned(&[(label, v)]))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::default();
        let counter = |r: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            r.register(name, help, c.clone());
            c
        };
        let hit_rate = Gauge::<f64, AtomicU64>::default();
        r.register(
            "kv_cache_hit_rate",
            "Blocks found loadable over blocks looked up",
            hit_rate.clone(),
        );
        let lookup_blocks = counter(
            &mut r,
            "kv_lookup_blocks",
            "Blocks looked up by the scheduler side",
        );
        let lookup_hits = counter(
            &mut r,
            "kv_lookup_hit_blocks",
            "Blocks looked up that were loadable",
        );
        let bytes_family = Family::<ByteLabels, Counter>::default();
        r.register(
            "kv_transfer_bytes",
            "KV bytes loaded (in) or served (out), by traffic class",
            bytes_family.clone(),
        );
        let bytes = ["in", "out"].map(|dir| {
            CLASSES.map(|(class, _)| {
                bytes_family.get_or_create_owned(&[("direction", dir), ("class", class)])
            })
        });
        let local_tier_bytes = counter(
            &mut r,
            "kv_local_tier_bytes",
            "KV bytes copied from this instance's own tier store into its KV caches",
        );
        let retransmits = counter(
            &mut r,
            "kv_retransmits",
            "Data frames the transfer engine sent again",
        );
        let recompute_blocks = counter(
            &mut r,
            "kv_recompute_blocks",
            "Blocks a load could not deliver intact; the engine recomputes them",
        );
        let saved_blocks = counter(
            &mut r,
            "kv_saved_blocks",
            "Blocks saved whole (every layer) into the local tier store",
        );
        let save_dropped = counter(
            &mut r,
            "kv_save_dropped_blocks",
            "Blocks a save could not store (no free slot, or evicted while being saved)",
        );
        let stale_lookups = counter(
            &mut r,
            "kv_stale_lookups",
            "Lookups that named a namespace other than the producer's current one",
        );
        let streamed_loads = counter(
            &mut r,
            "kv_streamed_loads",
            "Loads served while some of their layers were still being saved (streamed as saved)",
        );
        let abandoned_blocks = counter(
            &mut r,
            "kv_abandoned_blocks",
            "Blocks whose save ended before their last layer; never served",
        );
        let same_host_loads = counter(
            &mut r,
            "kv_same_host_loads",
            "Loads served over the same-host transport (shared memory) rather than the main one",
        );
        let same_host_fallbacks = counter(
            &mut r,
            "kv_same_host_fallbacks",
            "Loads whose consumer named this host but was not reachable there; served over the main transport",
        );
        let latency = Histogram::new(LATENCY_BUCKETS);
        r.register(
            "kv_transfer_latency_seconds",
            "Time from starting a load to its last layer arriving",
            latency.clone(),
        );
        let tier_blocks = family_of(
            &mut r,
            "kv_tier_blocks",
            "Blocks resident in the local tier store",
            "tier",
            TIERS,
        );
        let tier_capacity = family_of(
            &mut r,
            "kv_tier_capacity_blocks",
            "Blocks the local tier store can hold",
            "tier",
            TIERS,
        );
        let held_blocks = Gauge::default();
        r.register(
            "kv_held_blocks",
            "Blocks held in the store for a decode that has not loaded them yet",
            held_blocks.clone(),
        );
        let hold_expired = counter(
            &mut r,
            "kv_hold_expired_blocks",
            "Holds that ran out before a decode loaded their block (no decode came in time)",
        );
        let disk = DiskCounters {
            demoted: counter(
                &mut r,
                "kv_disk_demoted_blocks",
                "Blocks moved from host memory to the disk tier",
            ),
            demote_dropped: counter(
                &mut r,
                "kv_disk_demote_dropped_blocks",
                "Host victims admitted to disk that it could not take (write-back queue full, no slot)",
            ),
            promoted: counter(
                &mut r,
                "kv_disk_promoted_blocks",
                "Disk blocks read back into host memory for a use",
            ),
            promote_failed: counter(
                &mut r,
                "kv_disk_promote_failed_blocks",
                "Disk blocks that could not be read back (damaged, an I/O error); recomputed",
            ),
            corrupt: counter(
                &mut r,
                "kv_disk_corrupt_blocks",
                "Disk records that failed their check on read; never served",
            ),
            write_failures: counter(
                &mut r,
                "kv_disk_write_failures",
                "Disk writes that failed (a full disk included)",
            ),
        };
        let index = IndexCounters {
            lookups: counter(
                &mut r,
                "kv_index_lookups",
                "Cluster-index lookups answered (scheduler side)",
            ),
            lookup_failures: counter(
                &mut r,
                "kv_index_lookup_failures",
                "Cluster-index lookups that failed or timed out; the peers were asked instead",
            ),
            stale_entries: counter(
                &mut r,
                "kv_index_stale_entries",
                "Index entries lookups skipped: their instance's lease lapsed, or an old epoch",
            ),
            published: counter(
                &mut r,
                "kv_index_published",
                "Block events this instance published to the cluster index",
            ),
            dropped: counter(
                &mut r,
                "kv_index_publish_dropped",
                "Block events dropped (queue full, Redis failing); a re-sync repairs what they said",
            ),
            renew_failures: counter(
                &mut r,
                "kv_index_lease_renewal_failures",
                "Lease renewals that failed; past the lease the index stops naming this instance",
            ),
            resyncs: counter(
                &mut r,
                "kv_index_resyncs",
                "Full re-syncs of this instance's holdings into the cluster index",
            ),
        };
        let kv_events_dropped = counter(
            &mut r,
            "kv_events_dropped",
            "KV events for the serving engine's event stream dropped, not taken in time",
        );
        Self {
            registry: r,
            hit_rate,
            lookup_blocks,
            lookup_hits,
            bytes,
            retransmits,
            local_tier_bytes,
            recompute_blocks,
            saved_blocks,
            save_dropped,
            stale_lookups,
            streamed_loads,
            abandoned_blocks,
            same_host_loads,
            same_host_fallbacks,
            latency,
            latency_count: AtomicU64::new(0),
            latency_sum_us: AtomicU64::new(0),
            tier_blocks,
            tier_capacity,
            held_blocks,
            hold_expired,
            disk,
            index,
            kv_events_dropped,
        }
    }
}
