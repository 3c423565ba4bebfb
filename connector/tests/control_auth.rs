//! The control channel's authentication end to end: a producer with a shared secret serves consumers
//! holding it and no one else, and sends a load only to an engine of the consumer that asked.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use backends::tcp::{Secret, TcpConfig};
use common::raw_control::{answer, connect, frame, handshake};
use common::{Instance, Kv, begin_save, plan_load};
use connector::{ConnectorConfig, KvRole, namespace};
use transfer_engine::MemoryRegion;

const KV: Kv = Kv {
    layers: 2,
    block: 4096,
    pool: 16,
};

fn config(role: KvRole, secret: Option<&str>) -> ConnectorConfig {
    let mut c = ConnectorConfig::new(role, namespace("auth-model", 1, 16));
    (c.layers, c.block_bytes, c.prefetch_depth) = (KV.layers, KV.block, 1);
    c.store_blocks = if role.saves() { 32 } else { 0 };
    c.load_timeout = Duration::from_secs(3);
    c.lookup_timeout = Duration::from_secs(3);
    c.secret = secret.map(Secret::from);
    c
}

/// A producer holding two saved blocks of `tokens`.
fn producer(secret: Option<&str>, tokens: &[u32]) -> Instance {
    let mut tcp = TcpConfig::with_engine_id(1);
    tcp.listen = None;
    let p = Instance::tcp(config(KvRole::Producer, secret), tcp, None, None).unwrap();
    p.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), KV.pool)
        .unwrap();
    assert_eq!(begin_save(&p, "saved", tokens, &[0, 1]), (0, false));
    for layer in 0..KV.layers {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    p.clear_connector_metadata();
    p
}

fn consumer(secret: Option<&str>, engine: u32, producer: &Instance) -> Instance {
    let c = Instance::tcp(
        config(KvRole::Consumer, secret),
        TcpConfig::with_engine_id(engine),
        None,
        producer.control_addr(),
    )
    .unwrap();
    c.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), KV.pool)
        .unwrap();
    c
}

#[test]
fn a_producer_with_a_secret_serves_consumers_holding_it_and_no_one_else() {
    let tokens: Vec<u32> = (0..33).collect();
    let p = producer(Some("cluster-secret"), &tokens);
    let honest = consumer(Some("cluster-secret"), 2, &p);
    assert_eq!(plan_load(&honest, "a", &tokens, &[2, 3]), 32);
    honest.start_load_kv().unwrap();
    honest.wait_for_all_loads().unwrap();
    assert_eq!(honest.failed_blocks(), Vec::<u32>::new());
    // Another secret, or none: the lookup is refused, so nothing is found (a miss, recomputed).
    for (engine, secret) in [(3, Some("guess")), (4, None)] {
        let stranger = consumer(secret, engine, &p);
        assert_eq!(
            plan_load(&stranger, "b", &tokens, &[2, 3]),
            0,
            "a consumer with secret {secret:?} was served"
        );
    }
}

/// A raw control connection that passed the handshake without a secret, claiming `engines`.
fn control_as(addr: SocketAddr, engines: &[u32]) -> TcpStream {
    let mut s = connect(addr);
    let ns = config(KvRole::Consumer, None).lane_namespace().id().0;
    handshake(&mut s, ns, engines);
    s
}

fn load(engine_addr: &str, ns: u64) -> Vec<u8> {
    let head = format!(
        r#"{{"op":"load","ns":{ns},"engine_addr":"{engine_addr}","blocks":[0],"class":1,"request":0,"tp":{{"rank":0,"size":1,"mla":false}}}}"#
    );
    frame(head.as_bytes(), &[0u8; 32])
}

#[test]
fn a_producer_sends_only_to_an_engine_of_the_consumer_that_asked() {
    let tokens: Vec<u32> = (0..33).collect();
    let p = producer(None, &tokens);
    let victim = consumer(None, 2, &p);
    let victim_addr = victim.address().unwrap().to_string();
    let ns = config(KvRole::Consumer, None).namespace.id().0;
    // A stranger claiming engine 7 names the victim's engine address: the producer reaches engine 2
    // there, which is not the asker's, and sends nothing.
    let mut stranger = control_as(p.control_addr().unwrap(), &[7]);
    stranger.write_all(&load(&victim_addr, ns)).unwrap();
    let refused = answer(&mut stranger);
    assert!(
        refused.contains("not an engine of the consumer that asked"),
        "{refused}"
    );
    // Without a secret, an address on another host than the connection's is refused before any dial.
    stranger.write_all(&load("127.0.0.2:9", ns)).unwrap();
    let refused = answer(&mut stranger);
    assert!(refused.contains("without a shared secret"), "{refused}");
    assert_eq!(p.snapshot().bytes_out, 0, "the producer sent KV");
    // The victim's own loads still work.
    assert_eq!(plan_load(&victim, "v", &tokens, &[2, 3]), 32);
    victim.start_load_kv().unwrap();
    victim.wait_for_all_loads().unwrap();
    assert_eq!(victim.failed_blocks(), Vec::<u32>::new());
}
