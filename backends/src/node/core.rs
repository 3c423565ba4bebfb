//! [`NodeCore`]: what a node and its driver's tasks share, whatever the backend: the engine and its board,
//! the log, the segments offered to peers and the dead-peer verdicts. A driver keeps one and hands it to
//! its tasks; [`super::Node`] answers every common call from it.

use std::time::Instant;

use transfer_engine::{EngineConfig, PeerId, RegionHandle, RegionId};

use super::log::{Log, LogKind};
use super::reach::{Admitted, Verdict, Verdicts};
use super::station::Station;
use crate::lock::lock;
use crate::transport::{Segment, TransportError};

/// What a node and its driver's tasks share: the engine and its board, the log, the segments offered to
/// peers and the dead-peer verdicts. Public only as an opaque part of [`super::Driver`].
#[derive(Debug)]
pub struct NodeCore {
    pub(crate) station: Station,
    pub(crate) log: Log,
    pub(crate) segments: Segments,
    pub(crate) verdicts: Verdicts,
    engine_id: u32,
}

impl NodeCore {
    /// The core of a `backend` node with engine configuration `cfg`.
    pub(crate) fn new(backend: &'static str, cfg: EngineConfig) -> Self {
        let engine_id = cfg.engine_id;
        Self {
            station: Station::new(cfg),
            log: Log::new(backend, engine_id),
            segments: Segments::default(),
            verdicts: Verdicts::default(),
            engine_id,
        }
    }

    /// This node's engine id.
    pub(crate) fn engine_id(&self) -> u32 {
        self.engine_id
    }

    /// Ends `peer`'s sessions because another process now answers for it (see
    /// [`NodeCore::end_sessions`]), and logs it when any ended.
    pub(crate) fn replace_peer(&self, peer: PeerId, reason: &str) -> usize {
        let ended = self.station.end_sessions(peer, reason);
        if ended > 0 {
            self.log.note(
                LogKind::SessionsEnded,
                Some(peer),
                format!("{reason}; ended {ended} session(s)"),
            );
        }
        ended
    }
}

/// The dead-peer rule (see [`super::reach`]): what every driver calls.
impl NodeCore {
    /// Declares `peer` unreachable for `reason`: its sessions end with recompute, new ones are refused
    /// until the verdict ends. Returns how many sessions ended.
    pub(crate) fn declare_unreachable(&self, peer: PeerId, reason: String, now: Instant) -> usize {
        self.verdicts
            .declare(&self.station, &self.log, peer, reason, now)
    }

    /// `peer` was heard from again: its verdict, if any, ends. Returns whether it had one.
    pub(crate) fn reachable_again(&self, peer: PeerId) -> bool {
        self.verdicts.clear(&self.log, peer)
    }

    /// Whether `peer` is declared unreachable now.
    pub(crate) fn is_unreachable(&self, peer: PeerId) -> bool {
        self.verdicts.get(peer).is_some()
    }

    /// The verdict on `peer`, if any.
    pub(crate) fn verdict(&self, peer: PeerId) -> Option<Verdict> {
        self.verdicts.get(peer)
    }

    /// Forgets the verdict on `peer` (the node let go of the peer), silently.
    pub(crate) fn forget_verdict(&self, peer: PeerId) {
        self.verdicts.forget(peer);
    }

    /// Admits a new session to `peer` unless a verdict that `holds` still holds refuses it; see
    /// [`Verdicts::admit`].
    pub(crate) fn admit(
        &self,
        peer: PeerId,
        holds: impl FnOnce(&Verdict) -> bool,
    ) -> Result<Admitted<'_>, TransportError> {
        self.verdicts.admit(peer, holds)
    }
}

/// The regions a node offers to peers, by name.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    offered: std::sync::Mutex<Vec<Segment>>,
}

impl Segments {
    /// Offers `handle` under `name`, replacing a segment of that name.
    pub(crate) fn offer(&self, name: &str, handle: RegionHandle) {
        let mut offered = lock(&self.offered);
        offered.retain(|s| s.name != name);
        offered.push(Segment {
            name: name.to_owned(),
            handle,
        });
    }

    /// Stops offering region `id` under any name.
    pub(crate) fn withdraw(&self, id: RegionId) {
        lock(&self.offered).retain(|s| s.handle.id != id);
    }

    /// The segments offered now.
    pub(crate) fn list(&self) -> Vec<Segment> {
        lock(&self.offered).clone()
    }
}
