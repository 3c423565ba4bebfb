//! The in-process loopback backend: a producer engine and a consumer engine in one process, each on its
//! own thread, joined by bounded channels.
//!
//! Every frame goes through the real wire codec. A data frame's payload is never copied into a message: the
//! producer checksums it in place and sends the header with a reference to its region; the consumer copies
//! it once, straight from the producer's region into the place its engine names, and verifies it there.
//! The producer's checksum pass pulls the bytes into the shared cache just before the consumer copies them,
//! so the two cores together keep close to the speed of a plain copy.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::time::{Duration, Instant};

use transfer_engine::wire::{HEADER_LEN, Header};
use transfer_engine::{
    Backoff, BlockId, Body, Engine, EngineConfig, Error, Event, HostMemory, KvLayout, PayloadRef,
    PeerId, Placement, RegionHandle, Role, SessionId, TransferMode, TransferRequest,
};

/// The producer's peer id, as the consumer sees it.
pub const PRODUCER: PeerId = PeerId(1);
/// The consumer's peer id, as the producer sees it.
pub const CONSUMER: PeerId = PeerId(2);

/// Payload bytes in flight from producer to consumer: enough to keep both cores busy, few enough that the
/// bytes the producer just checksummed are still in cache when the consumer copies them (measured: 1 MiB
/// beats 256 KiB and 4 MiB on a 2-core machine with 1 MiB of L2 per core).
const IN_FLIGHT_BYTES: u64 = 1 << 20;

/// Frames the channel holds: about [`IN_FLIGHT_BYTES`] of the largest unit these requests send.
fn channel_depth(reqs: &[TransferRequest]) -> usize {
    let unit = reqs
        .iter()
        .map(|r| {
            let block = r.src_layout.block_bytes;
            match r.mode.unwrap_or_else(TransferMode::auto) {
                TransferMode::Exclusive => block,
                TransferMode::Packetized { slice_bytes } => block.min(u64::from(slice_bytes)),
                TransferMode::Auto { .. } => block.max(transfer_engine::AUTO_MAX_UNIT_BYTES),
            }
        })
        .max()
        .unwrap_or(IN_FLIGHT_BYTES);
    (IN_FLIGHT_BYTES / unit.max(1)).clamp(2, 64) as usize
}

/// Engine settings for loopback: nothing is ever lost in process, so a frame is late only when a thread
/// was not scheduled. The retransmit timer starts at 100 ms (not the network default of 5 ms) so that a
/// scheduling hiccup on a busy machine does not turn into a burst of pointless resends.
#[must_use]
pub fn loopback_engine_config(engine_id: u32) -> EngineConfig {
    let defaults = EngineConfig::default();
    EngineConfig {
        engine_id,
        backoff: Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
            ..defaults.backoff
        },
        ..defaults
    }
}

/// Errors of the loopback driver itself (the engines' refusals of frames are recorded, not raised).
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    /// The engine refused a command.
    #[error(transparent)]
    Engine(#[from] Error),
    /// Transfers did not finish within the time allowed.
    #[error("{pending} session(s) did not finish within {waited:?}")]
    Stalled {
        /// Sessions still running.
        pending: usize,
        /// How long we waited.
        waited: Duration,
    },
}

/// One engine with the memory behind its regions, and what it reported.
#[derive(Debug)]
pub struct Endpoint {
    /// The engine.
    pub engine: Engine,
    /// Bytes of its regions.
    pub memory: HostMemory,
    /// Every event it emitted, in order.
    pub events: Vec<Event>,
    /// Every frame it refused, with the reason. A refusal never stops the endpoint.
    pub refused: Vec<Error>,
}

impl Endpoint {
    fn new(cfg: EngineConfig) -> Self {
        Self {
            engine: Engine::new(cfg),
            memory: HostMemory::default(),
            events: Vec::new(),
            refused: Vec::new(),
        }
    }

    /// Registers a KV region and allocates its bytes.
    pub fn kv_region(&mut self, layout: KvLayout) -> Result<RegionHandle, Error> {
        let handle = self.engine.register_kv_region(layout)?;
        self.memory.alloc(&handle)?;
        Ok(handle)
    }

    fn drain_events(&mut self) {
        while let Some(event) = self.engine.poll_event() {
            self.events.push(event);
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
        }
    }

    /// How long to block waiting for frames before a timer is due (at most `cap`).
    fn wait(&self, now: Instant, cap: Duration) -> Duration {
        self.engine
            .poll_timeout()
            .map_or(cap, |t| t.saturating_duration_since(now).min(cap))
    }
}

/// A frame on the in-process wire.
#[derive(Debug)]
enum Frame {
    /// A data header (its payload CRC not yet filled in); the payload stays in the producer's region. The
    /// consumer places and checksums the bytes while the producer computes the sender's CRC.
    Data([u8; HEADER_LEN], PayloadRef),
    /// The same header sealed with the sender's CRC of the payload: the consumer compares the two.
    Seal([u8; HEADER_LEN]),
    /// A control frame with its payload.
    Control([u8; HEADER_LEN], Vec<u8>),
}

/// What a finished transfer reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The session.
    pub session: SessionId,
    /// Blocks the producer was told to recompute (source ids); empty when all arrived.
    pub recompute: Vec<BlockId>,
    /// Wall time from submit until both ends reported completion.
    pub elapsed: Duration,
}

/// A producer and a consumer engine with their host memory, wired back to back.
#[derive(Debug)]
pub struct LoopbackPair {
    /// The sending end.
    pub producer: Endpoint,
    /// The receiving end.
    pub consumer: Endpoint,
}

impl LoopbackPair {
    /// Two engines with these configurations (their engine ids must differ).
    #[must_use]
    pub fn new(producer: EngineConfig, consumer: EngineConfig) -> Self {
        Self {
            producer: Endpoint::new(producer),
            consumer: Endpoint::new(consumer),
        }
    }

    /// A pair with engine ids 1 and 2 and [`loopback_engine_config`]'s timing.
    #[must_use]
    pub fn with_defaults() -> Self {
        Self::new(
            loopback_engine_config(1),
            EngineConfig {
                rng_seed: 1,
                ..loopback_engine_config(2)
            },
        )
    }

    /// Runs one transfer to completion; see [`LoopbackPair::transfer_all`].
    pub fn transfer(
        &mut self,
        req: TransferRequest,
        limit: Duration,
    ) -> Result<Outcome, LoopbackError> {
        let mut out = self.transfer_all(vec![req], limit)?;
        Ok(out.remove(0))
    }

    /// Submits every request on the producer and drives both engines, each on its own thread, until every
    /// session has completed on both ends (delivered or reported for recompute) or `limit` passes.
    pub fn transfer_all(
        &mut self,
        reqs: Vec<TransferRequest>,
        limit: Duration,
    ) -> Result<Vec<Outcome>, LoopbackError> {
        let start = Instant::now();
        let depth = channel_depth(&reqs);
        let mut sessions = Vec::with_capacity(reqs.len());
        for req in reqs {
            sessions.push(self.producer.engine.submit(start, req)?);
        }
        let deadline = start + limit;
        let (data_tx, data_rx) = mpsc::sync_channel(2 * depth);
        let (ack_tx, ack_rx) = mpsc::channel();
        let (producer, consumer) = (&mut self.producer, &mut self.consumer);
        let producer_mem = &producer.memory;
        let completed = std::thread::scope(|scope| {
            let consumer_thread =
                scope.spawn(|| run_consumer(consumer, producer_mem, data_rx, ack_tx, deadline));
            let side = ProducerSide {
                engine: &mut producer.engine,
                events: &mut producer.events,
                refused: &mut producer.refused,
                memory: producer_mem,
            };
            let sent = run_producer(side, data_tx, ack_rx, deadline, depth);
            consumer_thread
                .join()
                .expect("loopback consumer thread panicked");
            sent
        });
        let finished_at = |session| {
            completed
                .iter()
                .find(|(id, _)| *id == session)
                .map(|(_, at)| *at)
        };
        let pending = sessions
            .iter()
            .filter(|s| finished_at(**s).is_none())
            .count();
        if pending > 0 {
            return Err(LoopbackError::Stalled {
                pending,
                waited: limit,
            });
        }
        Ok(sessions
            .into_iter()
            .map(|session| {
                let elapsed = finished_at(session).map_or(limit, |at| at.duration_since(start));
                let recompute = self
                    .producer
                    .events
                    .iter()
                    .find_map(|e| match e {
                        Event::Recompute {
                            session: s,
                            role: Role::Sender,
                            blocks,
                        } if *s == session => Some(blocks.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                Outcome {
                    session,
                    recompute,
                    elapsed,
                }
            })
            .collect())
    }
}

/// Producer loop: sends until every session is over (close handshake included). Returns when each session
/// completed on the receiving end, as acknowledged (completion time = when the sender learned it).
fn run_producer(
    side: ProducerSide<'_>,
    data_tx: SyncSender<Frame>,
    ack_rx: Receiver<Frame>,
    deadline: Instant,
    depth: usize,
) -> Vec<(SessionId, Instant)> {
    let ProducerSide {
        engine,
        events,
        refused,
        memory,
    } = side;
    let mut completed = Vec::new();
    loop {
        let now = Instant::now();
        loop {
            match ack_rx.try_recv() {
                Ok(frame) => receive(engine, frame, now, CONSUMER, refused),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return completed,
            }
        }
        if engine.poll_timeout().is_some_and(|t| t <= now) {
            engine.handle_timeout(now);
        }
        let mut sent = 0;
        while let Some(mut t) = engine.poll_transmit(now) {
            let frame = match t.body {
                Body::Payload(p) => match memory.read(p.region, p.range()) {
                    Ok(payload) => {
                        // The header goes first so the consumer copies while we checksum.
                        if data_tx.send(Frame::Data(t.header.encode(), p)).is_err() {
                            return completed;
                        }
                        Frame::Seal(t.seal(payload))
                    }
                    Err(e) => {
                        refused.push(e);
                        continue;
                    }
                },
                Body::Control(ref payload) => Frame::Control(t.header.encode(), payload.clone()),
                Body::Empty => Frame::Control(t.header.encode(), Vec::new()),
            };
            if data_tx.send(frame).is_err() {
                return completed;
            }
            sent += 1;
            if sent >= depth {
                break;
            }
        }
        while let Some(event) = engine.poll_event() {
            if let Event::Completed {
                session,
                role: Role::Sender,
                ..
            } = event
            {
                completed.push((session, Instant::now()));
            }
            events.push(event);
        }
        if engine.live_sessions() == 0 || now >= deadline {
            return completed;
        }
        if sent == 0 {
            let wait = engine.poll_timeout().map_or(Duration::from_millis(1), |t| {
                t.saturating_duration_since(now)
            });
            match ack_rx.recv_timeout(wait.min(Duration::from_millis(1))) {
                Ok(frame) => receive(engine, frame, Instant::now(), CONSUMER, refused),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return completed,
            }
        }
    }
}

/// Consumer loop: places and verifies data, sends acknowledgements, until the producer hangs up.
fn run_consumer(
    consumer: &mut Endpoint,
    producer_mem: &HostMemory,
    data_rx: Receiver<Frame>,
    ack_tx: mpsc::Sender<Frame>,
    deadline: Instant,
) {
    let mut pending = None;
    loop {
        let now = Instant::now();
        let wait = consumer.wait(now, Duration::from_millis(1));
        match data_rx.recv_timeout(wait) {
            Ok(frame) => {
                let now = Instant::now();
                receive_into(consumer, frame, now, producer_mem, &mut pending);
                // Drain what is already queued before answering, so acknowledgements coalesce.
                while let Ok(frame) = data_rx.try_recv() {
                    receive_into(consumer, frame, now, producer_mem, &mut pending);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        consumer.handle_timeout(now);
        while let Some(t) = consumer.engine.poll_transmit(now) {
            let payload = match &t.body {
                Body::Control(p) => p.clone(),
                _ => Vec::new(),
            };
            if ack_tx
                .send(Frame::Control(t.header.encode(), payload))
                .is_err()
            {
                return;
            }
        }
        consumer.drain_events();
        if now >= deadline {
            return;
        }
    }
}

/// The producer's engine and what it reports, borrowed for the producer thread; its memory is shared
/// read-only with the consumer thread.
struct ProducerSide<'a> {
    engine: &'a mut Engine,
    events: &'a mut Vec<Event>,
    refused: &'a mut Vec<Error>,
    memory: &'a HostMemory,
}

/// A data payload placed and checksummed at the consumer, waiting for the sender's sealed header.
struct Placed {
    header: Header,
    /// CRC-32C of the placed bytes; `None` when the engine said to discard them.
    crc: Option<u32>,
}

fn receive_into(
    consumer: &mut Endpoint,
    frame: Frame,
    now: Instant,
    producer_mem: &HostMemory,
    pending: &mut Option<Placed>,
) {
    let result = match frame {
        Frame::Data(header, payload_ref) => {
            let placed = place(
                &mut consumer.engine,
                &header,
                payload_ref,
                producer_mem,
                &mut consumer.memory,
            );
            placed.map(|p| *pending = Some(p))
        }
        Frame::Seal(sealed) => match (pending.take(), Header::decode(&sealed)) {
            (Some(placed), Ok(sealed)) => {
                let mut unsealed = sealed;
                unsealed.crc = placed.header.crc;
                if unsealed == placed.header {
                    let crc = placed.crc.unwrap_or(sealed.crc);
                    consumer.engine.handle_data(now, PRODUCER, &sealed, crc)
                } else {
                    Err(Error::InvalidRequest(
                        "sealed header does not match the data it seals".into(),
                    ))
                }
            }
            // The data frame was refused (and recorded) already.
            (None, Ok(_)) => Ok(()),
            (_, Err(e)) => Err(e.into()),
        },
        control => {
            receive(
                &mut consumer.engine,
                control,
                now,
                PRODUCER,
                &mut consumer.refused,
            );
            Ok(())
        }
    };
    if let Err(e) = result {
        consumer.refused.push(e);
    }
}

/// Hands one control frame to `engine`.
fn receive(
    engine: &mut Engine,
    frame: Frame,
    now: Instant,
    from: PeerId,
    refused: &mut Vec<Error>,
) {
    let result = match frame {
        Frame::Control(header, payload) => Header::decode(&header)
            .map_err(Error::from)
            .and_then(|h| engine.handle_frame(now, from, &h, &payload)),
        Frame::Data(..) | Frame::Seal(_) => Err(Error::InvalidRequest(
            "data frame sent towards the producer".into(),
        )),
    };
    if let Err(e) = result {
        refused.push(e);
    }
}

/// Places a data payload where the consumer's engine says, checksumming the placed bytes.
fn place(
    engine: &mut Engine,
    header: &[u8; HEADER_LEN],
    payload_ref: PayloadRef,
    src_mem: &HostMemory,
    dst_mem: &mut HostMemory,
) -> Result<Placed, Error> {
    let header = Header::decode(header)?;
    let payload = src_mem.read(payload_ref.region, payload_ref.range())?;
    let crc = match engine.placement(PRODUCER, &header)? {
        Placement::Write {
            region,
            offset,
            len,
        } => {
            let dst = dst_mem.write(region, offset as usize..offset as usize + len as usize)?;
            Some(transfer_engine::copy_and_crc32c(dst, payload))
        }
        Placement::Discard => None,
    };
    Ok(Placed { header, crc })
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::{Dtype, TransferMode};

    fn fill(bytes: &mut [u8], seed: u8) {
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8;
        }
    }

    #[test]
    fn small_transfer_arrives_in_each_mode() {
        for mode in [
            TransferMode::Exclusive,
            TransferMode::Packetized { slice_bytes: 1024 },
            TransferMode::auto(),
        ] {
            let mut pair = LoopbackPair::with_defaults();
            let layout = KvLayout::new(4, 8, 4096, 16, Dtype::F16).unwrap();
            let src = pair.producer.kv_region(layout).unwrap();
            let dst = pair.consumer.kv_region(layout).unwrap();
            fill(pair.producer.memory.region_mut(src.id).unwrap(), 7);
            let req = TransferRequest::whole(CONSUMER, &src, &dst)
                .unwrap()
                .with_mode(mode);
            let out = pair.transfer(req, Duration::from_secs(10)).unwrap();
            assert!(out.recompute.is_empty(), "{mode:?}");
            assert_eq!(
                pair.producer.memory.region(src.id).unwrap(),
                pair.consumer.memory.region(dst.id).unwrap()
            );
            assert!(
                pair.producer.refused.is_empty(),
                "{:?}",
                pair.producer.refused
            );
            assert!(
                pair.consumer.refused.is_empty(),
                "{:?}",
                pair.consumer.refused
            );
            assert_eq!(pair.producer.engine.live_sessions(), 0);
            let layers = pair
                .consumer
                .events
                .iter()
                .filter(|e| matches!(e, Event::LayerComplete { .. }))
                .count();
            assert_eq!(layers, 4);
        }
    }
}
