//! Strangers against a real server: floods that never read (corrupt slices, control frames), an impostor
//! of another client's engine id and a session taken over by a new connection group, a client writing
//! into another's region, a peer that stops reading, a half-sent header, a reflected dial-back, and
//! garbage that must be answered with a reason. After each, a well-behaved client beside the attacker
//! still completes a byte-identical transfer, and the server's queue is back within bounds. The limits a
//! stranger meets (lanes, handshakes, idle lanes) are tested in `tcp_limits.rs`.

mod common;

use std::time::{Duration, Instant};

use backends::node::LogKind;
use backends::tcp::Namespace;
use backends::tcp::handshake::{self, Hello, TOKEN_LEN};
use backends::tcp::{TcpConfig, TcpNode};
use backends::transport::CloseReason;
use common::tcp_client::{LIMIT, attack_frames, good_transfer, handshake_as, server};
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
    let stalled = server
        .log_entries()
        .into_iter()
        .any(|e| e.peer == Some(PeerId(41)) && matches!(e.closed, Some(CloseReason::Stalled(_))));
    assert!(stalled, "{:?}", server.log());
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
        cfg.security.dial_back = false;
        cfg.serving.serve_bytes = 64 << 20;
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
        cfg.liveness.stall_timeout = Duration::from_millis(500);
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
    let stalled = |node: &TcpNode| {
        node.log_entries()
            .into_iter()
            .any(|e| e.peer == Some(peer) && matches!(e.closed, Some(CloseReason::Stalled(_))))
    };
    while !stalled(&sender) && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stalled(&sender), "{:?}", sender.log());
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
    let takeover = server
        .log_entries()
        .into_iter()
        .find(|e| e.kind == LogKind::SessionsEnded && e.peer == Some(PeerId(66)));
    assert!(takeover.is_some(), "no takeover in {:#?}", server.log());
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
