//! The driver's half of the dead-peer rule: it pings senders gone quiet, judges from writes and answers
//! which peers are unreachable ([`super::reach`]), and declares them to the node's verdicts, which end
//! their sessions and refuse new ones.

use std::time::Instant;

use transfer_engine::PeerId;

use super::Driver;
use crate::TransportError;
use crate::rdma::message::Message;
use crate::rdma::shared::lock;

impl Driver<'_> {
    /// Pings the peers this node has live sessions with that have been silent for half the answer
    /// timeout: a sender that died while this node waited to receive from it is noticed like any peer that
    /// does not answer (a live one that is only slow to produce answers the ping). Looked at every tenth of
    /// the answer timeout.
    pub(super) fn ping_silent_senders(&mut self, now: Instant) -> Result<(), TransportError> {
        let timeout = self.shared.cfg.liveness.answer_timeout;
        if now.saturating_duration_since(self.last_ping_check) < timeout / 10 {
            return Ok(());
        }
        self.last_ping_check = now;
        let peers: Vec<PeerId> = {
            let routes = lock(&self.shared.routes);
            let engine = self.shared.core.station.engine();
            routes
                .keys()
                .filter(|p| engine.has_sessions_with(**p))
                .copied()
                .collect()
        };
        for peer in self.reach.due_for_ping(&peers, now, timeout / 2) {
            if let Some(route) = self.route(peer) {
                let ping = Message::Ping.encode(self.shared.engine_id());
                match self.ep.send(route.addr, &ping) {
                    Err(TransportError::Unreachable(why)) => self.peer_gone(peer, &why),
                    other => {
                        other?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Ends the sessions of peers that failed every write, or answered nothing, for too long.
    pub(super) fn declare_unreachable(&mut self, now: Instant) {
        let cfg = &self.shared.cfg;
        for (peer, reason) in self.reach.unreachable(
            now,
            cfg.liveness.unreachable_after,
            cfg.liveness.answer_timeout,
        ) {
            // Recorded and ended under one lock, so no session submitted meanwhile waits for the same
            // verdict again; waiters learn at once, as on every backend.
            self.shared.core.declare_unreachable(peer, reason, now);
        }
    }

    /// A frame to `peer` was refused before the provider was called, its process having exited (see
    /// `ffi/process.rs`): dropped, and counted as a failed write, so the peer is declared unreachable as
    /// one whose writes fail.
    pub(super) fn peer_gone(&mut self, peer: PeerId, why: &str) {
        self.reach.failed(peer, Instant::now(), why);
        self.shared.failed(
            Some(peer),
            format!("peer {}: a frame dropped: {why}", peer.0),
        );
    }
}
