//! The in-process loopback backend: a producer engine and a consumer engine in one process, each driven by
//! its own thread, joined by channels.
//!
//! Every frame goes through the real wire codec. A data frame's payload is never copied into a message: the
//! producer sends the header with a handle on its region's memory and checksums the payload in place; the
//! consumer copies it once, straight from the producer's memory into the place its engine names, and
//! verifies it there. The producer's checksum pass pulls the bytes into the shared cache just before the
//! consumer copies them, so the two cores together keep close to the speed of a plain copy.
//!
//! Both ends are [`LoopbackEnd`]s with the same calls as a TCP node: register caller memory, submit and
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::broadcast;
use transfer_engine::{
    Counters, EngineConfig, Error, Event, KvLayout, MemoryRegion, PeerId, RegionHandle, RegionId,
    SessionId, ShapingConfig, TransferRequest,
};

use crate::TransportError;
use crate::board::{IncomingSession, Outcome, Received, WaitError};
use crate::lock::lock;
use crate::node::station::Station;
use credit::Credit;
use threads::{Frame, RefusalLog};

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

/// One end of the pair: an engine, the caller memory registered with it, and what it reported.
#[derive(Debug)]
pub struct LoopbackEnd {
    station: Station,
    refused: RefusalLog,
    /// Wakes this end's thread (a submit, a consumed layer).
    wake: WakeHandle,
    /// How the other end names this one.
    peer_id: PeerId,
    /// Moves units where either side is GPU memory (the consumer's).
    gpu: gpu::GpuPlacer,
    /// Regions offered to the other end by name.
    segments: std::sync::Mutex<Vec<crate::transport::Segment>>,
    /// Why the other end is gone, once it was shut down.
    peer_gone: std::sync::Mutex<Option<String>>,
}

#[derive(Debug)]
enum WakeHandle {
    Producer(mpsc::Sender<Frame>),
    Consumer(mpsc::SyncSender<Frame>),
}

impl LoopbackEnd {
    /// How the other end names this one ([`PRODUCER`] or [`CONSUMER`]).
    #[must_use]
    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// Registers the caller's `memory` as a KV region of `layout`; transfers read from it or place into it
    /// in place.
    pub fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TransportError> {
        Ok(self.station.register_kv_region(layout, memory)?)
    }

    /// Sets this end's traffic shaping (link rate, KV share of it, per-class rates, bursts): a KV bandwidth
    /// cap. Takes effect for every frame from now on.
    pub fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), TransportError> {
        self.station.engine().set_shaping(shaping)?;
        self.wake();
        Ok(())
    }

    /// Registers a KV region of `layout` over zeroed host memory the engine allocates.
    pub fn kv_region(&self, layout: KvLayout) -> Result<RegionHandle, TransportError> {
        let memory = MemoryRegion::zeroed(usize::try_from(layout.total_bytes()).map_err(|_| {
            TransportError::Unsupported {
                backend: "loopback",
                what: "hold a layout larger than this machine's address space".into(),
            }
        })?);
        self.register_kv_region(layout, memory)
    }

    /// The memory behind a registered region.
    pub fn memory(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        Ok(self.station.engine().memory(id)?.clone())
    }

    /// Unregisters a region no live session uses and hands back its memory.
    pub fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TransportError> {
        Ok(self.station.engine().unregister_region(id)?)
    }

    /// Waits until sending session `session` is over.
    pub async fn wait(&self, session: SessionId) -> Result<Outcome, TransportError> {
        Ok(self.station.board.wait_sent(session).await?)
    }

    /// The notice of the next incoming session nobody has taken yet (the session already runs: the engine
    /// admitted it when its open arrived), waiting for one.
    pub async fn next_incoming(&self) -> Result<IncomingSession, TransportError> {
        Ok(self.station.board.next_incoming().await?)
    }

    /// Waits until `layer` of receiving session `session` has arrived whole (an error names its blocks to
    /// recompute if the session ended without it).
    pub async fn wait_layer(&self, session: SessionId, layer: u32) -> Result<(), TransportError> {
        Ok(self.station.board.wait_layer(session, layer).await?)
    }

    /// Waits until receiving session `session` is over.
    pub async fn wait_received(&self, session: SessionId) -> Result<Received, TransportError> {
        Ok(self.station.board.wait_received(session).await?)
    }

    /// The consumer is about to compute `layer` of receiving session `session` (layers in order): the
    /// producer may then send up to its prefetch depth beyond it. Returns whether the layer is complete.
    pub fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, TransportError> {
        let complete = self.station.consume_layer(session, layer)?;
        self.wake();
        Ok(complete)
    }

    /// Stops receiving session `session`: none of its bytes is placed from now on, and its blocks not yet
    /// verified are reported for recompute.
    pub fn abandon_receive(&self, session: SessionId) -> Result<(), TransportError> {
        self.station.abandon_receive(session)?;
        self.wake();
        Ok(())
    }

    /// Every event from now on.
    #[must_use]
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.station.board.subscribe()
    }

    /// Frames this end refused, newest last (the newest 1024), with the total count.
    #[must_use]
    pub fn refused(&self) -> (Vec<TransportError>, u64) {
        self.refused.snapshot()
    }

    /// The engine's counters.
    #[must_use]
    pub fn stats(&self) -> Counters {
        self.station.engine().stats()
    }

    /// Live sessions (both roles).
    #[must_use]
    pub fn live_sessions(&self) -> usize {
        self.station.engine().live_sessions()
    }

    fn wake(&self) {
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

/// One end's thread (taken when it is joined) and the flag that stops it.
type EndThread = (Arc<AtomicBool>, std::sync::Mutex<Option<JoinHandle<()>>>);

/// A producer and a consumer engine, wired back to back, each driven by its own thread until the pair
/// is dropped.
#[derive(Debug)]
pub struct LoopbackPair {
    producer: Arc<LoopbackEnd>,
    consumer: Arc<LoopbackEnd>,
    /// Each end's thread and the flag that stops it: producer, then consumer.
    threads: [EndThread; 2],
    /// Runs the blocking waits of [`LoopbackPair::transfer_all`].
    /// (An option only so that dropping the pair on an async runtime's thread can shut it down in the
    /// background, where dropping it in place would panic.)
    rt: Option<tokio::runtime::Runtime>,
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
        let producer = Arc::new(LoopbackEnd {
            refused: RefusalLog::new(producer.engine_id),
            station: Station::new(producer),
            wake: WakeHandle::Producer(ack_tx.clone()),
            peer_id: PRODUCER,
            gpu: gpu::GpuPlacer::new(),
            segments: std::sync::Mutex::default(),
            peer_gone: std::sync::Mutex::default(),
        });
        let consumer = Arc::new(LoopbackEnd {
            refused: RefusalLog::new(consumer.engine_id),
            station: Station::new(consumer),
            wake: WakeHandle::Consumer(data_tx.clone()),
            peer_id: CONSUMER,
            gpu: gpu::GpuPlacer::new(),
            segments: std::sync::Mutex::default(),
            peer_gone: std::sync::Mutex::default(),
        });
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
        let [p, c] = stops;
        let threads = [
            (p, std::sync::Mutex::new(Some(producer_thread))),
            (c, std::sync::Mutex::new(Some(consumer_thread))),
        ];
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime for blocking waits");
        Self {
            producer,
            consumer,
            threads,
            rt: Some(rt),
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
    pub fn producer(&self) -> &LoopbackEnd {
        &self.producer
    }

    /// The receiving end.
    #[must_use]
    pub fn consumer(&self) -> &LoopbackEnd {
        &self.consumer
    }

    /// Starts a transfer from the producer to the consumer; await it with [`LoopbackEnd::wait`].
    pub fn submit(&self, req: TransferRequest) -> Result<SessionId, TransportError> {
        // Held until the session is in the engine: a shutdown of the consumer either comes first (and
        // this submit is refused) or ends this session with the rest.
        let gone = lock(&self.producer.peer_gone);
        if let Some(reason) = gone.clone() {
            return Err(TransportError::Unreachable(reason));
        }
        if req.peer != CONSUMER {
            return Err(TransportError::NoRoute {
                peer: req.peer,
                why: format!("a loopback producer sends only to its consumer ({CONSUMER:?})"),
            });
        }
        let src = self.producer.memory(req.src_region)?;
        if let Ok(dst) = self.consumer.memory(req.dst_region)
            && src.same_memory(&dst)
        {
            return Err(Error::SameRegion.into());
        }
        let id = self.producer.station.submit(req)?;
        drop(gone);
        self.producer.wake();
        Ok(id)
    }

    /// The producer of sending session `session` has written every layer below `until`: those layers may
    /// go out (for requests made with `TransferRequest::with_layers_written`).
    pub fn layers_written(&self, session: SessionId, until: u32) -> Result<(), TransportError> {
        self.producer
            .station
            .engine()
            .layers_written(session, until)?;
        self.producer.wake();
        Ok(())
    }

    /// Stops sending session `session`: every block not yet acknowledged is reported for recompute, at
    /// both ends.
    pub fn cancel(&self, session: SessionId) -> Result<(), TransportError> {
        self.producer.station.engine().cancel(session)?;
        self.producer.wake();
        Ok(())
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
        let board = &self.producer.station.board;
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
        let (this, other, index) = match side {
            Side::Producer => (&self.producer, &self.consumer, 0),
            Side::Consumer => (&self.consumer, &self.producer, 1),
        };
        let (stop, thread) = &self.threads[index];
        stop.store(true, Ordering::Relaxed);
        this.wake();
        let thread = lock(thread).take();
        let Some(thread) = thread else {
            return;
        };
        let _ = thread.join();
        this.station.board.close();
        let reason = format!("the loopback {side} was shut down");
        // Under the lock a submit holds, so no session slips in between the verdict and the abort.
        let mut gone = lock(&other.peer_gone);
        *gone = Some(reason.clone());
        let mut engine = other.station.engine();
        engine.abort_peer(this.peer_id, &reason);
        other.station.drain_events(&mut engine);
        drop(engine);
        drop(gone);
    }
}

impl Drop for LoopbackPair {
    fn drop(&mut self) {
        self.shutdown(Side::Producer);
        self.shutdown(Side::Consumer);
        if let Some(rt) = self.rt.take()
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
