//! Served regions against strangers: a region stays its client's while the client is connected and for
//! a grace after it leaves, one address holds at most its share, and a claimant of a departed engine id
//! gets a fresh region, never the departed one's bytes.

mod common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use backends::tcp::TcpConfig;
use backends::tcp::handshake::TOKEN_LEN;
use common::tcp_client::{
    LIMIT, good_client, good_transfer, handshake_as, handshake_from, layout, server, server_with,
    transfer_and_check,
};
use transfer_engine::TransferRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_the_served_regions() {
    let region = layout().total_bytes();
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 4 * region;
        cfg.serving.serve_bytes_per_address = Some(2 * region);
        cfg
    })
    .await;
    let addr = server.local_addr().unwrap();
    // A stranger on 127.0.0.2 asks for regions under one engine id after another, keeping each lane.
    let stranger = IpAddr::from([127, 0, 0, 2]);
    let mut held = Vec::new();
    for id in 70..72 {
        let (lane, admitted) = handshake_from(stranger, addr, id, [0; TOKEN_LEN], None).await;
        admitted.unwrap();
        held.push(lane);
    }
    let (_lane, refused) = handshake_from(stranger, addr, 72, [0; TOKEN_LEN], None).await;
    let why = refused.unwrap_err();
    assert!(
        why.contains("address 127.0.0.2 already holds") && why.contains("its share"),
        "{why}"
    );
    // Clients on 127.0.0.1 still find the other half. Before, the stranger could take all four.
    let (_a, _, _, _) = good_client(addr, 9).await;
    good_transfer(&server, addr, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departed_clients_region_is_kept_for_its_grace_then_served_to_another() {
    let grace = Duration::from_secs(3);
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = layout().total_bytes();
        cfg.serving.served_region_grace = grace;
        cfg
    })
    .await;
    let addr = server.local_addr().unwrap();
    good_transfer(&server, addr, 9).await;
    // Engine 9's process has left (its node is dropped). Within the grace its region is not another's:
    // a client losing its lanes for a moment finds it again. Before, it was freed at once.
    let left = Instant::now();
    let (_lane, refused) = handshake_as(addr, 70, [0; TOKEN_LEN], None).await;
    let why = refused.unwrap_err();
    assert!(
        left.elapsed() >= grace || why.contains("held by a connected peer"),
        "{why}"
    );
    // After the grace it is freed for the next asker.
    let region = loop {
        let (lane, admitted) = handshake_as(addr, 70, [0; TOKEN_LEN], None).await;
        if let Ok((region, _)) = admitted {
            break (lane, region).1;
        }
        assert!(left.elapsed() < LIMIT, "the region was never freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        left.elapsed() >= grace,
        "freed after {:?}, within its {grace:?} grace",
        left.elapsed()
    );
    assert_eq!(region.len, layout().total_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_asking_for_regions_takes_none_from_a_connected_client() {
    // Room for two served regions.
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 2 * layout().total_bytes();
        cfg
    })
    .await;
    let addr = server.local_addr().unwrap();
    // An honest client connects and gets its region, but has not opened a session yet.
    let (node, src, dst, peer) = good_client(addr, 9).await;
    // A stranger takes the other region, then asks for more under other engine ids.
    let (_held, first) = handshake_as(addr, 70, [0; TOKEN_LEN], None).await;
    first.unwrap();
    for id in 71..75 {
        let (_, more) = handshake_as(addr, id, [0; TOKEN_LEN], None).await;
        let why = more.unwrap_err();
        assert!(why.contains("held by a connected peer"), "{why}");
    }
    // The honest client's region is still its own: its transfer lands. Before, the stranger's request
    // freed it (it was idle), and this transfer was refused.
    transfer_and_check(&server, &node, (src, dst), peer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimant_of_a_departed_engine_id_gets_a_fresh_region_not_its_bytes() {
    let server = server().await;
    let addr = server.local_addr().unwrap();
    // Engine 9 lands its bytes in its served region, then its process leaves.
    let (node, src, old, peer) = good_client(addr, 9).await;
    let req = TransferRequest::whole(peer, &src, &old).unwrap();
    let out = node.transfer(req, LIMIT).await.unwrap();
    assert!(out.recompute.is_empty(), "{:?}", out.reason);
    drop(node);
    // Another process claims engine 9 once its lanes are down (before, it is refused).
    let end = Instant::now() + LIMIT;
    let (_lane, region) = loop {
        let (lane, admitted) = handshake_as(addr, 9, [0; TOKEN_LEN], None).await;
        if let Ok((region, _)) = admitted {
            break (lane, region);
        }
        assert!(Instant::now() < end, "engine 9's lanes never closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // It is a new connection group: it is given a new, zeroed region, and the departed group's region,
    // with its bytes, is gone. Before, the claimant was handed the departed group's region to write into.
    assert_ne!(region.id, old.id);
    let bytes = server.memory(region.id).unwrap().to_vec().unwrap();
    assert!(
        bytes.iter().all(|&b| b == 0),
        "the claimant's region is not zeroed"
    );
    assert!(
        server.memory(old.id).is_err(),
        "the departed group's region is still served"
    );
}
