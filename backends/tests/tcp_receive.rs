//! The receiving side over real sockets: caller memory on both ends, incoming sessions accepted, layers
//! awaited and consumed one by one with the producer's prefetch window following, and a dead peer that
//! ends its sessions promptly instead of at their deadline.

mod common;

use std::time::Duration;

use backends::tcp::{TcpConfig, TcpNode};
use backends::{IncomingSession, TransportError, WaitError};
use common::pattern;
use tokio::sync::broadcast::error::TryRecvError;
use tokio::time::timeout;
use transfer_engine::{
    BlockId, Dtype, Event, KvLayout, MemoryRegion, TransferMode, TransferRequest,
};

const LIMIT: Duration = Duration::from_secs(60);

fn layout(layers: u32, blocks: u32, block_bytes: u64) -> KvLayout {
    KvLayout::new(layers, blocks, block_bytes, 16, Dtype::Bf16).unwrap()
}

/// Two nodes, each over memory the caller handed it, connected.
async fn nodes(
    l: KvLayout,
    seed: u64,
) -> (
    TcpNode,
    TcpNode,
    MemoryRegion,
    MemoryRegion,
    TransferRequest,
) {
    let tx = TcpNode::start({
        let mut cfg = TcpConfig::with_engine_id(1);
        cfg.listen = None;
        cfg
    })
    .await
    .unwrap();
    let rx = TcpNode::start(TcpConfig::with_engine_id(2)).await.unwrap();
    let len = l.total_bytes() as usize;
    let (src_mem, dst_mem) = (
        MemoryRegion::from_vec(pattern(len, seed)),
        MemoryRegion::zeroed(len),
    );
    let src = tx.register_kv_region(l, src_mem.clone()).unwrap();
    let dst = rx.register_kv_region(l, dst_mem.clone()).unwrap();
    let peer = tx
        .connect(rx.local_addr().unwrap(), None)
        .await
        .unwrap()
        .peer;
    let req = TransferRequest::whole(peer, &src, &dst).unwrap();
    (tx, rx, src_mem, dst_mem, req)
}

fn layer_bytes(memory: &MemoryRegion, l: KvLayout, layer: u32) -> Vec<u8> {
    let start = l.block_offset(BlockId::new(layer, 0)) as usize;
    let len = (l.block_bytes * u64::from(l.blocks_per_layer)) as usize;
    memory.read(start..start + len).unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_stream_into_caller_memory_as_the_consumer_computes_them() {
    let l = layout(8, 16, 64 << 10);
    let (tx, rx, src_mem, dst_mem, req) = nodes(l, 3).await;
    let mut events = rx.subscribe();
    let session = tx
        .submit(
            req.with_prefetch_depth(1)
                .with_mode(TransferMode::packetized()),
        )
        .unwrap();
    let incoming: IncomingSession = timeout(LIMIT, rx.next_incoming()).await.unwrap().unwrap();
    assert_eq!((incoming.session, incoming.peer.0), (session, 1));
    assert_eq!(incoming.layers, 0..8);
    // Nobody consumes yet: the producer may run only its prefetch depth ahead of layer 0, so layers 0 and
    // 1 arrive (waited for; the limit only guards against a hang) and nothing beyond them.
    // Nothing says when a window that let more through would have done so, so this catches such a
    // driver only when it has (most runs, in practice); transfer-engine/tests/shaping.rs checks the
    // engine's window exactly, in virtual time.
    for layer in 0..2 {
        timeout(LIMIT, rx.wait_layer(session, layer))
            .await
            .unwrap_or_else(|_| panic!("layer {layer} is inside the window but never arrived"))
            .unwrap();
    }
    let mut complete = Vec::new();
    loop {
        match events.try_recv() {
            Ok(Event::LayerComplete { layer, .. }) => complete.push(layer),
            Ok(_) | Err(TryRecvError::Lagged(_)) => {}
            Err(_) => break,
        }
    }
    assert!(
        complete.iter().all(|l| *l <= 1),
        "layers beyond the window arrived before they were consumed: {complete:?}"
    );
    for layer in 2..8 {
        assert!(
            layer_bytes(&dst_mem, l, layer).iter().all(|&b| b == 0),
            "bytes of layer {layer}, beyond the window, arrived before any layer was consumed"
        );
    }
    for layer in 0..8 {
        rx.consume_layer(session, layer).unwrap();
        timeout(LIMIT, rx.wait_layer(session, layer))
            .await
            .unwrap()
            .unwrap();
        assert!(
            layer_bytes(&dst_mem, l, layer) == layer_bytes(&src_mem, l, layer),
            "layer {layer} differs"
        );
    }
    let out = tx.wait(session, LIMIT).await.unwrap();
    assert!(out.recompute.is_empty() && out.reason.is_none(), "{out:?}");
    let received = timeout(LIMIT, rx.wait_received(session))
        .await
        .unwrap()
        .unwrap();
    assert!(received.recompute.is_empty());
    assert_eq!(received.stats.blocks_delivered, 8 * 16);
    assert!(
        matches!(
            rx.wait_layer(session, 9).await,
            Err(TransportError::Wait(WaitError::NoSuchLayer { .. }))
        ),
        "a layer outside the session is a clear error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_peer_ends_its_sessions_promptly_and_new_transfers_fail_at_once() {
    // A long deadline: the report must come from noticing the peer is gone, not from the deadline.
    let l = layout(16, 64, 256 << 10);
    let (tx, rx, _src, _dst, req) = nodes(l, 4).await;
    let req = req.with_deadline(Duration::from_secs(60));
    let peer = req.peer;
    let session = tx.submit(req.clone()).unwrap();
    let mut first = rx.subscribe();
    // Let some KV arrive, then the receiving process "dies": its listener and lanes vanish.
    loop {
        if let Ok(Event::BlockDelivered { .. }) = timeout(LIMIT, first.recv()).await.unwrap() {
            break;
        }
    }
    rx.shutdown();
    drop(rx);
    // No bound on the time it takes: the reason says whether the peer's death was noticed (the session is
    // aborted as unreachable) or the 60 s deadline ended it (no reason); `wait`'s limit guards a hang.
    let out = tx.wait(session, LIMIT).await.unwrap();
    let reason = out.reason.clone().unwrap_or_default();
    assert!(reason.contains("unreachable"), "{reason:?}");
    // Whatever was not acknowledged before the peer died (at most every block) comes back.
    let n = out.recompute.len();
    assert!((1..=16 * 64).contains(&n), "{n} blocks to recompute");
    match tx.submit(req) {
        Err(TransportError::Unreachable(why)) => assert!(why.contains(&format!("peer {}", peer.0))),
        other => panic!("a new transfer to a dead peer must fail at once, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_go_out_as_the_producer_writes_them() {
    let l = layout(3, 8, 64 << 10);
    let (tx, rx, src_memory, dst_memory, req) = nodes(l, 21).await;
    // Nothing is written yet: the session opens, and no byte moves until the producer says so.
    let session = tx.submit(req.with_layers_written(0)).unwrap();
    let incoming = timeout(LIMIT, rx.next_incoming()).await.unwrap().unwrap();
    for layer in 0..3u32 {
        // The producer "computes" the layer, then releases it.
        tx.layers_written(session, layer + 1).unwrap();
        timeout(LIMIT, rx.wait_layer(incoming.session, layer))
            .await
            .unwrap()
            .unwrap();
        assert!(
            layer_bytes(&dst_memory, l, layer) == layer_bytes(&src_memory, l, layer),
            "layer {layer} arrived whole"
        );
        if layer < 2 {
            // The next layer is not released: not one of its bytes was sent.
            assert!(
                layer_bytes(&dst_memory, l, layer + 1)
                    .iter()
                    .all(|&b| b == 0),
                "layer {} arrived before it was written",
                layer + 1
            );
        }
    }
    let out = timeout(LIMIT, tx.wait(session, LIMIT))
        .await
        .unwrap()
        .unwrap();
    assert!(out.recompute.is_empty(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_declared_unreachable_is_not_redialed_until_a_transfer_needs_it() {
    let hold = Duration::from_secs(2);
    let tx = TcpNode::start({
        let mut cfg = TcpConfig::with_engine_id(1);
        cfg.listen = None;
        cfg.liveness.unreachable_hold = hold;
        cfg
    })
    .await
    .unwrap();
    let rx = TcpNode::start(TcpConfig::with_engine_id(2)).await.unwrap();
    let addr = rx.local_addr().unwrap();
    let l = layout(4, 16, 64 << 10);
    let len = l.total_bytes() as usize;
    let src = tx
        .register_kv_region(l, MemoryRegion::from_vec(pattern(len, 9)))
        .unwrap();
    let dst = rx.register_kv_region(l, MemoryRegion::zeroed(len)).unwrap();
    let peer = tx.connect(addr, None).await.unwrap().peer;
    let req = TransferRequest::whole(peer, &src, &dst)
        .unwrap()
        .with_layers_written(0)
        .with_deadline(Duration::from_secs(60));
    let session = tx.submit(req.clone()).unwrap();
    timeout(LIMIT, rx.next_incoming()).await.unwrap().unwrap();
    rx.shutdown();
    drop(rx);
    let out = tx.wait(session, LIMIT).await.unwrap();
    assert!(out.reason.unwrap_or_default().contains("unreachable"));
    let declared = std::time::Instant::now();
    // The peer's port is taken by a plain listener that counts the dials made to it.
    let listener = std::net::TcpListener::bind(addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut refused = 0;
    while declared.elapsed() < hold - Duration::from_millis(500) {
        match tx.submit(req.clone()) {
            Err(TransportError::Unreachable(_)) => refused += 1,
            other => panic!("within the hold a transfer must fail at once, got {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused > 0);
    assert!(
        listener.accept().is_err(),
        "nothing needs the peer, yet it was redialed"
    );
    tokio::time::sleep_until((declared + hold).into()).await;
    // After the hold, a transfer needs the peer again: it is dialed.
    tx.submit(req).unwrap();
    let dialed = std::time::Instant::now();
    loop {
        if listener.accept().is_ok() {
            break;
        }
        assert!(
            dialed.elapsed() < LIMIT,
            "the transfer's peer was never dialed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
