//! Replay of the Mooncake traces in `data/traces/` against the reference points in its README.

use cache_research::{PolicyKind, replay};
use policy::Trace;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/traces/");

fn load(file: &str) -> Trace {
    let path = format!("{DATA}{file}");
    Trace::load(&path).unwrap_or_else(|e| {
        panic!(
            "{e}\nthe replay tests need the shared traces: clone or copy `shared/` next to the repository \
             so that {path} exists"
        )
    })
}

fn three_decimals(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[test]
fn conversation_trace_matches_the_reference_points_at_5_percent() {
    let trace = load("conversation_trace_first6000.jsonl");
    assert_eq!(trace.requests().len(), 6000);
    assert_eq!(trace.distinct_blocks(), 99_716);
    let cap = 4_985;
    let lru = replay(&trace, cap, PolicyKind::Lru);
    let belady = replay(&trace, cap, PolicyKind::Belady);
    let infinite = replay(&trace, trace.distinct_blocks(), PolicyKind::Lru);
    assert_eq!(three_decimals(lru.hit_ratio), 0.111, "{lru:?}");
    assert_eq!(three_decimals(belady.hit_ratio), 0.326, "{belady:?}");
    assert_eq!(three_decimals(infinite.hit_ratio), 0.346, "{infinite:?}");
    assert_eq!(lru.blocks, trace.total_blocks());
    assert_eq!((lru.requests, lru.capacity_blocks), (6000, cap));

    let heat = replay(&trace, cap, PolicyKind::Heat);
    assert!(
        heat.hit_ratio > lru.hit_ratio,
        "heat {} must beat LRU {}",
        heat.hit_ratio,
        lru.hit_ratio
    );
    assert!(
        heat.hit_ratio <= belady.hit_ratio + 0.005,
        "heat {} above Belady",
        heat.hit_ratio
    );
}

#[test]
fn synthetic_trace_orders_the_policies() {
    let trace = load("synthetic_trace.jsonl");
    assert_eq!(trace.requests().len(), 3_993);
    let cap = trace.distinct_blocks() / 20;
    let [lru, heat, cont, belady] = [
        PolicyKind::Lru,
        PolicyKind::Heat,
        PolicyKind::Continuation,
        PolicyKind::Belady,
    ]
    .map(|k| replay(&trace, cap, k).hit_ratio);
    assert!(
        lru < heat && heat < belady && lru < cont && cont < belady,
        "lru {lru}, heat {heat}, continuation {cont}, belady {belady}"
    );
}

#[test]
fn continuation_beats_every_baseline_on_the_conversation_trace_at_5_percent() {
    let trace = load("conversation_trace_first6000.jsonl");
    let cap = 4_985;
    let cont = replay(&trace, cap, PolicyKind::Continuation).hit_ratio;
    assert!(cont >= 0.1735, "continuation {cont} below the 0.174 goal");
    for k in [
        PolicyKind::Lru,
        PolicyKind::S3Fifo,
        PolicyKind::Lirs,
        PolicyKind::Arc,
        PolicyKind::WTinyLfu,
        PolicyKind::Heat,
    ] {
        let r = replay(&trace, cap, k).hit_ratio;
        assert!(cont > r, "continuation {cont} vs {k} {r}");
    }
}

/// The tier manager's nearest-tier order is the continuation policy itself, hosted: on real conversations
/// (the first rows of the conversation trace) both keep exactly the same blocks, so give the same hits.
#[test]
fn continuation_hosted_by_the_tier_manager_gives_the_same_hits_as_standalone() {
    let full = load("conversation_trace_first6000.jsonl");
    for rows in [300, 1500] {
        let part = Trace::from_requests("first rows", full.requests()[..rows].to_vec());
        for cap in [0, 3, 17, 60, 400] {
            let alone = replay(&part, cap, PolicyKind::Continuation).hit_blocks;
            let hosted = replay(&part, cap, PolicyKind::TierContinuation).hit_blocks;
            assert_eq!(alone, hosted, "first {rows} rows, capacity {cap}");
            assert!(cap < 400 || alone > 0, "no hits at all at capacity {cap}");
        }
    }
}
