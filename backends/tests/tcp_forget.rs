//! Strangers are forgotten (`Liveness::forget_peer_after`): peers that connected, took a region and left
//! under engine ids of their own leave no link behind once idle, while a peer the node's user named and a
//! client still connected are kept, and the client's transfers go on.

mod common;

use std::time::{Duration, Instant};

use backends::tcp::TcpConfig;
use backends::tcp::handshake::TOKEN_LEN;
use common::tcp_client::{good_client, handshake_as, server_with, transfer_and_check};
use transfer_engine::PeerId;

/// Strangers, each under an engine id of its own (fewer than the 64 engines one address may hold).
const STRANGERS: u32 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_cycling_engine_ids_are_forgotten_and_named_or_connected_peers_are_kept() {
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 64 << 20;
        cfg.liveness.forget_peer_after = Duration::from_millis(300);
        cfg.serving.served_region_grace = Duration::from_millis(300);
        cfg
    })
    .await;
    let addr = server.local_addr().unwrap();
    // A peer this node's user named (never connected), and a client connected throughout.
    server.add_peer(PeerId(77), "127.0.0.1:9".parse().unwrap());
    let (node, src, dst, peer) = good_client(addr, 9).await;
    for id in 1000..1000 + STRANGERS {
        let (s, admitted) = handshake_as(addr, id, [0; TOKEN_LEN], None).await;
        admitted.unwrap();
        drop(s);
    }
    let before = server.stats();
    assert!(
        before.peers_known >= u64::from(STRANGERS),
        "the strangers were never known: {before:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let stats = server.stats();
        if stats.peers_known == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "strangers not forgotten after 15 s: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = server.stats();
    assert_eq!(after.peers_forgotten, u64::from(STRANGERS), "{after:?}");
    assert_eq!(
        server.peer_addr(PeerId(77)),
        Some("127.0.0.1:9".parse().unwrap())
    );
    transfer_and_check(&server, &node, (src, dst), peer).await;
}
