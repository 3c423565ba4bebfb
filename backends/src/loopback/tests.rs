//! Unit tests of the loopback pair.

use super::*;
use crate::node::LogKind;
use transfer_engine::{Dtype, Event, KvLayout, MemoryRegion, TransferMode};

/// Frames `end` refused, counting repeats.
fn refused(end: &LoopbackNode) -> u64 {
    end.log_entries()
        .iter()
        .filter(|e| e.kind == LogKind::Refused)
        .map(|e| e.times)
        .sum()
}

fn fill(bytes: &mut [u8], seed: u8) {
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8;
    }
}

#[test]
fn small_transfer_arrives_in_each_mode() {
    for mode in [
        TransferMode::Exclusive,
        TransferMode::Packetized { slice_bytes: 1024 },
        TransferMode::auto(),
    ] {
        let pair = LoopbackPair::with_defaults();
        let layout = KvLayout::new(4, 8, 4096, 16, Dtype::F16).unwrap();
        let mut kv = vec![0; layout.total_bytes() as usize];
        fill(&mut kv, 7);
        let src = pair
            .producer()
            .register_kv_region(layout, MemoryRegion::from_vec(kv.clone()))
            .unwrap();
        let dst = pair.consumer().kv_region(layout).unwrap();
        let mut events = pair.consumer().subscribe();
        let req = TransferRequest::whole(CONSUMER, &src, &dst)
            .unwrap()
            .with_mode(mode);
        let out = pair.transfer(req, Duration::from_secs(10)).unwrap();
        assert!(out.recompute.is_empty(), "{mode:?}");
        let received = pair
            .block_on(pair.consumer().wait_received(out.session))
            .unwrap();
        assert!(received.recompute.is_empty());
        assert_eq!(
            pair.consumer().memory(dst.id).unwrap().to_vec().unwrap(),
            kv
        );
        assert_eq!(refused(pair.producer()), 0);
        assert_eq!(refused(pair.consumer()), 0);
        // The close handshake follows completion; then the session is forgotten.
        let start = std::time::Instant::now();
        while pair.producer().live_sessions() > 0 && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pair.producer().live_sessions(), 0);
        let mut layers = 0;
        while let Ok(e) = events.try_recv() {
            layers += usize::from(matches!(e, Event::LayerComplete { .. }));
        }
        assert_eq!(layers, 4);
    }
}

#[test]
fn the_same_memory_on_both_ends_is_refused_at_submit() {
    let pair = LoopbackPair::with_defaults();
    let layout = KvLayout::new(1, 2, 4096, 16, Dtype::F16).unwrap();
    let memory = MemoryRegion::zeroed(layout.total_bytes() as usize);
    let src = pair
        .producer()
        .register_kv_region(layout, memory.clone())
        .unwrap();
    let dst = pair.consumer().register_kv_region(layout, memory).unwrap();
    let req = TransferRequest::whole(CONSUMER, &src, &dst).unwrap();
    let err = pair.submit(req).unwrap_err();
    assert!(err.to_string().contains("same memory"), "{err}");
}
