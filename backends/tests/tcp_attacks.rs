//! Strangers against a real server: floods that never read (corrupt slices, control frames), an impostor
//! of another client's engine id and a session taken over by a new connection group, too many lanes (per
//! peer, per address, node-wide), connections that send nothing, a client writing into another's region,
//! a half-sent header, a reflected dial-back, and garbage that must be answered with a reason. After each, a well-behaved client beside the attacker
//! still completes a byte-identical transfer, and the server's queue is back within bounds.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use backends::tcp::Namespace;
use backends::tcp::handshake::{self, Hello, TOKEN_LEN};
use backends::tcp::{TcpConfig, TcpNode};
use common::tcp_client::{
    LIMIT, attack_frames, good_client, good_transfer, handshake_as, honest_handshake, layout,
    server, server_with,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;
use transfer_engine::wire::{FrameKind, HEADER_LEN, Header};
use transfer_engine::{Dtype, KvLayout, PeerId, RegionHandle, TransferRequest};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_corrupt_slices_from_a_client_that_never_reads_wedge_nobody() {
    let server = server().await;
    let addr = server.local_addr().unwrap();
    // Three floods of about 150,000 corrupt 256-byte slices, each answered with a nack the attacker never
    // reads, with a disconnect between them (the issue saw four such floods wedge the server for good).
    for round in 0..3 {
        // A fresh engine id each round: the last round's lane may not be gone yet, and its id stays
        // bound to its connection group while it lives.
        let (mut s, admitted) = handshake_as(addr, 66 + round, [0; TOKEN_LEN], None).await;
        let (dst, _) = admitted.unwrap();
        let (open, data) = attack_frames(dst, 256);
        s.write_all(&open).await.unwrap();
        let mut burst = Vec::new();
        for frame in data.iter().take(64) {
            let mut bad = frame.clone();
            let last = bad.len() - 1;
            bad[last] ^= 0xFF;
            burst.extend_from_slice(&bad);
        }
        let flood = tokio::spawn(async move {
            for _ in 0..2400 {
                if s.write_all(&burst).await.is_err() {
                    break;
                }
            }
            s
        });
        // A good client transfers while the flood runs.
        good_transfer(&server, addr, 7 + round).await;
        let s = timeout(LIMIT, flood).await.unwrap().unwrap();
        let during = server.stats();
        assert!(
            during.queued_bytes <= (16 << 20) + (1 << 20),
            "round {round}: queue {} bytes",
            during.queued_bytes
        );
        drop(s);
        // Once the attacker is gone, its queue is released and everyone is served again.
        let start = Instant::now();
        while server.stats().queued_bytes > 0 && start.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            server.stats().queued_bytes,
            0,
            "round {round}: the flooder's queue was not released"
        );
    }
    let stats = server.stats();
    assert!(stats.engine.checksum_failures > 100_000, "{stats:?}");
    // One pending nack per slice keeps what the server owes the flooder tiny; the per-peer queue share
    // (1 MiB here) is the bound behind it.
    println!(
        "{} corrupt slices refused; {} control frames dropped over the flooder's share",
        stats.engine.checksum_failures, stats.control_frames_dropped
    );
    good_transfer(&server, addr, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_lanes_and_served_regions_are_isolated() {
    let server = server().await;
    let addr = server.local_addr().unwrap();
    let (first, admitted) = handshake_as(addr, 30, [0; TOKEN_LEN], None).await;
    let (region_30, token) = admitted.unwrap();
    // An impostor claiming engine 30 without its group's token is refused while 30 is connected.
    let (_, impostor) = handshake_as(addr, 30, [0; TOKEN_LEN], None).await;
    let why = impostor.unwrap_err();
    assert!(why.contains("another connection group"), "{why}");
    // A second lane of the real group is admitted; a third lane is beyond the bound of 2.
    let (second, again) = handshake_as(addr, 30, token, None).await;
    assert_eq!(again.unwrap().1, token);
    let (_, third) = handshake_as(addr, 30, token, None).await;
    assert!(third.unwrap_err().contains("lanes"));
    // Another client asking for the same layout gets a region of its own.
    let (other, admitted) = handshake_as(addr, 31, [0; TOKEN_LEN], None).await;
    let (region_31, _) = admitted.unwrap();
    assert_ne!(region_30.id, region_31.id);
    // Engine 31, even knowing 30's region id and key, may not open a session into it.
    let (open, _) = attack_frames(region_30, 4096);
    let mut other = other;
    other.write_all(&open).await.unwrap();
    let reject = read_frame(&mut other).await;
    assert_eq!(reject.0.kind, FrameKind::Reject);
    assert!(
        String::from_utf8_lossy(&reject.1).contains("belongs to another peer"),
        "{}",
        String::from_utf8_lossy(&reject.1)
    );
    drop((first, second));
    good_transfer(&server, addr, 9).await;
}

/// Reads one frame (header and payload) from a raw lane.
async fn read_frame(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut h = [0u8; HEADER_LEN];
    timeout(LIMIT, s.read_exact(&mut h)).await.unwrap().unwrap();
    let header = Header::decode(&h).unwrap();
    let mut payload = vec![0u8; header.length as usize];
    timeout(LIMIT, s.read_exact(&mut payload))
        .await
        .unwrap()
        .unwrap();
    (header, payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_answered_with_a_reason_and_a_half_header_is_dropped() {
    let server = server().await;
    let addr = server.local_addr().unwrap();
    let (mut garbage, admitted) = handshake_as(addr, 40, [0; TOKEN_LEN], None).await;
    admitted.unwrap();
    garbage.write_all(&[0xAB; HEADER_LEN]).await.unwrap();
    let (header, reason) = read_frame(&mut garbage).await;
    assert_eq!((header.kind, header.session), (FrameKind::Reject, 0));
    assert!(
        String::from_utf8_lossy(&reason).contains("refused frame"),
        "{}",
        String::from_utf8_lossy(&reason)
    );
    // A client that starts a header and stalls loses its lane after the stall timeout (0.5 s here).
    let (mut stall, admitted) = handshake_as(addr, 41, [0; TOKEN_LEN], None).await;
    admitted.unwrap();
    stall.write_all(&[1, 2, 3, 4, 5]).await.unwrap();
    let mut buf = [0u8; 64];
    let closed = timeout(Duration::from_secs(5), stall.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "the stalled lane was not closed"
    );
    assert!(
        server.log().iter().any(|l| l.contains("mid-header")),
        "{:?}",
        server.log()
    );
    good_transfer(&server, addr, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_naming_a_third_host_is_never_dialed_there() {
    let server = server().await;
    let addr = server.local_addr().unwrap();
    let (_lane, admitted) = handshake_as(addr, 50, [0; TOKEN_LEN], Some("10.255.0.7:7400")).await;
    admitted.unwrap();
    // Dial-back goes to the address the connection came from (loopback), at the named port only.
    let back = server.peer_addr(PeerId(50)).unwrap();
    assert_eq!(back, "127.0.0.1:7400".parse().unwrap());
    // And not at all when dial-back is off.
    let quiet = TcpNode::start({
        let mut cfg = TcpConfig::with_engine_id(3);
        cfg.dial_back = false;
        cfg.serve_bytes = 64 << 20;
        cfg
    })
    .await
    .unwrap();
    let (_lane, admitted) = handshake_as(
        quiet.local_addr().unwrap(),
        51,
        [0; TOKEN_LEN],
        Some("127.0.0.1:7400"),
    )
    .await;
    admitted.unwrap();
    assert_eq!(quiet.peer_addr(PeerId(51)), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_loses_its_lane_and_its_queue() {
    // A raw peer that completes the handshake as the acceptor, then never reads a byte.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let l = KvLayout::new(4, 64, 1 << 20, 16, Dtype::Bf16).unwrap();
    let fake = RegionHandle {
        id: transfer_engine::RegionId(1),
        key: transfer_engine::AccessKey(1),
        len: l.total_bytes(),
        layout: Some(l),
    };
    let silent = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let Ok(handshake::Message::Hello(..)) = handshake::recv(&mut s).await else {
            panic!("expected a hello");
        };
        let me = Hello::new(9, Namespace::default()).unwrap();
        handshake::send(&mut s, &handshake::Message::Hello(Box::new(me), [0; 32]))
            .await
            .unwrap();
        let _auth = handshake::recv(&mut s).await.unwrap();
        let segment = handshake::Segment {
            name: "kv".into(),
            handle: fake,
        };
        handshake::send(
            &mut s,
            &handshake::Message::Welcome([7; TOKEN_LEN], vec![segment]),
        )
        .await
        .unwrap();
        // Accept the session (so data starts to flow), then read nothing more.
        let (open, _) = read_frame(&mut s).await;
        let mut ack = Header::new(FrameKind::OpenAck, open.session);
        ack.crc = transfer_engine::crc32c(&[]);
        s.write_all(&ack.encode()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(s);
    });
    let sender = TcpNode::start({
        let mut cfg = TcpConfig::with_engine_id(1);
        cfg.listen = None;
        cfg.stall_timeout = Duration::from_millis(500);
        cfg
    })
    .await
    .unwrap();
    let src = sender.kv_region(l).unwrap();
    let peer = sender.connect(addr, None).await.unwrap().peer;
    sender
        .submit(TransferRequest::whole(peer, &src, &fake).unwrap())
        .unwrap();
    // 256 MiB to a peer that reads nothing: the socket fills, the writer stalls, the lane goes.
    let start = Instant::now();
    let stalled = |log: &[String]| {
        log.iter()
            .any(|l| l.contains("did not read what this node wrote"))
    };
    while !stalled(&sender.log()) && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stalled(&sender.log()), "{:?}", sender.log());
    assert!(sender.stats().queued_bytes <= (16 << 20) + (1 << 20));
    silent.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_not_taken_over_by_a_new_connection_group_claiming_its_engine_id() {
    let server = server().await;
    let addr = server.local_addr().unwrap();
    // Engine 66 opens a session and sends its first slice, then its lane drops with the session live.
    let (mut first, admitted) = handshake_as(addr, 66, [0; TOKEN_LEN], None).await;
    let (region, _) = admitted.unwrap();
    let (open, data) = attack_frames(region, 4096);
    let session = Header::decode(&open).unwrap().session;
    first.write_all(&open).await.unwrap();
    let answer = read_frame(&mut first).await;
    assert_eq!(answer.0.kind, FrameKind::OpenAck, "{answer:?}");
    first.write_all(&data[0]).await.unwrap();
    first.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.live_sessions(), 1);
    drop(first);
    // Another connection claims engine 66 with no token: without a secret it is admitted, as a new
    // connection group, and the earlier group's session ends there and then.
    let (mut second, admitted) = handshake_as(addr, 66, [0; TOKEN_LEN], None).await;
    admitted.unwrap();
    let line = server
        .log()
        .into_iter()
        .find(|l| l.contains("new connection group"))
        .unwrap_or_else(|| panic!("no takeover line in {:#?}", server.log()));
    assert!(line.contains("ended 1 session"), "{line}");
    assert_eq!(server.live_sessions(), 0);
    // Its slices and its Close for that session are refused: nothing of them is acknowledged.
    for frame in &data[1..] {
        second.write_all(frame).await.unwrap();
    }
    let mut close = Header::new(FrameKind::Close, session);
    close.crc = transfer_engine::crc32c(&[]);
    second
        .write_all(&transfer_engine::wire::encode_frame(&close, &[]))
        .await
        .unwrap();
    let end = Instant::now() + Duration::from_secs(1);
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        let mut h = [0u8; HEADER_LEN];
        match timeout(left, second.read_exact(&mut h)).await {
            Ok(Ok(_)) => {
                let header = Header::decode(&h).unwrap();
                assert!(
                    header.kind != FrameKind::Ack || header.session != session,
                    "the new group's slices were acknowledged: {header:?}"
                );
                let mut payload = vec![0u8; header.length as usize];
                second.read_exact(&mut payload).await.unwrap();
            }
            Ok(Err(_)) | Err(_) => break,
        }
    }
    assert_eq!(server.live_sessions(), 0);
    good_transfer(&server, addr, 9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_control_frames_that_never_reads_delays_no_one_and_holds_bounded_memory() {
    let server = server().await;
    let addr = server.local_addr().unwrap();
    // The flooder opens a session into its served region, closes it, then repeats that Open and Close
    // (a finished session: every Open is answered with a Reject, every Close with a CloseAck) as fast as
    // it can, and never reads.
    let (mut flood, admitted) = handshake_as(addr, 66, [0; TOKEN_LEN], None).await;
    let (region, _) = admitted.unwrap();
    let (open, _) = attack_frames(region, 4096);
    let session = Header::decode(&open).unwrap().session;
    let mut close = Header::new(FrameKind::Close, session);
    close.crc = transfer_engine::crc32c(&[]);
    let close = close.encode();
    let mut burst = Vec::new();
    for _ in 0..1024 {
        burst.extend_from_slice(&open);
        burst.extend_from_slice(&close);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooding = stop.clone();
    let flooder = tokio::spawn(async move {
        let started = Instant::now();
        let mut frames = 0u64;
        while !flooding.load(std::sync::atomic::Ordering::Relaxed) {
            assert!(
                started.elapsed() < LIMIT,
                "the honest clients were not served within {LIMIT:?} of flooding"
            );
            if timeout(Duration::from_secs(1), flood.write_all(&burst))
                .await
                .is_ok_and(|w| w.is_ok())
            {
                frames += 2048;
            }
        }
        frames
    });
    // Meanwhile three honest clients each complete byte-identical transfers, the flood still running.
    for id in [9, 10, 11] {
        good_transfer(&server, addr, id).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let frames = flooder.await.unwrap();
    let stats = server.stats();
    println!("{frames} flood frames written; {stats:?}");
    // The flooder was held back by its lane's control budget, its unread answers were capped, and what
    // is queued for it stays within the per-peer bound.
    assert!(stats.control_frames_throttled > 0, "{stats:?}");
    assert!(stats.engine.replies_dropped > 0, "{stats:?}");
    assert!(stats.queued_bytes <= (1 << 20) + 64 * 1024, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_lane_and_every_refusal_says_why() {
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serve_bytes = 64 << 20;
        cfg.max_connections_per_address = 4;
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
        cfg.serve_bytes = 64 << 20;
        cfg.max_lanes = 2;
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
        cfg.serve_bytes = 64 << 20;
        cfg.max_connections_per_address = 1;
        cfg.max_pending_refusals = 2;
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
        cfg.serve_bytes = 64 << 20;
        cfg.inbound_idle_timeout = Some(idle);
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
        cfg.serve_bytes = 64 << 20;
        cfg.handshake_timeout = Duration::from_secs(4);
        cfg.max_connections_per_address = 512;
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
        cfg.serve_bytes = 64 << 20;
        cfg.max_connections_per_address = 512;
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
