//! One conformance suite for every [`Transport`]: the same test code runs against loopback, TCP, RDMA
//! (libfabric's `tcp` and `shm` providers) and same-host shm. Adding a backend is a fixture and one `conformance!` line.
//!
//! Each backend's fixture builds a sending and a receiving node; the receiver publishes its KV pool as
//! segment `kv` (and a second one, `spare`), the sender reaches it through [`Transport::connect`]. The
//! tests: every mode byte-identical; strided layouts (vLLM's layer- and block-major, K/V apart) block for
//! block; layer streaming within a prefetch window; cancel; bad requests
//! refused with the caller's fault; a receiver that refuses a session; a receiver that dies (recompute, no
//! hang, then refusals until it answers again).

mod common;
#[path = "conformance/pairs.rs"]
mod pairs;

use std::time::Duration;

use backends::{Fault, TransportError};
use transfer_engine::{
    AccessKey, BlockId, Dtype, Event, KvLayout, MemoryRegion, PeerId, SessionId, TransferMode,
    TransferRequest,
};

use pairs::{HANG, Pair, pattern};

fn every_mode_arrives_byte_identical(pair: &Pair) {
    let s = pair.setup();
    for mode in [
        TransferMode::Exclusive,
        TransferMode::Packetized { slice_bytes: 4096 },
        TransferMode::auto(),
    ] {
        s.pool.fill_with(|_, bytes| bytes.fill(0)).unwrap();
        let session = pair.sender.submit(s.request().with_mode(mode)).unwrap();
        pair.delivered(session);
        assert!(
            s.pool.to_vec().unwrap() == s.source,
            "{} {mode:?}: the pool differs from the source",
            pair.sender.backend()
        );
    }
}

/// vLLM 0.33 views of `layers` layers of `(32, 2, 16, 64)` bf16 blocks: layer-major (LBNHC) or block-major
/// (BLNHC) over one buffer.
fn vllm_views(layers: u64, block_major: bool) -> Vec<transfer_engine::TensorView> {
    let block = 2 * 16 * 64;
    (0..layers)
        .map(|l| {
            let (stride, at) = if block_major {
                (block * layers, l * block)
            } else {
                (block, l * 32 * block)
            };
            transfer_engine::TensorView::new(&[32, 2, 16, 64], &[stride, 64, 128, 1], at, 2)
        })
        .collect()
}

/// The older K/V-apart views, `(2, 32, 16, 2, 32)` bf16 per layer, with `gap` elements between K and V.
fn kv_apart_views(layers: u64, gap: u64) -> Vec<transfer_engine::TensorView> {
    let half = 32 * 16 * 2 * 32;
    (0..layers)
        .map(|l| {
            transfer_engine::TensorView::new(
                &[2, 32, 16, 2, 32],
                &[half + gap, 1024, 64, 32, 1],
                l * (2 * half + gap),
                2,
            )
        })
        .collect()
}

/// A block's logical bytes, gathered from its chunks.
fn gather(layout: &KvLayout, bytes: &[u8], block: BlockId) -> Vec<u8> {
    let mut out = Vec::new();
    for (at, len) in layout.chunks(block) {
        out.extend_from_slice(&bytes[at as usize..(at + len) as usize]);
    }
    out
}

fn strided_layouts_arrive_block_for_block(pair: &Pair) {
    let pairs = [
        (
            KvLayout::from_vllm(&vllm_views(3, false), Dtype::Bf16).unwrap(),
            KvLayout::from_vllm(&vllm_views(3, true), Dtype::Bf16).unwrap(),
        ),
        (
            KvLayout::from_kv_apart(&kv_apart_views(3, 0), Dtype::Bf16).unwrap(),
            KvLayout::from_kv_apart(&kv_apart_views(3, 4096), Dtype::Bf16).unwrap(),
        ),
    ];
    let mut regions = Vec::new();
    for (i, (src_layout, dst_layout)) in pairs.iter().enumerate() {
        let source = pattern(src_layout.total_bytes() as usize, i as u8);
        let src = pair
            .sender
            .register_kv_region(*src_layout, MemoryRegion::from_vec(source.clone()))
            .unwrap();
        let pool = MemoryRegion::zeroed(dst_layout.total_bytes() as usize);
        let dst = pair
            .receiver
            .register_kv_region(*dst_layout, pool.clone())
            .unwrap();
        pair.receiver
            .publish_segment(&format!("strided{i}"), dst)
            .unwrap();
        regions.push((src, source, pool));
    }
    let address = pair.receiver.address().expect("a receiver has an address");
    let peer = pair.block_on(pair.sender.connect(&address)).unwrap();
    for (i, ((src_layout, dst_layout), (src, source, pool))) in
        pairs.iter().zip(&regions).enumerate()
    {
        let dst = *peer.segment(&format!("strided{i}")).unwrap();
        for mode in [
            TransferMode::Exclusive,
            TransferMode::Packetized { slice_bytes: 1536 },
            TransferMode::auto(),
        ] {
            pool.fill_with(|_, bytes| bytes.fill(0)).unwrap();
            // Blocks out of order and onto other blocks, as a serving engine's block tables hand them out.
            let req = TransferRequest::blocks(
                peer.peer,
                src,
                vec![5, 6, 7, 0, 31],
                &dst,
                vec![9, 10, 11, 30, 1],
                0..3,
            )
            .unwrap()
            .with_mode(mode)
            .with_deadline(Duration::from_secs(30));
            let session = pair.sender.submit(req).unwrap();
            pair.delivered(session);
            let got = pool.to_vec().unwrap();
            for layer in 0..3 {
                for (s, d) in [(5, 9), (6, 10), (7, 11), (0, 30), (31, 1)] {
                    assert!(
                        gather(src_layout, source, BlockId::new(layer, s))
                            == gather(dst_layout, &got, BlockId::new(layer, d)),
                        "{} {mode:?} pair {i}: layer {layer} block {s} -> {d} differs",
                        pair.sender.backend()
                    );
                }
            }
        }
    }
}

fn layers_stream_within_the_prefetch_window(pair: &Pair) {
    let s = pair.setup();
    let mut events = pair.receiver.subscribe();
    let session = pair
        .sender
        .submit(s.request().with_prefetch_depth(1))
        .unwrap();
    pair.within(pair.receiver.wait_announced(session))
        .expect("the session is announced")
        .unwrap();
    pair.receiver.consume_layer(session, 0).unwrap();
    for layer in 0..2 {
        pair.block_on(pair.receiver.wait_layer(session, layer))
            .unwrap();
        let (got, want) = s.layer_bytes(layer);
        assert!(got == want, "layer {layer} differs");
    }
    // The consumer is still at layer 0: with a depth of 1 nothing of layers 2 and 3 has been sent.
    while let Ok(e) = events.try_recv() {
        if let Event::LayerComplete { layer, .. } = e {
            assert!(
                layer < 2,
                "layer {layer} arrived beyond the prefetch window"
            );
        }
    }
    for layer in 2..4 {
        let (got, _) = s.layer_bytes(layer);
        assert!(
            got.iter().all(|&b| b == 0),
            "bytes of layer {layer} arrived beyond the prefetch window"
        );
    }
    assert!(
        pair.receiver.consume_layer(session, 1).unwrap(),
        "layer 1 is whole"
    );
    for layer in 2..4 {
        pair.receiver.consume_layer(session, layer - 1).unwrap();
        pair.block_on(pair.receiver.wait_layer(session, layer))
            .unwrap();
    }
    pair.delivered(session);
}

fn cancel_hands_back_what_was_not_delivered(pair: &Pair) {
    let s = pair.setup();
    let session = pair.layer_zero_only(&s);
    pair.sender.cancel(session).unwrap();
    let out = pair.block_on(pair.sender.wait(session, HANG)).unwrap();
    // Every block of the layers never written comes back; layer 0's come back too if their
    // acknowledgements were still on the way (the sender counts only what was acknowledged).
    for layer in 1..4 {
        for block in 0..8 {
            assert!(
                out.recompute.contains(&BlockId::new(layer, block)),
                "{layer}/{block} missing from {out:?}"
            );
        }
    }
    assert!(out.recompute.len() <= 4 * 8, "{out:?}");
    let got = pair
        .within(pair.receiver.wait_received(session))
        .expect("the receiver hears of the cancel")
        .unwrap();
    // The receiver verified layer 0: only the others are its to recompute.
    assert!(got.recompute.iter().all(|b| b.layer >= 1), "{got:?}");
    assert!(!got.recompute.is_empty());
    let (got, want) = s.layer_bytes(0);
    assert!(got == want, "layer 0 was delivered before the cancel");
}

fn bad_requests_are_refused_as_the_callers(pair: &Pair) {
    let s = pair.setup();
    let caller = |r: Result<SessionId, TransportError>, what: &str| match r {
        Err(e) => assert_eq!(e.fault(), Fault::Caller, "{what}: {e}"),
        Ok(id) => panic!("{what}: accepted as session {id}"),
    };
    let mut unknown_src = s.src;
    unknown_src.id = transfer_engine::RegionId(9999);
    caller(
        TransferRequest::whole(s.peer.peer, &unknown_src, &s.dst())
            .map_err(TransportError::from)
            .and_then(|r| pair.sender.submit(r)),
        "an unknown source region",
    );
    caller(
        TransferRequest::whole(PeerId(77), &s.src, &s.dst())
            .map_err(TransportError::from)
            .and_then(|r| pair.sender.submit(r)),
        "a peer never reached",
    );
    let unknown = SessionId(0xdead_beef);
    let e = pair.block_on(pair.sender.wait(unknown, HANG)).unwrap_err();
    assert_eq!(e.fault(), Fault::Caller, "{e}");
    let e = pair
        .block_on(pair.receiver.wait_layer(unknown, 0))
        .unwrap_err();
    assert_eq!(e.fault(), Fault::Caller, "{e}");
    let e = pair.sender.cancel(unknown).unwrap_err();
    assert_eq!(e.fault(), Fault::Caller, "{e}");
    let mut unregistered = s.dst();
    unregistered.id = transfer_engine::RegionId(4242);
    let e = pair
        .receiver
        .publish_segment("nowhere", unregistered)
        .unwrap_err();
    assert_eq!(e.fault(), Fault::Caller, "{e}");
    let wrong_kind = match pair.receiver.address() {
        Some(backends::PeerAddress::Loopback) => backends::PeerAddress::Rdma {
            provider: None,
            name: vec![1, 2],
        },
        _ => backends::PeerAddress::Loopback,
    };
    let e = pair.block_on(pair.sender.connect(&wrong_kind)).unwrap_err();
    assert!(
        matches!(e, TransportError::Unsupported { .. }),
        "connecting to {wrong_kind}: {e}"
    );
    // Nothing of the refusals disturbed the pair: a real transfer still arrives.
    let session = pair.sender.submit(s.request()).unwrap();
    pair.delivered(session);
}

fn a_refused_session_reports_every_block(pair: &Pair) {
    let s = pair.setup();
    let mut forged = s.dst();
    forged.key = AccessKey(forged.key.0 ^ 0x5a5a);
    let req = TransferRequest::whole(s.peer.peer, &s.src, &forged)
        .unwrap()
        .with_deadline(Duration::from_secs(30));
    let session = pair.sender.submit(req).unwrap();
    let out = pair.block_on(pair.sender.wait(session, HANG)).unwrap();
    assert_eq!(out.recompute.len(), 4 * 8, "{out:?}");
    assert!(out.reason.is_some(), "{out:?}");
    assert!(
        s.pool.to_vec().unwrap().iter().all(|&b| b == 0),
        "a refused session wrote into the pool"
    );
}

fn a_dead_receiver_ends_its_sessions_with_recompute(pair: &Pair) {
    let s = pair.setup();
    let session = pair.layer_zero_only(&s);
    {
        let _guard = pair.rt.enter();
        pair.receiver.shutdown();
    }
    // The producer goes on writing layers: nobody is there to take them (a backend that noticed the death
    // at once has ended the session already).
    let _ = pair.sender.layers_written(session, 4);
    let out = pair.block_on(pair.sender.wait(session, HANG)).unwrap();
    assert!(!out.recompute.is_empty(), "{out:?}");
    assert!(out.reason.is_some(), "{out:?}");
    let e = pair.sender.submit(s.request()).unwrap_err();
    assert_eq!(e.fault(), Fault::Transport, "{e}");
    assert!(matches!(e, TransportError::Unreachable(_)), "{e}");
}

fn a_dead_sender_ends_its_sessions_at_the_receiver(pair: &Pair) {
    let s = pair.setup();
    let session = pair.layer_zero_only(&s);
    {
        let _guard = pair.rt.enter();
        pair.sender.shutdown();
    }
    // A receiver waiting on a sender that died (one that was only slow to produce would answer).
    let got = pair
        .within(pair.receiver.wait_received(session))
        .expect("the receiver notices its sender die")
        .unwrap();
    assert!(got.reason.is_some(), "{got:?}");
    assert!(got.recompute.iter().all(|b| b.layer >= 1), "{got:?}");
    assert_eq!(got.recompute.len(), 3 * 8, "{got:?}");
    let (got, want) = s.layer_bytes(0);
    assert!(got == want, "layer 0 stays as it was delivered");
}

/// One module per backend with one test per check, each on a fresh pair from `$fixture` (`None`: the
/// fixture printed why it did not run).
macro_rules! conformance {
    ($backend:ident, $fixture:expr) => {
        conformance!(
            @each $backend, $fixture,
            every_mode_arrives_byte_identical,
            strided_layouts_arrive_block_for_block,
            layers_stream_within_the_prefetch_window,
            cancel_hands_back_what_was_not_delivered,
            bad_requests_are_refused_as_the_callers,
            a_refused_session_reports_every_block,
            a_dead_receiver_ends_its_sessions_with_recompute,
            a_dead_sender_ends_its_sessions_at_the_receiver
        );
    };
    (@each $backend:ident, $fixture:expr, $($check:ident),+) => {
        mod $backend {
            use super::*;
            $(
                #[test]
                fn $check() {
                    if let Some(pair) = $fixture {
                        super::$check(&pair);
                    }
                }
            )+
        }
    };
}

conformance!(loopback, pairs::loopback());
#[cfg(target_os = "linux")]
conformance!(shm, pairs::shm());
conformance!(tcp, pairs::tcp());
#[cfg(feature = "rdma")]
conformance!(rdma_tcp, pairs::rdma("tcp", Some("lo")));
#[cfg(feature = "rdma")]
conformance!(rdma_shm, pairs::rdma("shm", None));
