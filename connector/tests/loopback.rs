//! Producer and consumer connectors in one process over the loopback backend: the local tier store's
//! eviction between a lookup and the load hands back exactly the blocks that are gone.

mod common;

use common::{
    Instance, Kv, begin_save, loopback_pair, loopback_pair_with, plan_load, request, returns,
};
use connector::{BlockHash, ConnectorConfig, KvRequest, KvRole, RequestExtras, namespace};
use transfer_engine::MemoryRegion;

const KV: Kv = Kv {
    layers: 2,
    block: 4096,
    pool: 16,
};
const LAYERS: u32 = KV.layers;
const BLOCK: u64 = KV.block;
const POOL: u32 = KV.pool;

fn pair(store_blocks: u32) -> (Instance, Instance) {
    loopback_pair(&KV, store_blocks)
}

fn save(p: &Instance, id: &str, tokens: &[u32], blocks: &[u32]) {
    begin_save(p, id, tokens, blocks);
    for layer in 0..LAYERS {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
}

#[test]
fn blocks_evicted_after_the_lookup_are_recomputed_the_rest_load() {
    let (p, c) = pair(4);
    let bytes = KV.pool_bytes();
    let src = MemoryRegion::from_vec((0..bytes).map(|i| (i / 4096) as u8).collect());
    let dst = MemoryRegion::zeroed(bytes);
    p.register_kv_caches(src.clone(), POOL).unwrap();
    c.register_kv_caches(dst.clone(), POOL).unwrap();
    let a: Vec<u32> = (0..16 * 4 + 1).collect();
    save(&p, "a", &a, &[0, 1, 2, 3]);

    let extras = RequestExtras::default();
    let (n, _) = c
        .get_num_new_matched_tokens(&request("a", &a, &extras), 0)
        .unwrap();
    assert_eq!(n, 64);
    c.update_state_after_alloc("a", &[8, 9, 10, 11], n).unwrap();
    // Before the worker starts the load, other traffic pushes the chain's tail out of the 4-block store.
    let b: Vec<u32> = (500..500 + 16 * 2 + 1).collect();
    save(&p, "b", &b, &[4, 5]);
    c.bind_connector_metadata(c.build_connector_meta());
    c.start_load_kv().unwrap();
    c.wait_for_all_loads().unwrap();
    let failed = c.failed_blocks();
    assert_eq!(
        failed,
        vec![10, 11],
        "the tail went first; the head still loads"
    );
    let layer_bytes = POOL as usize * BLOCK as usize;
    for layer in 0..LAYERS as usize {
        for (i, d) in [8usize, 9].iter().enumerate() {
            let at = layer * layer_bytes + d * BLOCK as usize;
            let from = layer * layer_bytes + i * BLOCK as usize;
            assert!(
                dst.read(at..at + BLOCK as usize).unwrap()[..]
                    == src.read(from..from + BLOCK as usize).unwrap()[..]
            );
        }
    }
    assert_eq!(c.metrics().snapshot().recompute_blocks, 2);
    assert!(c.prometheus().contains("kv_recompute_blocks_total 2"));
}

#[test]
fn a_serving_engines_own_keys_are_used_as_they_are() {
    let (p, c) = pair(16);
    let bytes = KV.pool_bytes();
    p.register_kv_caches(MemoryRegion::from_vec(vec![3; bytes]), POOL)
        .unwrap();
    let dst = MemoryRegion::zeroed(bytes);
    c.register_kv_caches(dst.clone(), POOL).unwrap();
    // Keys from the engine's own hashing (KV-event u64s, say); the tokens are not hashed at all.
    let own: Vec<connector::BlockHash> = [11u64, 12, 13]
        .iter()
        .map(|&k| connector::BlockHash::external_u64(k))
        .collect();
    let tokens: Vec<u32> = vec![0; 16 * 3 + 1];
    let extras = RequestExtras::default();
    let req = KvRequest {
        id: "e",
        tokens: &tokens,
        extras: &extras,
        external_keys: Some(&own),
        transfer_params: None,
    };
    assert_eq!(
        p.request_keys(&req)
            .iter()
            .map(|k| k.hash)
            .collect::<Vec<_>>(),
        own
    );
    p.get_num_new_matched_tokens(&req, 0).unwrap();
    p.update_state_after_alloc("e", &[0, 1, 2, 3], 0).unwrap();
    p.bind_connector_metadata(p.build_connector_meta());
    for layer in 0..LAYERS {
        p.save_kv_layer(layer).unwrap();
    }
    let (n, _) = c.get_num_new_matched_tokens(&req, 0).unwrap();
    assert_eq!(n, 48);
    // Other keys for the same tokens find nothing.
    let other = [connector::BlockHash::external_u64(99)];
    let req2 = KvRequest {
        external_keys: Some(&other),
        id: "f",
        ..req
    };
    assert_eq!(c.get_num_new_matched_tokens(&req2, 0).unwrap().0, 0);
    c.update_state_after_alloc("e", &[5, 6, 7], n).unwrap();
    c.bind_connector_metadata(c.build_connector_meta());
    c.start_load_kv().unwrap();
    c.wait_for_all_loads().unwrap();
    assert!(c.failed_blocks().is_empty());
    let at = 5 * BLOCK as usize;
    assert!(
        dst.read(at..at + 3 * BLOCK as usize)
            .unwrap()
            .iter()
            .all(|&b| b == 3)
    );
}

#[test]
fn the_kv_bandwidth_cap_reaches_the_engine() {
    use transfer_engine::ShapingConfig;
    let mut p = ConnectorConfig::new(KvRole::Producer, namespace("m", 7, 16));
    (p.layers, p.block_bytes, p.store_blocks) = (LAYERS, BLOCK, 8);
    let mut c = p.clone();
    c.role = KvRole::Consumer;
    c.store_blocks = 0;
    // A cap the engine accepts: a 10 Gb/s link, KV at most 40% of it.
    let mut cap = ShapingConfig::default();
    cap.link_bytes_per_sec = Some(1_250_000_000);
    let mut capped = p.clone();
    capped.shaping = Some(cap.clone());
    assert!(Instance::loopback_pair(capped, c.clone()).is_ok());
    // One it refuses (KV share above the whole link) fails the connector with the engine's reason.
    let mut bad = p;
    bad.shaping = Some({
        let mut cfg = cap;
        cfg.kv_share = 1.5;
        cfg
    });
    let Err(err) = Instance::loopback_pair(bad, c) else {
        panic!("a KV share of 1.5 was accepted");
    };
    let err = err.to_string();
    assert!(err.contains("1.5"), "{err}");
}

/// A producer that has saved layer 0 of three blocks (the prefill still computing the rest), and a consumer
/// that found them being saved, started loading them into blocks 5-7 and has layer 0; `pair` holds 16
/// blocks in the producer's store.
fn streaming_after_layer_0(
    (p, c): (Instance, Instance),
) -> (Instance, Instance, MemoryRegion, MemoryRegion, Vec<u32>) {
    let bytes = KV.pool_bytes();
    let src = MemoryRegion::from_vec((0..bytes).map(|i| (i / 4096 + 1) as u8).collect());
    let dst = MemoryRegion::zeroed(bytes);
    p.register_kv_caches(src.clone(), POOL).unwrap();
    c.register_kv_caches(dst.clone(), POOL).unwrap();
    let a: Vec<u32> = (0..16 * 3 + 1).collect();
    begin_save(&p, "a", &a, &[0, 1, 2]);
    p.save_kv_layer(0).unwrap();
    assert_eq!(plan_load(&c, "a", &a, &[5, 6, 7]), 48);
    c.start_load_kv().unwrap();
    c.wait_for_layer_load(0).unwrap();
    (p, c, src, dst, a)
}

#[test]
fn a_load_streams_each_layer_as_the_producer_saves_it() {
    let (p, c, src, dst, _) = streaming_after_layer_0(pair(16));
    for (s, d) in [(0, 5), (1, 6), (2, 7)] {
        assert_eq!(KV.block_bytes(&dst, 0, d), KV.block_bytes(&src, 0, s));
        // Layer 1 is not saved yet, so not one byte of it moved.
        assert!(KV.block_bytes(&dst, 1, d).iter().all(|&b| b == 0));
    }
    p.save_kv_layer(1).unwrap();
    p.wait_for_save().unwrap();
    c.wait_for_layer_load(1).unwrap();
    assert!(c.failed_blocks().is_empty());
    for (s, d) in [(0, 5), (1, 6), (2, 7)] {
        assert_eq!(KV.block_bytes(&dst, 1, d), KV.block_bytes(&src, 1, s));
    }
    let snap = p.metrics().snapshot();
    assert_eq!((snap.streamed_loads, snap.abandoned_blocks), (1, 0));
    assert!(p.prometheus().contains("kv_streamed_loads_total 1"));
}

#[test]
fn a_save_that_ends_early_cancels_its_streaming_load_and_the_rest_is_recomputed() {
    // The load's session has an hour before its deadline, and the consumer an hour before it stops
    // waiting for a layer: within the hang guard, only the cancel can end its wait.
    let (p, c, _, _, a) = streaming_after_layer_0(loopback_pair_with(&KV, 16, |cfg| {
        cfg.load_timeout = std::time::Duration::from_secs(3600);
    }));
    // The step ends without layer 1: its blocks are abandoned and the load is cancelled, so the consumer
    // learns that layer 1 of those blocks must be recomputed.
    p.wait_for_save().unwrap();
    let (c, waited) = returns("waiting for the cancelled layer", c, |c| {
        c.wait_for_layer_load(1)
    });
    waited.unwrap();
    assert_eq!(c.failed_blocks(), vec![5, 6, 7]);
    assert_eq!(p.metrics().snapshot().abandoned_blocks, 3);
    // Never served again: a new lookup finds nothing.
    let extras = RequestExtras::default();
    let (n, _) = c
        .get_num_new_matched_tokens(&request("b", &a, &extras), 0)
        .unwrap();
    assert_eq!(n, 0);
    c.request_finished("b");
}

#[test]
fn a_preempted_request_stops_saving_and_its_running_load_ends_cleanly() {
    let (p, c) = pair(16);
    let bytes = KV.pool_bytes();
    p.register_kv_caches(
        MemoryRegion::from_vec((0..bytes).map(|i| (i % 7) as u8).collect()),
        POOL,
    )
    .unwrap();
    c.register_kv_caches(MemoryRegion::zeroed(bytes), POOL)
        .unwrap();
    // The producer prefills in chunks: the first step computes one block of three, then the engine
    // preempts the request. The rest of its plan is dropped; the saved block stays whole.
    let tokens: Vec<u32> = (500..500 + 16 * 3 + 1).collect();
    let extras = RequestExtras::default();
    p.get_num_new_matched_tokens(&request("pre", &tokens, &extras), 0)
        .unwrap();
    p.update_state_after_alloc("pre", &[0, 1, 2, 3], 0).unwrap();
    assert!(p.record_step("pre", &[], false, 16));
    p.bind_connector_metadata(p.build_connector_meta());
    for layer in 0..LAYERS {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    assert!(p.scheduler.request_preempted("pre"));
    assert!(!p.scheduler.request_preempted("never-seen"));
    assert!(p.record_step("pre", &[], false, 48));
    let meta = p.build_connector_meta();
    assert!(meta.saves.is_empty(), "{meta:?}");
    assert_eq!(meta.preempted, vec!["pre".to_string()]);
    // The consumer loads the one saved block, and is preempted before it waits for the load: the load
    // is abandoned and reported over, none of its blocks a failed block.
    assert_eq!(plan_load(&c, "pre", &tokens, &[9, 10, 11]), 16);
    c.start_load_kv().unwrap();
    assert!(c.take_load_errors().is_empty());
    assert!(c.scheduler.request_preempted("pre"));
    let meta = c.build_connector_meta();
    c.handle_preemptions(&meta);
    c.wait_for_all_loads().unwrap();
    assert_eq!(c.get_finished().1, vec!["pre".to_string()]);
    assert!(c.failed_blocks().is_empty());
}

#[test]
fn a_prompt_saved_in_chunks_reports_each_block_with_its_tokens_and_parent_as_kv_events() {
    let (p, _c) = loopback_pair_with(&KV, 16, |cfg| cfg.kv_events = true);
    let bytes = KV.pool_bytes();
    p.register_kv_caches(MemoryRegion::zeroed(bytes), POOL)
        .unwrap();
    let tokens: Vec<u32> = (100..100 + 16 * 3 + 5).collect();
    let extras = RequestExtras::default();
    let keys = p.scheduler.request_keys(&request("a", &tokens, &extras));
    p.get_num_new_matched_tokens(&request("a", &tokens, &extras), 0)
        .unwrap();
    // The engine's own hashes of the blocks, which its events name them by.
    let theirs: Vec<BlockHash> = (0..3).map(|i| BlockHash([i + 1; 32])).collect();
    assert!(p.scheduler.set_engine_hashes("a", theirs.clone()));
    p.update_state_after_alloc("a", &[0, 1], 0).unwrap();
    // Two steps of a chunked prefill: 20 tokens (one full block), then the rest.
    let mut events = Vec::new();
    for (new_blocks, computed) in [(vec![], 20), (vec![2, 3], tokens.len())] {
        assert!(p.record_step("a", &new_blocks, false, computed));
        p.bind_connector_metadata(p.build_connector_meta());
        for layer in 0..LAYERS {
            p.save_kv_layer(layer).unwrap();
        }
        p.wait_for_save().unwrap();
        p.clear_connector_metadata();
        events.extend(p.take_kv_events());
    }
    assert_eq!(events.len(), 3, "{events:?}");
    for (i, e) in events.iter().enumerate() {
        let connector::store::KvEvent::Stored {
            key,
            hash,
            medium,
            origin,
        } = e
        else {
            panic!("{e:?}")
        };
        assert_eq!((*key, *medium), (keys[i], connector::store::Medium::Host));
        assert_eq!(*hash, theirs[i]);
        assert_eq!(origin.parent, i.checked_sub(1).map(|j| theirs[j]));
        assert_eq!(&origin.tokens[..], &tokens[16 * i..16 * (i + 1)]);
    }
    assert!(p.take_kv_events().is_empty(), "taken once");
}
