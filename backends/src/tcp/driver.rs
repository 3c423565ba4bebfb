//! The driver task: polls the engine's timers, transmits and events, routes transmits to their peers'
//! links, and dials lanes where they are needed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use transfer_engine::Body;

use super::lane;
use super::peer_link::PeerLink;
use super::reach;
use super::state::NodeState;

/// How often the driver looks for strangers to forget.
const FORGET_EVERY: Duration = Duration::from_secs(1);

/// Runs until the node shuts down.
pub(crate) async fn drive(node: Arc<NodeState>) {
    let mut stop = node.shutdown.subscribe();
    let mut last_forget = Instant::now();
    loop {
        let next = step(&node);
        ensure_lanes(&node);
        if last_forget.elapsed() >= FORGET_EVERY {
            last_forget = Instant::now();
            super::forget::forget_idle_strangers(&node, last_forget);
        }
        let nap = next.map_or(Duration::from_millis(50), |t| {
            t.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50))
        });
        tokio::select! {
            () = node.ctx.wake.notified() => {}
            () = tokio::time::sleep(nap) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One pass of the driver: timers, transmits routed to links, events. Returns the next timer.
fn step(node: &NodeState) -> Option<Instant> {
    let now = Instant::now();
    let mut engine = node.ctx.core.station.engine();
    if engine.poll_timeout().is_some_and(|t| t <= now) {
        engine.handle_timeout(now);
    }
    let mut touched: Vec<Arc<PeerLink>> = Vec::new();
    while node.ctx.total_queued.load(Ordering::Relaxed) < node.ctx.cfg.buffers.queue_bytes {
        let Some(t) = engine.poll_transmit(now) else {
            break;
        };
        let link = match touched.iter().find(|l| l.peer == t.peer) {
            Some(l) => l.clone(),
            None => {
                let l = node.link(t.peer);
                touched.push(l.clone());
                l
            }
        };
        if !link.routable() {
            node.ctx.counters.unroutable.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // A peer that does not read its acks and nacks (or floods to make them) cannot fill the queue
        // everyone shares: beyond its own share, control frames to it are dropped (the engines' timers
        // recover what matters). Data frames are bounded by the sessions' windows.
        if !matches!(t.body, Body::Payload(_))
            && link.queued_bytes.load(Ordering::Relaxed) >= node.ctx.cfg.limits.peer_queue_bytes
        {
            node.ctx
                .counters
                .control_dropped
                .fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let len = t.wire_len() as u64;
        link.push(t);
        node.ctx.total_queued.fetch_add(len, Ordering::Relaxed);
    }
    node.ctx.core.station.drain_events(&mut engine);
    let next = engine.poll_timeout();
    drop(engine);
    for link in &touched {
        link.ready.notify_one();
    }
    next
}

/// Dials more lanes where they are needed: a first lane to a peer with live sessions (frames queued for
/// a peer without any are dropped instead), more (up to the pool's bound) while more than a batch waits,
/// within each peer's dial rate; ends the sessions of peers
/// found unreachable (see [`super::reach`]).
fn ensure_lanes(node: &Arc<NodeState>) {
    let links = node.all_links();
    let now = Instant::now();
    for link in links {
        let redial = reach::judge(node, &link, now) == reach::Verdict::Redial;
        let queued = link.queued_bytes.load(Ordering::Relaxed);
        let lanes = link.lane_count();
        if lanes == 0 && !redial && queued > 0 {
            // No lane and no session needs one: what is queued (answers to a peer that left, such as
            // Rejects and CloseAcks) is not worth a dial. Its engine resends what mattered.
            let dropped = link.clear_queue(&node.ctx) as u64;
            node.ctx
                .counters
                .unroutable
                .fetch_add(dropped, Ordering::Relaxed);
            continue;
        }
        let want = (lanes == 0 && redial)
            || (lanes > 0
                && queued > node.ctx.cfg.buffers.batch_bytes as u64
                && lanes < node.ctx.cfg.limits.max_lanes_per_peer);
        if want && let Some(addr) = link.dial_due(now, &node.ctx) {
            tokio::spawn(lane::redial(node.clone(), link, addr));
        }
    }
}
