//! What the connector's test files share: the shape of their KV caches, and the scheduler's steps that
//! start a save and a load.
#![allow(dead_code)] // each test file uses part of it

pub(crate) mod instance;
pub(crate) mod raw_control;

use std::ops::Range;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use backends::tcp::TcpConfig;
use connector::{ConnectorConfig, KvRequest, KvRole, RequestExtras, namespace};
pub(crate) use instance::Instance;
use transfer_engine::MemoryRegion;

/// KV caches of `layers` layers of `pool` blocks of `block` bytes, layer-major.
pub(crate) struct Kv {
    pub(crate) layers: u32,
    pub(crate) block: u64,
    pub(crate) pool: u32,
}

impl Kv {
    /// Bytes of the whole KV caches.
    pub(crate) const fn pool_bytes(&self) -> usize {
        (self.layers as u64 * self.pool as u64 * self.block) as usize
    }

    /// Where block `block` of layer `layer` lies in the KV caches.
    pub(crate) fn block_range(&self, layer: u32, block: u32) -> Range<usize> {
        let at =
            ((u64::from(layer) * u64::from(self.pool) + u64::from(block)) * self.block) as usize;
        at..at + self.block as usize
    }

    /// A copy of block `block` of layer `layer` of `memory`.
    pub(crate) fn block_bytes(&self, memory: &MemoryRegion, layer: u32, block: u32) -> Vec<u8> {
        memory
            .read(self.block_range(layer, block))
            .unwrap()
            .to_vec()
    }
}

/// Waits for each layer of the consumer's planned loads in turn and checks, as soon as the layer is whole,
/// that block `dst_blocks[i]` of it holds what block `src_first + i` of that layer holds at the producer.
pub(crate) fn wait_each_layer_and_check(
    kv: &Kv,
    c: &Instance,
    src: &MemoryRegion,
    dst: &MemoryRegion,
    src_first: u32,
    dst_blocks: &[u32],
) {
    for layer in 0..kv.layers {
        c.wait_for_layer_load(layer).unwrap();
        // Layer `layer` is whole now: the consumer could compute it.
        for (i, &b) in dst_blocks.iter().enumerate() {
            assert!(
                dst.read(kv.block_range(layer, b)).unwrap()[..]
                    == src
                        .read(kv.block_range(layer, src_first + i as u32))
                        .unwrap()[..],
                "layer {layer} block {b}"
            );
        }
    }
}

/// A request for `tokens` with no keys or transfer parameters of the serving engine's.
pub(crate) fn request<'a>(
    id: &'a str,
    tokens: &'a [u32],
    extras: &'a RequestExtras,
) -> KvRequest<'a> {
    KvRequest {
        id,
        tokens,
        extras,
        external_keys: None,
        transfer_params: None,
    }
}

/// The producer's scheduler step that starts saving `id`'s `tokens` from `blocks`, no layer saved yet;
/// returns what its lookup answered (tokens found elsewhere, and whether they load asynchronously).
pub(crate) fn begin_save(p: &Instance, id: &str, tokens: &[u32], blocks: &[u32]) -> (usize, bool) {
    begin_save_held(p, id, tokens, blocks, false)
}

/// As [`begin_save`], the request held for a decode ([`Instance::hold_for_decode`]) when `hold`.
pub(crate) fn begin_save_held(
    p: &Instance,
    id: &str,
    tokens: &[u32],
    blocks: &[u32],
    hold: bool,
) -> (usize, bool) {
    let extras = RequestExtras::default();
    let found = p
        .get_num_new_matched_tokens(&request(id, tokens, &extras), 0)
        .unwrap();
    if hold {
        p.hold_for_decode(id).unwrap();
    }
    p.update_state_after_alloc(id, blocks, 0).unwrap();
    p.bind_connector_metadata(p.build_connector_meta());
    found
}

/// The consumer's scheduler step that plans loading `id`'s `tokens` into `blocks` (the load not yet
/// started); returns the tokens it will load.
pub(crate) fn plan_load(c: &Instance, id: &str, tokens: &[u32], blocks: &[u32]) -> usize {
    let extras = RequestExtras::default();
    let (n, _) = c
        .get_num_new_matched_tokens(&request(id, tokens, &extras), 0)
        .unwrap();
    c.update_state_after_alloc(id, blocks, n).unwrap();
    c.bind_connector_metadata(c.build_connector_meta());
    n
}

/// A producer (holding `store_blocks` in its store) and a consumer of KV caches shaped `kv`, in one
/// process over the loopback backend.
pub(crate) fn loopback_pair(kv: &Kv, store_blocks: u32) -> (Instance, Instance) {
    loopback_pair_with(kv, store_blocks, |_| {})
}

/// As [`loopback_pair`], with the settings both ends share changed by `configure` first.
pub(crate) fn loopback_pair_with(
    kv: &Kv,
    store_blocks: u32,
    configure: impl FnOnce(&mut ConnectorConfig),
) -> (Instance, Instance) {
    let mut p = ConnectorConfig::new(KvRole::Producer, namespace("m", 7, 16));
    (p.layers, p.block_bytes, p.store_blocks) = (kv.layers, kv.block, store_blocks);
    configure(&mut p);
    let mut c = p.clone();
    c.role = KvRole::Consumer;
    c.store_blocks = 0;
    Instance::loopback_pair(p, c).unwrap()
}

/// Only guards a test against a hang: [`returns`] fails a call that has not returned by then. Never a
/// bound the code is expected to come near.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(30);

/// Runs `f(&value)` on a thread of its own and hands back `value` with the result, failing the test if it
/// has not returned within [`HANG_GUARD`] (the thread is then left blocked) and passing on its panic.
pub(crate) fn returns<T: Send + 'static, R: Send + 'static>(
    what: &str,
    value: T,
    f: impl FnOnce(&T) -> R + Send + 'static,
) -> (T, R) {
    let (tx, rx) = mpsc::channel();
    let call = std::thread::spawn(move || {
        let out = f(&value);
        let _ = tx.send((value, out));
    });
    match rx.recv_timeout(HANG_GUARD) {
        Ok(out) => out,
        Err(RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(call.join().expect_err("it ended without an answer"))
        }
        Err(RecvTimeoutError::Timeout) => panic!("{what} did not return within {HANG_GUARD:?}"),
    }
}

/// A producer over TCP on this host (engine 1, dialing only), configured by `config`.
pub(crate) fn tcp_producer(config: impl Fn(KvRole) -> ConnectorConfig) -> Instance {
    Instance::tcp(
        config(KvRole::Producer),
        {
            let mut cfg = TcpConfig::with_engine_id(1);
            cfg.listen = None;
            cfg
        },
        None,
        None,
    )
    .unwrap()
}

/// A producer and a consumer over TCP on this host, each configured by `config` for its role; the consumer
/// knows the producer's control address.
pub(crate) fn tcp_pair(config: impl Fn(KvRole) -> ConnectorConfig) -> (Instance, Instance) {
    let producer = tcp_producer(&config);
    let consumer = Instance::tcp(
        config(KvRole::Consumer),
        TcpConfig::with_engine_id(2),
        None,
        producer.control_addr(),
    )
    .unwrap();
    (producer, consumer)
}

/// A Unix socket path no other test uses.
#[cfg(target_os = "linux")]
pub(crate) fn fresh_socket(tag: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("connector-{tag}-{}-{n}.sock", std::process::id()))
}

/// A producer over TCP with the same-host backend beside it (engine 1, dialing only), configured by
/// `config`.
#[cfg(target_os = "linux")]
pub(crate) fn tcp_with_shm_producer(config: impl Fn(KvRole) -> ConnectorConfig) -> Instance {
    Instance::tcp_with_shm(
        config(KvRole::Producer),
        {
            let mut cfg = TcpConfig::with_engine_id(1);
            cfg.listen = None;
            cfg
        },
        backends::shm::ShmConfig::new(1, None),
        None,
        None,
    )
    .unwrap()
}

/// A producer and a consumer over TCP with the same-host backend beside it ([`Instance::tcp_with_shm`]),
/// on this host; the consumer's shm node listens and it knows the producer's control address.
#[cfg(target_os = "linux")]
pub(crate) fn tcp_with_shm_pair(
    config: impl Fn(KvRole) -> ConnectorConfig,
) -> (Instance, Instance) {
    use backends::shm::ShmConfig;
    let producer = tcp_with_shm_producer(&config);
    let consumer = Instance::tcp_with_shm(
        config(KvRole::Consumer),
        TcpConfig::with_engine_id(2),
        ShmConfig::new(2, Some(fresh_socket("mixed"))),
        None,
        producer.control_addr(),
    )
    .unwrap();
    (producer, consumer)
}
