//! Lookups over the control channel (TCP on loopback): every candidate asked at once, each for at most
//! `lookup_timeout`; a silent peer costs a lookup that timeout, unless a quicker one holds the whole prompt.
//! With the cluster index (a real `redis-server` the tests start), only the holders it names are asked.

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use backends::tcp::TcpConfig;
use cluster::local_redis::LocalRedis;
use cluster::{IndexClient, IndexConfig};
use common::{Instance, Kv, begin_save, request, returns, tcp_producer};
use connector::{ConnectorConfig, KvRole, RequestExtras, ScopedKey, namespace};
use transfer_engine::MemoryRegion;

const KV: Kv = Kv {
    layers: 2,
    block: 4096,
    pool: 16,
};

fn config(role: KvRole) -> ConnectorConfig {
    let mut c = ConnectorConfig::new(role, namespace("test-model", 1, 16));
    (c.layers, c.block_bytes) = (KV.layers, KV.block);
    c.store_blocks = if role.saves() { 64 } else { 0 };
    c
}

/// A peer that accepts a connection and never answers.
fn silent_peer() -> (SocketAddr, JoinHandle<std::io::Result<TcpStream>>) {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    (
        addr,
        std::thread::spawn(move || silent.accept().map(|(s, _)| s)),
    )
}

/// A consumer asking `peers` (in this order), each lookup given `timeout`.
fn consumer(peers: Vec<SocketAddr>, timeout: Duration) -> Instance {
    let mut cfg = config(KvRole::Consumer);
    cfg.lookup_timeout = timeout;
    let c = Instance::tcp(cfg, TcpConfig::with_engine_id(2), None, None).unwrap();
    c.scheduler.set_peers(peers);
    c
}

/// A producer that has saved blocks `0..n` of `tokens`.
fn producer_holding(tokens: &[u32], n: u32) -> Instance {
    let p = tcp_producer(config);
    p.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), KV.pool)
        .unwrap();
    let blocks: Vec<u32> = (0..n).collect();
    begin_save(&p, "made", &tokens[..n as usize * 16], &blocks);
    for layer in 0..KV.layers {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    p.clear_connector_metadata();
    p
}

fn lookup(c: Instance, tokens: Vec<u32>) -> (Instance, (usize, bool)) {
    returns("a lookup", c, move |c| {
        let extras = RequestExtras::default();
        c.get_num_new_matched_tokens(&request("ask", &tokens, &extras), 0)
            .unwrap()
    })
}

#[test]
fn a_producer_that_never_answers_costs_a_lookup_its_timeout_not_a_hang() {
    let (silent, hold) = silent_peer();
    let c = consumer(vec![silent], Duration::from_millis(300));
    // The lookup's timeout is what ends it (the error names it): nothing found, the prompt computed;
    // the guard only catches a hang.
    let (c, found) = lookup(c, (0..40).collect());
    assert_eq!(found, (0, false));
    let errors = c.scheduler.take_lookup_errors();
    assert!(
        errors
            .iter()
            .any(|e| e.to_string().contains("no answer to a lookup within 300ms")),
        "{errors:?}"
    );
    drop(hold.join());
}

#[test]
fn an_idle_step_waits_for_a_running_lookup_up_to_its_limit_and_no_longer_than_it_runs() {
    let extras = RequestExtras::default();
    let tokens: Vec<u32> = (0..40).collect();
    // No lookup runs: no wait.
    let c = consumer(Vec::new(), Duration::from_secs(1));
    let started = Instant::now();
    c.scheduler.wait_for_lookups(Duration::from_secs(20));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // A lookup at a silent peer runs for its timeout: a wait lasts its own limit.
    let (silent, hold) = silent_peer();
    let c = consumer(vec![silent], Duration::from_secs(3));
    let asked = c
        .scheduler
        .get_num_new_matched_tokens(&request("r", &tokens, &extras), 0);
    assert!(asked.unwrap().is_none(), "the lookup should be running");
    let started = Instant::now();
    c.scheduler.wait_for_lookups(Duration::from_millis(100));
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
    assert!(c.scheduler.lookup_running("r"));
    // A longer wait ends when the lookup does (its 3 s timeout), not at the wait's limit.
    let started = Instant::now();
    c.scheduler.wait_for_lookups(Duration::from_secs(60));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(!c.scheduler.lookup_running("r"));
    drop(hold.join());
}

#[test]
fn a_producer_holding_the_whole_prompt_ends_the_lookup_without_the_silent_one() {
    let tokens: Vec<u32> = (500..500 + 3 * 16 + 1).collect();
    let p = producer_holding(&tokens, 3);
    let (silent, hold) = silent_peer();
    // The silent peer is asked first, and would be waited for a minute.
    let c = consumer(
        vec![silent, p.control_addr().unwrap()],
        Duration::from_secs(60),
    );
    let started = Instant::now();
    let (c, found) = lookup(c, tokens);
    assert_eq!(found, (48, false));
    // Not the minute: the answer came as soon as the producer said it holds every block.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(c.scheduler.take_lookup_errors().is_empty());
    drop(c);
    drop(hold.join());
}

#[test]
fn a_producer_holding_part_of_the_prompt_waits_for_the_others() {
    let tokens: Vec<u32> = (900..900 + 3 * 16 + 1).collect();
    let p = producer_holding(&tokens, 2);
    let (silent, hold) = silent_peer();
    // The silent peer might hold more: it is given its timeout, then the producer's two blocks win.
    let c = consumer(
        vec![p.control_addr().unwrap(), silent],
        Duration::from_millis(300),
    );
    let (c, found) = lookup(c, tokens);
    assert_eq!(found, (32, false));
    let errors = c.scheduler.take_lookup_errors();
    assert!(
        errors
            .iter()
            .any(|e| e.to_string().contains("within 300ms")),
        "{errors:?}"
    );
    drop(hold.join());
}

/// An index client of the test's Redis, to watch what producers published.
fn watcher(url: &str) -> IndexClient {
    let mut cfg = IndexConfig::new(url, "watcher");
    cfg.timeout = Duration::from_secs(2);
    IndexClient::new(cfg).unwrap()
}

/// Waits (at most 20 s) until the index says `producer` holds `blocks` leading blocks of `keys`.
fn published(url: &str, keys: &[ScopedKey], producer: &Instance, blocks: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let watch = watcher(url);
    let name = producer.control_addr().unwrap().to_string();
    let tier_keys: Vec<_> = keys.iter().map(ScopedKey::tier_key).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = rt.block_on(watch.lookup(keys[0].ns, &tier_keys));
        if found.as_ref().is_ok_and(|f| f.held_by(&name) == blocks) {
            return;
        }
        assert!(Instant::now() < deadline, "never published: {found:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn prompt_keys(c: &Instance, tokens: &[u32]) -> Vec<ScopedKey> {
    let extras = RequestExtras::default();
    c.request_keys(&request("keys", tokens, &extras))
}

#[test]
fn with_the_index_a_lookup_asks_the_holder_it_names_and_not_the_peers() {
    let redis = LocalRedis::start().unwrap();
    // Three usable blocks; the holder has two, so a lookup asking anyone else would wait for them.
    let tokens: Vec<u32> = (1300..1300 + 3 * 16 + 1).collect();
    let holder = producer_holding_published(&tokens, 2, &redis.url());
    // A peer that listens and never answers: listed, but the index does not name it, so it is never
    // asked (asked, it would cost the lookup its 20 s timeout).
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = consumer(vec![silent.local_addr().unwrap()], Duration::from_secs(20));
    c.scheduler
        .use_index(IndexConfig::new(redis.url(), ""))
        .unwrap();
    let keys = prompt_keys(&c, &tokens);
    published(&redis.url(), &keys, &holder, 2);
    let started = Instant::now();
    let (c, found) = lookup(c, tokens);
    assert_eq!(found, (32, false));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(c.scheduler.take_lookup_errors().is_empty());
    // What an operator watches: the lookup answered by the index, the holder's publishes.
    let seen = c.scheduler.snapshot();
    assert_eq!((seen.index_lookups, seen.index_lookup_failures), (1, 0));
    assert!(
        c.scheduler
            .prometheus()
            .contains("kv_index_lookups_total 1\n")
    );
    let holder_seen = holder.snapshot();
    assert!(holder_seen.index_published >= 2, "{holder_seen:?}");
    assert_eq!(holder_seen.index_publish_dropped, 0);
    assert!(holder.prometheus().contains("kv_index_published_total"));
}

#[test]
fn without_an_answer_from_the_index_a_lookup_asks_the_peers() {
    // An index where nothing listens: the lookup asks whom it would without one.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", dead.local_addr().unwrap());
    drop(dead);
    let tokens: Vec<u32> = (1700..1700 + 2 * 16 + 1).collect();
    let p = producer_holding(&tokens, 2);
    let c = consumer(vec![p.control_addr().unwrap()], Duration::from_secs(5));
    c.scheduler.use_index(IndexConfig::new(url, "")).unwrap();
    let (c, found) = lookup(c, tokens);
    assert_eq!(found, (32, false));
    assert_eq!(c.scheduler.snapshot().index_lookup_failures, 1);
    assert!(
        c.scheduler
            .prometheus()
            .contains("kv_index_lookup_failures_total 1\n")
    );
}

/// A producer that has saved blocks `0..n` of `tokens`, publishing to the index at `url`.
fn producer_holding_published(tokens: &[u32], n: u32, url: &str) -> Instance {
    let p = tcp_producer(config);
    p.worker
        .publish_to_index(IndexConfig::new(url, ""))
        .unwrap();
    p.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), KV.pool)
        .unwrap();
    let blocks: Vec<u32> = (0..n).collect();
    begin_save(&p, "made", &tokens[..n as usize * 16], &blocks);
    for layer in 0..KV.layers {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    p.clear_connector_metadata();
    p
}
