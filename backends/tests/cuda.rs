//! GPU memory through the `cuda` feature.
//!
//! On a machine without a CUDA driver only `without_a_driver_every_entry_point_says_so` runs: it checks the
//! clean error path and prints "not run: no CUDA driver" for the GPU part. The GPU tests are `#[ignore]`d
//! so they are never counted as passed where they cannot run; `scripts/gpu-check.sh` runs them on a GPU
//! machine (`cargo test -p backends --features cuda --test cuda -- --include-ignored`), where a missing
//! driver fails them.
#![cfg(feature = "cuda")]

use backends::cuda::{
    BlockCopied, CallerDeviceMemory, CopyEngine, CudaError, DeviceMemory, Gpu, GpuMover,
    PinnedHostMemory, Route, device_count, driver_present, ipc_export,
};
use backends::shm::{ShmConfig, ShmNode};
use backends::staging::Stager;
use transfer_engine::policy::{BlockKey, Tier, TierMove};
use transfer_engine::{MemoryKind, MemoryRegion, RawMemory};

/// The GPU, or a failure that says why there is none (these tests run only when asked for).
fn gpu() -> Gpu {
    if !driver_present() {
        say("not run: no CUDA driver");
        panic!(
            "not run: no CUDA driver (this test needs a GPU; run it through scripts/gpu-check.sh)"
        );
    }
    Gpu::open(0).expect("GPU 0")
}

/// Writes a line to stderr past the test harness's capture, so "not run" shows in every run.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 9) as u8 ^ seed)
        .collect()
}

#[test]
fn without_a_driver_every_entry_point_says_so() {
    if driver_present() {
        say(
            "not run: a CUDA driver is present; the GPU tests (--include-ignored) cover this machine",
        );
        // With a driver, opening GPU 0 either works or says why not, and never claims there is no driver.
        match Gpu::open(0) {
            Ok(gpu) => assert!(!gpu.name().is_empty()),
            Err(e) => assert!(!matches!(e, CudaError::NoDriver), "{e}"),
        }
        return;
    }
    say("not run: no CUDA driver (the GPU tests are ignored); checking the no-driver errors only");
    let open = Gpu::open(0).unwrap_err();
    assert!(matches!(open, CudaError::NoDriver), "{open:?}");
    assert!(open.to_string().contains("no CUDA driver"), "{open}");
    assert!(matches!(device_count(), Err(CudaError::NoDriver)));
    // Nothing GPU-side can be made without a `Gpu`, so every other entry point is behind this one. A host
    // region still works, and refuses device-only use with a clear error rather than a panic.
    let host = MemoryRegion::zeroed(16);
    assert_eq!(host.kind(), MemoryKind::Host);
    // The loopback hook's entry point, handed a GPU region: the driver is looked for before anything else.
    let gpu_region = MemoryRegion::from_raw_memory(NeverTouched);
    let mover = GpuMover::new(4096);
    let placed = mover.place(&host, 0..16, &gpu_region, 0..16).unwrap_err();
    assert!(matches!(placed, CudaError::NoDriver), "{placed:?}");
    let both_host = mover.place(&host, 0..16, &MemoryRegion::zeroed(16), 0..16);
    assert!(matches!(both_host, Err(CudaError::Invalid(_))));
    let uneven = mover.place(&host, 0..16, &gpu_region, 0..8);
    assert!(matches!(uneven, Err(CudaError::Invalid(_))));
    // The same-host backend's CUDA IPC path: exporting, and registering GPU memory on an shm node.
    let export = ipc_export(&gpu_region).unwrap_err();
    assert!(matches!(export, CudaError::NoDriver), "{export:?}");
    assert!(matches!(
        ipc_export(&host),
        Err(CudaError::WrongKind { .. })
    ));
    let node = ShmNode::start(ShmConfig::new(1, None)).unwrap();
    let layout =
        transfer_engine::KvLayout::new(1, 1, 16, 16, transfer_engine::Dtype::Bf16).unwrap();
    let refused = node.register_kv_region(layout, gpu_region).unwrap_err();
    assert!(refused.to_string().contains("no CUDA driver"), "{refused}");
    node.shutdown();
}

/// A GPU region's stand-in for the no-driver test: its address is never used, since without a driver
/// nothing gets as far as a copy.
struct NeverTouched;

// SAFETY: device memory is never dereferenced by the host, and without a driver no copy reaches it; the
// address is a placeholder that nothing uses.
#[allow(unsafe_code)]
unsafe impl RawMemory for NeverTouched {
    fn as_ptr(&self) -> *mut u8 {
        std::ptr::dangling_mut()
    }
    fn len(&self) -> usize {
        16
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device { ordinal: 0 }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn tier_moves_between_gpu_and_host_report_each_block() {
    let gpu = gpu();
    let block = 256 << 10;
    let data = pattern(4 * block, 5);
    let gpu_tier = DeviceMemory::alloc(&gpu, 4 * block).unwrap().into_region();
    let host_tier = MemoryRegion::from_vec(data.clone());
    let back = MemoryRegion::zeroed(4 * block);
    let mover = GpuMover::new(64 << 10);
    // Blocks 0..4 live at slot k of each tier; promote all four, then demote two into `back`.
    let promote: Vec<TierMove> = (0..4)
        .map(|k| TierMove {
            key: BlockKey(k),
            from: Tier::Host,
            to: Some(Tier::Gpu),
        })
        .collect();
    let slot = |k: BlockKey| k.0 as usize * block..(k.0 as usize + 1) * block;
    let mut done = Vec::new();
    mover.run_tier_moves(
        &promote,
        |k, t| {
            Some((
                if t == Tier::Gpu {
                    gpu_tier.clone()
                } else {
                    host_tier.clone()
                },
                slot(k),
            ))
        },
        |m, r| done.push((m.key, r.unwrap().unwrap().crc32c)),
    );
    let expect: Vec<_> = (0..4)
        .map(|k| {
            (
                BlockKey(k),
                Some(transfer_engine::crc32c(&data[slot(BlockKey(k))])),
            )
        })
        .collect();
    assert_eq!(
        done, expect,
        "one report per block, with the CRC of its host bytes"
    );
    let demote = [
        TierMove {
            key: BlockKey(1),
            from: Tier::Gpu,
            to: Some(Tier::Host),
        },
        TierMove {
            key: BlockKey(3),
            from: Tier::Gpu,
            to: None,
        },
    ];
    let mut outcomes = Vec::new();
    mover.run_tier_moves(
        &demote,
        |k, t| {
            Some((
                if t == Tier::Gpu {
                    gpu_tier.clone()
                } else {
                    back.clone()
                },
                slot(k),
            ))
        },
        |m, r| outcomes.push((m.key, r.unwrap().is_some())),
    );
    assert_eq!(
        outcomes,
        [(BlockKey(1), true), (BlockKey(3), false)],
        "a drop is the caller's"
    );
    assert!(back.read(slot(BlockKey(1))).unwrap()[..] == data[slot(BlockKey(1))]);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn every_route_moves_every_byte_and_checksums_host_side_blocks() {
    let gpu = gpu();
    let len = (3 << 20) + 12_345;
    let data = pattern(len, 7);
    let pageable = MemoryRegion::from_vec(data.clone());
    let pinned = PinnedHostMemory::alloc(&gpu, len).unwrap().into_region();
    pinned.copy_from(0, &data).unwrap();
    let dev_a = DeviceMemory::alloc(&gpu, len).unwrap().into_region();
    let dev_b = DeviceMemory::alloc(&gpu, len).unwrap().into_region();
    assert_eq!(dev_a.kind(), MemoryKind::Device { ordinal: 0 });
    assert!(
        dev_a.read(0..1).is_err(),
        "the host never dereferences GPU memory"
    );
    for block in [256 << 10, 1 << 20] {
        let mut engine = CopyEngine::new(&gpu, block).unwrap();
        for (src, staged) in [(&pageable, true), (&pinned, false)] {
            gpu.zero(&dev_a, 0..len).unwrap();
            let mut blocks = Vec::new();
            let report = engine
                .copy(src, 0..len, &dev_a, 0, |b| blocks.push(b))
                .unwrap();
            assert_eq!(report.route, Route::HostToDevice { staged });
            assert_eq!(report.bytes, len as u64);
            assert_eq!(report.crc32c, Some(transfer_engine::crc32c(&data)));
            check_blocks(&blocks, &data, block);
            let back = MemoryRegion::zeroed(len);
            gpu.plain_copy(&dev_a, 0, &back, 0, len).unwrap();
            assert!(
                back.to_vec().unwrap() == data,
                "host to GPU, staged {staged}"
            );
        }
        gpu.zero(&dev_b, 0..len).unwrap();
        let mut blocks = Vec::new();
        let report = engine
            .copy(&dev_a, 0..len, &dev_b, 0, |b| blocks.push(b))
            .unwrap();
        assert_eq!(report.route, Route::DeviceToDevice);
        assert!(
            blocks.iter().all(|b| b.crc32c.is_none()),
            "GPU to GPU is not checksummed"
        );
        for (dst, staged) in [
            (MemoryRegion::zeroed(len), true),
            (
                PinnedHostMemory::alloc(&gpu, len).unwrap().into_region(),
                false,
            ),
        ] {
            let mut blocks = Vec::new();
            let report = engine
                .copy(&dev_b, 0..len, &dst, 0, |b| blocks.push(b))
                .unwrap();
            assert_eq!(report.route, Route::DeviceToHost { staged });
            assert_eq!(report.crc32c, Some(transfer_engine::crc32c(&data)));
            check_blocks(&blocks, &data, block);
            assert!(
                dst.to_vec().unwrap() == data,
                "GPU to host, staged {staged}"
            );
        }
    }
}

fn check_blocks(blocks: &[BlockCopied], data: &[u8], block: usize) {
    assert_eq!(blocks.len(), data.len().div_ceil(block));
    for (i, b) in blocks.iter().enumerate() {
        assert_eq!(b.offset, i * block, "blocks are reported in order");
        let bytes = &data[b.offset..b.offset + b.len];
        assert_eq!(b.crc32c, Some(transfer_engine::crc32c(bytes)), "block {i}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
// Registering caller-owned device memory is `unsafe` by contract; this test is that caller.
#[allow(unsafe_code)]
fn memory_the_serving_engine_owns_is_used_in_place_and_bad_ranges_are_refused() {
    let gpu = gpu();
    let pool = DeviceMemory::alloc(&gpu, 1 << 20).unwrap().into_region();
    let base = pool.address() as u64;
    // SAFETY: `pool` is kept alive as the owner until the borrowed region drops; nothing else writes it.
    let borrowed =
        unsafe { CallerDeviceMemory::new(&gpu, base + 4096, 8192, Some(Box::new(pool.clone()))) }
            .unwrap()
            .into_region();
    let data = pattern(8192, 3);
    let mut engine = CopyEngine::new(&gpu, 4096).unwrap();
    engine
        .copy(
            &MemoryRegion::from_vec(data.clone()),
            0..8192,
            &borrowed,
            0,
            |_| {},
        )
        .unwrap();
    let back = MemoryRegion::zeroed(8192);
    gpu.plain_copy(&pool, 4096, &back, 0, 8192).unwrap();
    assert!(
        back.to_vec().unwrap() == data,
        "the bytes landed in the caller's pool, in place"
    );
    // SAFETY: refused before it could be used: the range runs past the allocation.
    let past = unsafe { CallerDeviceMemory::new(&gpu, base + (1 << 20) - 10, 64 << 20, None) };
    assert!(past.is_err(), "a range past the allocation is refused");
    let out_of_range = engine
        .copy(&back, 0..8192, &borrowed, 1, |_| {})
        .unwrap_err();
    assert!(
        matches!(out_of_range, CudaError::Range { .. }),
        "{out_of_range}"
    );
    let overlap = engine
        .copy(&pool, 0..8192, &pool, 4096, |_| {})
        .unwrap_err();
    assert!(overlap.to_string().contains("overlap"), "{overlap}");
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn the_pinned_stager_round_trips_units_through_the_gpu_with_checksums() {
    let gpu = gpu();
    let unit = 64 << 10;
    let data = pattern(5 * unit + 100, 9);
    let dev = DeviceMemory::alloc(&gpu, data.len()).unwrap().into_region();
    let mut stager = Stager::pinned(&gpu, unit).unwrap();
    // Receive side: socket bytes into pinned buffers, then to the GPU.
    for (i, chunk) in data.chunks(unit).enumerate() {
        let mut landing = stager.receive().unwrap();
        landing.buffer().unwrap()[..chunk.len()].copy_from_slice(chunk);
        let crc = landing.place(&dev, i * unit, chunk.len()).unwrap();
        assert_eq!(crc, transfer_engine::crc32c(chunk));
    }
    stager.flush().unwrap();
    // Send side: GPU bytes out through the pinned buffers, the next unit's copy in flight meanwhile.
    let units: Vec<_> = (0..data.len())
        .step_by(unit)
        .map(|a| a..(a + unit).min(data.len()))
        .collect();
    let mut sent = Vec::new();
    stager.prefetch(&dev, units[0].clone()).unwrap();
    for i in 0..units.len() {
        if let Some(next) = units.get(i + 1) {
            stager.prefetch(&dev, next.clone()).unwrap();
        }
        let staged = stager.take().unwrap();
        assert_eq!(
            staged.crc32c(),
            transfer_engine::crc32c(&data[units[i].clone()])
        );
        sent.extend_from_slice(staged.bytes());
    }
    assert!(sent == data);
    let host = MemoryRegion::zeroed(unit);
    let wrong = stager.prefetch(&host, 0..10).unwrap_err();
    assert!(
        wrong.to_string().contains("needs"),
        "a host source is refused as the wrong kind: {wrong}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn tier_moves_run_as_loopback_sessions_between_gpu_and_host() {
    use backends::loopback::{LoopbackPair, TierRegions};
    use transfer_engine::{Dtype, KvLayout};
    let gpu = gpu();
    let layout = KvLayout::new(2, 4, 256 << 10, 16, Dtype::Bf16).unwrap();
    let len = layout.total_bytes() as usize;
    let data = pattern(len, 9);
    let host = MemoryRegion::from_vec(data.clone());
    let back = MemoryRegion::zeroed(len);
    let pair = LoopbackPair::with_defaults();
    let mut tiers = TierRegions::new();
    let device = DeviceMemory::alloc(&gpu, len).unwrap().into_region();
    tiers.register(&pair, Tier::Gpu, layout, device).unwrap();
    tiers.register(&pair, Tier::Host, layout, host).unwrap();
    tiers
        .register(&pair, Tier::Remote, layout, back.clone())
        .unwrap();
    let moves = |from, to| -> Vec<TierMove> {
        (0..4)
            .map(|k| TierMove {
                key: BlockKey(k),
                from,
                to: Some(to),
            })
            .collect()
    };
    let slot = |k: BlockKey, _| Some(k.0 as u32);
    let timeout = std::time::Duration::from_secs(20);
    for (from, to) in [(Tier::Host, Tier::Gpu), (Tier::Gpu, Tier::Remote)] {
        let reports = pair
            .run_tier_moves(&tiers, &moves(from, to), slot, timeout)
            .unwrap();
        assert!(reports.iter().all(|r| r.result.is_ok()), "{reports:?}");
    }
    // Host to GPU and back out to a third tier: the bytes made the round trip.
    assert!(*back.read(0..len).unwrap() == data[..]);
    say("tier moves as loopback sessions: host -> GPU -> host, byte-identical");
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn tcp_lanes_stage_gpu_regions_on_both_ends_byte_identical() {
    use backends::tcp::{TcpConfig, TcpNode};
    use transfer_engine::{Dtype, KvLayout, PeerId, TransferMode, TransferRequest};

    let gpu = gpu();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // 2 MiB blocks with 1 MiB staging buffers: exclusive units take the two-pass path, slices the
        // pipelined one.
        let layout = KvLayout::new(2, 8, 2 << 20, 16, Dtype::Bf16).unwrap();
        let len = layout.total_bytes() as usize;
        let data = pattern(len, 11);
        let cfg = |id| {
            let mut cfg = TcpConfig::with_engine_id(id);
            cfg.buffers.stage_bytes = 1 << 20;
            cfg
        };
        let tx = TcpNode::start(cfg(1)).await.unwrap();
        let rx = TcpNode::start(cfg(2)).await.unwrap();
        let host_src = MemoryRegion::from_vec(data.clone());
        let gpu_src = DeviceMemory::alloc(&gpu, len).unwrap().into_region();
        let mut engine = CopyEngine::new(&gpu, 4 << 20).unwrap();
        engine.copy(&host_src, 0..len, &gpu_src, 0, |_| {}).unwrap();
        let gpu_dst = DeviceMemory::alloc(&gpu, len).unwrap().into_region();
        let host_dst = MemoryRegion::zeroed(len);
        let sources = [
            tx.register_kv_region(layout, gpu_src).unwrap(),
            tx.register_kv_region(layout, host_src).unwrap(),
        ];
        let gpu_dst_handle = rx.register_kv_region(layout, gpu_dst.clone()).unwrap();
        let host_dst_handle = rx.register_kv_region(layout, host_dst.clone()).unwrap();
        tx.connect(rx.local_addr().unwrap(), None).await.unwrap();
        let peer = PeerId(2);
        // GPU to GPU, GPU to host and host to GPU, in both modes.
        let routes = [
            (&sources[0], &gpu_dst_handle, true),
            (&sources[0], &host_dst_handle, false),
            (&sources[1], &gpu_dst_handle, true),
        ];
        for (src, dst, to_gpu) in routes {
            for mode in [TransferMode::packetized(), TransferMode::Exclusive] {
                let back = MemoryRegion::zeroed(len);
                if to_gpu {
                    gpu.zero(&gpu_dst, 0..len).unwrap();
                } else {
                    host_dst.fill_with(|_, b| b.fill(0)).unwrap();
                }
                let req = TransferRequest::whole(peer, src, dst)
                    .unwrap()
                    .with_mode(mode);
                let out = tx
                    .transfer(req, std::time::Duration::from_secs(60))
                    .await
                    .unwrap();
                assert!(out.recompute.is_empty(), "{mode:?}: {out:?} {:?}", rx.log());
                let arrived = if to_gpu {
                    engine.copy(&gpu_dst, 0..len, &back, 0, |_| {}).unwrap();
                    back
                } else {
                    host_dst.clone()
                };
                assert!(arrived.to_vec().unwrap() == data, "{mode:?}: bytes differ");
            }
        }
        assert!(tx.stats().staged_bytes_sent >= 4 * len as u64);
        assert!(rx.stats().staged_bytes_received >= 4 * len as u64);
    });
}
