//! What a node's engine reported, kept for its user with the same bounded retention on every backend:
//! sessions it receives (to take notice of, and to await layer by layer or whole), sessions it sends (to
//! await), and a feed of every event for subscribers.
//!
//! Drivers hand the board each event while they hold the engine; users wait on the board
//! without touching the engine. Waits are plain futures (tokio's sync primitives): any executor runs them,
//! and `tokio::time::timeout` bounds them.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, watch};
use transfer_engine::{BlockId, Counters, Event, PeerId, RegionId, Role, SessionId};

/// Events a subscriber may fall behind by before it misses the oldest (it is told how many).
pub const KEEP_EVENTS: usize = 1 << 16;
/// Finished sessions remembered for late waiters, per role; older ones are forgotten.
pub const KEEP_FINISHED: usize = 4096;
/// Incoming sessions kept for accepting before the oldest unaccepted one is dropped (its transfer
/// still runs; only the notice is lost, and counted).
pub const KEEP_INCOMING: usize = 4096;

/// A session another node opened towards this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingSession {
    /// The session.
    pub session: SessionId,
    /// Who sends it.
    pub peer: PeerId,
    /// The local region its KV lands in.
    pub region: RegionId,
    /// The layers that will arrive, in order of their index.
    pub layers: Range<u32>,
    /// The destination blocks within each layer.
    pub blocks: Vec<u32>,
}

/// What a finished sending session reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The session.
    pub session: SessionId,
    /// Blocks to recompute (source ids); empty when every block was delivered and acknowledged.
    pub recompute: Vec<BlockId>,
    /// Why blocks were not delivered, when the peer refused the session or the driver lost the peer.
    pub reason: Option<String>,
    /// Time from submit until the sender learned the session was over.
    pub elapsed: Duration,
}

/// What a finished receiving session reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The session and where it landed.
    pub incoming: IncomingSession,
    /// Destination blocks that did not arrive intact: recompute them. Every other block is in place.
    pub recompute: Vec<BlockId>,
    /// Why, when the driver lost the peer.
    pub reason: Option<String>,
    /// The session's final counters.
    pub stats: Counters,
}

/// Why a wait on the board ended without its answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// No live or recently finished session has this id on this node (in the role waited for).
    #[error("session {0} is not known here (never seen, or finished long ago and forgotten)")]
    UnknownSession(SessionId),
    /// The layer is not part of the session.
    #[error("layer {layer} is not part of session {session} (layers {layers:?})")]
    NoSuchLayer {
        /// The session.
        session: SessionId,
        /// The layer asked for.
        layer: u32,
        /// The session's layers.
        layers: Range<u32>,
    },
    /// The session ended before the layer arrived whole: these blocks of it must be recomputed.
    #[error("session {session} ended without layer {layer}: recompute {} of its blocks{}", blocks.len(),
            reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    LayerLost {
        /// The session.
        session: SessionId,
        /// The layer.
        layer: u32,
        /// Its blocks that did not arrive.
        blocks: Vec<BlockId>,
        /// Why, when the driver lost the peer.
        reason: Option<String>,
    },
    /// The node shut down.
    #[error("the node is shut down")]
    Closed,
}

/// The board itself.
#[derive(Debug)]
pub(crate) struct Board {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    events: broadcast::Sender<Event>,
}

#[derive(Debug, Default)]
struct State {
    incoming: VecDeque<IncomingSession>,
    incoming_dropped: u64,
    receiving: HashMap<SessionId, Receiving>,
    sending: HashMap<SessionId, Sending>,
    finished: [VecDeque<SessionId>; 2],
}

#[derive(Debug)]
struct Receiving {
    info: IncomingSession,
    layer_done: Vec<bool>,
    recompute: Vec<BlockId>,
    reason: Option<String>,
    done: Option<Counters>,
}

#[derive(Debug)]
struct Sending {
    started: Instant,
    recompute: Vec<BlockId>,
    reason: Option<String>,
    done: Option<Outcome>,
}

impl Default for Board {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            changed: watch::Sender::new(0),
            events: broadcast::Sender::new(KEEP_EVENTS),
        }
    }
}

impl Board {
    fn state(&self) -> MutexGuard<'_, State> {
        crate::lock::lock(&self.state)
    }

    /// A session was submitted at `at` (call while holding the engine, before its events are drained).
    pub(crate) fn submitted(&self, session: SessionId, at: Instant) {
        self.state().sending.insert(
            session,
            Sending {
                started: at,
                recompute: Vec::new(),
                reason: None,
                done: None,
            },
        );
    }

    /// Records one event from the engine and passes it to subscribers.
    pub(crate) fn observe(&self, event: &Event) {
        let mut s = self.state();
        match event {
            Event::Incoming {
                session,
                peer,
                region,
                layers,
                blocks,
            } => {
                let info = IncomingSession {
                    session: *session,
                    peer: *peer,
                    region: *region,
                    layers: layers.clone(),
                    blocks: blocks.clone(),
                };
                if s.incoming.len() >= KEEP_INCOMING {
                    s.incoming.pop_front();
                    s.incoming_dropped += 1;
                }
                s.incoming.push_back(info.clone());
                s.receiving.insert(
                    *session,
                    Receiving {
                        layer_done: vec![false; layers.len()],
                        info,
                        recompute: Vec::new(),
                        reason: None,
                        done: None,
                    },
                );
            }
            Event::LayerComplete { session, layer } => {
                if let Some(r) = s.receiving.get_mut(session)
                    && let Some(done) = layer
                        .checked_sub(r.info.layers.start)
                        .and_then(|i| r.layer_done.get_mut(i as usize))
                {
                    *done = true;
                }
            }
            Event::Recompute {
                session,
                role,
                blocks,
            } => match role {
                Role::Sender => {
                    if let Some(x) = s.sending.get_mut(session) {
                        x.recompute = blocks.clone();
                    }
                }
                Role::Receiver => {
                    if let Some(x) = s.receiving.get_mut(session) {
                        x.recompute = blocks.clone();
                    }
                }
            },
            Event::Refused { session, reason } => {
                if let Some(x) = s.sending.get_mut(session) {
                    x.reason = Some(reason.clone());
                }
            }
            Event::Aborted {
                session,
                role,
                reason,
            } => match role {
                Role::Sender => {
                    if let Some(x) = s.sending.get_mut(session) {
                        x.reason = Some(reason.clone());
                    }
                }
                Role::Receiver => {
                    if let Some(x) = s.receiving.get_mut(session) {
                        x.reason = Some(reason.clone());
                    }
                }
            },
            Event::Completed {
                session,
                role,
                stats,
            } => {
                let known = match role {
                    Role::Sender => s.sending.get_mut(session).is_some_and(|x| {
                        x.done = Some(Outcome {
                            session: *session,
                            recompute: std::mem::take(&mut x.recompute),
                            reason: x.reason.take(),
                            elapsed: x.started.elapsed(),
                        });
                        true
                    }),
                    Role::Receiver => s.receiving.get_mut(session).is_some_and(|x| {
                        x.done = Some(*stats);
                        true
                    }),
                };
                if known {
                    s.finish(*session, *role);
                }
            }
            Event::BlockDelivered { .. } => {}
        }
        drop(s);
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(event.clone());
        }
        // A delivered block changes nothing a waiter waits for (layers and sessions do).
        if !matches!(event, Event::BlockDelivered { .. }) {
            // A closed board stays closed: `u64::MAX` is its mark, never counted past.
            self.changed.send_if_modified(|n| {
                if *n == u64::MAX {
                    return false;
                }
                *n = (*n + 1) % u64::MAX;
                true
            });
        }
    }

    /// Wakes every waiter with [`WaitError::Closed`] from now on.
    pub(crate) fn close(&self) {
        self.changed.send_replace(u64::MAX);
    }

    /// A feed of every event from now on (a subscriber more than [`KEEP_EVENTS`] behind is told how many
    /// it missed).
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Incoming sessions dropped unaccepted because more than [`KEEP_INCOMING`] waited.
    pub(crate) fn incoming_dropped(&self) -> u64 {
        self.state().incoming_dropped
    }

    /// Whether `layer` of receiving session `session` has arrived whole; `None` when the session or the
    /// layer is not known.
    pub(crate) fn layer_done(&self, session: SessionId, layer: u32) -> Option<bool> {
        let s = self.state();
        let r = s.receiving.get(&session)?;
        let index = layer.checked_sub(r.info.layers.start)?;
        r.layer_done.get(index as usize).copied()
    }

    /// The notice of the next incoming session nobody has taken yet (the session already runs: the engine
    /// admitted it when its open arrived), waiting for one if needed.
    pub(crate) async fn next_incoming(&self) -> Result<IncomingSession, WaitError> {
        self.wait_for(|s| Some(Ok(s.incoming.pop_front()?))).await
    }

    /// Waits until `layer` of receiving session `session` has arrived whole.
    pub(crate) async fn wait_layer(&self, session: SessionId, layer: u32) -> Result<(), WaitError> {
        self.wait_for(|s| {
            let Some(r) = s.receiving.get(&session) else {
                return Some(Err(WaitError::UnknownSession(session)));
            };
            let Some(index) = layer
                .checked_sub(r.info.layers.start)
                .filter(|i| (*i as usize) < r.layer_done.len())
            else {
                return Some(Err(WaitError::NoSuchLayer {
                    session,
                    layer,
                    layers: r.info.layers.clone(),
                }));
            };
            if r.layer_done[index as usize] {
                return Some(Ok(()));
            }
            r.done?;
            Some(Err(WaitError::LayerLost {
                session,
                layer,
                blocks: r
                    .recompute
                    .iter()
                    .filter(|b| b.layer == layer)
                    .copied()
                    .collect(),
                reason: r.reason.clone(),
            }))
        })
        .await
    }

    /// Waits until receiving session `session` is known here (announced, or finished and still
    /// remembered).
    pub(crate) async fn wait_announced(&self, session: SessionId) -> Result<(), WaitError> {
        self.wait_for(|s| s.receiving.contains_key(&session).then_some(Ok(())))
            .await
    }

    /// Waits until receiving session `session` is over.
    pub(crate) async fn wait_received(&self, session: SessionId) -> Result<Received, WaitError> {
        self.wait_for(|s| {
            let Some(r) = s.receiving.get(&session) else {
                return Some(Err(WaitError::UnknownSession(session)));
            };
            Some(Ok(Received {
                incoming: r.info.clone(),
                recompute: r.recompute.clone(),
                reason: r.reason.clone(),
                stats: r.done?,
            }))
        })
        .await
    }

    /// Waits until sending session `session` is over.
    pub(crate) async fn wait_sent(&self, session: SessionId) -> Result<Outcome, WaitError> {
        self.wait_for(|s| match s.sending.get(&session) {
            None => Some(Err(WaitError::UnknownSession(session))),
            Some(x) => x.done.clone().map(Ok),
        })
        .await
    }

    /// The outcome of sending session `session` if it is over, without waiting.
    pub(crate) fn sent(&self, session: SessionId) -> Option<Outcome> {
        self.state().sending.get(&session)?.done.clone()
    }

    /// Evaluates `check` after every change until it answers.
    async fn wait_for<T>(
        &self,
        mut check: impl FnMut(&mut State) -> Option<Result<T, WaitError>>,
    ) -> Result<T, WaitError> {
        let mut changes = self.changed.subscribe();
        loop {
            if *changes.borrow_and_update() == u64::MAX {
                return Err(WaitError::Closed);
            }
            if let Some(answer) = check(&mut self.state()) {
                return answer;
            }
            if changes.changed().await.is_err() {
                return Err(WaitError::Closed);
            }
        }
    }
}

impl State {
    /// Remembers that a session finished, forgetting the oldest finished one past [`KEEP_FINISHED`].
    fn finish(&mut self, session: SessionId, role: Role) {
        let index = usize::from(role == Role::Receiver);
        self.finished[index].push_back(session);
        while self.finished[index].len() > KEEP_FINISHED {
            if let Some(old) = self.finished[index].pop_front() {
                match role {
                    Role::Sender => {
                        self.sending.remove(&old);
                    }
                    Role::Receiver => {
                        self.receiving.remove(&old);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
