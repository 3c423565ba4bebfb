//! A lane's writer: takes batches of frames from its link and hands the kernel their sealed headers and
//! payloads in one vectored write, the payloads read straight from the caller's memory.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::tcp::OwnedWriteHalf;
use transfer_engine::wire::HEADER_LEN;
use transfer_engine::{Body, MemoryRegion, RegionId, Transmit};

use super::context::{Context, lock};
use super::lane_state::{LaneState, ready};
use super::link::Link;

/// Most buffers handed to one `sendmsg` (Linux allows 1024).
const MAX_IOV: usize = 512;

pub(crate) async fn writer(
    ctx: Arc<Context>,
    link: Arc<Link>,
    lane: Arc<LaneState>,
    wr: OwnedWriteHalf,
) {
    let reason = write_loop(&ctx, &link, &lane, &wr).await;
    if reason.starts_with("write failed") {
        let line = format!("lane {} to peer {} closed: {reason}", lane.id, link.peer.0);
        ctx.log(line);
    }
    lane.close(&reason);
    link.remove(lane.id, &ctx);
}

async fn write_loop(ctx: &Context, link: &Link, lane: &LaneState, wr: &OwnedWriteHalf) -> String {
    let mut closed = lane.closed.subscribe();
    let mut batch = Vec::new();
    loop {
        let goodbye = lock(&lane.goodbye).take();
        if let Some(bytes) = goodbye {
            let frames = [Frame::Bytes(&bytes)];
            let _ = write_all(wr, &frames, &[], ctx.cfg.stall_timeout).await;
            return "closed after refusing a frame".into();
        }
        if closed.borrow().is_some() {
            return closed.borrow().clone().unwrap_or_default();
        }
        batch.clear();
        link.take_batch(ctx, &mut batch);
        if batch.is_empty() {
            let idle = ctx.cfg.idle_timeout;
            tokio::select! {
                () = link.ready.notified() => {}
                _ = closed.changed() => {}
                () = tokio::time::sleep(idle) => {
                    if lane.outbound && lock(&lane.last_rx).elapsed() >= idle {
                        return "idle".into();
                    }
                }
            }
            continue;
        }
        if let Err(e) = send_batch(ctx, &mut batch, wr).await {
            return format!("write failed: {e}");
        }
        ctx.wake.notify_one();
    }
}

enum Frame<'a> {
    Bytes(&'a [u8]),
    Region(usize, std::ops::Range<usize>),
}

async fn send_batch(ctx: &Context, batch: &mut [Transmit], wr: &OwnedWriteHalf) -> io::Result<()> {
    // The memory of each region the batch reads from, looked up once per batch (not once per frame).
    let mut ids: Vec<RegionId> = Vec::new();
    let mut regions: Vec<MemoryRegion> = Vec::new();
    let mut headers: Vec<[u8; HEADER_LEN]> = Vec::with_capacity(batch.len());
    let mut payloads: Vec<Option<(usize, std::ops::Range<usize>)>> =
        Vec::with_capacity(batch.len());
    for t in batch.iter_mut() {
        let payload = match &t.body {
            Body::Payload(p) => {
                let range = p.range();
                let idx = match ids.iter().position(|id| *id == p.region) {
                    Some(i) => Some(i),
                    None => ctx.station.engine().memory(p.region).ok().map(|m| {
                        ids.push(p.region);
                        regions.push(m.clone());
                        regions.len() - 1
                    }),
                };
                let crc = idx.and_then(|i| regions[i].crc32c(range.clone()).ok());
                let (Some(idx), Some(crc)) = (idx, crc) else {
                    // The region was unregistered under a live session: drop the frame; the engine
                    // resends or gives up with recompute.
                    headers.push([0; HEADER_LEN]);
                    payloads.push(None);
                    continue;
                };
                t.header.crc = crc;
                Some((idx, range))
            }
            Body::Control(_) | Body::Empty => None,
        };
        headers.push(t.header.encode());
        payloads.push(payload);
    }
    let mut frames: Vec<Frame<'_>> = Vec::with_capacity(batch.len() * 2);
    for ((t, h), p) in batch.iter().zip(&headers).zip(&payloads) {
        if matches!(t.body, Body::Payload(_)) && p.is_none() {
            continue;
        }
        frames.push(Frame::Bytes(h));
        match (&t.body, p) {
            (Body::Control(c), _) => frames.push(Frame::Bytes(c)),
            (_, Some((idx, range))) => frames.push(Frame::Region(*idx, range.clone())),
            _ => {}
        }
    }
    write_all(wr, &frames, &regions, ctx.cfg.stall_timeout).await
}

/// Writes every piece, in order, with vectored non-blocking writes. Each region's bytes are read through
/// one view covering its pieces in this syscall, held only during the syscall, never across an await.
async fn write_all(
    wr: &OwnedWriteHalf,
    frames: &[Frame<'_>],
    regions: &[MemoryRegion],
    stall: Duration,
) -> io::Result<()> {
    let lens: Vec<usize> = frames
        .iter()
        .map(|f| match f {
            Frame::Bytes(b) => b.len(),
            Frame::Region(_, r) => r.len(),
        })
        .collect();
    let (mut first, mut skip) = (0usize, 0usize);
    while first < frames.len() {
        ready(wr.writable(), stall, "did not read what this node wrote").await?;
        let result = {
            let end = (first + MAX_IOV).min(frames.len());
            // One view per region: the span of its pieces in this syscall.
            let mut spans: Vec<Option<std::ops::Range<usize>>> = vec![None; regions.len()];
            for f in &frames[first..end] {
                if let Frame::Region(idx, r) = f {
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
            for (i, f) in frames[first..end].iter().enumerate() {
                let bytes: &[u8] = match f {
                    Frame::Bytes(b) => b,
                    Frame::Region(idx, r) => {
                        let (base, view) = views[*idx].as_ref().expect("viewed above");
                        &view[r.start - base..r.end - base]
                    }
                };
                slices.push(IoSlice::new(if i == 0 { &bytes[skip..] } else { bytes }));
            }
            wr.try_write_vectored(&slices)
        };
        match result {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(mut n) => {
                while n > 0 && first < frames.len() {
                    let left = lens[first] - skip;
                    if n >= left {
                        n -= left;
                        first += 1;
                        skip = 0;
                    } else {
                        skip += n;
                        n = 0;
                    }
                }
                while first < frames.len() && lens[first] == 0 {
                    first += 1;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
