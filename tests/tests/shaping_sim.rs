//! Traffic shaping in the simulated fabric: a collective keeps its latency beside KV under strict priority
//! and the KV cap (and FIFO shows the harm), bulk KV still progresses under constant collective load, the
//! cap holds on the wire, and layer-wise streaming overlaps transfer with compute.

use std::time::{Duration, Instant};

use fabric_sim::{
    CollectiveFlow, ContentionConfig, ContentionReport, LinkConfig, OverlapConfig, QueueDiscipline,
    Sharing,
};
use tests::seed;

/// 128 MiB of KV (4 layers x 128 blocks x 256 KiB) beside the decode all-reduce, on the default 200 Gb/s
/// link.
fn contention(seed: u64) -> ContentionConfig {
    let mut cfg = ContentionConfig::default();
    cfg.seed = seed;
    cfg.layers = 4;
    cfg.collective = CollectiveFlow::all_reduce(40);
    cfg
}

fn run(cfg: &ContentionConfig, sharing: Sharing) -> ContentionReport {
    let r = cfg
        .run(sharing, Instant::now())
        .unwrap_or_else(|e| panic!("FABRIC_SEED={}: {e}", cfg.seed));
    eprintln!("FABRIC_SEED={} {r:?}", cfg.seed);
    r
}

#[test]
fn collectives_keep_their_latency_beside_kv_under_priority_and_cap_and_fifo_shows_the_harm() {
    let cfg = contention(seed(41));
    let s = cfg.seed;
    let alone = run(&cfg, Sharing::Alone);
    let priority = run(&cfg, Sharing::Priority);
    let fifo = run(&cfg, Sharing::Fifo);
    assert!(alone.collective_ops >= 40, "seed {s}: {alone:?}");
    assert!(
        priority.collective_ops >= 10 && fifo.collective_ops >= 5,
        "seed {s}: too few operations measured: {priority:?} {fifo:?}"
    );
    let inflation = priority.collective_p99_us / alone.collective_p99_us;
    assert!(
        inflation <= 1.10,
        "seed {s}: p99 {:.1} us beside capped KV vs {:.1} alone ({inflation:.3}x)",
        priority.collective_p99_us,
        alone.collective_p99_us
    );
    assert!(
        fifo.collective_p99_us >= 3.0 * alone.collective_p99_us,
        "seed {s}: a FIFO queue full of KV should delay the collective: {fifo:?} vs {alone:?}"
    );
    assert!(priority.kv_intact && fifo.kv_intact, "seed {s}");
    // Uncapped KV in FIFO takes nearly the whole link; capped KV its share.
    assert!(fifo.kv_link_share > 0.9, "seed {s}: {fifo:?}");
}

#[test]
fn the_kv_cap_holds_on_the_wire_after_its_burst() {
    let cfg = contention(seed(42));
    let s = cfg.seed;
    let burst = transfer_engine::ShapingConfig::default().burst_bytes;
    let cap = cfg.kv_share * cfg.link.bandwidth as f64;
    // The first burst goes at line rate, the rest at the cap.
    let expected = (cfg.kv_bytes() - burst) as f64 / cap;
    for sharing in [Sharing::Priority, Sharing::FifoCapped] {
        let r = run(&cfg, sharing);
        let secs = r.kv_ms / 1e3;
        assert!(
            (secs - expected).abs() / expected < 0.03,
            "seed {s} {sharing:?}: KV took {secs:.5} s, the cap allows {expected:.5} s: {r:?}"
        );
        assert!(r.kv_intact, "seed {s}: {r:?}");
    }
    let uncapped = run(&cfg, Sharing::PriorityUncapped);
    assert!(uncapped.kv_link_share > 0.9, "seed {s}: {uncapped:?}");
}

#[test]
fn bulk_kv_still_progresses_under_constant_collective_load() {
    let starvation = Duration::from_micros(200);
    let mut cfg = ContentionConfig::default();
    cfg.seed = seed(43);
    // 4 MiB of KV in 64 slices of 64 KiB.
    cfg.layers = 1;
    cfg.blocks = 16;
    // A collective offering 33 GB/s to a 25 GB/s link: it alone would keep the link busy for ever.
    cfg.collective = CollectiveFlow {
        op_bytes: 1 << 20,
        period: Duration::from_micros(32),
        ..CollectiveFlow::all_reduce(0)
    };
    // Four KV frames queued at a time, so none waits near the engine's 1 ms retransmit floor.
    cfg.link = {
        let mut cfg = LinkConfig::default();
        cfg.bandwidth = 25_000_000_000;
        cfg.queue_bytes = 256 << 10;
        cfg
    };
    cfg.priority = QueueDiscipline::Priority {
        mtu: 4096,
        max_starvation: starvation,
    };
    let s = cfg.seed;
    let r = run(&cfg, Sharing::PriorityUncapped);
    assert!(
        r.kv_intact,
        "seed {s}: bulk KV starved or arrived damaged: {r:?}"
    );
    // One 64 KiB frame (2.6 us) per starvation limit, plus the open, the close and slack.
    let frames = cfg.kv_bytes() / (64 << 10);
    let allowed = (frames + 3) as f64 * (starvation.as_secs_f64() + 3e-6) * 1.1;
    assert!(
        r.kv_ms / 1e3 <= allowed,
        "seed {s}: {} ms for {frames} frames, anti-starvation allows {:.2} ms: {r:?}",
        r.kv_ms,
        allowed * 1e3
    );
    // The collective kept nearly the whole link meanwhile.
    assert!(r.kv_link_share < 0.05, "seed {s}: {r:?}");
}

/// 8 layers of 4 MiB (168 us each at 25 GB/s) and 170 us of compute a layer: transfer and compute balanced,
/// the case that needs the pipeline most.
fn overlap(seed: u64, depth: u32) -> OverlapConfig {
    let mut cfg = OverlapConfig::default();
    cfg.seed = seed;
    cfg.layers = 8;
    cfg.layer_bytes = 4 << 20;
    cfg.layer_compute = Duration::from_micros(170);
    cfg.prefetch_depth = depth;
    cfg
}

#[test]
fn streaming_two_layers_ahead_overlaps_transfer_with_compute() {
    let base = overlap(seed(44), 2);
    let s = base.seed;
    let (transfer, intact) = base
        .transfer_time(Instant::now())
        .unwrap_or_else(|e| panic!("FABRIC_SEED={s}: {e}"));
    assert!(intact, "seed {s}");
    let report = |depth| {
        let r = overlap(s, depth)
            .report(transfer, intact, Instant::now())
            .unwrap_or_else(|e| panic!("FABRIC_SEED={s}: {e}"));
        eprintln!("FABRIC_SEED={s} {r:?}");
        assert!(r.intact, "seed {s}: {r:?}");
        r
    };
    let deep = report(2);
    assert!(deep.ratio <= 1.10, "seed {s}: {deep:?}");
    assert!(
        deep.pipelined_ms < deep.serial_ms * 0.6,
        "seed {s}: {deep:?}"
    );
    // Depth 0 sends a layer only once the consumer asks for it: transfer and compute alternate.
    let none = report(0);
    assert!(none.ratio > 1.5, "seed {s}: {none:?}");
    assert!(none.stall_ms > deep.stall_ms, "seed {s}: {none:?} {deep:?}");
}
