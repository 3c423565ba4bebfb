//! The dead-peer rule's verdicts, one table for every backend. Each driver detects a dead peer its own way
//! (TCP: no lane and redialing refused for `unreachable_after`; RDMA: writes failing, or no answer; shm:
//! its socket closed or it stalled; loopback: the other end shut down) and declares it here. Declaring
//! records the verdict and ends the peer's sessions with recompute under one lock, and a new session is
//! admitted under the same lock, so a session is either submitted before the verdict (and ended by it) or
//! refused by it: none waits for a peer already judged dead.
//!
//! A verdict refuses new sessions to its peer (with its reason, as [`TransportError::Unreachable`]) until
//! the peer is heard from again ([`super::NodeCore::reachable_again`]) or the driver's hold rule lets a new
//! session try (TCP, after `unreachable_hold`: see [`super::Driver::verdict_holds`]).
//!
//! Lock order: the verdicts, then the engine; never the reverse.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use transfer_engine::PeerId;

use super::log::{Log, LogKind};
use super::station::Station;
use crate::lock::lock;
use crate::transport::TransportError;

/// Why a peer was declared unreachable, and when. Public only as an opaque part of [`super::Driver`].
#[derive(Debug, Clone)]
pub struct Verdict {
    pub(crate) reason: String,
    pub(crate) since: Instant,
}

/// The verdicts of one node, by peer.
#[derive(Debug, Default)]
pub(crate) struct Verdicts {
    table: Mutex<HashMap<PeerId, Verdict>>,
}

/// A new session to a peer was admitted: no verdict is declared while this lives, so submit the session
/// before dropping it.
pub(crate) struct Admitted<'a> {
    _table: MutexGuard<'a, HashMap<PeerId, Verdict>>,
    /// The peer had a verdict whose hold had ended: it was cleared for this session.
    pub(crate) cleared: bool,
}

impl Verdicts {
    /// Declares `peer` unreachable for `reason`: records the verdict, ends its sessions in `station`'s
    /// engine with recompute (their waiters learn at once) and logs it. Returns how many sessions ended.
    pub(crate) fn declare(
        &self,
        station: &Station,
        log: &Log,
        peer: PeerId,
        reason: String,
        now: Instant,
    ) -> usize {
        let mut table = lock(&self.table);
        let ended = station.end_sessions(peer, &reason);
        let line = format!("{reason}; ended {ended} session(s)");
        table.insert(peer, Verdict { reason, since: now });
        drop(table);
        log.note(LogKind::Unreachable, Some(peer), line);
        ended
    }

    /// `peer` was heard from again: its verdict, if any, ends (and that is logged). Returns whether it had
    /// one.
    pub(crate) fn clear(&self, log: &Log, peer: PeerId) -> bool {
        let had = lock(&self.table).remove(&peer).is_some();
        if had {
            log.note(
                LogKind::Reachable,
                Some(peer),
                format!("peer {} is reachable again", peer.0),
            );
        }
        had
    }

    /// Forgets the verdict on `peer`, silently: the node let go of everything it knew of the peer.
    pub(crate) fn forget(&self, peer: PeerId) {
        lock(&self.table).remove(&peer);
    }

    /// The verdict on `peer`, if any.
    pub(crate) fn get(&self, peer: PeerId) -> Option<Verdict> {
        lock(&self.table).get(&peer).cloned()
    }

    /// Admits a new session to `peer`, or refuses it with the verdict's reason while `holds` says the
    /// verdict still holds; a verdict that no longer holds is cleared.
    pub(crate) fn admit(
        &self,
        peer: PeerId,
        holds: impl FnOnce(&Verdict) -> bool,
    ) -> Result<Admitted<'_>, TransportError> {
        let mut table = lock(&self.table);
        let mut cleared = false;
        if let Some(verdict) = table.get(&peer) {
            if holds(verdict) {
                return Err(TransportError::Unreachable(verdict.reason.clone()));
            }
            table.remove(&peer);
            cleared = true;
        }
        Ok(Admitted {
            _table: table,
            cleared,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use transfer_engine::EngineConfig;

    use super::*;
    use crate::node::NodeCore;

    #[test]
    fn a_verdict_refuses_until_it_is_heard_from_or_its_hold_ends() {
        let core = NodeCore::new("tcp", EngineConfig::with_engine_id(1));
        let (peer, t0) = (PeerId(2), Instant::now());
        assert!(core.admit(peer, |_| true).is_ok_and(|a| !a.cleared));
        assert_eq!(core.declare_unreachable(peer, "gone".into(), t0), 0);
        assert!(core.is_unreachable(peer));
        let refused = core.admit(peer, |_| true).err().unwrap();
        assert!(
            matches!(&refused, TransportError::Unreachable(r) if r == "gone"),
            "{refused}"
        );
        // The driver's hold ended: the session may try, and the verdict is gone.
        let hold = Duration::from_secs(5);
        let later = t0 + hold;
        assert!(
            core.admit(peer, |v| later.duration_since(v.since) < hold)
                .is_ok_and(|a| a.cleared)
        );
        assert!(!core.is_unreachable(peer));
        core.declare_unreachable(peer, "gone again".into(), later);
        assert!(core.reachable_again(peer));
        assert!(!core.reachable_again(peer));
        let kinds: Vec<LogKind> = core.log.entries().iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                LogKind::Unreachable,
                LogKind::Unreachable,
                LogKind::Reachable
            ]
        );
    }
}
