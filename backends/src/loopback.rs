//! The in-process loopback backend: a producer engine and a consumer engine in one process, each driven by
//! its own thread, joined by channels.
//!
//! Every frame goes through the real wire codec. A data frame's payload is never copied into a message: the
//! producer sends the header with a handle on its region's memory and checksums the payload in place; the
//! consumer copies it once, straight from the producer's memory into the place its engine names, and
//! verifies it there. The producer's checksum pass pulls the bytes into the shared cache just before the
//! consumer copies them, so the two cores together keep close to the speed of a plain copy.
//!
//! Both ends are [`LoopbackNode`]s, nodes like any other backend's: register caller memory, submit and
//! await transfers, take notices of incoming sessions, await them layer by layer and consume layers,
//! subscribe to events.

mod credit;
mod gpu;
mod node;
mod threads;
mod tier_moves;

pub use node::{LoopbackDriver, LoopbackNode, Side};

pub use tier_moves::{TierMoveReport, TierRegions};

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::Duration;

use transfer_engine::{EngineConfig, PeerId, SessionId, TransferRequest};

use crate::TransportError;
use crate::board::{Outcome, WaitError};
use crate::node::{LogKind, Node, NodeCore};
use credit::Credit;
use node::Ends;
use threads::Frame;

/// The producer's peer id, as the consumer sees it.
pub const PRODUCER: PeerId = PeerId(1);
/// The consumer's peer id, as the producer sees it.
pub const CONSUMER: PeerId = PeerId(2);

/// Payload bytes in flight from producer to consumer: enough to keep both cores busy, few enough that the
/// bytes the producer just checksummed are still in cache when the consumer copies them (measured: 1 MiB
/// beats 256 KiB and 4 MiB on a 2-core machine with 1 MiB of L2 per core).
const IN_FLIGHT_BYTES: u64 = 1 << 20;
/// Frames the producer-to-consumer channel holds (a data frame and its seal are two).
const CHANNEL_FRAMES: usize = 256;

/// Engine settings for loopback: nothing is ever lost in process, so a frame is late only when a thread
/// was not scheduled. The retransmit timer starts at 100 ms (not the network default of 5 ms) so that a
/// scheduling hiccup on a busy machine does not turn into a burst of pointless resends.
#[must_use]
pub fn loopback_engine_config(engine_id: u32) -> EngineConfig {
    let mut cfg = EngineConfig::with_engine_id(engine_id);
    (cfg.backoff.base, cfg.backoff.max) = (Duration::from_millis(100), Duration::from_secs(2));
    cfg
}

/// One end of the pair, as its thread and its node's driver share it: its core (engine, log, segments,
/// verdicts), how its thread is woken and how the other end names it.
#[derive(Debug)]
pub(crate) struct LoopbackEnd {
    pub(crate) core: NodeCore,
    /// Wakes this end's thread (a submit, a consumed layer).
    wake: WakeHandle,
    /// How the other end names this one.
    peer_id: PeerId,
    /// Moves units where either side is GPU memory (the consumer's).
    gpu: gpu::GpuPlacer,
}

#[derive(Debug)]
enum WakeHandle {
    Producer(mpsc::Sender<Frame>),
    Consumer(mpsc::SyncSender<Frame>),
}

impl LoopbackEnd {
    fn new(cfg: EngineConfig, wake: WakeHandle, peer_id: PeerId) -> Self {
        Self {
            core: NodeCore::new("loopback", cfg),
            wake,
            peer_id,
            gpu: gpu::GpuPlacer::new(),
        }
    }

    /// How the other end names this one ([`PRODUCER`] or [`CONSUMER`]).
    pub(crate) fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// How this end names the other one.
    pub(crate) fn other_peer(&self) -> PeerId {
        if self.peer_id == PRODUCER {
            CONSUMER
        } else {
            PRODUCER
        }
    }

    /// Logs a frame from the other end that this end refused.
    pub(crate) fn refused(&self, e: impl Into<TransportError>) {
        self.core.log.error(
            LogKind::Refused,
            Some(self.other_peer()),
            "refused a frame",
            e,
        );
    }

    /// Logs a frame this end could not send.
    pub(crate) fn failed(&self, what: &str, e: impl Into<TransportError>) {
        self.core
            .log
            .error(LogKind::Failed, Some(self.other_peer()), what, e);
    }

    /// Wakes this end's thread.
    pub(crate) fn wake(&self) {
        match &self.wake {
            WakeHandle::Producer(tx) => {
                let _ = tx.send(Frame::Wake);
            }
            // A full channel means the consumer thread is busy and will look again soon.
            WakeHandle::Consumer(tx) => {
                let _ = tx.try_send(Frame::Wake);
            }
        }
    }
}

/// A producer and a consumer engine, wired back to back, each driven by its own thread until both ends
/// are dropped (or shut down). Each end is a [`LoopbackNode`], with every call of a node.
#[derive(Debug)]
pub struct LoopbackPair {
    producer: LoopbackNode,
    consumer: LoopbackNode,
    /// Runs the blocking waits of [`LoopbackPair::transfer_all`].
    rt: PairRuntime,
}

impl LoopbackPair {
    /// Two engines with these configurations (their engine ids must differ), and their threads.
    ///
    /// # Panics
    /// If the operating system refuses a thread or a timer.
    #[must_use]
    pub fn new(producer: EngineConfig, consumer: EngineConfig) -> Self {
        let (data_tx, data_rx) = mpsc::sync_channel(CHANNEL_FRAMES);
        let (ack_tx, ack_rx) = mpsc::channel();
        let producer = Arc::new(LoopbackEnd::new(
            producer,
            WakeHandle::Producer(ack_tx.clone()),
            PRODUCER,
        ));
        let consumer = Arc::new(LoopbackEnd::new(
            consumer,
            WakeHandle::Consumer(data_tx.clone()),
            CONSUMER,
        ));
        let stops = [
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        ];
        let credit = Arc::new(Credit::new(IN_FLIGHT_BYTES));
        let producer_thread = threads::spawn_producer(
            producer.clone(),
            data_tx,
            ack_rx,
            credit.clone(),
            stops[0].clone(),
        );
        let consumer_thread =
            threads::spawn_consumer(consumer.clone(), data_rx, ack_tx, credit, stops[1].clone());
        let ends = Arc::new(Ends::new(
            [producer, consumer],
            stops,
            [producer_thread, consumer_thread],
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime for blocking waits");
        Self {
            producer: Node::from_driver(LoopbackDriver::new(ends.clone(), Side::Producer)),
            consumer: Node::from_driver(LoopbackDriver::new(ends, Side::Consumer)),
            rt: PairRuntime(Some(rt)),
        }
    }

    /// A pair with engine ids 1 and 2 and [`loopback_engine_config`]'s timing.
    #[must_use]
    pub fn with_defaults() -> Self {
        Self::new(loopback_engine_config(1), {
            let mut cfg = loopback_engine_config(2);
            cfg.rng_seed = 1;
            cfg
        })
    }

    /// The sending end.
    #[must_use]
    pub fn producer(&self) -> &LoopbackNode {
        &self.producer
    }

    /// The receiving end.
    #[must_use]
    pub fn consumer(&self) -> &LoopbackNode {
        &self.consumer
    }

    /// The pair's two ends as transports: the producer, then the consumer. The pair's threads run while
    /// either end lives.
    #[must_use]
    pub fn into_nodes(self) -> (LoopbackNode, LoopbackNode) {
        (self.producer, self.consumer)
    }

    /// Starts a transfer from the producer to the consumer; await it with the producer's
    /// [`Node::wait`](crate::node::Node::wait).
    pub fn submit(&self, req: TransferRequest) -> Result<SessionId, TransportError> {
        self.producer.submit(req)
    }

    /// The producer of sending session `session` has written every layer below `until`: those layers may
    /// go out (for requests made with `TransferRequest::with_layers_written`).
    pub fn layers_written(&self, session: SessionId, until: u32) -> Result<(), TransportError> {
        self.producer.layers_written(session, until)
    }

    /// Stops sending session `session`: every block not yet acknowledged is reported for recompute, at
    /// both ends.
    pub fn cancel(&self, session: SessionId) -> Result<(), TransportError> {
        self.producer.cancel(session)
    }

    /// Runs one transfer to completion; see [`LoopbackPair::transfer_all`].
    pub fn transfer(
        &self,
        req: TransferRequest,
        limit: Duration,
    ) -> Result<Outcome, TransportError> {
        let mut out = self.transfer_all(vec![req], limit)?;
        Ok(out.remove(0))
    }

    /// Submits every request and blocks until every session has completed on the producer (delivered and
    /// acknowledged, or reported for recompute) or `limit` passes.
    pub fn transfer_all(
        &self,
        reqs: Vec<TransferRequest>,
        limit: Duration,
    ) -> Result<Vec<Outcome>, TransportError> {
        let sessions = reqs
            .into_iter()
            .map(|r| self.submit(r))
            .collect::<Result<Vec<_>, _>>()?;
        self.wait_all(&sessions, limit)
            .map_err(|pending| stalled(pending.len(), limit))?
            .into_iter()
            .map(|out| Ok(out?))
            .collect()
    }

    /// Waits, up to `limit` in all, until each of `sessions` has completed on the producer, in order; each
    /// one's outcome (stopping after the first that cannot be waited for), or the sessions still running
    /// when `limit` passed.
    fn wait_all(
        &self,
        sessions: &[SessionId],
        limit: Duration,
    ) -> Result<Vec<Result<Outcome, WaitError>>, Vec<SessionId>> {
        let board = &crate::node::Driver::core(self.producer.driver())
            .station
            .board;
        let all = async {
            let mut out = Vec::with_capacity(sessions.len());
            for s in sessions {
                let outcome = board.wait_sent(*s).await;
                let failed = outcome.is_err();
                out.push(outcome);
                if failed {
                    break;
                }
            }
            out
        };
        self.runtime()
            .block_on(async { tokio::time::timeout(limit, all).await })
            .map_err(|_| {
                sessions
                    .iter()
                    .filter(|s| board.sent(**s).is_none())
                    .copied()
                    .collect()
            })
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.rt
            .0
            .as_ref()
            .expect("the runtime lives until the pair drops")
    }

    /// Runs `f` to completion on the pair's own runtime (for callers without an executor).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime().block_on(f)
    }
}

impl LoopbackPair {
    /// Stops one end, as a process exiting would: its thread ends, its waiters are woken with
    /// [`WaitError::Closed`], and the other end notices at once: its sessions with this end end with
    /// recompute, and new ones are refused. Idempotent.
    pub fn shutdown(&self, side: Side) {
        self.producer.driver().ends().shutdown(side);
    }
}

/// The pair's runtime for blocking waits. (An option only so that dropping the pair on an async runtime's
/// thread can shut it down in the background, where dropping it in place would panic.)
#[derive(Debug)]
struct PairRuntime(Option<tokio::runtime::Runtime>);

impl Drop for PairRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            rt.shutdown_background();
        }
    }
}

/// `pending` sessions did not finish within `waited`.
fn stalled(pending: usize, waited: Duration) -> TransportError {
    TransportError::Timeout {
        what: format!("{pending} session(s)"),
        waited,
    }
}

#[cfg(test)]
mod tests;
