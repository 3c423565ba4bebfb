//! Fair shares of a node's lanes: the `max_lanes` bound holds however many handshakes finish at once, and
//! a node that a few addresses filled with engine ids still lets a newcomer in, shedding the idlest lane
//! of the address that holds the most (told why in a Reject).

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use backends::tcp::handshake::{self, Hello};
use backends::tcp::{Namespace, TcpConfig, TcpNode};
use common::tcp_client::{LIMIT, server_with};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// A handshake as engine `id` from local address `from`, asking for no region.
async fn lane_from(from: IpAddr, addr: SocketAddr, id: u32) -> (TcpStream, Result<(), String>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let hello = Hello::new(id, Namespace::default()).unwrap();
    let result = handshake::dial(&mut s, &hello, None, None, LIMIT)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    (s, result)
}

fn local(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// A server with at most `max_lanes` lanes.
async fn bounded(max_lanes: usize) -> TcpNode {
    server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.limits.max_lanes = max_lanes;
        cfg
    })
    .await
}

/// What the server sent on an admitted lane within `wait`: `None` while it stays open and silent, else
/// everything up to its close (a shed lane's Reject).
async fn heard(lane: &mut TcpStream, wait: Duration) -> Option<String> {
    let mut buf = Vec::new();
    match tokio::time::timeout(wait, lane.read_to_end(&mut buf)).await {
        Err(_) => None,
        Ok(_) => Some(String::from_utf8_lossy(&buf).into_owned()),
    }
}

/// Waits until the server's open lanes number `want` (shed lanes close a moment after their seat went).
async fn settle(server: &TcpNode, want: u64) {
    let end = Instant::now() + LIMIT;
    loop {
        let s = server.stats();
        let open = s.lanes_opened - s.lanes_closed;
        if open == want {
            return;
        }
        assert!(Instant::now() < end, "{open} lanes open, not {want}: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lane_bound_holds_when_many_addresses_handshake_at_once_and_each_keeps_a_share() {
    // 6 addresses x 16 engine ids, all at once, against 48 lanes (the 6 x 64 against 256, scaled
    // to the file descriptors a test may take).
    let (addresses, ids, max_lanes) = (6u8, 16u32, 48usize);
    let server = bounded(max_lanes).await;
    let addr = server.local_addr().unwrap();
    let mut tasks = Vec::new();
    for a in 0..addresses {
        for i in 0..ids {
            let id = 100 + u32::from(a) * ids + i;
            tasks.push(tokio::spawn(async move {
                (a, lane_from(local(2 + a), addr, id).await)
            }));
        }
    }
    let mut admitted = Vec::new();
    for t in tasks {
        let (a, (lane, result)) = t.await.unwrap();
        match result {
            Ok(()) => admitted.push((a, lane)),
            Err(why) => assert!(why.contains("lanes, its most"), "{why}"),
        }
    }
    assert!(admitted.len() >= max_lanes, "{} admitted", admitted.len());
    settle(&server, max_lanes as u64).await;
    let stats = server.stats();
    assert_eq!(
        admitted.len() as u64 - stats.lanes_shed,
        max_lanes as u64,
        "every admission past the bound shed one lane: {stats:?}"
    );
    let mut live: HashMap<u8, usize> = HashMap::new();
    for (a, mut lane) in admitted {
        match heard(&mut lane, Duration::from_millis(50)).await {
            None => *live.entry(a).or_default() += 1,
            Some(said) => assert!(said.contains("lane shed"), "{said:?}"),
        }
    }
    assert_eq!(live.values().sum::<usize>(), max_lanes, "{live:?}");
    // A fair share is 8 each; none was shut out, and none kept twice its share.
    let share = max_lanes / usize::from(addresses);
    for a in 0..addresses {
        let n = live.get(&a).copied().unwrap_or(0);
        assert!(
            n >= share / 2 && n <= share * 2,
            "address {} kept {n} lanes: {live:?}",
            local(2 + a)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_to_a_full_node_gets_the_idlest_lane_of_the_address_holding_the_most() {
    let server = bounded(8).await;
    let addr = server.local_addr().unwrap();
    let (big, small, newcomer) = (local(2), local(3), local(9));
    let mut big_lanes = Vec::new();
    for id in 200..206 {
        let (lane, ok) = lane_from(big, addr, id).await;
        ok.unwrap();
        big_lanes.push(lane);
    }
    let mut small_lanes = Vec::new();
    for id in 300..302 {
        let (lane, ok) = lane_from(small, addr, id).await;
        ok.unwrap();
        small_lanes.push(lane);
    }
    settle(&server, 8).await;
    // Full: a host with no lane still gets one, from the address with six.
    let (mut honest, ok) = lane_from(newcomer, addr, 900).await;
    ok.unwrap();
    let said = heard(&mut big_lanes[0], LIMIT)
        .await
        .expect("the idlest lane stayed open");
    assert!(
        said.contains("lane shed") && said.contains("127.0.0.2 held the most lanes (6)"),
        "{said:?}"
    );
    for lane in &mut big_lanes[1..] {
        assert_eq!(heard(lane, Duration::from_millis(50)).await, None);
    }
    // Still 2 against 5: the second address gets one of the biggest's too.
    let (_more, ok) = lane_from(small, addr, 302).await;
    ok.unwrap();
    settle(&server, 8).await;
    // Now 4, 3 and 1: the biggest holds no two more than anyone asking, so a lane is refused, saying why.
    let (_, refused) = lane_from(big, addr, 206).await;
    let why = refused.unwrap_err();
    assert!(
        why.contains("already has 8 lanes, its most") && why.contains("127.0.0.2"),
        "{why}"
    );
    assert_eq!(server.stats().lanes_shed, 2);
    assert_eq!(heard(&mut honest, Duration::from_millis(50)).await, None);
    for lane in &mut small_lanes {
        assert_eq!(heard(lane, Duration::from_millis(50)).await, None);
    }
}
