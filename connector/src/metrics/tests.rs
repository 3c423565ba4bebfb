//! The metrics text, read back by a Prometheus parser against the table in the module docs.
use prometheus_parse::{Scrape, Value};

use super::*;

/// The names and types the module docs' table promises, as (name, type).
fn documented() -> Vec<(String, String)> {
    include_str!("mod.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//! | `kv_"))
        .map(|row| {
            let mut cells = row.split('|').map(str::trim);
            let name = cells.next().unwrap().trim_end_matches('`');
            let name = name.split('{').next().unwrap();
            (format!("kv_{name}"), cells.next().unwrap().to_owned())
        })
        .collect()
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Counter(_) => "counter",
        Value::Gauge(_) => "gauge",
        Value::Histogram(_) => "histogram",
        Value::Summary(_) => "summary",
        Value::Untyped(_) => "untyped",
    }
}

/// The one sample of `name` with `labels` (all of them), as a plain value.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    match &found[0].value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        other => panic!("{name} is {other:?}"),
    }
}

#[test]
fn a_parser_reads_every_documented_metric_with_its_type_and_value() {
    let m = Metrics::default();
    m.lookup(4, 3);
    m.bytes(Direction::In, TrafficClass::UrgentKv, 100);
    m.latency(Duration::from_millis(3));
    m.recompute(2);
    m.same_host_load();
    m.set_host_capacity(64);
    m.set_store(StoreFigures {
        host_blocks: 5,
        held_blocks: 1,
        hold_expired: 7,
    });
    m.set_retransmits(9);
    m.set_retransmits(4);
    // The index client's counters: the scheduler's lookups and the worker's publishing, each setting
    // only its own (they share one set of metrics in one process).
    let mut lookups = cluster::IndexCounts::default();
    (lookups.lookups, lookups.lookup_failures, lookups.published) = (11, 2, 99);
    let mut publishing = cluster::IndexCounts::default();
    (publishing.published, publishing.dropped, publishing.lookups) = (40, 3, 99);
    m.set_index_lookups(&lookups);
    m.set_index_publishing(&publishing);
    m.set_kv_events_dropped(5);
    let text = m.prometheus();
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses");

    let documented = documented();
    assert_eq!(documented.len(), 33, "the table in the module docs");
    for (name, ty) in &documented {
        let samples: Vec<_> = scrape
            .samples
            .iter()
            .filter(|s| &s.metric == name)
            .collect();
        assert!(!samples.is_empty(), "{name} missing in\n{text}");
        for s in samples {
            assert_eq!(kind(&s.value), ty, "{name}");
        }
        assert!(scrape.docs.contains_key(name), "{name} has no HELP");
    }
    // The parser reads a histogram's `_sum` and `_count` as samples of their own.
    for s in &scrape.samples {
        let base = ["_sum", "_count"]
            .iter()
            .find_map(|suffix| s.metric.strip_suffix(suffix))
            .unwrap_or(&s.metric);
        assert!(
            documented
                .iter()
                .any(|(name, _)| name == &s.metric || name == base),
            "{} is not in the table of the module docs",
            s.metric
        );
    }

    assert_eq!(value(&scrape, "kv_cache_hit_rate", &[]), 0.75);
    let bytes = |dir, class| {
        value(
            &scrape,
            "kv_transfer_bytes_total",
            &[("direction", dir), ("class", class)],
        )
    };
    assert_eq!(bytes("in", "urgent"), 100.0);
    assert_eq!(bytes("out", "bulk"), 0.0);
    assert_eq!(value(&scrape, "kv_recompute_blocks_total", &[]), 2.0);
    assert_eq!(value(&scrape, "kv_retransmits_total", &[]), 9.0);
    assert_eq!(value(&scrape, "kv_same_host_loads_total", &[]), 1.0);
    assert_eq!(value(&scrape, "kv_tier_blocks", &[("tier", "host")]), 5.0);
    assert_eq!(value(&scrape, "kv_tier_blocks", &[("tier", "disk")]), 0.0);
    assert_eq!(
        value(&scrape, "kv_tier_capacity_blocks", &[("tier", "host")]),
        64.0
    );
    assert_eq!(value(&scrape, "kv_held_blocks", &[]), 1.0);
    assert_eq!(value(&scrape, "kv_hold_expired_blocks_total", &[]), 7.0);
    assert_eq!(value(&scrape, "kv_index_lookups_total", &[]), 11.0);
    assert_eq!(value(&scrape, "kv_index_lookup_failures_total", &[]), 2.0);
    assert_eq!(value(&scrape, "kv_index_published_total", &[]), 40.0);
    assert_eq!(value(&scrape, "kv_index_publish_dropped_total", &[]), 3.0);
    assert_eq!(value(&scrape, "kv_events_dropped_total", &[]), 5.0);
    let latency = scrape
        .samples
        .iter()
        .find(|s| s.metric == "kv_transfer_latency_seconds")
        .unwrap();
    let Value::Histogram(buckets) = &latency.value else {
        panic!("{latency:?}");
    };
    let at = |le: f64| buckets.iter().find(|b| b.less_than == le).unwrap().count;
    assert_eq!((at(0.002), at(0.005), at(f64::INFINITY)), (0.0, 1.0, 1.0));
    // What the connector's tests and users grep for stays as it was.
    for line in [
        "kv_transfer_latency_seconds_bucket{le=\"0.005\"} 1",
        "kv_transfer_latency_seconds_count 1",
        "kv_same_host_fallbacks_total 0",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}
