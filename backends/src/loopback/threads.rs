//! The two threads of a loopback pair: the producer sends frames and takes acknowledgements, the consumer
//! places and verifies data and answers.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};

use std::thread::JoinHandle;
use std::time::Instant;

use transfer_engine::wire::{HEADER_LEN, Header};
use transfer_engine::{Body, Engine, Error, MemoryRegion, Transmit};

use super::credit::Credit;
use super::gpu::GpuPlacer;
use super::{LoopbackEnd, PRODUCER};
use crate::TransportError;
use crate::node::station::{BUSY_NAP, IDLE_NAP, fire_timers, nap};

/// Frames the consumer handles before it answers and looks at its timers again.
const CONSUMER_BATCH: usize = 64;

/// A frame on the in-process wire.
#[derive(Debug)]
pub(super) enum Frame {
    /// A data header (its payload CRC not yet filled in) and where the payload lies in the producer's
    /// memory. The consumer places and checksums the bytes while the producer computes the sender's CRC.
    Data([u8; HEADER_LEN], MemoryRegion, Range<usize>),
    /// The same header sealed with the sender's CRC of the payload: the consumer compares the two.
    Seal([u8; HEADER_LEN]),
    /// A control frame with its payload.
    Control([u8; HEADER_LEN], Vec<u8>),
    /// Nothing to handle: look at the engine again (a command changed it).
    Wake,
}

/// A data transmit and the memory its payload lies in.
struct Outgoing {
    transmit: Transmit,
    memory: Option<MemoryRegion>,
}

pub(super) fn spawn_producer(
    end: Arc<LoopbackEnd>,
    data_tx: SyncSender<Frame>,
    ack_rx: Receiver<Frame>,
    credit: Arc<Credit>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("loopback-producer".into())
        .spawn(move || run_producer(&end, &data_tx, &ack_rx, &credit, &stop))
        .expect("spawning the loopback producer thread")
}

pub(super) fn spawn_consumer(
    end: Arc<LoopbackEnd>,
    data_rx: Receiver<Frame>,
    ack_tx: mpsc::Sender<Frame>,
    credit: Arc<Credit>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("loopback-consumer".into())
        .spawn(move || run_consumer(&end, &data_rx, &ack_tx, &credit, &stop))
        .expect("spawning the loopback consumer thread")
}

/// Producer loop: takes acknowledgements, fires timers, sends what the engine asks for, until stopped.
fn run_producer(
    end: &LoopbackEnd,
    data_tx: &SyncSender<Frame>,
    ack_rx: &Receiver<Frame>,
    credit: &Credit,
    stop: &AtomicBool,
) {
    let mut inbox = Vec::new();
    let mut out: Vec<Outgoing> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        loop {
            match ack_rx.try_recv() {
                Ok(frame) => inbox.push(frame),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        let now = Instant::now();
        let wait = {
            let mut engine = end.core.station.engine();
            for frame in inbox.drain(..) {
                receive_control(end, &mut engine, frame, now);
            }
            fire_timers(&mut engine, now);
            let mut bytes = 0;
            while bytes < super::IN_FLIGHT_BYTES {
                let Some(t) = engine.poll_transmit(now) else {
                    break;
                };
                let memory = match &t.body {
                    Body::Payload(p) => {
                        bytes += u64::from(p.len);
                        engine.memory(p.region).ok().cloned()
                    }
                    _ => None,
                };
                out.push(Outgoing {
                    transmit: t,
                    memory,
                });
            }
            end.core.station.drain_events(&mut engine);
            nap(&engine, now)
        };
        let sent = out.len();
        for o in out.drain(..) {
            if !send(end, o, data_tx, credit, stop) {
                return;
            }
        }
        if sent == 0 {
            match ack_rx.recv_timeout(wait) {
                Ok(frame) => inbox.push(frame),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

/// Sends one transmit to the consumer; false when the consumer is gone or the pair stops.
fn send(
    end: &LoopbackEnd,
    o: Outgoing,
    data_tx: &SyncSender<Frame>,
    credit: &Credit,
    stop: &AtomicBool,
) -> bool {
    let Outgoing {
        transmit: mut t,
        memory,
    } = o;
    let frame = match (&t.body, memory) {
        (Body::Payload(p), Some(memory)) => {
            let range = p.range();
            while !credit.take(u64::from(p.len), BUSY_NAP) {
                if stop.load(Ordering::Relaxed) {
                    return false;
                }
            }
            // The header goes first so the consumer copies while we checksum.
            let header = t.header.encode();
            if data_tx
                .send(Frame::Data(header, memory.clone(), range.clone()))
                .is_err()
            {
                return false;
            }
            if !memory.kind().is_host() {
                // GPU bytes: the consumer's copy takes the CRC of what lands (see loopback/gpu.rs).
                Frame::Seal(header)
            } else {
                match memory.read(range) {
                    Ok(payload) => Frame::Seal(t.seal(&payload)),
                    Err(e) => {
                        end.failed("cannot checksum a unit to send", e);
                        Frame::Seal(header)
                    }
                }
            }
        }
        (Body::Payload(p), None) => {
            end.failed("cannot send a unit", Error::UnknownRegion(p.region));
            return true;
        }
        (Body::Control(payload), _) => Frame::Control(t.header.encode(), payload.clone()),
        (Body::Empty, _) => Frame::Control(t.header.encode(), Vec::new()),
    };
    data_tx.send(frame).is_ok()
}

/// Consumer loop: places and verifies data, sends acknowledgements, until stopped.
fn run_consumer(
    end: &LoopbackEnd,
    data_rx: &Receiver<Frame>,
    ack_tx: &mpsc::Sender<Frame>,
    credit: &Credit,
    stop: &AtomicBool,
) {
    let mut pending = None;
    let mut wait = IDLE_NAP;
    while !stop.load(Ordering::Relaxed) {
        match data_rx.recv_timeout(wait) {
            Ok(frame) => {
                receive_into(end, frame, &mut pending, credit);
                // Drain what is already queued before answering, so acknowledgements coalesce.
                for _ in 0..CONSUMER_BATCH {
                    let Ok(frame) = data_rx.try_recv() else {
                        break;
                    };
                    receive_into(end, frame, &mut pending, credit);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        let mut out = Vec::new();
        {
            let mut engine = end.core.station.engine();
            fire_timers(&mut engine, now);
            while let Some(t) = engine.poll_transmit(now) {
                out.push(t);
            }
            end.core.station.drain_events(&mut engine);
            wait = nap(&engine, now);
        }
        for t in out {
            let payload = match t.body {
                Body::Control(p) => p,
                _ => Vec::new(),
            };
            if ack_tx
                .send(Frame::Control(t.header.encode(), payload))
                .is_err()
            {
                return;
            }
        }
    }
}

/// A data payload placed and checksummed at the consumer, waiting for the sender's sealed header.
struct Placed {
    header: Header,
    /// CRC-32C of the placed bytes; `None` when the engine said to discard them (or GPU to GPU).
    crc: Option<u32>,
    /// The source is GPU memory, which the producer cannot checksum: its seal carries no CRC.
    unsealed_source: bool,
}

fn receive_into(end: &LoopbackEnd, frame: Frame, pending: &mut Option<Placed>, credit: &Credit) {
    let result = match frame {
        Frame::Data(header, memory, range) => {
            let placed = place(end, &header, &memory, range.clone());
            credit.give(range.len() as u64);
            placed.map(|p| *pending = Some(p))
        }
        Frame::Seal(sealed) => match (pending.take(), Header::decode(&sealed)) {
            (Some(placed), Ok(sealed)) => {
                let mut unsealed = sealed;
                unsealed.crc = placed.header.crc;
                if unsealed == placed.header {
                    let crc = placed.crc.unwrap_or(sealed.crc);
                    // A GPU source was not checksummed by the producer: the engine gets the CRC of
                    // what landed, so it checks the copy arrived whole (see loopback/gpu.rs).
                    let mut sealed = sealed;
                    if placed.unsealed_source {
                        sealed.crc = crc;
                    }
                    end.core
                        .station
                        .engine()
                        .handle_data(Instant::now(), PRODUCER, &sealed, crc)
                        .map_err(TransportError::from)
                } else {
                    Err(TransportError::protocol(
                        "loopback",
                        "sealed header does not match the data it seals",
                    ))
                }
            }
            // The data frame was refused (and recorded) already.
            (None, Ok(_)) => Ok(()),
            (_, Err(e)) => Err(Error::from(e).into()),
        },
        control => {
            receive_control(end, &mut end.core.station.engine(), control, Instant::now());
            Ok(())
        }
    };
    if let Err(e) = result {
        end.refused(e);
    }
}

/// Hands one control frame to `end`'s `engine` (locked by the caller).
fn receive_control(end: &LoopbackEnd, engine: &mut Engine, frame: Frame, now: Instant) {
    let from = end.other_peer();
    let result = match frame {
        Frame::Control(header, payload) => Header::decode(&header)
            .map_err(Error::from)
            .and_then(|h| engine.handle_frame(now, from, &h, &payload))
            .map_err(TransportError::from),
        Frame::Wake => Ok(()),
        Frame::Data(..) | Frame::Seal(_) => Err(TransportError::protocol(
            "loopback",
            "data frame sent towards the producer",
        )),
    };
    if let Err(e) = result {
        end.refused(e);
    }
}

/// Places a data payload where the consumer's engine says, checksumming the placed bytes. The engine is
/// locked only to decide; the copy runs outside it. Units from or to GPU memory go through the end's GPU
/// placer.
fn place(
    end: &LoopbackEnd,
    header: &[u8; HEADER_LEN],
    src_memory: &MemoryRegion,
    src_range: Range<usize>,
) -> Result<Placed, TransportError> {
    let header = Header::decode(header).map_err(Error::from)?;
    let unsealed_source = !src_memory.kind().is_host();
    let target = end.core.station.engine().destination(PRODUCER, &header)?;
    let crc = match target {
        Some((dst_memory, dst_range)) => {
            if dst_memory.same_memory(src_memory) {
                return Err(Error::SameRegion.into());
            }
            if src_range.len() != dst_range.len() {
                return Err(TransportError::protocol(
                    "loopback",
                    "payload length differs from its placement",
                ));
            }
            if GpuPlacer::needed(src_memory, &dst_memory) {
                end.gpu
                    .place(src_memory, src_range, &dst_memory, dst_range)?
            } else {
                // Both views at once, in the one order every holder of two views keeps: the pair's two
                // directions place at the same time when both ends save and load.
                Some(
                    src_memory
                        .with_views(src_range, &dst_memory, dst_range, |src, dst| {
                            transfer_engine::copy_and_crc32c(dst, src)
                        })
                        .map_err(|e| e.refused_from(PRODUCER))?,
                )
            }
        }
        None => None,
    };
    Ok(Placed {
        header,
        crc,
        unsealed_source,
    })
}
