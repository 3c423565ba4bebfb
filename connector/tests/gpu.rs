//! KV caches in GPU memory: without GPU support (or without a driver) they are refused at registration with
//! the reason; with a GPU, a producer saves from its GPU KV caches into its host tier store and a consumer
//! loads into its own GPU KV caches, byte-identical (ignored: needs a GPU; `scripts/gpu-check.sh` runs it).
#![allow(unsafe_code)] // one fixture: host bytes presented as GPU memory, never dereferenced.

use connector::{ConnectorConfig, KvConnector, Role, namespace};
use transfer_engine::{MemoryKind, MemoryRegion, RawMemory};

const LAYERS: u32 = 2;
const BLOCK: u64 = 4096;
const POOL: u32 = 16;

fn pair() -> (KvConnector, KvConnector) {
    let mut p = ConnectorConfig::new(Role::Producer, namespace("m", 7, 16));
    (p.layers, p.block_bytes, p.store_blocks) = (LAYERS, BLOCK, 16);
    let c = ConnectorConfig {
        role: Role::Consumer,
        store_blocks: 0,
        ..p.clone()
    };
    KvConnector::loopback_pair(p, c).unwrap()
}

fn pool_bytes() -> usize {
    (u64::from(LAYERS) * u64::from(POOL) * BLOCK) as usize
}

/// Host bytes that claim to be memory of GPU 0 (never dereferenced: GPU memory is refused before use).
struct ClaimsToBeGpu(Box<[u8]>);

// SAFETY: the pointer and length are the boxed slice's, which this value owns and never moves or frees while
// it lives; nothing reads or writes through the pointer (kind Device is never dereferenced by the host).
unsafe impl RawMemory for ClaimsToBeGpu {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr().cast_mut()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device { ordinal: 0 }
    }
}

/// Writes a line to stderr past the test harness's capture, so "not run" shows in every run.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[test]
fn gpu_kv_caches_without_a_gpu_are_refused_with_the_reason() {
    #[cfg(feature = "cuda")]
    if backends::cuda::driver_present() {
        say("not run: this machine has a CUDA driver; the fixture is not real GPU memory");
        return;
    }
    let (p, c) = pair();
    for node in [&p, &c] {
        let gpu = MemoryRegion::from_raw_memory(ClaimsToBeGpu(vec![0; pool_bytes()].into()));
        let err = node.register_kv_caches(gpu, POOL).unwrap_err().to_string();
        let why = if cfg!(feature = "cuda") {
            "no CUDA driver"
        } else {
            "feature `cuda`"
        };
        assert!(err.contains("GPU") && err.contains(why), "{err}");
        // Host KV caches still register.
        node.register_kv_caches(MemoryRegion::zeroed(pool_bytes()), POOL)
            .unwrap();
    }
    say("not run: KV caches in GPU memory (no GPU); the refusal was checked");
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn a_consumer_loads_into_gpu_kv_caches_what_a_producer_saved_from_its_own() {
    use backends::cuda::{CopyEngine, DeviceMemory, Gpu, driver_present};
    use connector::{KvRequest, RequestExtras};

    if !driver_present() {
        say("not run: no CUDA driver");
        panic!("not run: no CUDA driver (this test needs a GPU)");
    }
    let gpu = Gpu::open(0).unwrap();
    let bytes = pool_bytes();
    let data: Vec<u8> = (0..bytes).map(|i| (i / 4096 + 1) as u8 ^ i as u8).collect();
    let mut engine = CopyEngine::new(&gpu, 1 << 20).unwrap();
    let src = DeviceMemory::alloc(&gpu, bytes).unwrap().into_region();
    engine
        .copy(
            &MemoryRegion::from_vec(data.clone()),
            0..bytes,
            &src,
            0,
            |_| {},
        )
        .unwrap();
    let dst = DeviceMemory::alloc(&gpu, bytes).unwrap().into_region();
    gpu.zero(&dst, 0..bytes).unwrap();
    let (p, c) = pair();
    p.register_kv_caches(src, POOL).unwrap();
    c.register_kv_caches(dst.clone(), POOL).unwrap();
    let extras = RequestExtras::default();
    let tokens: Vec<u32> = (0..16 * 3 + 1).collect();
    let request = |id| KvRequest {
        id,
        tokens: &tokens,
        extras: &extras,
        external_keys: None,
        transfer_params: None,
    };
    p.get_num_new_matched_tokens(&request("a"), 0).unwrap();
    p.update_state_after_alloc("a", &[0, 1, 2], 0).unwrap();
    p.bind_connector_metadata(p.build_connector_meta());
    for layer in 0..LAYERS {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    let (n, _) = c.get_num_new_matched_tokens(&request("a"), 0).unwrap();
    assert_eq!(n, 48);
    c.update_state_after_alloc("a", &[5, 6, 7], n).unwrap();
    c.bind_connector_metadata(c.build_connector_meta());
    c.start_load_kv().unwrap();
    c.wait_for_all_loads().unwrap();
    assert!(c.failed_blocks().is_empty());
    let back = MemoryRegion::zeroed(bytes);
    engine.copy(&dst, 0..bytes, &back, 0, |_| {}).unwrap();
    let back = back.to_vec().unwrap();
    let at = |layer: u32, block: u32| {
        (u64::from(layer) * u64::from(POOL) + u64::from(block)) as usize * BLOCK as usize
    };
    for layer in 0..LAYERS {
        for (s, d) in [(0, 5), (1, 6), (2, 7)] {
            let (s, d) = (at(layer, s), at(layer, d));
            assert_eq!(&back[d..d + BLOCK as usize], &data[s..s + BLOCK as usize]);
        }
    }
}
