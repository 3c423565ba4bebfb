//! The driver thread: fires the engine's timers, takes what it wants sent and queues each frame on its
//! peer's link, then naps until the next timer or until something wakes it (a command, a link's frames).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Instant;

use transfer_engine::{Body, Engine, Transmit};

use super::link::Outbound;
use super::shared::Shared;
use crate::lock::lock;
use crate::node::LogKind;
use crate::node::station::{fire_timers, nap};

/// Frames taken from the engine per round, so the lock is not held long.
const ROUND_FRAMES: usize = 512;

/// The frame for a transmit, with a handle on its payload's memory.
fn outbound(engine: &Engine, t: Transmit) -> Option<Outbound> {
    match t.body {
        Body::Payload(p) => {
            let memory = engine.memory(p.region).ok()?.clone();
            Some(Outbound::Data(t.header, memory, p.range()))
        }
        Body::Control(payload) => Some(Outbound::Control(t.header, payload)),
        Body::Empty => Some(Outbound::Control(t.header, Vec::new())),
    }
}

/// Runs until the node stops.
pub(crate) fn run(shared: &Arc<Shared>, wake: &Receiver<()>) {
    let mut out = Vec::with_capacity(ROUND_FRAMES);
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let wait = {
            let mut engine = shared.core.station.engine();
            fire_timers(&mut engine, now);
            while out.len() < ROUND_FRAMES {
                let Some(t) = engine.poll_transmit(now) else {
                    break;
                };
                let peer = t.peer;
                match outbound(&engine, t) {
                    Some(frame) => out.push((peer, frame)),
                    None => shared.refused(
                        LogKind::Refused,
                        Some(peer),
                        "refused to send a unit of an unknown region",
                        None,
                    ),
                }
            }
            shared.core.station.drain_events(&mut engine);
            nap(&engine, now)
        };
        let full = out.len() == ROUND_FRAMES;
        if !out.is_empty() {
            let links = lock(&shared.links);
            for (peer, frame) in out.drain(..) {
                let sent = links.get(&peer).is_some_and(|l| l.send(frame));
                if !sent {
                    shared
                        .counters
                        .frames_dropped
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if !full {
            match wake.recv_timeout(wait) {
                Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}
