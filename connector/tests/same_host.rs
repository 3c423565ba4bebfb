//! One connector, two transports: TCP for every peer and the same-host backend for peers on this host.
//! A load goes over shared memory when the consumer names the producer's host and can be reached there,
//! and over TCP otherwise (another host, a consumer without shm, or an shm endpoint that cannot be
//! dialled); the bytes are the producer's either way, and the metrics say which path ran.
#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use backends::shm::{ShmConfig, ShmNode};
use backends::tcp::{TcpConfig, TcpNode};
use common::{Instance, Kv, begin_save, fresh_socket, plan_load};
use connector::{ConnectorConfig, KvRole, SameHostTransport, namespace};
use policy::Namespace;
use transfer_engine::MemoryRegion;

const KV: Kv = Kv {
    layers: 3,
    block: 4096,
    pool: 16,
};

fn config(role: KvRole) -> ConnectorConfig {
    let mut c = ConnectorConfig::new(role, namespace("test-model", 1, 16));
    (c.layers, c.block_bytes, c.prefetch_depth) = (KV.layers, KV.block, 1);
    c.store_blocks = if role.saves() { 32 } else { 0 };
    c.load_timeout = Duration::from_secs(60);
    c
}

/// Saves four blocks of a request on `p`, plans their load on `c` into other blocks, loads them layer by
/// layer and checks every byte.
fn save_then_load(p: &Instance, c: &Instance) {
    let src = MemoryRegion::from_vec((0..KV.pool_bytes()).map(|i| (i * 13 % 251) as u8).collect());
    let dst = MemoryRegion::zeroed(KV.pool_bytes());
    p.register_kv_caches(src.clone(), KV.pool).unwrap();
    c.register_kv_caches(dst.clone(), KV.pool).unwrap();
    let tokens: Vec<u32> = (500..500 + 16 * 4 + 1).collect();
    assert_eq!(begin_save(p, "r", &tokens, &[1, 2, 3, 4, 5]), (0, false));
    for layer in 0..KV.layers {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    p.clear_connector_metadata();
    let _ = p.request_finished("r");
    let dst_blocks = [9, 10, 14, 15, 2];
    assert_eq!(plan_load(c, "r", &tokens, &dst_blocks), 64);
    c.start_load_kv().unwrap();
    assert!(c.take_load_errors().is_empty());
    common::wait_each_layer_and_check(&KV, c, &src, &dst, 1, &dst_blocks[..4]);
    assert!(c.failed_blocks().is_empty());
    assert_eq!(c.get_finished().1, vec!["r".to_string()]);
}

/// (loads over shm, loads that fell back to TCP) as the producer counted them.
fn paths(p: &Instance) -> (u64, u64) {
    let s = p.metrics().snapshot();
    (s.same_host_loads, s.same_host_fallbacks)
}

fn mixed_producer() -> Instance {
    common::tcp_with_shm_producer(config)
}

#[test]
fn a_consumer_on_this_host_is_served_over_shared_memory() {
    let (p, c) = common::tcp_with_shm_pair(config);
    save_then_load(&p, &c);
    assert_eq!(paths(&p), (1, 0));
    assert!(p.prometheus().contains("kv_same_host_loads_total 1"));
}

#[test]
fn a_consumer_without_shm_is_served_over_tcp() {
    let p = mixed_producer();
    let c = Instance::tcp(
        config(KvRole::Consumer),
        TcpConfig::with_engine_id(2),
        None,
        p.control_addr(),
    )
    .unwrap();
    save_then_load(&p, &c);
    assert_eq!(paths(&p), (0, 0));
}

#[test]
fn a_consumer_on_another_host_is_served_over_tcp() {
    // The consumer's own runtime for its TCP node, kept until the connector is gone.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let p = mixed_producer();
    let cfg = config(KvRole::Consumer);
    let mut tcp = TcpConfig::with_engine_id(2);
    tcp.namespace = Namespace {
        weight_version: 0,
        ..cfg.namespace.clone()
    };
    let main = Arc::new(rt.block_on(TcpNode::start(tcp)).unwrap());
    let shm = ShmNode::start(ShmConfig::new(2, Some(fresh_socket("elsewhere")))).unwrap();
    let same_host = SameHostTransport::on_host(Arc::new(shm), "another-host");
    let c = Instance::over_with_same_host(cfg, main, same_host, None, p.control_addr()).unwrap();
    save_then_load(&p, &c);
    assert_eq!(paths(&p), (0, 0), "another host is never dialled over shm");
    drop(c);
}

#[test]
fn a_same_host_endpoint_that_cannot_be_dialled_falls_back_to_tcp() {
    let p = mixed_producer();
    let socket = fresh_socket("gone");
    let c = Instance::tcp_with_shm(
        config(KvRole::Consumer),
        TcpConfig::with_engine_id(2),
        ShmConfig::new(2, Some(socket.clone())),
        None,
        p.control_addr(),
    )
    .unwrap();
    // Same host by name, yet unreachable there (as from another container of the same kernel).
    std::fs::remove_file(&socket).unwrap();
    save_then_load(&p, &c);
    assert_eq!(paths(&p), (0, 1));
}

#[test]
fn this_host_names_the_boot_and_the_host_name() {
    let host = connector::this_host();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert!(host.starts_with(boot.trim()), "{host}");
    assert_eq!(host, connector::this_host(), "stable within a process");
}
