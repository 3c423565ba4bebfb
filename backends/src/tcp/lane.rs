//! Lanes: the TCP connections to one peer. This module dials and starts them; each runs a writer task
//! ([`super::writer`]: vectored batches of sealed frames) and a reader task ([`super::reader`]: headers
//! decoded, payloads received straight into their destination).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::net::TcpStream;
use tokio::sync::watch;
use transfer_engine::{KvLayout, PeerId};

use super::context::lock;
use super::handshake::{self};
use super::lane_state::LaneState;
use super::peer_link::{LaneHandle, PeerLink};
use super::socket;
use super::state::NodeState;
use super::state::PeerInfo;
use crate::node::LogKind;
use crate::{Fault, TransportError};

/// Dials `addr`, handshakes and starts a lane; the peer's id comes from its hello (checked against
/// `expect` if given).
pub(crate) async fn dial(
    node: &Arc<NodeState>,
    addr: SocketAddr,
    expect: Option<PeerId>,
    want: Option<KvLayout>,
) -> Result<PeerInfo, TransportError> {
    let limit = node.ctx.cfg.liveness.handshake_timeout;
    let mut stream = tokio::time::timeout(limit, TcpStream::connect(addr))
        .await
        .map_err(|_| TransportError::Timeout {
            what: format!("connecting to {addr}"),
            waited: limit,
        })?
        .map_err(|e| TransportError::io("tcp", &e))?;
    socket::configure(&stream, addr.ip(), &node.ctx.cfg)
        .map_err(|e| TransportError::io("tcp", &e))?;
    let mut hello = node.hello()?;
    hello.want = want;
    // A later lane to a peer proves it belongs to the peer's connection group with the group's token.
    let known = match expect {
        Some(peer) => Some(node.link(peer)),
        None => node.link_at(addr),
    };
    if let Some(token) = known.and_then(|l| l.token()) {
        hello.token = token;
    }
    let expect = expect.map(|p| p.0 as u32);
    let accepted = handshake::dial(&mut stream, &hello, node.ctx.secret(), expect, limit)
        .await
        .inspect_err(|e| {
            let kind = match e.fault() {
                Fault::Peer => LogKind::HandshakeRefused,
                _ => LogKind::Failed,
            };
            node.ctx
                .core
                .log
                .error(kind, None, format!("dialing {addr}"), e.clone());
        })?;
    let peer = PeerId(u64::from(accepted.peer.engine_id));
    let link = node.link(peer);
    link.pin();
    link.set_addr(addr);
    super::group::join(node, &link, accepted.token);
    start(node, &link, stream, true, None);
    Ok(PeerInfo {
        peer,
        segments: accepted.segments,
    })
}

/// A dial the driver asked for; failures back off.
pub(crate) async fn redial(node: Arc<NodeState>, link: Arc<PeerLink>, addr: SocketAddr) {
    let result = dial(&node, addr, Some(link.peer), None)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    link.dial_done(result, &node.ctx);
    node.ctx.wake.notify_one();
}

/// Starts the reader and writer of a lane on a handshaken stream.
pub(crate) fn start(
    node: &Arc<NodeState>,
    link: &Arc<PeerLink>,
    stream: TcpStream,
    outbound: bool,
    slot: Option<super::admission::ConnectionSlot>,
) {
    let id = node.ctx.next_lane.fetch_add(1, Ordering::Relaxed);
    let state = Arc::new(LaneState {
        id,
        outbound,
        closed: watch::Sender::new(None),
        goodbye: Mutex::new(None),
        last_rx: Mutex::new(Instant::now()),
        address_budget: slot.as_ref().and_then(|s| s.control_budget()),
        address_data_budget: slot.as_ref().and_then(|s| s.data_budget()),
    });
    let seat = match &slot {
        Some(slot) => {
            slot.seat_lane(&state);
            None
        }
        None => Some(node.admission.outbound_seat()),
    };
    let (rd, wr) = stream.into_split();
    let mut lanes = lock(&link.lanes);
    // A dial or accept that completes after the node shut down (its lanes were closed under this lock,
    // after the flag was set) starts nothing: the connection drops here rather than idling for the
    // idle timeout while its peer takes it for a live node.
    if *node.shutdown.borrow() {
        return;
    }
    let r = tokio::spawn(super::reader::reader(
        node.ctx.clone(),
        link.clone(),
        state.clone(),
        rd,
    ));
    let w = tokio::spawn(super::writer::writer(
        node.ctx.clone(),
        link.clone(),
        state.clone(),
        wr,
    ));
    lanes.insert(
        id,
        LaneHandle {
            state,
            tasks: vec![r.abort_handle(), w.abort_handle()],
            _slot: slot,
            _outbound: seat,
        },
    );
    drop(lanes);
    node.ctx
        .counters
        .lanes_opened
        .fetch_add(1, Ordering::Relaxed);
    node.ctx.wake.notify_one();
}
