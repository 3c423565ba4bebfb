//! The limits a stranger meets at a real server: connections per address and lanes node-wide (each
//! refusal naming its reason), a connect flood answered a bounded number at a time, a lane silent after
//! its welcome closed unless a session is live, and connections that send nothing or half a handshake
//! holding no turn a real client needs.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use backends::tcp::Namespace;
use backends::tcp::handshake::{self, Hello, TOKEN_LEN};
use backends::tcp::{TcpConfig, TcpNode};
use common::tcp_client::{LIMIT, good_client, handshake_as, honest_handshake, layout, server_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;
use transfer_engine::TransferRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_lane_and_every_refusal_says_why() {
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 64 << 20;
        cfg.limits.max_connections_per_address = 4;
        cfg
    })
    .await;
    let addr = server.local_addr().unwrap();
    let mut held = Vec::new();
    for id in 40..44 {
        let (lane, admitted) = handshake_as(addr, id, [0; TOKEN_LEN], None).await;
        admitted.unwrap();
        held.push(lane);
    }
    // A fifth connection from the same address, whatever engine id it claims, is told why.
    let (_, refused) = handshake_as(addr, 44, [0; TOKEN_LEN], None).await;
    let why = refused.unwrap_err();
    assert!(why.contains("already holds 4 connections"), "{why}");
    // A lane that ends gives its address's slot back.
    drop(held.pop());
    let end = Instant::now() + LIMIT;
    loop {
        let (lane, admitted) = handshake_as(addr, 45, [0; TOKEN_LEN], None).await;
        if admitted.is_ok() {
            held.push(lane);
            break;
        }
        assert!(Instant::now() < end, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(held);
    // The node-wide lane limit is answered with its reason too.
    let small = TcpNode::start({
        let mut cfg = TcpConfig::with_engine_id(3);
        cfg.serving.serve_bytes = 64 << 20;
        cfg.limits.max_lanes = 2;
        cfg
    })
    .await
    .unwrap();
    let small_addr = small.local_addr().unwrap();
    let (_a, first) = handshake_as(small_addr, 50, [0; TOKEN_LEN], None).await;
    let (_b, second) = handshake_as(small_addr, 51, [0; TOKEN_LEN], None).await;
    first.unwrap();
    second.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, third) = handshake_as(small_addr, 52, [0; TOKEN_LEN], None).await;
    let why = third.unwrap_err();
    assert!(why.contains("lanes, its most"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_flood_is_answered_a_bounded_number_at_a_time() {
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 64 << 20;
        cfg.limits.max_connections_per_address = 1;
        cfg.limits.max_pending_refusals = 2;
        cfg
    })
    .await;
    let addr = server.local_addr().unwrap();
    let (_held, admitted) = handshake_as(addr, 40, [0; TOKEN_LEN], None).await;
    admitted.unwrap();
    // Ten more connections from the address, sending nothing: each refused; two are told why (a
    // refusal waits 200 ms for what the dialer sends first), the rest closed at once.
    let mut flood = Vec::new();
    for _ in 0..10 {
        flood.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut answered = 0;
    for mut s in flood {
        let mut buf = Vec::new();
        let read = timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "a refused connection was never closed");
        if !buf.is_empty() {
            answered += 1;
        }
    }
    assert_eq!(answered, 2, "{:#?}", server.log());
    let stats = server.stats();
    assert_eq!(
        (stats.handshakes_refused, stats.refusals_unanswered),
        (10, 8)
    );
    // Once those refusals are done (each drains its connection briefly), the next is answered again.
    let end = Instant::now() + LIMIT;
    loop {
        let (_, refused) = handshake_as(addr, 41, [0; TOKEN_LEN], None).await;
        if refused.unwrap_err().contains("already holds 1 connections") {
            break;
        }
        assert!(Instant::now() < end, "refusals were never answered again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_that_says_nothing_after_its_welcome_is_closed_unless_a_session_is_live() {
    let idle = Duration::from_millis(300);
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 64 << 20;
        cfg.liveness.inbound_idle_timeout = Some(idle);
        cfg
    })
    .await;
    let addr = server.local_addr().unwrap();
    // (Timed from before the handshake: the server's idle clock cannot start earlier.)
    let started = Instant::now();
    let (mut silent, admitted) = handshake_as(addr, 40, [0; TOKEN_LEN], None).await;
    admitted.unwrap();
    let mut buf = [0u8; 64];
    let read = timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "a silent lane was not closed: {read:?}"
    );
    assert!(started.elapsed() >= idle, "closed before it idled");
    // A session that waits longer than that for its producer's next layer keeps its lane.
    let (client, src, dst, peer) = good_client(addr, 41).await;
    let req = TransferRequest::whole(peer, &src, &dst).unwrap();
    let session = client.submit(req.with_layers_written(0)).unwrap();
    tokio::time::sleep(idle * 4).await;
    let closed_before = server.stats().lanes_closed;
    client.layers_written(session, layout().layers).unwrap();
    let out = client.wait(session, LIMIT).await.unwrap();
    assert!(out.recompute.is_empty(), "{out:?}");
    assert_eq!(client.stats().lanes_closed, 0, "{:#?}", server.log());
    assert_eq!(server.stats().lanes_closed, closed_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_nothing_hold_no_handshake_turn() {
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 64 << 20;
        cfg.liveness.handshake_timeout = Duration::from_secs(4);
        cfg.limits.max_connections_per_address = 512;
        cfg
    })
    .await;
    let addr = server.local_addr().unwrap();
    // 100 connections that never send a byte: more than the node's 64 handshake turns.
    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A real client is served while they are held; before, each held a turn until its handshake timed
    // out, and a client arriving after them waited for that.
    let accepted = honest_handshake(addr, Duration::from_secs(2)).await;
    assert!(accepted.is_ok(), "{accepted:?}: {:#?}", server.log());
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_handshakes_hold_no_turn_a_real_client_needs() {
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 64 << 20;
        cfg.limits.max_connections_per_address = 512;
        cfg
    })
    .await;
    let addr = server.local_addr().unwrap();
    // 100 connections from another address (127.0.0.2) that send the first bytes of a Hello and then
    // nothing, and 100 from the client's own address (127.0.0.1) that send a whole Hello and never their
    // Auth: more than the node's 64 turns, and than an address's 8.
    let mut half_open = Vec::new();
    for k in 0..200u32 {
        let host = if k % 2 == 0 {
            [127, 0, 0, 2]
        } else {
            [127, 0, 0, 1]
        };
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((host, 0))).unwrap();
        let mut s = socket.connect(addr).await.unwrap();
        if k % 2 == 0 {
            s.write_all(&[200, 0, 0, 0, 1]).await.unwrap();
        } else {
            let hello = Hello::new(500 + k, Namespace::default()).unwrap();
            let msg = handshake::Message::Hello(Box::new(hello), [0; 32]);
            handshake::send(&mut s, &msg).await.unwrap();
        }
        half_open.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A real client from 127.0.0.1 is served within 1 s: a connection waiting for its peer's next
    // message holds no turn. Before, the first held the turns until they timed out, and a client from
    // their address waited for its address's turns even after the node's were freed.
    let started = Instant::now();
    let accepted = honest_handshake(addr, Duration::from_secs(1)).await;
    assert!(
        accepted.is_ok(),
        "{accepted:?} after {:?}: {:#?}",
        started.elapsed(),
        server.log()
    );
    drop(half_open);
}
