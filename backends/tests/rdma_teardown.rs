//! Closing nodes on `shm`, whose provider maps an in-process peer's memory directly: a node that closes
//! while a peer in this process still runs costs that peer recompute, never a crash or a write into memory
//! mapped since, and every endpoint is really closed once all its in-process peers are. In a file of its
//! own, so the count of parked endpoints is this test's alone.
#![cfg(feature = "rdma")]

mod common;

use std::time::Duration;

use backends::TransportError;
use backends::rdma::{Provider, RdmaConfig, RdmaNode, parked_endpoints};
use transfer_engine::{Dtype, KvLayout, MemoryRegion, TransferRequest};

/// A node on shm: `None` (a "not run") only where libfabric lists no shm provider; a listed one that
/// cannot start a node fails the test.
fn start(id: u32) -> Option<RdmaNode> {
    let mut cfg = RdmaConfig::new(id, Provider::Named("shm".into()));
    // A closed shm peer never completes a write nor answers: found unreachable after a second.
    cfg.write_timeout = Duration::from_secs(1);
    cfg.liveness.answer_timeout = Duration::from_secs(1);
    common::on_listed_provider("shm", None, || RdmaNode::start(cfg))
}

#[test]
fn closing_in_process_peers_costs_recompute_not_a_crash_and_releases_every_endpoint() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let layout = KvLayout::new(2, 8, 256 << 10, 16, Dtype::F16).unwrap();
    let bytes = layout.total_bytes() as usize;
    let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    // Several rounds, so that a survivor touching a closed peer's old mapping (reused by the next round's
    // allocations) would show.
    for round in 0..4u32 {
        let Some(producer) = start(10 + round) else {
            return;
        };
        let src = producer
            .register_kv_region(layout, MemoryRegion::from_vec(data.clone()))
            .unwrap();
        let mut consumers = Vec::new();
        for c in 0..3u32 {
            let Some(consumer) = start(100 + 10 * round + c) else {
                return;
            };
            let pool = MemoryRegion::zeroed(bytes);
            let dst = consumer.register_kv_region(layout, pool.clone()).unwrap();
            consumer.publish_segment("kv", dst).unwrap();
            let peer = rt.block_on(producer.connect(consumer.address())).unwrap();
            let dst = *peer.segment("kv").unwrap();
            let req = TransferRequest::whole(peer.peer, &src, &dst).unwrap();
            let out = rt
                .block_on(producer.transfer(req, Duration::from_secs(30)))
                .unwrap();
            assert!(out.recompute.is_empty(), "{out:?}");
            assert!(*pool.read(0..bytes).unwrap() == data[..]);
            consumers.push((consumer, peer.peer, dst));
        }
        // The consumers close while the producer runs: they stay parked, and sending to them again comes
        // back as recompute once each is found unreachable.
        let targets: Vec<_> = consumers
            .iter()
            .map(|(c, p, d)| (c.address().to_vec(), *p, *d))
            .collect();
        drop(consumers);
        assert_eq!(parked_endpoints(), 3, "round {round}");
        let sessions: Vec<_> = targets
            .iter()
            .map(|(_, peer, dst)| {
                let req = TransferRequest::whole(*peer, &src, dst)
                    .unwrap()
                    .with_deadline(Duration::from_secs(30));
                producer.submit(req).unwrap()
            })
            .collect();
        for session in sessions {
            let out = rt
                .block_on(producer.wait(session, Duration::from_secs(60)))
                .unwrap();
            // Every block of every layer: none reached the closed peer.
            let blocks = (layout.layers * layout.blocks_per_layer) as usize;
            assert_eq!(out.recompute.len(), blocks, "{out:?}");
            let reason = out.reason.clone().unwrap_or_default();
            assert!(
                reason.contains("unreachable"),
                "{out:?} {:?} {:?}",
                producer.log(),
                producer.stats()
            );
        }
        // A peer found unreachable refuses new sessions at once, until it answers again.
        let (_, peer, dst) = &targets[0];
        let refused = producer
            .submit(TransferRequest::whole(*peer, &src, dst).unwrap())
            .unwrap_err();
        assert!(
            matches!(refused, backends::TransportError::Unreachable(_)),
            "{refused}"
        );
        // A closed endpoint's address is refused with a clear error, not handed its old mapping.
        let refused = rt.block_on(producer.connect(&targets[0].0)).unwrap_err();
        assert!(
            matches!(&refused, TransportError::Unreachable(m) if m.contains("is closed")),
            "{refused}"
        );
        drop(producer);
        assert_eq!(parked_endpoints(), 0, "round {round}");
    }
}
