//! A producer holds the blocks of a request a decode will load (vLLM's `do_remote_decode`) out of its
//! store's eviction order until the decode's load completes, or until `hold_timeout` passes.

mod common;

use std::time::{Duration, Instant};

use common::{Instance, Kv, begin_save_held, loopback_pair_with, plan_load, request};
use connector::RequestExtras;
use transfer_engine::MemoryRegion;

const KV: Kv = Kv {
    layers: 2,
    block: 4096,
    pool: 16,
};

/// Saves `tokens` from `blocks` through a whole producer step, held for a decode when `hold`.
fn save(p: &Instance, id: &str, tokens: &[u32], blocks: &[u32], hold: bool) {
    begin_save_held(p, id, tokens, blocks, hold);
    for layer in 0..KV.layers {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    p.request_finished(id);
}

/// Tokens the consumer could load for `tokens` now (a lookup only: the request is then dropped).
fn loadable(c: &Instance, id: &str, tokens: &[u32]) -> usize {
    let extras = RequestExtras::default();
    let (n, _) = c
        .get_num_new_matched_tokens(&request(id, tokens, &extras), 0)
        .unwrap();
    c.request_finished(id);
    n
}

fn pair(hold_timeout: Duration) -> (Instance, Instance, MemoryRegion, MemoryRegion) {
    let (p, c) = loopback_pair_with(&KV, 4, |cfg| cfg.hold_timeout = hold_timeout);
    let src = MemoryRegion::from_vec((0..KV.pool_bytes()).map(|i| (i / 4096) as u8).collect());
    let dst = MemoryRegion::zeroed(KV.pool_bytes());
    p.register_kv_caches(src.clone(), KV.pool).unwrap();
    c.register_kv_caches(dst.clone(), KV.pool).unwrap();
    (p, c, src, dst)
}

#[test]
fn a_decodes_blocks_outlive_other_traffic_until_it_loads_them() {
    let (p, c, src, dst) = pair(Duration::from_secs(600));
    let a: Vec<u32> = (0..16 * 4 + 1).collect();
    let b: Vec<u32> = (500..500 + 16 * 2 + 1).collect();
    save(&p, "a", &a, &[0, 1, 2, 3], true);
    assert_eq!(p.snapshot().held_blocks, 4);
    // The store is full of held blocks: another prompt's save is dropped rather than evict them.
    save(&p, "b", &b, &[4, 5], false);
    assert_eq!(loadable(&c, "b?", &b), 0);
    assert_eq!(p.snapshot().held_blocks, 4);

    assert_eq!(plan_load(&c, "a", &a, &[8, 9, 10, 11]), 64);
    c.start_load_kv().unwrap();
    c.wait_for_all_loads().unwrap();
    assert!(c.failed_blocks().is_empty());
    for layer in 0..KV.layers {
        for (i, b) in (8..12).enumerate() {
            assert_eq!(
                KV.block_bytes(&dst, layer, b),
                KV.block_bytes(&src, layer, i as u32),
                "layer {layer} block {b}"
            );
        }
    }
    // The load's end releases the holds (on the producer's runtime, just after the consumer has them).
    let start = Instant::now();
    while p.snapshot().held_blocks > 0 {
        assert!(
            start.elapsed() < common::HANG_GUARD,
            "the holds were never released"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    save(&p, "b2", &b, &[4, 5], false);
    assert_eq!(loadable(&c, "b?", &b), 32, "released, a's tail made room");
    assert_eq!(p.snapshot().hold_expired_blocks, 0);
}

#[test]
fn a_hold_runs_out_when_no_decode_comes() {
    let (p, c, _, _) = pair(Duration::from_millis(50));
    let a: Vec<u32> = (0..16 * 4 + 1).collect();
    let b: Vec<u32> = (500..500 + 16 * 2 + 1).collect();
    save(&p, "a", &a, &[0, 1, 2, 3], true);
    assert_eq!(p.snapshot().held_blocks, 4);
    // Sleeping past the deadline is the point here, not a bound on anything's speed.
    std::thread::sleep(Duration::from_millis(100));
    save(&p, "b", &b, &[4, 5], false);
    let s = p.snapshot();
    assert_eq!((s.held_blocks, s.hold_expired_blocks), (0, 4));
    assert!(p.prometheus().contains("kv_hold_expired_blocks_total 4"));
    assert_eq!(loadable(&c, "b?", &b), 32);
    assert!(loadable(&c, "a?", &a) < 64, "a's tail made room for b");
}
