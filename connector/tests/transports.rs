//! The connector's one code path over every transport: the same scenarios against loopback, same-host shm, TCP,
//! TCP with shm beside it, and RDMA
//! (libfabric's `tcp` and `shm` providers): a save loaded layer by layer into other blocks, a producer
//! that dies mid-load (recompute, never wrong KV), and the blocking calls made from async code.

mod common;

use std::time::Duration;

use common::{Instance, Kv, begin_save, plan_load};
use connector::{ConnectorConfig, KvRole, namespace};
use transfer_engine::MemoryRegion;

const KV: Kv = Kv {
    layers: 4,
    block: 8192,
    pool: 32,
};

fn config(role: KvRole) -> ConnectorConfig {
    let mut c = ConnectorConfig::new(role, namespace("test-model", 1, 16));
    (c.layers, c.block_bytes, c.prefetch_depth) = (KV.layers, KV.block, 1);
    c.store_blocks = if role.saves() { 64 } else { 0 };
    // Long enough that only what a test checks (a death noticed, a layer arriving) can end a wait.
    c.load_timeout = Duration::from_secs(3600);
    c
}

/// Saves `id`'s `tokens` from `blocks` on the producer, every layer.
fn produce(p: &Instance, id: &str, tokens: &[u32], blocks: &[u32]) {
    assert_eq!(begin_save(p, id, tokens, blocks), (0, false));
    for layer in 0..KV.layers {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    p.clear_connector_metadata();
    let _ = p.request_finished(id);
}

fn saved_then_loaded_layer_by_layer((p, c): (Instance, Instance)) {
    let (p, c) = (&p, &c);
    let src = MemoryRegion::from_vec((0..KV.pool_bytes()).map(|i| (i * 7 % 253) as u8).collect());
    let dst = MemoryRegion::zeroed(KV.pool_bytes());
    p.register_kv_caches(src.clone(), KV.pool).unwrap();
    c.register_kv_caches(dst.clone(), KV.pool).unwrap();
    let tokens: Vec<u32> = (1000..1000 + 16 * 5 + 3).collect();
    produce(p, "a", &tokens, &[3, 4, 5, 6, 7, 8]);
    let dst_blocks = [20, 11, 12, 30, 31, 9];
    assert_eq!(plan_load(c, "a", &tokens, &dst_blocks), 80, "5 full blocks");
    c.start_load_kv().unwrap();
    assert!(c.take_load_errors().is_empty());
    common::wait_each_layer_and_check(&KV, c, &src, &dst, 3, &dst_blocks[..5]);
    assert!(c.failed_blocks().is_empty());
    assert_eq!(c.get_finished().1, vec!["a".to_string()]);
    assert!(
        dst.read(KV.block_range(0, 9))
            .unwrap()
            .iter()
            .all(|&b| b == 0),
        "block 5 was not loaded"
    );
}

fn a_producer_that_dies_mid_load_yields_recompute((p, c): (Instance, Instance)) {
    let c = std::sync::Arc::new(c);
    let src = MemoryRegion::from_vec(vec![0xAB; KV.pool_bytes()]);
    let dst = MemoryRegion::zeroed(KV.pool_bytes());
    p.register_kv_caches(src, KV.pool).unwrap();
    c.register_kv_caches(dst.clone(), KV.pool).unwrap();
    let tokens: Vec<u32> = (0..16 * 8 + 1).collect();
    let blocks: Vec<u32> = (0..8).collect();
    produce(&p, "r", &tokens, &blocks);
    let dst_blocks: Vec<u32> = (10..18).collect();
    assert_eq!(plan_load(&c, "r", &tokens, &dst_blocks), 128);
    c.start_load_kv().unwrap();
    c.wait_for_layer_load(0).unwrap();
    drop(p); // the prefill instance goes away with layers still to send
    // The load timeout is an hour: only noticing the death ends these waits (a guard against a hang).
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = c.clone();
    std::thread::spawn(move || {
        for layer in 1..KV.layers {
            waiter.wait_for_layer_load(layer).unwrap();
        }
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(120))
        .expect("the consumer never noticed its producer die");
    let failed = c.failed_blocks();
    for b in dst_blocks.iter().filter(|b| !failed.contains(b)) {
        for layer in 0..KV.layers {
            assert!(
                dst.read(KV.block_range(layer, *b))
                    .unwrap()
                    .iter()
                    .all(|&x| x == 0xAB),
                "block {b} layer {layer} is neither loaded nor handed back"
            );
        }
    }
    assert!(failed.iter().all(|b| dst_blocks.contains(b)), "{failed:?}");
    // Layers beyond the prefetch window never left the dead producer: those blocks are handed back.
    assert!(!failed.is_empty());
}

fn blocking_calls_work_from_async_code((p, c): (Instance, Instance)) {
    let (p, c) = (&p, &c);
    let src = MemoryRegion::from_vec(vec![0x5C; KV.pool_bytes()]);
    p.register_kv_caches(src, KV.pool).unwrap();
    let dst = MemoryRegion::zeroed(KV.pool_bytes());
    c.register_kv_caches(dst.clone(), KV.pool).unwrap();
    let tokens: Vec<u32> = (0..16 * 2 + 1).collect();
    produce(p, "x", &tokens, &[0, 1]);
    assert_eq!(plan_load(c, "x", &tokens, &[5, 6]), 32);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // From inside an async task (tokio would panic at a nested block_on), and from a thread that entered
    // a runtime as `spawn_blocking`'s threads do.
    rt.block_on(async { c.start_load_kv() }).unwrap();
    rt.block_on(async { c.wait_for_layer_load(0) }).unwrap();
    {
        let _entered = rt.enter();
        c.wait_for_layer_load(1).unwrap();
    }
    for layer in 2..KV.layers {
        rt.block_on(async { c.wait_for_layer_load(layer) }).unwrap();
    }
    assert!(c.failed_blocks().is_empty());
    assert!(
        dst.read(KV.block_range(3, 6))
            .unwrap()
            .iter()
            .all(|&b| b == 0x5C)
    );
    // Built and dropped on a runtime's thread, neither blocks nor panics.
    rt.block_on(async {
        let pair = Instance::loopback_pair(config(KvRole::Producer), config(KvRole::Consumer));
        drop(pair.unwrap());
    });
}

/// One module per transport with one test per scenario, each on a fresh producer and consumer from
/// `$pair` (`None`: it printed why it did not run).
macro_rules! over {
    ($backend:ident, $pair:expr) => {
        over!(
            @each $backend, $pair,
            saved_then_loaded_layer_by_layer,
            a_producer_that_dies_mid_load_yields_recompute,
            blocking_calls_work_from_async_code
        );
    };
    (@each $backend:ident, $pair:expr, $($scenario:ident),+) => {
        mod $backend {
            use super::*;
            $(
                #[test]
                fn $scenario() {
                    if let Some(pair) = $pair {
                        super::$scenario(pair);
                    }
                }
            )+
        }
    };
}

fn loopback() -> Option<(Instance, Instance)> {
    Some(Instance::loopback_pair(config(KvRole::Producer), config(KvRole::Consumer)).unwrap())
}

fn tcp() -> Option<(Instance, Instance)> {
    Some(common::tcp_pair(config))
}

/// Connectors over libfabric provider `provider` on `domain`.
#[cfg(feature = "rdma")]
fn rdma(provider: &str, domain: Option<&str>) -> Option<(Instance, Instance)> {
    use backends::rdma::{Provider, RdmaConfig, available_providers};
    // The RDMA tests' rule (backends/tests/common): "not run" only where libfabric does not list the
    // provider on the domain; a listed one that fails to start fails the test.
    let full = if provider == "tcp" {
        "tcp;ofi_rxm"
    } else {
        provider
    };
    let listed = available_providers()
        .expect("libfabric is linked, so fi_getinfo answers")
        .iter()
        .any(|p| p.provider == full && domain.is_none_or(|d| p.domain == d));
    if !listed {
        println!("not run: libfabric lists no {full} provider here");
        return None;
    }
    let node = |id| {
        let mut cfg = RdmaConfig::new(id, Provider::Named(provider.into()));
        cfg.domain = domain.map(str::to_owned);
        cfg.liveness.answer_timeout = Duration::from_secs(1);
        cfg
    };
    let p = Instance::rdma(config(KvRole::Producer), node(1), None, None).unwrap();
    let c = Instance::rdma(config(KvRole::Consumer), node(2), None, p.control_addr()).unwrap();
    Some((p, c))
}

/// Connectors over the same-host backend; the consumer listens on a socket of its own.
fn shm() -> Option<(Instance, Instance)> {
    use backends::shm::ShmConfig;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let socket =
        std::env::temp_dir().join(format!("connector-shm-{}-{n}.sock", std::process::id()));
    let p = Instance::shm(
        config(KvRole::Producer),
        ShmConfig::new(1, None),
        None,
        None,
    )
    .unwrap();
    let c = Instance::shm(
        config(KvRole::Consumer),
        ShmConfig::new(2, Some(socket)),
        None,
        p.control_addr(),
    )
    .unwrap();
    Some((p, c))
}

/// Connectors over TCP with the same-host backend beside it (both on this host, so KV goes over shm).
#[cfg(target_os = "linux")]
fn tcp_with_shm() -> Option<(Instance, Instance)> {
    Some(common::tcp_with_shm_pair(config))
}

over!(loopback, loopback());
over!(shm, shm());
#[cfg(target_os = "linux")]
over!(tcp_with_shm, tcp_with_shm());
over!(tcp, tcp());
#[cfg(feature = "rdma")]
over!(rdma_tcp, rdma("tcp", Some("lo")));
#[cfg(feature = "rdma")]
over!(rdma_shm, rdma("shm", None));
