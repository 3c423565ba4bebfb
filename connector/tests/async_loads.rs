//! Asynchronous loads (the request waits outside the forward pass until `get_finished` reports its load)
//! over loopback and TCP, a load given up on that never writes again, and saves that follow what each
//! step computes (a prompt prefilled in chunks).

mod common;

use std::time::{Duration, Instant};

use common::{HANG_GUARD, Instance, Kv, begin_save, loopback_pair_with, request, tcp_pair};
use connector::{ConnectorConfig, KvRole, RequestExtras, namespace};
use transfer_engine::MemoryRegion;

const KV: Kv = Kv {
    layers: 2,
    block: 4096,
    pool: 16,
};

fn config(role: KvRole, load_timeout: Duration) -> ConnectorConfig {
    config_with(role, load_timeout, true)
}

fn config_with(role: KvRole, load_timeout: Duration, async_loads: bool) -> ConnectorConfig {
    let mut c = ConnectorConfig::new(role, namespace("m", 7, 16));
    (c.layers, c.block_bytes) = (KV.layers, KV.block);
    c.store_blocks = if role.saves() { 16 } else { 0 };
    c.async_loads = async_loads;
    c.load_timeout = load_timeout;
    c
}

/// A pair whose consumer gives up on a load after `load_timeout` (the producer's sessions have the
/// hang guard's time).
fn loopback(load_timeout: Duration) -> (Instance, Instance) {
    Instance::loopback_pair(
        config(KvRole::Producer, HANG_GUARD),
        config(KvRole::Consumer, load_timeout),
    )
    .unwrap()
}

fn tcp(load_timeout: Duration) -> (Instance, Instance) {
    tcp_pair(|role| {
        config(
            role,
            if role.saves() {
                HANG_GUARD
            } else {
                load_timeout
            },
        )
    })
}

/// KV caches for both ends: the producer's blocks hold their own numbers, the consumer's zeros.
fn caches(p: &Instance, c: &Instance) -> (MemoryRegion, MemoryRegion) {
    let bytes = KV.pool_bytes();
    let src = MemoryRegion::from_vec((0..bytes).map(|i| (i / 4096 + 1) as u8).collect());
    let dst = MemoryRegion::zeroed(bytes);
    p.register_kv_caches(src.clone(), KV.pool).unwrap();
    c.register_kv_caches(dst.clone(), KV.pool).unwrap();
    (src, dst)
}

/// Calls `get_finished` until it reports `id` as received (failing after [`HANG_GUARD`]).
fn until_received(c: &Instance, id: &str) -> Duration {
    let start = Instant::now();
    loop {
        let (_, received) = c.get_finished();
        if received.iter().any(|r| r == id) {
            return start.elapsed();
        }
        assert!(start.elapsed() < HANG_GUARD, "{id} was never reported");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The consumer's step: `id` found asynchronous, its load planned into `blocks` and started.
fn start_async_load(c: &Instance, id: &str, tokens: &[u32], blocks: &[u32]) -> usize {
    let extras = RequestExtras::default();
    let (n, load_async) = c
        .get_num_new_matched_tokens(&request(id, tokens, &extras), 0)
        .unwrap();
    assert!(load_async, "a load of {n} tokens was not asynchronous");
    c.update_state_after_alloc(id, blocks, n).unwrap();
    c.bind_connector_metadata(c.build_connector_meta());
    c.start_load_kv().unwrap();
    // The forward pass (of other requests) never waits for it.
    for layer in 0..KV.layers {
        c.wait_for_layer_load(layer).unwrap();
    }
    c.clear_connector_metadata();
    n
}

fn an_asynchronous_load_arrives_whole_then_is_reported(
    (p, c): (Instance, Instance),
    backend: &str,
) {
    let (src, dst) = caches(&p, &c);
    let a: Vec<u32> = (0..16 * 3 + 1).collect();
    begin_save(&p, "a", &a, &[0, 1, 2]);
    for layer in 0..KV.layers {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    assert_eq!(start_async_load(&c, "a", &a, &[5, 6, 7]), 48, "{backend}");
    until_received(&c, "a");
    assert!(c.failed_blocks().is_empty(), "{backend}");
    for layer in 0..KV.layers {
        for (s, d) in [(0, 5), (1, 6), (2, 7)] {
            assert_eq!(
                KV.block_bytes(&dst, layer, d),
                KV.block_bytes(&src, layer, s),
                "{backend}: layer {layer} block {d}"
            );
        }
    }
    let snap = c.metrics().snapshot();
    assert_eq!(snap.bytes_in, 3 * 2 * 4096, "{backend}");
    assert_eq!((snap.loads, snap.recompute_blocks), (1, 0), "{backend}");
    // Reported once.
    assert!(c.get_finished().1.is_empty(), "{backend}");
    // Once the load is over the engine schedules the request: nothing more to load, and nothing to wait.
    c.update_state_after_alloc("a", &[5, 6, 7, 8], 0).unwrap();
    assert!(c.build_connector_meta().loads.is_empty(), "{backend}");
    c.request_finished("a");
}

#[test]
fn an_asynchronous_load_arrives_whole_then_is_reported_over_loopback() {
    an_asynchronous_load_arrives_whole_then_is_reported(loopback(HANG_GUARD), "loopback");
}

#[test]
fn an_asynchronous_load_arrives_whole_then_is_reported_over_tcp() {
    an_asynchronous_load_arrives_whole_then_is_reported(tcp(HANG_GUARD), "tcp");
}

/// A producer saving layer 0 only (its prefill stalls), and a consumer that gives up on the load after
/// `load_timeout`, asynchronous or inside the forward pass: every block is handed back, and once the
/// engine recomputes into them, the producer's late layer never lands there.
fn a_load_given_up_on_never_writes_again((p, c): (Instance, Instance), backend: &str) {
    let (_src, dst) = caches(&p, &c);
    let a: Vec<u32> = (0..16 * 3 + 1).collect();
    begin_save(&p, "a", &a, &[0, 1, 2]);
    p.save_kv_layer(0).unwrap();
    if backend.ends_with("sync") {
        assert_eq!(common::plan_load(&c, "a", &a, &[5, 6, 7]), 48, "{backend}");
        c.start_load_kv().unwrap();
        c.wait_for_layer_load(0).unwrap();
        c.wait_for_layer_load(1).unwrap();
    } else {
        assert_eq!(start_async_load(&c, "a", &a, &[5, 6, 7]), 48, "{backend}");
        until_received(&c, "a");
    }
    assert_eq!(c.failed_blocks(), vec![5, 6, 7], "{backend}");
    // The engine recomputes those blocks: it writes them itself.
    let marker = vec![0xEE_u8; 4096];
    for layer in 0..KV.layers {
        for b in [5, 6, 7] {
            dst.write(KV.block_range(layer, b))
                .unwrap()
                .copy_from_slice(&marker);
        }
    }
    // The producer's prefill goes on: layer 1 is saved and would stream to the consumer.
    p.save_kv_layer(1).unwrap();
    p.wait_for_save().unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        for layer in 0..KV.layers {
            for b in [5, 6, 7] {
                assert_eq!(
                    KV.block_bytes(&dst, layer, b),
                    marker,
                    "{backend}: layer {layer} block {b} was written after the load was given up"
                );
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(c.metrics().snapshot().recompute_blocks, 3, "{backend}");
}

#[test]
fn a_load_given_up_on_never_writes_again_over_loopback() {
    a_load_given_up_on_never_writes_again(loopback(Duration::from_millis(300)), "loopback");
}

#[test]
fn a_load_given_up_on_never_writes_again_over_tcp() {
    a_load_given_up_on_never_writes_again(tcp(Duration::from_millis(300)), "tcp");
}

#[test]
fn a_load_given_up_on_inside_the_forward_pass_never_writes_again_over_tcp() {
    let pair = tcp_pair(|role| {
        let timeout = if role.saves() {
            HANG_GUARD
        } else {
            Duration::from_millis(300)
        };
        config_with(role, timeout, false)
    });
    a_load_given_up_on_never_writes_again(pair, "tcp, sync");
}

#[test]
fn a_prompt_prefilled_in_chunks_is_saved_as_each_chunk_is_computed() {
    let (p, c) = loopback_pair_with(&KV, 16, |_| {});
    let (src, dst) = caches(&p, &c);
    let a: Vec<u32> = (0..16 * 3 + 1).collect();
    let extras = RequestExtras::default();
    p.get_num_new_matched_tokens(&request("a", &a, &extras), 0)
        .unwrap();
    // Step 1 computes 20 tokens: block 0 is whole, block 1 is not.
    p.update_state_after_alloc("a", &[0, 1], 0).unwrap();
    assert!(p.record_step("a", &[], false, 20));
    let meta = p.build_connector_meta();
    assert_eq!(meta.saves.len(), 1);
    assert_eq!(meta.saves[0].blocks, vec![0]);
    p.bind_connector_metadata(meta);
    for layer in 0..KV.layers {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    let lookup = |id: &str| {
        let (n, _) = c
            .get_num_new_matched_tokens(&request(id, &a, &extras), 0)
            .unwrap();
        c.request_finished(id);
        n
    };
    // A consumer finds only the computed block.
    assert_eq!(lookup("b"), 16);
    // Step 2 computes the rest, into a block appended to the table.
    assert!(p.record_step("a", &[2], false, 49));
    let meta = p.build_connector_meta();
    assert_eq!(meta.saves[0].blocks, vec![1, 2]);
    p.bind_connector_metadata(meta);
    for layer in 0..KV.layers {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    // Nothing is saved twice.
    assert!(p.build_connector_meta().saves.is_empty());
    p.request_finished("a");
    assert_eq!(lookup("c"), 48);
    // And what a consumer loads is what each chunk computed.
    let (n, _) = c
        .get_num_new_matched_tokens(&request("d", &a, &extras), 0)
        .unwrap();
    c.update_state_after_alloc("d", &[9, 10, 11], n).unwrap();
    c.bind_connector_metadata(c.build_connector_meta());
    c.start_load_kv().unwrap();
    common::wait_each_layer_and_check(&KV, &c, &src, &dst, 0, &[9, 10, 11]);
    assert!(!p.record_step("nobody", &[], false, 1));
}
