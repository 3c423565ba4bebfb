//! Fast failure on a dead peer: when every lane to a peer with live sessions is gone and redialing it is
//! refused (or it cannot be redialed at all) for [`super::Liveness::unreachable_after`], its sessions end
//! at once with recompute and a reason, and new transfers to it fail at once for
//! [`super::Liveness::unreachable_hold`] or until a lane opens again. Nothing redials a peer so declared:
//! only a transfer submitted after the hold (a session that needs it) does.

use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use transfer_engine::PeerId;

use super::context::lock;
use super::peer_link::{PeerLink, Reach};
use super::state::NodeState;
use crate::TransportError;

/// What the driver should do about a link after [`judge`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing: it has lanes, or nothing needs it.
    Fine,
    /// It has no lane but needs one: dial it (when its backoff allows).
    Redial,
}

/// Judges one link: clears its marks when a lane is open, starts the clock when it loses its last lane
/// under live sessions, and declares it unreachable (ending its sessions) once the clock runs out with
/// redialing refused.
pub(crate) fn judge(node: &NodeState, link: &Arc<PeerLink>, now: Instant) -> Verdict {
    let mut reach = lock(&link.reach);
    if link.lane_count() > 0 {
        if reach.unreachable.take().is_some() {
            node.ctx
                .log(format!("peer {} is reachable again", link.peer.0));
        }
        reach.lost_since = None;
        return Verdict::Fine;
    }
    let mut engine = node.ctx.station.engine();
    if reach.unreachable.is_some() || !engine.has_sessions_with(link.peer) {
        // Nothing needs a lane (a peer declared unreachable has no sessions: `check_held` clears the
        // verdict before a new one is submitted, under this lock): no dial.
        reach.lost_since = None;
        return Verdict::Fine;
    }
    let since = *reach.lost_since.get_or_insert(now);
    let (failures, last_error) = link.dial_failures();
    let addr = link.addr();
    let refused = addr.is_none() || failures > 0;
    if now.duration_since(since) < node.ctx.cfg.liveness.unreachable_after || !refused {
        return Verdict::Redial;
    }
    let reason = unreachable_reason(link.peer, addr, last_error, now.duration_since(since));
    let ended = engine.abort_peer(link.peer, &reason);
    node.ctx.station.drain_events(&mut engine);
    drop(engine);
    link.clear_queue(&node.ctx);
    node.ctx.log(format!("{reason}; ended {ended} session(s)"));
    reach.unreachable = Some((reason, now));
    Verdict::Fine
}

fn unreachable_reason(
    peer: PeerId,
    addr: Option<std::net::SocketAddr>,
    last_error: Option<String>,
    lost_for: std::time::Duration,
) -> String {
    let how = match (addr, last_error) {
        (Some(a), Some(e)) => format!("redialing {a} failed: {e}"),
        (Some(a), None) => format!("redialing {a} failed"),
        (None, _) => "its address is unknown, so it cannot be redialed".into(),
    };
    format!(
        "peer {} is unreachable: no connection for {} ms and {how}",
        peer.0,
        lost_for.as_millis()
    )
}

/// Refuses a new transfer to a peer declared unreachable less than `hold` ago (unless a lane to it is open
/// again); otherwise clears the verdict and the earlier dial failures, so the transfer's session makes
/// the driver dial the peer again and is judged afresh. The guard returned is held while the caller
/// submits the session, so the driver cannot declare the peer unreachable in between (a session
/// submitted under a verdict would never be dialed for).
pub(crate) fn check_held(
    link: &PeerLink,
    hold: Duration,
    now: Instant,
) -> Result<MutexGuard<'_, Reach>, TransportError> {
    let mut reach = lock(&link.reach);
    if let Some((reason, since)) = &reach.unreachable {
        if now.duration_since(*since) < hold && link.lane_count() == 0 {
            return Err(TransportError::Unreachable(reason.clone()));
        }
        reach.unreachable = None;
        link.reset_dial_failures(now);
    }
    Ok(reach)
}
