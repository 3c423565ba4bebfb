//! The accepting side of lanes: the handshake, admission of a lane into its peer's connection group, the
//! regions served to peers that ask for one, and where a peer may be dialed back.
//!
//! - Identity: without a secret, a peer's engine id is bound to the connection group that completed its
//!   first handshake: that lane's Welcome carries a fresh random token, and every later lane of the peer
//!   (in either direction) must present it while the group has live lanes. With a secret, the HMAC
//!   handshake authenticates every lane besides.
//! - At most `max_lanes_per_peer` lanes per peer are admitted, and at most `max_lanes` in all: at the
//!   bound the address holding the most lanes gives up its idlest for a newcomer from an address
//!   holding fewer ([`super::lane_shares`]).
//! - One IP address has at most `max_peers_per_address` engines connected at once.
//! - A served region belongs to the peer that asked for it: the engine refuses any other peer's open
//!   ([`super::served`]).
//! - Dial-back goes only to the IP address the peer's connection came from (at the port its Hello names),
//!   never to a host the Hello names, and not at all with `dial_back` off.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use transfer_engine::PeerId;

use super::group;
use super::handshake::{self, Hello, Message, NO_TOKEN, TOKEN_LEN};
use super::lane;
use super::peer_link::PeerLink;
use super::served::{Asker, offer};
use super::socket;
use super::state::NodeState;
use crate::TransportError;
use crate::node::LogKind;

pub(crate) async fn accept_loop(node: Arc<NodeState>, listener: TcpListener) {
    let mut stop = node.shutdown.subscribe();
    let turns = Arc::new(Semaphore::new(node.ctx.cfg.limits.max_handshakes.max(1)));
    let refusals = Arc::new(Semaphore::new(node.ctx.cfg.limits.max_pending_refusals));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, from)) => {
                    let c = &node.ctx.counters;
                    let limits = &node.ctx.cfg.limits;
                    let admitted = node.admission.admit(
                        from.ip(),
                        limits.max_connections_per_address,
                        limits.max_lanes,
                    );
                    let slot = match admitted {
                        Ok(slot) => slot,
                        Err(reason) => {
                            c.handshakes_refused.fetch_add(1, Ordering::Relaxed);
                            node.ctx.core.log.note(
                                LogKind::HandshakeRefused,
                                None,
                                format!("refused connection from {from}: {reason}"),
                            );
                            match refusals.clone().try_acquire_owned() {
                                Ok(permit) => {
                                    tokio::spawn(async move {
                                        super::admission::refuse(stream, reason).await;
                                        drop(permit);
                                    });
                                }
                                // As many refusals as the node answers at once: closed unanswered.
                                Err(_) => {
                                    c.refusals_unanswered.fetch_add(1, Ordering::Relaxed);
                                    drop(stream);
                                }
                            }
                            continue;
                        }
                    };
                    let (node, turns) = (node.clone(), turns.clone());
                    tokio::spawn(handshake_turn(node, turns, stream, from, slot));
                }
                Err(e) => {
                    node.ctx.core.log.error(
                        LogKind::Failed,
                        None,
                        "accept failed",
                        TransportError::io("tcp", &e),
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = stop.changed() => return,
        }
    }
}

/// Why a handshake failed: told to the peer already, or not yet.
enum Failed {
    /// The peer has not been told: it is answered with a Reject carrying the reason.
    Unanswered {
        /// What the Reject says.
        reason: String,
        /// What went wrong, as logged here.
        error: TransportError,
    },
    /// The peer was sent a Reject already (or sent one).
    Answered(TransportError),
}

impl Failed {
    /// A failure the peer is told of by its error's text.
    fn unanswered(error: TransportError) -> Self {
        Failed::Unanswered {
            reason: error.to_string(),
            error,
        }
    }
}

impl From<TransportError> for Failed {
    fn from(e: TransportError) -> Self {
        Self::Answered(e)
    }
}

/// Runs a connection's handshake within `handshake_timeout`. Only its checks hold a handshake turn (one
/// of its address's, then one of the node's): a connection waiting for its peer's next message holds
/// none, so connections that send nothing, part of a message, or a Hello and then no Auth cost only
/// their socket and what they sent, never a real client's turn. A connection that sends nothing, or gets
/// no turn, in time is refused with the reason.
async fn handshake_turn(
    node: Arc<NodeState>,
    turns: Arc<Semaphore>,
    mut stream: TcpStream,
    from: SocketAddr,
    mut slot: super::admission::ConnectionSlot,
) {
    // A socket the kernel will not configure still serves, with the kernel's settings.
    if let Err(e) = socket::configure(&stream, from.ip(), &node.ctx.cfg) {
        node.ctx.core.log.note(
            LogKind::Failed,
            None,
            format!("lane from {from}: socket settings refused ({e}); kept the kernel's"),
        );
    }
    let limit = node.ctx.cfg.liveness.handshake_timeout;
    let deadline = tokio::time::Instant::now() + limit;
    let late = move || Failed::Unanswered {
        reason: format!("no handshake within {limit:?}"),
        error: TransportError::Timeout {
            what: "the handshake".into(),
            waited: limit,
        },
    };
    let secret = node.ctx.secret();
    let result = async {
        let ours = node.hello().map_err(Failed::unanswered)?;
        let first = next_message(&mut stream, deadline, late).await?;
        let turn = take_turn(&slot, &turns, deadline, limit).await?;
        let answer = handshake::answer_hello(&mut stream, &first, &ours, secret);
        let (peer, covered) = tokio::time::timeout_at(deadline, answer)
            .await
            .map_err(|_| late())??;
        drop(turn);
        let auth = next_message(&mut stream, deadline, late).await?;
        let _turn = take_turn(&slot, &turns, deadline, limit).await?;
        handshake::check_auth(&mut stream, &auth, &covered, secret).await?;
        let link = welcome(&node, &mut stream, from, &mut slot, &peer);
        let link = tokio::time::timeout_at(deadline, link)
            .await
            .map_err(|_| late())??;
        Ok::<_, Failed>(link)
    }
    .await;
    let failed = match result {
        Ok(link) => return lane::start(&node, &link, stream, false, Some(slot)),
        Err(failed) => failed,
    };
    node.ctx
        .counters
        .handshakes_refused
        .fetch_add(1, Ordering::Relaxed);
    let refused = format!("refused connection from {from}");
    let error = match &failed {
        Failed::Answered(e) | Failed::Unanswered { error: e, .. } => e.clone(),
    };
    node.ctx
        .core
        .log
        .error(LogKind::HandshakeRefused, None, refused, error);
    // (The slot is held until the refusal is told: it still counts against its address.)
    if let Failed::Unanswered { reason, .. } = failed {
        super::admission::refuse(stream, reason).await;
    }
    drop(slot);
}

/// The peer's next handshake message, undecoded, by `deadline` (holding no turn while it waits).
async fn next_message(
    stream: &mut TcpStream,
    deadline: tokio::time::Instant,
    late: impl Fn() -> Failed,
) -> Result<Vec<u8>, Failed> {
    tokio::time::timeout_at(deadline, handshake::recv_body(stream))
        .await
        .map_err(|_| late())?
        .map_err(Failed::unanswered)
}

/// One of `slot`'s address's handshake turns, then one of the node's, by `deadline`.
async fn take_turn(
    slot: &super::admission::ConnectionSlot,
    turns: &Arc<Semaphore>,
    deadline: tokio::time::Instant,
    limit: std::time::Duration,
) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), Failed> {
    let both = async {
        let address = slot.address_turn().await;
        let node_turn = turns.clone().acquire_owned().await;
        (address, node_turn)
    };
    match tokio::time::timeout_at(deadline, both).await {
        Ok((address, Ok(node_turn))) => Ok((address, node_turn)),
        _ => {
            let reason = "too many handshakes in progress here: none had a turn within the handshake's time limit";
            Err(Failed::Unanswered {
                reason: reason.into(),
                error: TransportError::Timeout {
                    what: "waiting for a handshake turn".into(),
                    waited: limit,
                },
            })
        }
    }
}

/// Admits an authenticated lane of `peer` (its address's engine bound, its own lane bound, its
/// connection group), serves the region it asked for and writes Welcome; on a refusal, the Reject.
async fn welcome(
    node: &NodeState,
    stream: &mut TcpStream,
    from: SocketAddr,
    slot: &mut super::admission::ConnectionSlot,
    peer: &Hello,
) -> Result<Arc<PeerLink>, Failed> {
    let id = PeerId(u64::from(peer.engine_id));
    let link = node.link(id);
    let admitted = slot
        .join(id, node.ctx.cfg.limits.max_peers_per_address)
        .and_then(|()| admit(node, &link, peer))
        .and_then(|token| {
            if let Some(shed) = slot.take_seat(node.ctx.cfg.limits.max_lanes)? {
                node.ctx.counters.lanes_shed.fetch_add(1, Ordering::Relaxed);
                node.ctx
                    .core
                    .log
                    .note(LogKind::HandshakeRefused, None, shed.reason.clone());
                shed.lane.shed(shed.reason);
            }
            Ok(token)
        })
        .and_then(|token| {
            // A new group's predecessor goes first (its sessions end, its regions are freed), so a
            // restarted process finds the room its earlier self held.
            group::join(node, &link, token);
            let asker = Asker {
                peer: id,
                group: token,
                address: from.ip(),
            };
            Ok((token, offer(node, asker, peer.want)?))
        });
    match admitted {
        Ok((token, segments)) => {
            // Where to dial it back is known before it hears Welcome.
            if let Some(addr) = dial_back(node, peer, from) {
                link.set_addr(addr);
            }
            handshake::send(stream, &Message::Welcome(token, segments)).await?;
            Ok(link)
        }
        Err(reason) => {
            let _ = handshake::send(stream, &Message::Reject(reason.clone())).await;
            Err(Failed::Answered(TransportError::Refused(reason)))
        }
    }
}

/// Decides whether a lane joins `link`'s peer: within the lane bound, and in its connection group.
/// Returns the group's token (a fresh one for a new group).
fn admit(node: &NodeState, link: &PeerLink, peer: &Hello) -> Result<[u8; TOKEN_LEN], String> {
    let lanes = link.lane_count();
    if lanes >= node.ctx.cfg.limits.max_lanes_per_peer {
        return Err(format!(
            "engine {} already has {lanes} lanes here, the most this node allows per peer",
            peer.engine_id
        ));
    }
    match link.token() {
        Some(token) if lanes > 0 && peer.token != token => Err(format!(
            "engine {} is already connected here from another connection group: a later lane must \
             present the token its group was given (no two processes may share an engine id)",
            peer.engine_id
        )),
        Some(token) if peer.token == token && peer.token != NO_TOKEN => Ok(token),
        _ => crate::node::handshake::fresh::<TOKEN_LEN>("a token"),
    }
}

/// Where a peer may be dialed back: the host its connection came from, at the port its Hello names.
fn dial_back(node: &NodeState, peer: &Hello, from: SocketAddr) -> Option<SocketAddr> {
    if !node.ctx.cfg.security.dial_back {
        return None;
    }
    let named: SocketAddr = peer.listen.as_deref()?.parse().ok()?;
    Some(SocketAddr::new(from.ip(), named.port()))
}
