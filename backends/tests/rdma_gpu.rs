//! GPU regions on the RDMA backend: registered in place with libfabric's CUDA interface (`FI_HMEM`) on a node
//! that asked for a provider offering it (`RdmaConfig::gpu_memory`), staged through host mirrors elsewhere.
//! Here (no GPU) the refusals run, and the mirror path runs over host regions (the default); the GPU
//! paths need a GPU (not run here, and said so).
#![cfg(feature = "rdma")]

mod common;

use backends::rdma::{Provider, RdmaConfig, RdmaNode};
use common::{ClaimsToBeGpu, on_listed_provider, rdma_provider_listed, say};
use transfer_engine::{Dtype, KvLayout, MemoryRegion, TransferMode, TransferRequest};

fn config(provider: &str, domain: Option<&str>, gpu_memory: bool) -> RdmaConfig {
    let mut cfg = RdmaConfig::new(1, Provider::Named(provider.into()));
    cfg.domain = domain.map(str::to_owned);
    cfg.gpu_memory = gpu_memory;
    cfg
}

fn gpu_region(len: usize) -> MemoryRegion {
    MemoryRegion::from_raw_memory(ClaimsToBeGpu(vec![0u8; len].into_boxed_slice()))
}

/// A producer (engine 1) and a consumer (engine 2) on `cfg`'s provider, connected, with `src` and `dst`
/// registered; moves the whole region in each mode, calling `clear` before and `check` after each.
fn each_mode_through(
    cfg: &RdmaConfig,
    layout: KvLayout,
    src: MemoryRegion,
    dst: MemoryRegion,
    mut clear: impl FnMut(),
    mut check: impl FnMut(TransferMode),
) -> Result<(), backends::TransportError> {
    let start = |id: u32| {
        let mut cfg = cfg.clone();
        cfg.engine.engine_id = id;
        RdmaNode::start(cfg)
    };
    let (producer, consumer) = (start(1)?, start(2)?);
    let src = producer.register_kv_region(layout, src).unwrap();
    let dst = consumer.register_kv_region(layout, dst).unwrap();
    consumer.publish_segment("kv", dst).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let peer = rt
        .block_on(producer.connect(consumer.address()))
        .unwrap()
        .peer;
    for mode in [TransferMode::packetized(), TransferMode::Exclusive] {
        clear();
        let req = TransferRequest::whole(peer, &src, &dst)
            .unwrap()
            .with_mode(mode);
        let out = rt
            .block_on(producer.transfer(req, std::time::Duration::from_secs(60)))
            .unwrap();
        assert!(
            out.recompute.is_empty(),
            "{} {mode:?}: {out:?}",
            cfg.provider
        );
        check(mode);
    }
    Ok(())
}

/// What a GPU region is refused for on this machine: no GPU support in the build, or no driver.
fn no_gpu_here() -> &'static str {
    if cfg!(feature = "cuda") {
        "no CUDA driver"
    } else {
        "feature `cuda`"
    }
}

#[test]
fn without_a_gpu_a_gpu_region_is_refused_with_the_reason_and_host_memory_still_works() {
    #[cfg(feature = "cuda")]
    if backends::cuda::driver_present() {
        say("not run: this machine has a CUDA driver; the fixture is not real GPU memory");
        return;
    }
    let layout = KvLayout::new(1, 2, 4096, 16, Dtype::Bf16).unwrap();
    for (provider, domain) in [("tcp", Some("lo")), ("shm", None)] {
        let Some(node) = on_listed_provider(provider, domain, || {
            RdmaNode::start(config(provider, domain, false))
        }) else {
            continue;
        };
        let err = node
            .register_kv_region(layout, gpu_region(8192))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("GPU 0") && err.contains(no_gpu_here()),
            "{provider}: {err}"
        );
        node.register_kv_region(layout, MemoryRegion::zeroed(8192))
            .unwrap();
    }
}

/// Host regions staged through mirrors (`HostMemoryAccess::Mirrored`, the default), the path GPU regions take on providers
/// without `FI_HMEM`: the peer writes into the receiver's mirror, so the destination region holds the
/// bytes only if each unit was copied out of the mirror before it was reported.
#[test]
fn staged_regions_move_through_their_mirrors_byte_identical() {
    let layout = KvLayout::new(2, 8, 256 << 10, 16, Dtype::Bf16).unwrap();
    let len = layout.total_bytes() as usize;
    let data: Vec<u8> = (0..len).map(|i| (i * 13 + i / 4099) as u8).collect();
    for (provider, domain) in [("tcp", Some("lo")), ("shm", None)] {
        if !rdma_provider_listed(provider, domain) {
            continue;
        }
        let mut cfg = config(provider, domain, false);
        cfg.host_memory = backends::rdma::HostMemoryAccess::Mirrored;
        let pool = MemoryRegion::zeroed(len);
        let moved = each_mode_through(
            &cfg,
            layout,
            MemoryRegion::from_vec(data.clone()),
            pool.clone(),
            || pool.fill_with(|_, b| b.fill(0)).unwrap(),
            |mode| {
                assert!(
                    pool.to_vec().unwrap() == data,
                    "{provider} {mode:?}: the destination differs from the source"
                );
            },
        );
        if let Err(e) = moved {
            panic!("libfabric lists {provider} here, but its nodes cannot start: {e}");
        }
    }
}

#[test]
fn asking_for_gpu_memory_finds_a_provider_that_registers_it_or_says_none_does() {
    for (provider, domain) in [("tcp", Some("lo")), ("shm", None)] {
        // The provider must be listed at all for its answer to say anything about FI_HMEM.
        if !rdma_provider_listed(provider, domain) {
            continue;
        }
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
                assert!(err.contains(no_gpu_here()), "{provider}: {err}");
                say(&format!(
                    "not run: GPU registration over {provider} (FI_HMEM offered, but no GPU: {err})"
                ));
            }
        }
    }
}

/// GPU to GPU, byte-identical, every unit checksummed on a host copy: through host mirrors on the `tcp`
/// provider (no `FI_HMEM`), and registered in place on a provider that offers `FI_HMEM` for CUDA (`shm`, or
/// a NIC's provider named in `TE_GPU_PROVIDER`).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU (and, for the in-place half, a libfabric provider with FI_HMEM for CUDA)"]
fn gpu_regions_move_byte_identical_staged_and_in_place() {
    use backends::cuda::{CopyEngine, DeviceMemory, Gpu, driver_present};

    if !driver_present() {
        say("not run: no CUDA driver");
        panic!("not run: no CUDA driver (this test needs a GPU)");
    }
    let in_place = std::env::var("TE_GPU_PROVIDER").unwrap_or_else(|_| "shm".into());
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
    for (provider, domain, gpu_memory) in [("tcp", Some("lo"), false), (&*in_place, None, true)] {
        let moved = each_mode_through(
            &config(provider, domain, gpu_memory),
            layout,
            src_memory.clone(),
            dst_memory.clone(),
            || gpu.zero(&dst_memory, 0..len).unwrap(),
            |mode| {
                let back = MemoryRegion::zeroed(len);
                engine.copy(&dst_memory, 0..len, &back, 0, |_| {}).unwrap();
                assert!(
                    back.to_vec().unwrap() == data,
                    "{provider} {mode:?}: bytes differ"
                );
            },
        );
        if let Err(e) = moved {
            say(&format!(
                "not run: {provider} with FI_HMEM {gpu_memory}: {e}"
            ));
            assert!(gpu_memory, "the staged half must run: {e}");
        }
    }
}
