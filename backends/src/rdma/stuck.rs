//! The watch over a node's driver. A driver that has not come back from one step for
//! [`RdmaConfig::stuck_after`](super::RdmaConfig) is stuck inside a provider call: on libfabric 1.17's
//! `shm`, a peer process killed while it held a spin lock in shared memory (its own region's, or this
//! endpoint's while it sent here) leaves every later call that takes that lock spinning for good.
//! `ffi/process.rs` keeps calls away from peers whose process is known to have exited, but not from one
//! that dies during a call, and nothing can interrupt such a call. So the watch does what the driver no
//! longer can: it ends every live session with recompute and a reason, the node refuses new sessions
//! and registrations, and [`RdmaNode::shutdown`](super::RdmaNode::shutdown) leaves the driver behind (with
//! the endpoint it owns) instead of waiting for it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use transfer_engine::PeerId;

use super::shared::{Shared, lock};
use crate::TransportError;

/// How often the watch looks.
pub(super) const TICK: Duration = Duration::from_millis(100);

impl Shared {
    /// How long the driver has been inside its current step, when that is [`super::RdmaConfig::stuck_after`]
    /// or longer.
    pub(crate) fn stuck(&self) -> Option<Duration> {
        let quiet = self.beat.quiet_for();
        (quiet >= self.cfg.stuck_after).then_some(quiet)
    }

    /// The error for calls that need a stuck driver.
    pub(crate) fn stuck_error(quiet: Duration) -> TransportError {
        TransportError::Unreachable(format!(
            "the node's provider has not returned from a call for {:.1} s (a peer process that died \
             inside a call on shared memory leaves it spinning); restart the node",
            quiet.as_secs_f64()
        ))
    }
}

/// Runs the watch until the node stops (woken early by `unpark`).
pub(super) fn watch(shared: &Shared) {
    while !shared.stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(TICK);
        if let Some(quiet) = shared.stuck() {
            end_sessions(shared, quiet);
        }
    }
}

/// Ends the sessions of every peer this node has live sessions with, as unreachable.
fn end_sessions(shared: &Shared, quiet: Duration) {
    let peers: Vec<PeerId> = {
        let routes = lock(&shared.routes);
        let engine = shared.core.station.engine();
        routes
            .keys()
            .filter(|p| engine.has_sessions_with(**p))
            .copied()
            .collect()
    };
    let now = Instant::now();
    for peer in peers {
        let reason = format!(
            "peer {} unreachable: this node's provider has not returned from a call for {:.1} s",
            peer.0,
            quiet.as_secs_f64()
        );
        shared.core.declare_unreachable(peer, reason, now);
    }
}
