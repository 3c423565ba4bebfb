//! Fast failure on a dead peer: when every lane to a peer with live sessions is gone and redialing it is
//! refused (or it cannot be redialed at all) for [`super::Liveness::unreachable_after`], its sessions end
//! at once with recompute and a reason, and new transfers to it fail at once for
//! [`super::Liveness::unreachable_hold`] or until a lane opens again. Nothing redials a peer so declared:
//! only a transfer submitted after the hold (a session that needs it) does.

use std::sync::Arc;
use std::time::Instant;

use transfer_engine::PeerId;

use super::context::lock;
use super::peer_link::PeerLink;
use super::state::NodeState;

/// What the driver should do about a link after [`judge`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing: it has lanes, or nothing needs it.
    Fine,
    /// It has no lane but needs one: dial it (when its backoff allows).
    Redial,
}

/// Judges one link: clears its verdict and clock when a lane is open, starts the clock when it loses its
/// last lane under live sessions, and declares it unreachable (ending its sessions) once the clock runs
/// out with redialing refused.
pub(crate) fn judge(node: &NodeState, link: &Arc<PeerLink>, now: Instant) -> Verdict {
    let core = &node.ctx.core;
    let peer = link.peer;
    if link.lane_count() > 0 {
        core.reachable_again(peer);
        *lock(&link.lost_since) = None;
        return Verdict::Fine;
    }
    // A peer declared unreachable has no sessions left; one submitted after its hold cleared the verdict
    // and the dial failures first, so it is judged afresh from here.
    if core.is_unreachable(peer) || !core.station.engine().has_sessions_with(peer) {
        *lock(&link.lost_since) = None;
        return Verdict::Fine;
    }
    let since = *lock(&link.lost_since).get_or_insert(now);
    let (failures, last_error) = link.dial_failures();
    let addr = link.addr();
    let refused = addr.is_none() || failures > 0;
    if now.duration_since(since) < node.ctx.cfg.liveness.unreachable_after || !refused {
        return Verdict::Redial;
    }
    let reason = unreachable_reason(peer, addr, last_error, now.duration_since(since));
    core.declare_unreachable(peer, reason, now);
    link.clear_queue(&node.ctx);
    *lock(&link.lost_since) = None;
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
