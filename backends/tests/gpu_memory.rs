//! GPU memory on the host-only paths: loopback units from GPU memory go through the GPU placer (without a CUDA
//! driver, or without feature `cuda`, each is refused with a clear error and the blocks come back for recompute;
//! nothing is placed), and TCP refuses GPU regions at registration.
//!
//! The moves themselves need a GPU: they are tested by `backends/tests/cuda.rs` (ignored here, run by
//! `scripts/gpu-check.sh`). This test prints "not run" for them.

mod common;

use std::time::Duration;

use backends::loopback::{CONSUMER, LoopbackPair};
use common::ClaimsToBeGpu;
use transfer_engine::{Dtype, KvLayout, MemoryRegion, TransferRequest};

#[test]
fn units_from_gpu_memory_without_a_driver_are_refused_and_recomputed() {
    #[cfg(feature = "cuda")]
    if backends::cuda::driver_present() {
        // The fixture's bytes are host memory: a real driver would be handed a host pointer as a device one.
        eprintln!(
            "not run: this machine has a CUDA driver; the GPU moves are tested by tests/cuda.rs"
        );
        return;
    }
    let pair = LoopbackPair::with_defaults();
    let l = KvLayout::new(2, 4, 64 << 10, 16, Dtype::Bf16).unwrap();
    let len = l.total_bytes() as usize;
    let gpu = MemoryRegion::from_raw_memory(ClaimsToBeGpu(vec![7u8; len].into_boxed_slice()));
    let dst_memory = MemoryRegion::zeroed(len);
    let src = pair.producer().register_kv_region(l, gpu).unwrap();
    let dst = pair
        .consumer()
        .register_kv_region(l, dst_memory.clone())
        .unwrap();
    let req = TransferRequest::whole(CONSUMER, &src, &dst)
        .unwrap()
        .with_deadline(Duration::from_millis(300));
    let out = pair.transfer(req, Duration::from_secs(20)).unwrap();
    assert_eq!(out.recompute.len(), 8, "every block comes back: {out:?}");
    assert!(
        dst_memory.read(0..len).unwrap().iter().all(|&b| b == 0),
        "nothing was placed"
    );
    // The consumer's log says why, as a refusal carrying the device's error.
    let said = pair
        .consumer()
        .log_entries()
        .iter()
        .filter(|e| e.kind == backends::node::LogKind::Refused)
        .filter_map(|e| e.error.as_ref().map(ToString::to_string))
        .find(|e| e.contains("GPU"))
        .unwrap_or_default();
    if cfg!(feature = "cuda") {
        assert!(said.contains("no CUDA driver"), "{said:?}");
        say("not run: GPU placement itself (no CUDA driver); the refusal path was checked");
    } else {
        assert!(said.contains("feature `cuda`"), "{said:?}");
    }
}

/// Writes a line to stderr past the test harness's capture, so "not run" shows in every run.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[test]
fn tcp_refuses_gpu_memory_with_a_clear_error() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let node = backends::tcp::TcpNode::start(backends::tcp::TcpConfig::with_engine_id(9))
            .await
            .unwrap();
        let l = KvLayout::new(1, 1, 4096, 16, Dtype::Bf16).unwrap();
        let gpu = MemoryRegion::from_raw_memory(ClaimsToBeGpu(vec![0u8; 4096].into_boxed_slice()));
        let err = node.register_kv_region(l, gpu).unwrap_err().to_string();
        assert!(
            err.contains("memory of GPU 0") && err.contains("TCP lanes cannot"),
            "{err}"
        );
    });
}
