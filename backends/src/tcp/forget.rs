//! Forgetting strangers: the link of a peer that connected here (never one this node's user dialed, added
//! or sent a transfer to) is dropped once it has had no lane, nothing queued and no session for
//! [`super::Liveness::forget_peer_after`] (and at least the served-region grace), with any region served
//! to it. A stranger cycling through engine ids therefore cannot grow the node's memory, or the work of
//! its driver's pass over every link, without bound; a peer that comes back is a new connection group.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use transfer_engine::PeerId;

use super::context::lock;
use super::state::NodeState;

/// Forgets the strangers idle long enough; returns how many.
pub(crate) fn forget_idle_strangers(node: &NodeState, now: Instant) -> usize {
    let cfg = &node.ctx.cfg;
    let Some(cutoff) = now.checked_sub(
        cfg.liveness
            .forget_peer_after
            .max(cfg.serving.served_region_grace),
    ) else {
        return 0;
    };
    // Candidates first, from a snapshot (the engine is never locked under the map: the driver takes
    // them the other way round).
    let candidates: Vec<PeerId> = {
        let links = node.all_links();
        let engine = node.ctx.core.station.engine();
        links
            .iter()
            .filter(|l| l.idle_stranger_since(cutoff) && !engine.has_sessions_with(l.peer))
            .map(|l| l.peer)
            .collect()
    };
    if candidates.is_empty() {
        return 0;
    }
    // Then each one only if nothing else holds its link now (an accept, a dial or a submit in progress
    // holds it, and can take it only under this lock), and it is still idle.
    let mut forgotten = Vec::new();
    {
        let mut links = lock(&node.links);
        for peer in candidates {
            if links
                .get(&peer)
                .is_some_and(|l| Arc::strong_count(l) == 1 && l.idle_stranger_since(cutoff))
            {
                links.remove(&peer);
                forgotten.push(peer);
            }
        }
    }
    for &peer in &forgotten {
        super::served::free_all_of(node, peer);
        node.ctx.core.forget_verdict(peer);
    }
    node.ctx
        .counters
        .peers_forgotten
        .fetch_add(forgotten.len() as u64, Ordering::Relaxed);
    forgotten.len()
}
