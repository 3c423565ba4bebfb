//! The engine every node holds: behind a mutex that is held only for short, non-blocking calls, with the
//! [`Board`] its events go to.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use transfer_engine::{
    Engine, EngineConfig, Error, KvLayout, MemoryRegion, RegionHandle, SessionId, TransferRequest,
};

use crate::board::Board;

/// An engine and its board, in a node's [`super::NodeCore`].
#[derive(Debug)]
pub(crate) struct Station {
    engine: Mutex<Engine>,
    pub(crate) board: Board,
}

impl Station {
    pub(crate) fn new(cfg: EngineConfig) -> Self {
        Self {
            engine: Mutex::new(Engine::new(cfg)),
            board: Board::default(),
        }
    }

    /// The engine, locked: keep the guard for non-blocking calls only.
    pub(crate) fn engine(&self) -> MutexGuard<'_, Engine> {
        crate::lock::lock(&self.engine)
    }

    /// Registers `memory` as a KV region of `layout`.
    pub(crate) fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, Error> {
        self.engine().register_kv_region(layout, memory)
    }

    /// Submits a transfer and records its start on the board.
    pub(crate) fn submit(&self, req: TransferRequest) -> Result<SessionId, Error> {
        let now = Instant::now();
        let mut engine = self.engine();
        let id = engine.submit(now, req)?;
        self.board.submitted(id, now);
        Ok(id)
    }

    /// The consumer is about to compute `layer` of receiving session `session`; see
    /// [`Engine::consume_layer`]. A session that already finished (its last layers arrived before the
    /// consumer reached them) answers from the board.
    pub(crate) fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, Error> {
        let result = self.engine().consume_layer(Instant::now(), session, layer);
        match result {
            Err(Error::UnknownSession(_)) => self
                .board
                .layer_done(session, layer)
                .ok_or(Error::UnknownSession(session)),
            other => other,
        }
    }

    /// Stops placing receiving session `session`'s bytes; see [`Engine::abandon_receive`]. Its waiters
    /// learn at once.
    pub(crate) fn abandon_receive(&self, session: SessionId) -> Result<(), Error> {
        let mut engine = self.engine();
        engine.abandon_receive(session)?;
        self.drain_events(&mut engine);
        Ok(())
    }

    /// Ends every session with `peer`, with recompute and `reason`; their waiters learn at once. Returns
    /// how many ended.
    pub(crate) fn end_sessions(&self, peer: transfer_engine::PeerId, reason: &str) -> usize {
        let mut engine = self.engine();
        let ended = engine.abort_peer(peer, reason);
        self.drain_events(&mut engine);
        ended
    }

    /// Hands every pending event of `engine` (this station's, locked by the caller) to the board.
    pub(crate) fn drain_events(&self, engine: &mut Engine) {
        while let Some(event) = engine.poll_event() {
            self.board.observe(&event);
        }
    }
}

/// Longest nap of a driver thread with live sessions (a timer may be due sooner; a frame or a command
/// wakes it at once).
pub(crate) const BUSY_NAP: Duration = Duration::from_millis(1);
/// Longest nap of an idle driver thread.
pub(crate) const IDLE_NAP: Duration = Duration::from_millis(100);

/// How long a driver thread may nap: until the engine's next timer, at most [`BUSY_NAP`] while sessions
/// live, else [`IDLE_NAP`].
pub(crate) fn nap(engine: &Engine, now: Instant) -> Duration {
    let cap = if engine.live_sessions() > 0 {
        BUSY_NAP
    } else {
        IDLE_NAP
    };
    engine
        .poll_timeout()
        .map_or(cap, |t| t.saturating_duration_since(now).min(cap))
}

/// Fires the engine's timers when one is due.
pub(crate) fn fire_timers(engine: &mut Engine, now: Instant) {
    if engine.poll_timeout().is_some_and(|t| t <= now) {
        engine.handle_timeout(now);
    }
}
