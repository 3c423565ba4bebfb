//! Producer and consumer connectors over TCP (two nodes on loopback sockets): save layer by layer, load
//! layer by layer into other blocks, weight updates, failures handed back for recompute.

mod common;

use std::time::Duration;

use backends::tcp::TcpConfig;
use common::{Instance, Kv, begin_save, plan_load, request, tcp_pair, tcp_producer};
use connector::{ConnectorConfig, KvRole, RequestExtras, namespace};
use transfer_engine::MemoryRegion;

const KV: Kv = Kv {
    layers: 4,
    block: 8192,
    pool: 32,
};
const LAYERS: u32 = KV.layers;
const BLOCK: u64 = KV.block;
const POOL: u32 = KV.pool;

fn config(role: KvRole) -> ConnectorConfig {
    let mut c = ConnectorConfig::new(role, namespace("test-model", 1, 16));
    (c.layers, c.block_bytes, c.prefetch_depth) = (LAYERS, BLOCK, 1);
    c.store_blocks = if role.saves() { 64 } else { 0 };
    c.load_timeout = Duration::from_secs(3);
    c
}

fn pair() -> (Instance, Instance) {
    tcp_pair(config)
}

/// Runs the producer's step for `id`: plan, then save every layer of blocks `blocks`.
fn produce(p: &Instance, id: &str, tokens: &[u32], blocks: &[u32]) {
    assert_eq!(begin_save(p, id, tokens, blocks), (0, false));
    for layer in 0..LAYERS {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    let (sent, _) = p.get_finished();
    assert_eq!(sent, vec![id.to_string()]);
    p.clear_connector_metadata();
    let (delay_free, params) = p.request_finished(id);
    assert!(!delay_free);
    assert_eq!(params.map(|x| x.producer), p.control_addr());
}

#[test]
fn saved_on_the_producer_loaded_layer_by_layer_on_the_consumer() {
    let (p, c) = pair();
    let src = MemoryRegion::from_vec((0..KV.pool_bytes()).map(|i| (i * 7 % 253) as u8).collect());
    let dst = MemoryRegion::zeroed(KV.pool_bytes());
    p.register_kv_caches(src.clone(), POOL).unwrap();
    c.register_kv_caches(dst.clone(), POOL).unwrap();
    let tokens: Vec<u32> = (1000..1000 + 16 * 5 + 3).collect();
    produce(&p, "a", &tokens, &[3, 4, 5, 6, 7, 8]);

    let dst_blocks = [20, 11, 12, 30, 31, 9];
    assert_eq!(
        plan_load(&c, "a", &tokens, &dst_blocks),
        80,
        "5 full blocks"
    );
    c.start_load_kv().unwrap();
    assert!(
        c.take_load_errors().is_empty(),
        "{:?}",
        c.take_load_errors()
    );
    common::wait_each_layer_and_check(&KV, &c, &src, &dst, 3, &dst_blocks[..5]);
    assert!(c.failed_blocks().is_empty());
    assert_eq!(c.get_finished().1, vec!["a".to_string()]);
    assert!(
        dst.read(KV.block_range(0, 9))
            .unwrap()
            .iter()
            .all(|&b| b == 0),
        "block 5 was not loaded"
    );
    let snap = c.metrics().snapshot();
    assert_eq!((snap.lookup_blocks, snap.lookup_hits), (5, 5));
    assert_eq!(snap.bytes_in, 5 * u64::from(LAYERS) * BLOCK);
    // The producer counts what it served once its sending session is over.
    // (The limit only guards against a hang.)
    let deadline = std::time::Instant::now() + common::HANG_GUARD;
    while p.metrics().snapshot().bytes_out < snap.bytes_in && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(p.metrics().snapshot().bytes_out, snap.bytes_in);
    assert!(p.prometheus().contains("kv_tier_blocks{tier=\"host\"} 5"));
    let text = c.prometheus();
    assert!(
        text.contains("kv_transfer_bytes_total{direction=\"in\",class=\"urgent\"} 163840"),
        "{text}"
    );
    // The shared prefix is found for a longer prompt, up to where it differs.
    let mut longer = tokens[..64].to_vec();
    longer.extend(5000..5040);
    let extras = RequestExtras::default();
    let req = request("b", &longer, &extras);
    assert_eq!(
        c.get_num_new_matched_tokens(&req, 16).unwrap().0,
        48,
        "blocks 1..4 beyond the computed one"
    );
}

#[test]
fn after_a_weight_update_no_old_block_is_found_or_served() {
    let (p, c) = pair();
    p.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), POOL)
        .unwrap();
    c.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), POOL)
        .unwrap();
    let tokens: Vec<u32> = (0..40).collect();
    produce(&p, "old", &tokens, &[0, 1]);
    assert_eq!(p.store_usage().0, 2);

    // The consumer planned a load under version 1; then the producer's weights change.
    assert_eq!(plan_load(&c, "old", &tokens, &[5, 6]), 32);
    p.set_weight_version(2);
    assert_eq!(p.store_usage().0, 0, "old blocks dropped");
    c.start_load_kv().unwrap();
    c.wait_for_all_loads().unwrap();
    assert_eq!(
        c.failed_blocks(),
        vec![5, 6],
        "old KV is recomputed, never served"
    );

    // Under version 2 nothing old matches; new saves do.
    c.set_weight_version(2);
    assert_eq!(plan_load(&c, "x", &tokens, &[5, 6]), 0);
    produce(&p, "new", &tokens, &[0, 1]);
    assert_eq!(plan_load(&c, "y", &tokens, &[5, 6]), 32);
    c.start_load_kv().unwrap();
    c.wait_for_all_loads().unwrap();
    assert!(c.failed_blocks().is_empty());
}

#[test]
fn a_producer_that_dies_mid_load_yields_recompute_not_wrong_kv() {
    let (p, c) = pair();
    let src = MemoryRegion::from_vec(vec![0xAB; KV.pool_bytes()]);
    let dst = MemoryRegion::zeroed(KV.pool_bytes());
    p.register_kv_caches(src, POOL).unwrap();
    c.register_kv_caches(dst.clone(), POOL).unwrap();
    let tokens: Vec<u32> = (0..16 * 8 + 1).collect();
    let blocks: Vec<u32> = (0..8).collect();
    produce(&p, "r", &tokens, &blocks);
    let dst_blocks: Vec<u32> = (10..18).collect();
    assert_eq!(plan_load(&c, "r", &tokens, &dst_blocks), 128);
    c.start_load_kv().unwrap();
    c.wait_for_layer_load(0).unwrap();
    drop(p); // the prefill instance goes away with layers still to send
    for layer in 1..LAYERS {
        c.wait_for_layer_load(layer).unwrap();
    }
    let failed = c.failed_blocks();
    // Whatever did not arrive is handed back; every block not handed back holds the producer's bytes.
    for b in dst_blocks.iter().filter(|b| !failed.contains(b)) {
        for layer in 0..LAYERS {
            assert!(
                dst.read(KV.block_range(layer, *b))
                    .unwrap()
                    .iter()
                    .all(|&x| x == 0xAB)
            );
        }
    }
    assert!(failed.iter().all(|b| dst_blocks.contains(b)), "{failed:?}");
    // Layers beyond the prefetch window never left the dead producer: those blocks are handed back.
    assert!(!failed.is_empty());
    assert_eq!(c.get_finished().1, vec!["r".to_string()]);
}

#[test]
fn roles_refuse_what_they_never_do() {
    let (p, c) = pair();
    c.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), POOL)
        .unwrap();
    assert!(
        c.save_kv_layer(0)
            .unwrap_err()
            .to_string()
            .contains("consumer")
    );
    let tokens: Vec<u32> = (0..40).collect();
    let extras = RequestExtras::default();
    let req = request("p", &tokens, &extras);
    assert_eq!(
        p.get_num_new_matched_tokens(&req, 0).unwrap().0,
        0,
        "a producer never loads"
    );
    assert!(c.update_state_after_alloc("unknown", &[1], 16).is_err());
    // KV caches smaller than the layout say so.
    assert!(
        p.register_kv_caches(MemoryRegion::zeroed(10), POOL)
            .is_err()
    );
}

#[test]
fn a_control_peer_sending_garbage_gets_an_error_and_the_producer_keeps_serving() {
    use common::raw_control::{self, answer, frame};
    use std::io::{Read, Write};
    let (p, c) = pair();
    let addr = p.control_addr().unwrap();
    // Garbage before the handshake: told why, and the connection ends.
    let mut s = raw_control::connect(addr);
    s.write_all(&frame(b"{not json}", &[])).unwrap();
    let text = answer(&mut s);
    assert!(text.contains("\"reply\":\"error\""), "{text}");
    assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0, "the connection ended");
    // The handshake of a consumer without a secret (MACs of zeros) ...
    let mut s = raw_control::connect(addr);
    let ns = config(KvRole::Consumer).lane_namespace().id().0;
    raw_control::handshake(&mut s, ns, &[]);
    // ... then a head that is not JSON, and one that is no request: each answered with an error, the
    // connection kept.
    for head in [&b"{not json}"[..], br#"{"op":"lookup","ns":1}"#] {
        s.write_all(&frame(head, &[])).unwrap();
        let text = answer(&mut s);
        assert!(text.contains("\"reply\":\"error\""), "{text}");
    }
    c.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), POOL)
        .unwrap();
    p.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), POOL)
        .unwrap();
    let tokens: Vec<u32> = (0..33).collect();
    produce(&p, "ok", &tokens, &[0, 1]);
    assert_eq!(plan_load(&c, "ok", &tokens, &[2, 3]), 32);
}

#[test]
fn a_consumer_finds_its_producer_through_discovery() {
    use backends::discovery::{Discovery, Embedded};
    let registry = Embedded::new();
    let p = tcp_producer(config);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = rt.block_on(async {
        let lease = registry.grant(Duration::from_secs(30)).await.unwrap();
        p.announce(&registry, 1, lease).await.unwrap();
        assert!(
            connector::discovery::find_producer(&registry, 9)
                .await
                .is_err()
        );
        connector::discovery::find_producer(&registry, 1)
            .await
            .unwrap()
    });
    assert_eq!(Some(addr), p.control_addr());
    let c = Instance::tcp(
        config(KvRole::Consumer),
        TcpConfig::with_engine_id(2),
        None,
        Some(addr),
    )
    .unwrap();
    p.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), POOL)
        .unwrap();
    c.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), POOL)
        .unwrap();
    let tokens: Vec<u32> = (0..17).collect();
    produce(&p, "d", &tokens, &[0, 1]);
    assert_eq!(plan_load(&c, "d", &tokens, &[4, 5]), 16);
}

#[test]
fn a_tcp_config_of_another_namespace_is_refused_not_overwritten() {
    let mut tcp = TcpConfig::with_engine_id(7);
    tcp.namespace.model = "another-model".into();
    let refused = Instance::tcp(config(KvRole::Producer), tcp, None, None).unwrap_err();
    assert!(
        matches!(&refused, connector::ConnectorError::Config(m) if m.contains("another-model")),
        "{refused}"
    );
    assert_eq!(refused.fault(), backends::Fault::Caller);
    // The connector's own namespace (any weight version) is accepted, as is the default.
    let mut tcp = TcpConfig::with_engine_id(8);
    tcp.namespace = config(KvRole::Producer).namespace;
    tcp.namespace.weight_version += 1;
    assert!(Instance::tcp(config(KvRole::Producer), tcp, None, None).is_ok());
}

#[test]
fn a_both_connector_loads_from_its_own_tier_store() {
    let both = Instance::tcp(
        config(KvRole::Both),
        TcpConfig::with_engine_id(3),
        None,
        None,
    )
    .unwrap();
    let kv = MemoryRegion::from_vec((0..KV.pool_bytes()).map(|i| (i % 249) as u8).collect());
    both.register_kv_caches(kv.clone(), POOL).unwrap();
    let tokens: Vec<u32> = (0..16 * 3 + 2).collect();
    produce(&both, "first", &tokens, &[0, 1, 2]);
    // The engine freed blocks 0..2; a later request with the same prefix gets it back from the store.
    assert_eq!(plan_load(&both, "again", &tokens, &[20, 21, 22]), 48);
    both.start_load_kv().unwrap();
    both.wait_for_all_loads().unwrap();
    assert!(both.failed_blocks().is_empty());
    for layer in 0..LAYERS {
        for (from, to) in [(0, 20), (2, 22)] {
            assert!(
                kv.read(KV.block_range(layer, to)).unwrap()[..]
                    == kv.read(KV.block_range(layer, from)).unwrap()[..]
            );
        }
    }
    assert!(both.prometheus().contains(&format!(
        "kv_local_tier_bytes_total {}",
        3 * u64::from(LAYERS) * BLOCK
    )));
}

#[test]
fn a_consumer_without_a_default_producer_follows_the_transfer_params() {
    let (p, _) = pair();
    let c = Instance::tcp(
        config(KvRole::Consumer),
        TcpConfig::with_engine_id(5),
        None,
        None,
    )
    .unwrap();
    p.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), POOL)
        .unwrap();
    c.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), POOL)
        .unwrap();
    let tokens: Vec<u32> = (0..33).collect();
    produce(&p, "t", &tokens, &[0, 1]);
    let extras = RequestExtras::default();
    let mut req = request("t", &tokens, &extras);
    assert_eq!(
        c.get_num_new_matched_tokens(&req, 0).unwrap().0,
        0,
        "no producer named"
    );
    let params = p.request_finished("t").1.expect("a producer names itself");
    assert_eq!(
        params,
        connector::KvTransferParams::single(p.control_addr().unwrap())
    );
    // The proxy carries the producer's answer as JSON, as vLLM's kv_transfer_params.
    let carried: connector::KvTransferParams =
        serde_json::from_str(&serde_json::to_string(&params).unwrap()).unwrap();
    req.transfer_params = Some(&carried);
    let (n, _) = c.get_num_new_matched_tokens(&req, 0).unwrap();
    assert_eq!(n, 32);
    c.update_state_after_alloc("t", &[3, 4, 5], n).unwrap();
    c.bind_connector_metadata(c.build_connector_meta());
    c.start_load_kv().unwrap();
    c.wait_for_all_loads().unwrap();
    assert!(c.failed_blocks().is_empty());
    assert_eq!(
        c.metrics().snapshot().bytes_in,
        2 * u64::from(LAYERS) * BLOCK
    );
}

#[test]
fn an_oversized_or_old_control_frame_is_refused_with_a_reason_and_the_connection_ends() {
    use connector::control::frame::{MAX_HEAD, VERSION};
    use std::io::{Read, Write};
    let (p, _) = pair();
    let ask = |bytes: &[u8]| -> Vec<u8> {
        let mut s = std::net::TcpStream::connect(p.control_addr().unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        let mut answer = Vec::new();
        // The producer answers, then closes: the read ends (a hang here fails on the timeout).
        s.read_to_end(&mut answer).unwrap();
        answer
    };
    // A head declared longer than the producer takes: told why in a frame, nothing more is read.
    let mut oversized = vec![VERSION];
    oversized.extend_from_slice(&(MAX_HEAD + 1).to_le_bytes());
    let answer = ask(&oversized);
    assert_eq!(answer[0], VERSION, "{answer:?}");
    assert!(
        String::from_utf8_lossy(&answer).contains("longer than"),
        "{answer:?}"
    );
    // A consumer of protocol 1 (JSON lines) is told in its own protocol.
    let answer = ask(
        b"{\"op\":\"lookup\",\"ns\":1,\"keys\":[],\"tp\":{\"rank\":0,\"size\":1,\"mla\":false}}\n",
    );
    let line = String::from_utf8(answer).unwrap();
    assert!(line.starts_with("{\"reply\":\"error\""), "{line}");
    assert!(line.contains("control protocol 1"), "{line}");
    assert!(line.ends_with('\n'), "{line}");
}

#[test]
fn a_consumer_asking_mid_prefill_streams_each_layer_as_the_producer_saves_it() {
    let (p, c) = pair();
    let src = MemoryRegion::from_vec((0..KV.pool_bytes()).map(|i| (i * 5 % 251) as u8).collect());
    let dst = MemoryRegion::zeroed(KV.pool_bytes());
    p.register_kv_caches(src.clone(), POOL).unwrap();
    c.register_kv_caches(dst.clone(), POOL).unwrap();
    let tokens: Vec<u32> = (7000..7000 + 16 * 3 + 1).collect();
    // The prefill has saved layers 0 and 1 of its three blocks; it is still computing the rest.
    assert_eq!(begin_save(&p, "s", &tokens, &[0, 1, 2]), (0, false));
    p.save_kv_layer(0).unwrap();
    p.save_kv_layer(1).unwrap();
    // The consumer's lookup over the control channel counts the blocks being saved, and its load gets
    // the saved layers at once and nothing of the others.
    assert_eq!(plan_load(&c, "s", &tokens, &[10, 11, 12]), 48);
    c.start_load_kv().unwrap();
    assert!(c.take_load_errors().is_empty());
    c.wait_for_layer_load(1).unwrap();
    for (i, b) in [10u32, 11, 12].into_iter().enumerate() {
        for layer in 0..2 {
            assert!(
                dst.read(KV.block_range(layer, b)).unwrap()[..]
                    == src.read(KV.block_range(layer, i as u32)).unwrap()[..]
            );
        }
        assert!(
            dst.read(KV.block_range(2, b))
                .unwrap()
                .iter()
                .all(|&x| x == 0),
            "layer 2 is not saved yet"
        );
    }
    for layer in 2..LAYERS {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    for layer in 2..LAYERS {
        c.wait_for_layer_load(layer).unwrap();
    }
    assert!(c.failed_blocks().is_empty());
    for (i, b) in [10u32, 11, 12].into_iter().enumerate() {
        for layer in 2..LAYERS {
            assert!(
                dst.read(KV.block_range(layer, b)).unwrap()[..]
                    == src.read(KV.block_range(layer, i as u32)).unwrap()[..]
            );
        }
    }
    assert_eq!(p.metrics().snapshot().streamed_loads, 1);
}
