//! Lanes: the TCP connections to one peer. This module dials and starts them; each runs a writer task
//! ([`super::writer`]: vectored batches of sealed frames) and a reader task ([`super::reader`]: headers
//! decoded, payloads received straight into their destination).

use std::io::{self};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::watch;
use transfer_engine::{KvLayout, PeerId};

use super::TcpError;
use super::handshake::{self};
use super::link::{LaneHandle, Link};
use super::node::{PeerInfo, Shared, lock};

/// One lane's shared state between its reader and writer.
pub(crate) struct LaneState {
    pub(crate) id: u64,
    pub(crate) outbound: bool,
    pub(crate) closed: watch::Sender<Option<String>>,
    pub(crate) goodbye: Mutex<Option<Vec<u8>>>,
    pub(crate) last_rx: Mutex<Instant>,
}

impl LaneState {
    pub(crate) fn close(&self, reason: &str) {
        self.closed.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason.to_string());
                true
            } else {
                false
            }
        });
    }
}

/// Dials `addr`, handshakes and starts a lane; the peer's id comes from its hello (checked against
/// `expect` if given).
pub(crate) async fn dial(
    shared: &Arc<Shared>,
    addr: SocketAddr,
    expect: Option<PeerId>,
    want: Option<KvLayout>,
) -> Result<PeerInfo, TcpError> {
    let limit = shared.cfg.handshake_timeout;
    let mut stream = tokio::time::timeout(limit, TcpStream::connect(addr))
        .await
        .map_err(|_| TcpError::Timeout {
            what: format!("connecting to {addr}"),
            waited: limit,
        })??;
    stream.set_nodelay(true)?;
    let mut hello = shared.hello()?;
    hello.want = want;
    // A later lane to a peer proves it belongs to the peer's connection group with the group's token.
    let known = match expect {
        Some(peer) => Some(shared.link(peer)),
        None => shared.link_at(addr),
    };
    if let Some(token) = known.and_then(|l| l.token()) {
        hello.token = token;
    }
    let expect = expect.map(|p| p.0 as u32);
    let accepted = handshake::dial(&mut stream, &hello, shared.secret(), expect, limit)
        .await
        .inspect_err(|e| shared.log(format!("dialing {addr}: {e}")))?;
    let peer = PeerId(u64::from(accepted.peer.engine_id));
    let link = shared.link(peer);
    link.set_addr(addr);
    link.set_token(accepted.token);
    start(shared, &link, stream, true);
    Ok(PeerInfo {
        peer,
        segments: accepted.segments,
    })
}

/// A dial the driver asked for; failures back off.
pub(crate) async fn redial(shared: Arc<Shared>, link: Arc<Link>, addr: SocketAddr) {
    let result = dial(&shared, addr, Some(link.peer), None)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    link.dial_done(result, &shared);
    shared.wake.notify_one();
}

/// Starts the reader and writer of a lane on a handshaken stream.
pub(crate) fn start(shared: &Arc<Shared>, link: &Arc<Link>, stream: TcpStream, outbound: bool) {
    let id = shared.next_lane.fetch_add(1, Ordering::Relaxed);
    let state = Arc::new(LaneState {
        id,
        outbound,
        closed: watch::Sender::new(None),
        goodbye: Mutex::new(None),
        last_rx: Mutex::new(Instant::now()),
    });
    let (rd, wr) = stream.into_split();
    let mut lanes = lock(&link.lanes);
    let r = tokio::spawn(super::reader::reader(
        shared.clone(),
        link.clone(),
        state.clone(),
        rd,
    ));
    let w = tokio::spawn(super::writer::writer(
        shared.clone(),
        link.clone(),
        state.clone(),
        wr,
    ));
    lanes.insert(
        id,
        LaneHandle {
            state,
            tasks: vec![r.abort_handle(), w.abort_handle()],
        },
    );
    drop(lanes);
    shared.counters.lanes_opened.fetch_add(1, Ordering::Relaxed);
    shared.wake.notify_one();
}

/// Waits for a socket to be ready, at most `stall`: a peer that makes no progress for that long is
/// reported as having `what` (and loses its lane).
pub(crate) async fn ready(
    wait: impl std::future::Future<Output = io::Result<()>>,
    stall: Duration,
    what: &str,
) -> io::Result<()> {
    match tokio::time::timeout(stall, wait).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the peer {what} for {} s", stall.as_secs_f64()),
        )),
    }
}
