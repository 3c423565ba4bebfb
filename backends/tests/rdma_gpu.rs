//! GPU regions on the RDMA backend: registered with libfabric's CUDA interface (`FI_HMEM`) only on a node
//! that asked for a provider offering it (`RdmaConfig::gpu_memory`); elsewhere refused with a clear error.
//! This machine's `tcp` and `shm` providers are used without a GPU, so only the refusals run here; the GPU
//! path itself needs a GPU and a provider with CUDA support (not run here, and said so).
#![cfg(feature = "rdma")]

mod common;

use backends::rdma::{Provider, RdmaConfig, RdmaNode};
use common::ClaimsToBeGpu;
use transfer_engine::{Dtype, KvLayout, MemoryRegion};

fn config(provider: &str, domain: Option<&str>, gpu_memory: bool) -> RdmaConfig {
    let mut cfg = RdmaConfig::new(1, Provider::Named(provider.into()));
    cfg.domain = domain.map(str::to_owned);
    cfg.gpu_memory = gpu_memory;
    cfg
}

fn gpu_region(len: usize) -> MemoryRegion {
    MemoryRegion::from_raw_memory(ClaimsToBeGpu(vec![0u8; len].into_boxed_slice()))
}

/// Writes a line to stderr past the test harness's capture, so "not run" shows in every run.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[test]
fn a_node_not_opened_for_gpu_memory_refuses_gpu_regions_and_says_what_to_do() {
    let layout = KvLayout::new(1, 2, 4096, 16, Dtype::Bf16).unwrap();
    for (provider, domain) in [("tcp", Some("lo")), ("shm", None)] {
        let node = match RdmaNode::start(config(provider, domain, false)) {
            Ok(node) => node,
            Err(e) => {
                say(&format!("not run: provider {provider} unusable here: {e}"));
                continue;
            }
        };
        let err = node
            .register_kv_region(layout, gpu_region(8192))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("memory of GPU 0")
                && err.contains("FI_HMEM")
                && err.contains("gpu_memory"),
            "{provider}: {err}"
        );
        // The node still serves host memory.
        node.register_kv_region(layout, MemoryRegion::zeroed(8192))
            .unwrap();
    }
}

#[test]
fn asking_for_gpu_memory_finds_a_provider_that_registers_it_or_says_none_does() {
    for (provider, domain) in [("tcp", Some("lo")), ("shm", None)] {
        match RdmaNode::start(config(provider, domain, true)) {
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("FI_HMEM"), "{provider}: {e}");
                say(&format!(
                    "not run: GPU registration over {provider} (this libfabric build offers no FI_HMEM \
                     on it: {e})"
                ));
            }
            Ok(node) => {
                // The provider offers FI_HMEM (libfabric's shm does): a GPU region still needs a GPU.
                let layout = KvLayout::new(1, 2, 4096, 16, Dtype::Bf16).unwrap();
                #[cfg(feature = "cuda")]
                if backends::cuda::driver_present() {
                    say(
                        "not run: this machine has a CUDA driver; the fixture is not real GPU memory",
                    );
                    continue;
                }
                let err = node
                    .register_kv_region(layout, gpu_region(8192))
                    .unwrap_err()
                    .to_string();
                let why = if cfg!(feature = "cuda") {
                    "no CUDA driver"
                } else {
                    "feature `cuda`"
                };
                assert!(err.contains(why), "{provider}: {err}");
                say(&format!(
                    "not run: GPU registration over {provider} (FI_HMEM offered, but no GPU: {err})"
                ));
            }
        }
    }
}

/// GPU to GPU over a provider that registers CUDA memory (`shm` with libfabric's CUDA support, or a NIC's
/// provider given in `TE_GPU_PROVIDER`), byte-identical, every unit checksummed on a host copy.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU and a libfabric provider with FI_HMEM for CUDA"]
fn gpu_regions_move_byte_identical_over_a_provider_that_registers_them() {
    use backends::cuda::{CopyEngine, DeviceMemory, Gpu, driver_present};
    use transfer_engine::{PeerId, TransferMode, TransferRequest};

    if !driver_present() {
        say("not run: no CUDA driver");
        panic!("not run: no CUDA driver (this test needs a GPU)");
    }
    let provider = std::env::var("TE_GPU_PROVIDER").unwrap_or_else(|_| "shm".into());
    let gpu = Gpu::open(0).unwrap();
    let layout = KvLayout::new(2, 8, 1 << 20, 16, Dtype::Bf16).unwrap();
    let len = layout.total_bytes() as usize;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
    let mut engine = CopyEngine::new(&gpu, 4 << 20).unwrap();
    let src_memory = DeviceMemory::alloc(&gpu, len).unwrap().into_region();
    engine
        .copy(
            &MemoryRegion::from_vec(data.clone()),
            0..len,
            &src_memory,
            0,
            |_| {},
        )
        .unwrap();
    let dst_memory = DeviceMemory::alloc(&gpu, len).unwrap().into_region();
    let mut a = config(&provider, None, true);
    a.engine.engine_id = 1;
    let mut b = config(&provider, None, true);
    b.engine.engine_id = 2;
    let (producer, consumer) = (RdmaNode::start(a).unwrap(), RdmaNode::start(b).unwrap());
    let src = producer.register_kv_region(layout, src_memory).unwrap();
    let dst = consumer
        .register_kv_region(layout, dst_memory.clone())
        .unwrap();
    consumer.publish_segment("kv", dst).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let peer: PeerId = rt
        .block_on(producer.connect(consumer.address()))
        .unwrap()
        .peer;
    for mode in [TransferMode::packetized(), TransferMode::Exclusive] {
        gpu.zero(&dst_memory, 0..len).unwrap();
        let req = TransferRequest::whole(peer, &src, &dst)
            .unwrap()
            .with_mode(mode);
        let out = rt
            .block_on(producer.transfer(req, std::time::Duration::from_secs(60)))
            .unwrap();
        assert!(out.recompute.is_empty(), "{mode:?}: {out:?}");
        let back = MemoryRegion::zeroed(len);
        engine.copy(&dst_memory, 0..len, &back, 0, |_| {}).unwrap();
        assert!(back.to_vec().unwrap() == data, "{mode:?}: bytes differ");
    }
}
