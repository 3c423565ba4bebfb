//! One connection to a peer: a writer thread that drains the peer's bounded queue onto the socket, and
//! a reader thread that hands control frames to the engine and places data units by copying them out of
//! the peer's memory.

use std::io::{self, BufWriter, Write};
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::time::Instant;

use transfer_engine::wire::Header;
use transfer_engine::{MemoryRegion, PeerId};

use crate::TransportError;
use crate::node::LogKind;

use super::cma::{self, Credentials};
use super::context::Context;
use super::fdpass::{FdReader, send_with_fd};
use super::grants::Grants;
use super::hello::{Hello, peer_of};
use super::wire::{Envelope, GPU_HANDLE_LEN};
use crate::transport::Segment;

/// Read buffer of a link: many data headers per `read`.
const READ_BUFFER: usize = 64 << 10;

/// A frame waiting for the writer.
#[derive(Debug)]
pub(crate) enum Outbound {
    /// A control frame.
    Control(Header, Vec<u8>),
    /// A data unit: its header and where its payload lies here.
    Data(Header, MemoryRegion, Range<usize>),
    /// A grant of a region of this node's shared memory: its address, its length and its memfd.
    Grant(u64, u64, Arc<OwnedFd>),
    /// A grant of a GPU allocation of this node: its device address, its length and its CUDA IPC handle.
    GpuGrant(u64, u64, Box<[u8; GPU_HANDLE_LEN]>),
}

/// A live connection to one peer.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) peer: PeerId,
    /// Which link this is (a peer reached again gets a new one).
    pub(crate) id: u64,
    pub(crate) creds: Credentials,
    /// Where the peer listens, if it does.
    pub(crate) path: Option<PathBuf>,
    pub(crate) segments: Vec<Segment>,
    /// Whether units carry checksums (unless both ends turned them off).
    pub(crate) checksum: bool,
    queue: SyncSender<Outbound>,
    stream: UnixStream,
}

/// The node a link belongs to, as the link's threads see it: its [`Context`], and where a lost link is
/// reported (the node then ends the peer's sessions and forgets the link).
pub(crate) trait LinkOwner: Send + Sync {
    /// What the link's threads use: the engine, the configuration, counters, the log.
    fn context(&self) -> &Context;
    /// Link `id` to `peer` ended for `why`.
    fn link_lost(&self, peer: PeerId, id: u64, why: &str);
}

impl Link {
    /// Starts the link's reader and writer threads over `stream`, whose handshake passed.
    pub(crate) fn start(
        owner: Weak<dyn LinkOwner>,
        ctx: &Context,
        id: u64,
        stream: UnixStream,
        creds: Credentials,
        hello: Hello,
    ) -> io::Result<Arc<Self>> {
        let reader = stream.try_clone()?;
        let writer = stream.try_clone()?;
        writer.set_write_timeout(Some(ctx.cfg.liveness.stall_timeout))?;
        let (queue, rx) = mpsc::sync_channel(ctx.cfg.queue_frames.max(1));
        let link = Arc::new(Self {
            peer: peer_of(&hello),
            id,
            creds,
            path: hello.path,
            segments: hello.segments,
            checksum: hello.checksum || ctx.cfg.checksum,
            queue,
            stream,
        });
        let name = format!("shm-{}-{}", ctx.engine_id(), link.peer.0);
        let (s, l) = (owner.clone(), link.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("{name}-write"))
            .spawn(move || write_loop(&s, &l, writer, &rx))
            .and_then(|_| {
                let (s, l) = (owner, link.clone());
                std::thread::Builder::new()
                    .name(format!("{name}-read"))
                    .spawn(move || read_loop(&s, &l, reader))
            });
        if let Err(e) = spawned {
            link.close();
            return Err(e);
        }
        Ok(link)
    }

    /// Queues a frame for the peer; false when the queue is full (the frame is dropped: the engine resends
    /// what is not acknowledged).
    pub(crate) fn send(&self, frame: Outbound) -> bool {
        match self.queue.try_send(frame) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }

    /// Closes the socket both ways: the reader and writer threads end.
    pub(crate) fn close(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Drains the queue onto the socket, flushing whenever it runs empty. A data unit goes as its header and
/// address, then (with checksums) the seal: the CRC is taken here, under the source's read locks, while
/// the peer copies the same bytes.
fn write_loop(
    owner: &Weak<dyn LinkOwner>,
    link: &Link,
    stream: UnixStream,
    rx: &Receiver<Outbound>,
) {
    let mut out = BufWriter::with_capacity(READ_BUFFER, stream);
    let result = (|| -> io::Result<()> {
        loop {
            let frame = match rx.try_recv() {
                Ok(f) => f,
                Err(mpsc::TryRecvError::Empty) => {
                    out.flush()?;
                    match rx.recv() {
                        Ok(f) => f,
                        Err(_) => return Ok(()),
                    }
                }
                Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
            };
            match frame {
                Outbound::Control(h, payload) => {
                    Envelope::Control(h, payload).write_to(&mut out)?;
                }
                Outbound::Grant(address, len, fd) => {
                    out.flush()?;
                    let mut bytes = Vec::new();
                    Envelope::Grant(address, len).write_to(&mut bytes)?;
                    send_with_fd(out.get_ref(), &bytes, fd.as_raw_fd())?;
                }
                Outbound::GpuGrant(address, len, handle) => {
                    Envelope::GpuGrant(address, len, handle).write_to(&mut out)?;
                }
                Outbound::Data(mut h, memory, range) => {
                    let address = (memory.address() + range.start) as u64;
                    if !memory.kind().is_host() {
                        // GPU bytes are moved by the receiver's device copy and not checksummed.
                        h.crc = 0;
                        Envelope::Data(h, address).write_to(&mut out)?;
                        if link.checksum {
                            Envelope::Seal(h).write_to(&mut out)?;
                        }
                    } else if !link.checksum {
                        h.crc = 0;
                        Envelope::Data(h, address).write_to(&mut out)?;
                    } else {
                        Envelope::Data(h, address).write_to(&mut out)?;
                        // The header goes first so the peer copies while this end checksums.
                        out.flush()?;
                        match memory.crc32c(range) {
                            Ok(crc) => h.crc = crc,
                            Err(e) => {
                                if let Some(s) = owner.upgrade() {
                                    s.context().refused(
                                        LogKind::Refused,
                                        Some(link.peer),
                                        "refused to seal a unit",
                                        Some(e.into()),
                                    );
                                }
                            }
                        }
                        Envelope::Seal(h).write_to(&mut out)?;
                    }
                }
            }
            if let Some(s) = owner.upgrade() {
                s.context()
                    .counters
                    .frames_sent
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    })();
    if let (Err(e), Some(s)) = (result, owner.upgrade()) {
        let why = if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            format!(
                "took no bytes for {:?}",
                s.context().cfg.liveness.stall_timeout
            )
        } else if matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ) {
            format!("closed its socket ({e})")
        } else {
            format!("could not be written to: {e}")
        };
        s.link_lost(link.peer, link.id, &why);
    }
}

/// A data unit placed, waiting for its seal.
struct Placed {
    header: Header,
    /// CRC-32C of the placed bytes; `None` when the engine had no place for them.
    crc: Option<u32>,
}

/// Reads envelopes until the socket ends or the peer breaks the protocol; then the link is lost.
fn read_loop(owner: &Weak<dyn LinkOwner>, link: &Link, stream: UnixStream) {
    let mut input = FdReader::new(stream, READ_BUFFER);
    let mut pending: Option<Placed> = None;
    let mut grants = Grants::default();
    let why = loop {
        let envelope = match Envelope::read_from(&mut input) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break "closed its socket".into(),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                break format!("closed its socket ({e})");
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                break format!("sent a malformed message ({e})");
            }
            Err(e) => break format!("could not be read from: {e}"),
        };
        let Some(owner) = owner.upgrade() else {
            return;
        };
        let ctx = owner.context();
        let result = match envelope {
            Envelope::Control(h, payload) => ctx
                .core
                .station
                .engine()
                .handle_frame(Instant::now(), link.peer, &h, &payload)
                .map_err(TransportError::from),
            Envelope::Data(h, address) => {
                let placed = place(ctx, link, &mut grants, h, address);
                match placed {
                    Ok(p) if !link.checksum => {
                        pending = None;
                        seal(ctx, link, Some(p), h)
                    }
                    Ok(p) => {
                        pending = Some(p);
                        Ok(())
                    }
                    Err(e) => {
                        pending = None;
                        Err(e)
                    }
                }
            }
            Envelope::Seal(h) if link.checksum => seal(ctx, link, pending.take(), h),
            Envelope::Grant(address, len) => {
                let Some(fd) = input.take_fd() else {
                    break "sent a grant without its memory".into();
                };
                grants.add(address, len, &fd).map(|()| {
                    grants.choose_path(ctx, link.peer, link.creds.pid, address);
                })
            }
            Envelope::GpuGrant(address, len, handle) => grants.gpu.add(address, len, handle),
            other => break format!("sent {other:?} on a linked connection"),
        };
        if let Err(e) = result {
            ctx.refused(
                LogKind::Refused,
                Some(link.peer),
                format!("refused a frame from engine {}: {e}", link.peer.0),
                None,
            );
        }
        if input.buffered() == 0 {
            ctx.wake();
        }
    };
    if let Some(s) = owner.upgrade() {
        s.link_lost(link.peer, link.id, &why);
    }
}

/// Copies a data unit from the peer's memory at `address` to where the engine places it, under the
/// destination's write locks, taking the CRC of each chunk while it is in cache: a plain copy out of the
/// peer's granted shared memory where it lies there, by cross-memory attach otherwise. Units from or to
/// GPU memory take the CUDA IPC path (see the `gpu` module).
fn place(
    ctx: &Context,
    link: &Link,
    grants: &mut Grants,
    header: Header,
    address: u64,
) -> Result<Placed, TransportError> {
    let target = ctx.core.station.engine().destination(link.peer, &header)?;
    let Some((memory, range)) = target else {
        return Ok(Placed { header, crc: None });
    };
    let len = range.len();
    let crc = if grants.gpu.holds(address, len) {
        grants.gpu.copy_from_gpu(address, &memory, range)?;
        0
    } else if !memory.kind().is_host() {
        upload(ctx, link, grants, address, &memory, range)?
    } else {
        let mut view = memory.write(range).map_err(TransportError::from)?;
        pull_host(ctx, link, grants, address, &mut view)?
    };
    ctx.counters.units_pulled.fetch_add(1, Ordering::Relaxed);
    ctx.counters
        .bytes_pulled
        .fetch_add(len as u64, Ordering::Relaxed);
    Ok(Placed {
        header,
        crc: Some(crc),
    })
}

/// Fills `dst` from the peer's host memory at `address` (its granted shared memory, or by cross-memory
/// attach) in chunks, each checksummed while in cache; the CRC-32C of the whole, or 0 without checksums.
fn pull_host(
    ctx: &Context,
    link: &Link,
    grants: &Grants,
    address: u64,
    dst: &mut [u8],
) -> Result<u32, TransportError> {
    let chunk = ctx.cfg.pull_chunk.max(4096);
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    let mut each = |piece: &[u8]| {
        if link.checksum {
            digest.update(piece);
        }
    };
    let mapped = match grants.by_cma {
        Some(true) => None,
        _ => grants.find(address, dst.len()),
    };
    if let Some((mapping, offset)) = mapped {
        mapping.copy_out(offset, dst, chunk, &mut each);
    } else {
        let mut at = address;
        for piece in dst.chunks_mut(chunk) {
            cma::pull(link.creds.pid, at, piece).map_err(|e| TransportError::Io {
                backend: "shm",
                message: format!(
                    "the unit's bytes at {at:#x} in process {} cannot be copied: {e}",
                    link.creds.pid
                ),
            })?;
            each(piece);
            at += piece.len() as u64;
        }
        ctx.counters.units_by_cma.fetch_add(1, Ordering::Relaxed);
    }
    Ok(if link.checksum {
        digest.finalize() as u32
    } else {
        0
    })
}

/// Places a unit from the peer's host memory into a GPU region: pulled into a bounce buffer a chunk at
/// a time (checksummed there) and uploaded. The CRC-32C of the whole, or 0 without checksums.
fn upload(
    ctx: &Context,
    link: &Link,
    grants: &mut Grants,
    address: u64,
    memory: &MemoryRegion,
    range: Range<usize>,
) -> Result<u32, TransportError> {
    let chunk = ctx.cfg.pull_chunk.max(4096);
    let mut bounce = vec![0u8; chunk.min(range.len())];
    let mut crc = 0u32;
    let mut at = range.start;
    while at < range.end {
        let n = chunk.min(range.end - at);
        let piece = &mut bounce[..n];
        let piece_crc = pull_host(
            ctx,
            link,
            grants,
            address + (at - range.start) as u64,
            piece,
        )?;
        crc = if at == range.start {
            piece_crc
        } else {
            transfer_engine::crc32c_combine(crc, piece_crc, n)
        };
        grants.gpu.upload(piece, memory, at..at + n)?;
        at += n;
    }
    Ok(if link.checksum { crc } else { 0 })
}

/// Hands a placed unit to the engine once its seal matches the header it was placed by.
fn seal(
    ctx: &Context,
    link: &Link,
    placed: Option<Placed>,
    sealed: Header,
) -> Result<(), TransportError> {
    let Some(placed) = placed else {
        return Err(TransportError::protocol(
            "shm",
            "a seal without its data unit",
        ));
    };
    let mut unsealed = sealed;
    unsealed.crc = placed.header.crc;
    if unsealed != placed.header {
        return Err(TransportError::protocol(
            "shm",
            "a seal does not match the data unit it seals",
        ));
    }
    let crc = placed.crc.unwrap_or(sealed.crc);
    Ok(ctx
        .core
        .station
        .engine()
        .handle_data(Instant::now(), link.peer, &sealed, crc)?)
}
