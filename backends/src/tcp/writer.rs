//! A lane's writer: takes batches of frames from its link and hands the kernel their sealed headers and
//! payloads in vectored writes, the payloads read straight from the caller's memory.
//!
//! A header carries its payload's CRC-32C, so the CRC must be taken before the header is sent. The writer
//! seals a batch a group at a time (about [`FOLD_BYTES`] of payload), and writes each group right after
//! sealing it: the kernel's copy then reads bytes the CRC pass just brought into cache, instead of making
//! a second trip to memory for a whole batch.

use std::io::{self, IoSlice};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::tcp::OwnedWriteHalf;
use transfer_engine::wire::HEADER_LEN;
use transfer_engine::{Body, MemoryKind, MemoryRegion, RegionId, Transmit};

use super::context::{Context, lock};
use super::lane_state::{LaneState, ready};
use super::peer_link::PeerLink;
use super::socket_io::advance;
use super::stage::{LaneStagers, RELEASE_IDLE_STAGERS, staged};
use super::staged_io::{Outgoing, send_staged};
use crate::transport::CloseReason;

/// Most buffers handed to one `sendmsg` (Linux allows 1024).
const MAX_IOV: usize = 512;
/// Payload bytes sealed (CRC taken) and then written as one group: small enough to stay in a core's L2
/// between the CRC pass and the kernel's copy, large enough that one `sendmsg` moves plenty.
pub(crate) const FOLD_BYTES: usize = 512 << 10;

pub(crate) async fn writer(
    ctx: Arc<Context>,
    link: Arc<PeerLink>,
    lane: Arc<LaneState>,
    wr: OwnedWriteHalf,
) {
    let reason = write_loop(&ctx, &link, &lane, &wr).await;
    // Logged only when the writer's own write ended the lane; a close the reader saw first is its to log.
    let first = lane.closed.borrow().is_none();
    if first
        && matches!(
            reason,
            CloseReason::Io(_) | CloseReason::Stalled(_) | CloseReason::PeerClosed(_)
        )
    {
        let line = format!("lane {} to peer {} closed: {reason}", lane.id, link.peer.0);
        ctx.core.log.closed(link.peer, line, reason.clone());
    }
    lane.close(&reason);
    link.remove(lane.id, &ctx);
}

async fn write_loop(
    ctx: &Context,
    link: &PeerLink,
    lane: &LaneState,
    wr: &OwnedWriteHalf,
) -> CloseReason {
    let mut closed = lane.closed.subscribe();
    let mut batch = Vec::new();
    let mut scratch = Scratch::default();
    let mut stagers = LaneStagers::new(&ctx.staged);
    loop {
        let goodbye = lock(&lane.goodbye).take();
        if let Some(bytes) = goodbye {
            scratch.clear();
            scratch.goodbye = bytes;
            scratch.push(Piece::Goodbye, scratch.goodbye.len());
            let _ = write_all(wr, &scratch, &[], ctx.cfg.liveness.stall_timeout).await;
            return CloseReason::Refused("closed after refusing a frame".into());
        }
        if closed.borrow().is_some() {
            return closed.borrow().clone().unwrap_or(CloseReason::Local);
        }
        batch.clear();
        link.take_batch(ctx, &mut batch);
        if batch.is_empty() {
            let idle = if lane.outbound {
                Some(ctx.cfg.liveness.idle_timeout)
            } else {
                ctx.cfg.liveness.inbound_idle_timeout
            };
            let check = idle.unwrap_or(ctx.cfg.liveness.idle_timeout);
            // A lane holding staging buffers wakes early to let them go.
            let wait = if stagers.is_empty() {
                check
            } else {
                RELEASE_IDLE_STAGERS.min(check)
            };
            tokio::select! {
                () = link.ready.notified() => {}
                _ = closed.changed() => {}
                () = tokio::time::sleep(wait) => {
                    if !stagers.is_empty() {
                        stagers.release();
                    } else if idle_past(ctx, link, lane, idle) {
                        return CloseReason::Idle;
                    }
                }
            }
            continue;
        }
        if let Err(e) = send_batch(ctx, &mut batch, &mut scratch, &mut stagers, wr).await {
            return CloseReason::from_error(&e);
        }
        ctx.wake.notify_one();
    }
}

/// Whether a lane with nothing to write has also received nothing for `idle` (`None`: it never idles
/// out); a lane a peer dialed idles out only while no session with that peer is live.
fn idle_past(ctx: &Context, link: &PeerLink, lane: &LaneState, idle: Option<Duration>) -> bool {
    let Some(idle) = idle else {
        return false;
    };
    let quiet = lock(&lane.last_rx).elapsed();
    quiet >= idle && (lane.outbound || !ctx.core.station.engine().has_sessions_with(link.peer))
}

/// One piece of a vectored write, by index into the batch and the writer's scratch (no borrows, so the
/// lists are kept and reused from batch to batch).
#[derive(Debug, Clone)]
enum Piece {
    /// The sealed header `scratch.headers[i]`.
    Header(usize),
    /// The control payload of the batch's `i`th frame.
    Control(usize),
    /// Bytes of the region `regions[i]`.
    Region(usize, Range<usize>),
    /// The lane's last frame (a refusal), `scratch.goodbye`.
    Goodbye,
}

/// A lane writer's lists, reused across batches.
#[derive(Default)]
struct Scratch {
    ids: Vec<RegionId>,
    regions: Vec<MemoryRegion>,
    headers: Vec<[u8; HEADER_LEN]>,
    pieces: Vec<Piece>,
    /// Bytes of each piece.
    lens: Vec<usize>,
    goodbye: Vec<u8>,
    /// A run of frames sent through staging buffers.
    staged: Vec<Outgoing>,
}

impl Scratch {
    fn clear(&mut self) {
        self.headers.clear();
        self.pieces.clear();
        self.lens.clear();
    }

    fn push(&mut self, piece: Piece, len: usize) {
        self.pieces.push(piece);
        self.lens.push(len);
    }

    /// The index of `id`'s memory in `regions`, looked up in the engine once per batch.
    fn region(&mut self, ctx: &Context, id: RegionId) -> Option<usize> {
        if let Some(i) = self.ids.iter().position(|r| *r == id) {
            return Some(i);
        }
        let memory = ctx.core.station.engine().memory(id).ok()?.clone();
        self.ids.push(id);
        self.regions.push(memory);
        Some(self.regions.len() - 1)
    }

    /// The kind of `t`'s payload memory, if lanes send it through staging buffers.
    fn staged_kind(&mut self, ctx: &Context, t: &Transmit) -> Option<MemoryKind> {
        let Body::Payload(p) = &t.body else {
            return None;
        };
        let i = self.region(ctx, p.region)?;
        let kind = self.regions[i].kind();
        staged(&ctx.cfg, kind).then_some(kind)
    }
}

async fn send_batch(
    ctx: &Context,
    batch: &mut [Transmit],
    scratch: &mut Scratch,
    stagers: &mut LaneStagers,
    wr: &OwnedWriteHalf,
) -> io::Result<()> {
    let result = send_groups(ctx, batch, scratch, stagers, wr).await;
    // Hold no region's memory between batches: a caller waiting to take its memory back would wait on
    // an idle lane.
    scratch.ids.clear();
    scratch.regions.clear();
    scratch.staged.clear();
    result
}

/// Seals and writes the batch a group of about [`FOLD_BYTES`] at a time; runs of frames whose memory is
/// staged go through the lane's stager of their kind instead.
async fn send_groups(
    ctx: &Context,
    batch: &mut [Transmit],
    scratch: &mut Scratch,
    stagers: &mut LaneStagers,
    wr: &OwnedWriteHalf,
) -> io::Result<()> {
    let mut start = 0;
    while start < batch.len() {
        if let Some(kind) = scratch.staged_kind(ctx, &batch[start]) {
            let mut end = start;
            scratch.staged.clear();
            while end < batch.len() && scratch.staged_kind(ctx, &batch[end]) == Some(kind) {
                if let Body::Payload(p) = &batch[end].body {
                    let i = scratch.region(ctx, p.region).expect("looked up above");
                    let memory = scratch.regions[i].clone();
                    scratch.staged.push(Outgoing {
                        header: batch[end].header,
                        memory,
                        range: p.range(),
                    });
                }
                end += 1;
            }
            let stager = stagers
                .get(kind, ctx.cfg.buffers.stage_bytes)
                .map_err(io::Error::other)?;
            let sent = send_staged(ctx, stager, &mut scratch.staged, wr).await?;
            ctx.staged.add_sent(sent);
            start = end;
            continue;
        }
        scratch.clear();
        let mut group_bytes = 0usize;
        let mut end = start;
        while end < batch.len()
            && (end == start || group_bytes < FOLD_BYTES)
            && (end == start || scratch.staged_kind(ctx, &batch[end]).is_none())
        {
            group_bytes += seal(ctx, &mut batch[end], end, scratch);
            end += 1;
        }
        write_all(wr, scratch, batch, ctx.cfg.liveness.stall_timeout).await?;
        start = end;
    }
    Ok(())
}

/// Seals `t` (the `index`th frame of the batch): takes its payload's CRC, encodes its header and lists its
/// pieces. Returns the payload bytes it adds to the group.
fn seal(ctx: &Context, t: &mut Transmit, index: usize, scratch: &mut Scratch) -> usize {
    let region = match &t.body {
        Body::Payload(p) => {
            let range = p.range();
            let sealed = scratch
                .region(ctx, p.region)
                .and_then(|i| Some((i, scratch.regions[i].crc32c(range.clone()).ok()?)));
            let Some((i, crc)) = sealed else {
                // The region was unregistered under a live session: drop the frame; the engine resends
                // or gives up with recompute.
                return 0;
            };
            t.header.crc = crc;
            Some((i, range))
        }
        Body::Control(_) | Body::Empty => None,
    };
    scratch.headers.push(t.header.encode());
    scratch.push(Piece::Header(scratch.headers.len() - 1), HEADER_LEN);
    match (&t.body, region) {
        (Body::Control(c), _) => {
            scratch.push(Piece::Control(index), c.len());
            0
        }
        (_, Some((i, range))) => {
            let len = range.len();
            scratch.push(Piece::Region(i, range), len);
            len
        }
        _ => 0,
    }
}

/// Writes every piece, in order, with vectored non-blocking writes. Each region's bytes are read through
/// one view covering its pieces in this syscall, held only during the syscall, never across an await.
async fn write_all(
    wr: &OwnedWriteHalf,
    scratch: &Scratch,
    batch: &[Transmit],
    stall: Duration,
) -> io::Result<()> {
    let (pieces, lens, regions) = (&scratch.pieces, &scratch.lens, &scratch.regions);
    let (mut first, mut skip) = (0usize, 0usize);
    while first < pieces.len() {
        ready(wr.writable(), stall, "did not read what this node wrote").await?;
        let result = {
            let end = (first + MAX_IOV).min(pieces.len());
            // One view per region: the span of its pieces in this syscall.
            let mut spans: Vec<Option<Range<usize>>> = vec![None; regions.len()];
            for p in &pieces[first..end] {
                if let Piece::Region(idx, r) = p {
                    let span = spans[*idx].get_or_insert(r.clone());
                    span.start = span.start.min(r.start);
                    span.end = span.end.max(r.end);
                }
            }
            // Views are taken in order of address, the one order every holder of several views keeps,
            // so two lanes can never wait on each other's shards in a circle.
            let mut order: Vec<usize> = (0..regions.len()).collect();
            order.sort_by_key(|i| regions[*i].address());
            let mut views: Vec<Option<(usize, transfer_engine::Bytes<'_>)>> =
                (0..regions.len()).map(|_| None).collect();
            for i in order {
                if let Some(span) = spans[i].clone() {
                    let view = regions[i].read(span.clone()).map_err(io::Error::other)?;
                    views[i] = Some((span.start, view));
                }
            }
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(end - first);
            for (i, p) in pieces[first..end].iter().enumerate() {
                let bytes: &[u8] = match p {
                    Piece::Header(h) => &scratch.headers[*h],
                    Piece::Control(b) => match &batch[*b].body {
                        Body::Control(c) => c,
                        _ => &[],
                    },
                    Piece::Region(idx, r) => {
                        let (start, view) = views[*idx].as_ref().expect("viewed above");
                        &view[r.start - start..r.end - start]
                    }
                    Piece::Goodbye => &scratch.goodbye,
                };
                slices.push(IoSlice::new(if i == 0 { &bytes[skip..] } else { bytes }));
            }
            wr.try_write_vectored(&slices)
        };
        match result {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => advance(|i| lens[i], pieces.len(), n, &mut first, &mut skip),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
