//! KV caches in GPU memory: without GPU support (or without a driver) they are refused at registration with
//! the reason; with a GPU, a producer saves from its GPU KV caches into its host tier store and a consumer
//! loads into its own GPU KV caches, byte-identical (ignored: needs a GPU; `scripts/gpu-check.sh` runs it).
#![allow(unsafe_code)] // one fixture: host bytes presented as GPU memory, never dereferenced.

mod common;

use common::{Instance, Kv, loopback_pair};
use transfer_engine::{MemoryKind, MemoryRegion, RawMemory};

const KV: Kv = Kv {
    layers: 2,
    block: 4096,
    pool: 16,
};
const POOL: u32 = KV.pool;

fn pair() -> (Instance, Instance) {
    loopback_pair(&KV, 16)
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
        let gpu = MemoryRegion::from_raw_memory(ClaimsToBeGpu(vec![0; KV.pool_bytes()].into()));
        let err = node.register_kv_caches(gpu, POOL).unwrap_err().to_string();
        let why = if cfg!(feature = "cuda") {
            "no CUDA driver"
        } else {
            "feature `cuda`"
        };
        assert!(err.contains("GPU") && err.contains(why), "{err}");
        // Host KV caches still register.
        node.register_kv_caches(MemoryRegion::zeroed(KV.pool_bytes()), POOL)
            .unwrap();
    }
    say("not run: KV caches in GPU memory (no GPU); the refusal was checked");
}

/// With a GPU: KV caches in GPU memory on every path the connector has.
#[cfg(feature = "cuda")]
mod with_gpu {
    use backends::cuda::{CopyEngine, DeviceMemory, Gpu, driver_present};
    use backends::tcp::TcpConfig;
    use connector::{ConnectorConfig, KvRole};
    use transfer_engine::MemoryRegion;

    use super::common::{Instance, begin_save, plan_load, tcp_pair};
    use super::{KV, POOL, pair, say};

    const LAYERS: u32 = KV.layers;
    const BLOCK: u64 = KV.block;

    struct Setup {
        gpu: Gpu,
        engine: CopyEngine,
        data: Vec<u8>,
    }

    fn setup() -> Setup {
        if !driver_present() {
            say("not run: no CUDA driver");
            panic!("not run: no CUDA driver (this test needs a GPU)");
        }
        let gpu = Gpu::open(0).unwrap();
        let engine = CopyEngine::new(&gpu, 1 << 20).unwrap();
        let data = (0..KV.pool_bytes())
            .map(|i| (i / 4096 + 1) as u8 ^ i as u8)
            .collect();
        Setup { gpu, engine, data }
    }

    impl Setup {
        /// GPU KV caches holding `data` (or zeroes).
        fn kv(&mut self, filled: bool) -> MemoryRegion {
            let kv = DeviceMemory::alloc(&self.gpu, KV.pool_bytes())
                .unwrap()
                .into_region();
            if filled {
                let host = MemoryRegion::from_vec(self.data.clone());
                self.engine
                    .copy(&host, 0..KV.pool_bytes(), &kv, 0, |_| {})
                    .unwrap();
            } else {
                self.gpu.zero(&kv, 0..KV.pool_bytes()).unwrap();
            }
            kv
        }

        /// Checks that blocks `to` of `kv` hold blocks `from` of `data`, every layer.
        fn check(&mut self, kv: &MemoryRegion, from: &[u32], to: &[u32], what: &str) {
            let back = MemoryRegion::zeroed(KV.pool_bytes());
            self.engine
                .copy(kv, 0..KV.pool_bytes(), &back, 0, |_| {})
                .unwrap();
            let back = back.to_vec().unwrap();
            for layer in 0..LAYERS {
                for (&s, &d) in from.iter().zip(to) {
                    assert!(
                        back[KV.block_range(layer, d)] == self.data[KV.block_range(layer, s)],
                        "{what}: layer {layer} block {d} differs"
                    );
                }
            }
        }
    }

    /// Saves blocks 0-2 on `p` (from its GPU KV caches into its host store), then loads them on `c` into
    /// blocks 5-7 of its KV caches.
    fn save_then_load(p: &Instance, c: &Instance, tokens: &[u32]) {
        begin_save(p, "a", tokens, &[0, 1, 2]);
        for layer in 0..LAYERS {
            p.save_kv_layer(layer).unwrap();
        }
        p.wait_for_save().unwrap();
        p.clear_connector_metadata();
        p.request_finished("a");
        assert_eq!(plan_load(c, "b", tokens, &[5, 6, 7]), 48);
        c.start_load_kv().unwrap();
        c.wait_for_all_loads().unwrap();
        assert!(c.failed_blocks().is_empty());
    }

    fn config(role: KvRole) -> ConnectorConfig {
        let mut c = ConnectorConfig::new(role, connector::namespace("m", 7, 16));
        (c.layers, c.block_bytes) = (LAYERS, BLOCK);
        c.store_blocks = if role.saves() { 16 } else { 0 };
        c
    }

    #[test]
    #[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
    fn gpu_kv_caches_save_and_load_over_loopback_tcp_and_an_own_store() {
        let mut s = setup();
        let tokens: Vec<u32> = (0..16 * 3 + 1).collect();

        // Loopback: saves copy GPU to the host store, loads land through the loopback GPU placer.
        let (p, c) = pair();
        let (src, dst) = (s.kv(true), s.kv(false));
        p.register_kv_caches(src, POOL).unwrap();
        c.register_kv_caches(dst.clone(), POOL).unwrap();
        save_then_load(&p, &c, &tokens);
        s.check(&dst, &[0, 1, 2], &[5, 6, 7], "loopback");

        // TCP: loads land in the consumer's GPU KV caches through the lanes' pinned staging.
        let (p, c) = tcp_pair(config);
        let (src, dst) = (s.kv(true), s.kv(false));
        p.register_kv_caches(src, POOL).unwrap();
        c.register_kv_caches(dst.clone(), POOL).unwrap();
        save_then_load(&p, &c, &tokens);
        s.check(&dst, &[0, 1, 2], &[5, 6, 7], "tcp");

        // Both roles in one connector: a later request's blocks come back from its own store, host to GPU.
        let both = Instance::tcp(
            config(KvRole::Both),
            TcpConfig::with_engine_id(3),
            None,
            None,
        )
        .unwrap();
        let kv = s.kv(true);
        both.register_kv_caches(kv.clone(), POOL).unwrap();
        save_then_load(&both, &both, &tokens);
        s.check(&kv, &[0, 1, 2], &[5, 6, 7], "own store");
    }
}
