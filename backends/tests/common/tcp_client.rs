//! Clients for the TCP tests against a real server: a well-behaved one with its own byte pattern, and
//! raw handshakes as any engine id, from any local address.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use backends::tcp::handshake::{self, Hello, TOKEN_LEN};
use backends::tcp::{Namespace, TcpConfig, TcpNode};
use std::time::Instant;
use tokio::net::TcpStream;

use transfer_engine::wire::{FrameKind, Header};
use transfer_engine::{
    Body, Dtype, Engine, EngineConfig, KvLayout, MemoryRegion, PeerId, RegionHandle, TransferMode,
    TransferRequest,
};

pub(crate) const LIMIT: Duration = Duration::from_secs(60);

pub(crate) fn layout() -> KvLayout {
    KvLayout::new(2, 8, 64 << 10, 16, Dtype::Bf16).unwrap()
}

/// A server (engine 2) that serves 64 MiB of regions, drops a stalled lane after 0.5 s and a reply
/// queue past 1 MiB.
pub(crate) async fn server() -> TcpNode {
    server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 64 << 20;
        cfg.liveness.stall_timeout = Duration::from_millis(500);
        cfg.limits.peer_queue_bytes = 1 << 20;
        cfg
    })
    .await
}

/// A server started with `cfg`.
pub(crate) async fn server_with(cfg: TcpConfig) -> TcpNode {
    TcpNode::start(cfg).await.unwrap()
}

/// A well-behaved client with its own pattern, connected to `addr` and given a served region.
pub(crate) async fn good_client(
    addr: SocketAddr,
    id: u32,
) -> (TcpNode, RegionHandle, RegionHandle, PeerId) {
    let node = TcpNode::start({
        let mut cfg = TcpConfig::with_engine_id(id);
        cfg.listen = None;
        cfg
    })
    .await
    .unwrap();
    let l = layout();
    let bytes: Vec<u8> = (0..l.total_bytes() as usize)
        .map(|i| (i as u32).wrapping_mul(id * 2 + 1) as u8)
        .collect();
    let src = node
        .register_kv_region(l, MemoryRegion::from_vec(bytes))
        .unwrap();
    let info = node.connect(addr, Some(l)).await.unwrap();
    let dst = *info.segment("served").unwrap();
    (node, src, dst, info.peer)
}

/// Moves the good client's KV into its served region and checks the server holds exactly its bytes.
pub(crate) async fn good_transfer(server: &TcpNode, addr: SocketAddr, id: u32) {
    let (node, src, dst, peer) = good_client(addr, id).await;
    transfer_and_check(server, &node, (src, dst), peer).await;
}

/// Moves `node`'s region `src` whole into `dst` on `server` (packetized) and checks the bytes landed.
pub(crate) async fn transfer_and_check(
    server: &TcpNode,
    node: &TcpNode,
    (src, dst): (RegionHandle, RegionHandle),
    peer: PeerId,
) {
    let req = TransferRequest::whole(peer, &src, &dst)
        .unwrap()
        .with_mode(TransferMode::packetized());
    let out = node.transfer(req, LIMIT).await.unwrap();
    assert!(out.recompute.is_empty(), "{:?}", out.reason);
    let sent = node.memory(src.id).unwrap().to_vec().unwrap();
    let got = server.memory(dst.id).unwrap().to_vec().unwrap();
    assert!(
        sent == got,
        "engine {}'s bytes differ on the server",
        peer.0
    );
}

/// Completes the handshake as engine `id` (with `token`), asking for a served region.
pub(crate) async fn handshake_as(
    addr: SocketAddr,
    id: u32,
    token: [u8; TOKEN_LEN],
    listen: Option<&str>,
) -> (TcpStream, Result<(RegionHandle, [u8; TOKEN_LEN]), String>) {
    let from = IpAddr::from([127, 0, 0, 1]);
    handshake_from(from, addr, id, token, listen).await
}

/// [`handshake_as`] from local address `from` (any of 127.0.0.0/8 on loopback).
pub(crate) async fn handshake_from(
    from: IpAddr,
    addr: SocketAddr,
    id: u32,
    token: [u8; TOKEN_LEN],
    listen: Option<&str>,
) -> (TcpStream, Result<(RegionHandle, [u8; TOKEN_LEN]), String>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let mut hello = Hello::new(id, Namespace::default()).unwrap();
    hello.want = Some(layout());
    hello.token = token;
    hello.listen = listen.map(str::to_string);
    let result = handshake::dial(&mut s, &hello, None, None, LIMIT)
        .await
        .map(|a| (a.segments[0].handle, a.token))
        .map_err(|e| e.to_string());
    (s, result)
}

/// A real client's handshake (engine 60, asking for a region) within `limit`.
pub(crate) async fn honest_handshake(
    addr: SocketAddr,
    limit: Duration,
) -> Result<handshake::Accepted, backends::TransportError> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = Hello::new(60, Namespace::default()).unwrap();
    hello.want = Some(layout());
    handshake::dial(&mut s, &hello, None, None, limit).await
}

/// The frames an engine would send to open a session into `dst` and push its slices (payloads as given
/// by the engine's own region, which is zeros).
pub(crate) fn attack_frames(dst: RegionHandle, slice: u32) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut e = Engine::new({
        let mut cfg = EngineConfig::default();
        cfg.engine_id = 66;
        cfg
    });
    let src = e
        .register_kv_region(
            layout(),
            MemoryRegion::zeroed(layout().total_bytes() as usize),
        )
        .unwrap();
    let now = Instant::now();
    let req = TransferRequest::whole(PeerId(2), &src, &dst)
        .unwrap()
        .with_mode(TransferMode::Packetized { slice_bytes: slice });
    let session = e.submit(now, req).unwrap();
    let (mut open, mut data) = (Vec::new(), Vec::new());
    if let Some(t) = e.poll_transmit(now)
        && let Body::Control(p) = &t.body
    {
        open = transfer_engine::wire::encode_frame(&t.header, p);
    }
    // As if the server had answered the open: the engine then sends its slices.
    let mut ack = Header::new(FrameKind::OpenAck, session.0);
    ack.crc = transfer_engine::crc32c(&[]);
    e.handle_frame(now, PeerId(2), &ack, &[]).unwrap();
    while let Some(mut t) = e.poll_transmit(now) {
        if matches!(t.body, Body::Payload(_)) {
            data.push(e.encode_transmit(&mut t).unwrap());
        }
    }
    assert!(!open.is_empty() && !data.is_empty());
    (open, data)
}
