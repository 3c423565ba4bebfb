//! A lane's reader: decodes headers, asks the engine where each payload goes, receives it straight into
//! the caller's memory, and refuses (with a Reject naming the reason) what a peer may not send.

use std::io::{self, IoSliceMut};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::net::tcp::OwnedReadHalf;
use transfer_engine::wire::{FrameKind, HEADER_LEN, Header};
use transfer_engine::{Error, MemoryRegion, PeerId};

use super::context::{Context, lock};
use super::lane_state::{LaneState, ready};
use super::peer_link::PeerLink;
use super::reader_budgets::ReaderBudgets;
use super::socket_io::recv_exact;
use super::stage::{LaneStagers, RELEASE_IDLE_STAGERS, staged};
use super::staged_io::{Unplaced, recv_staged};
use crate::node::LogKind;
use crate::transport::{CloseReason, TransportError};

/// Data frames received back to back before the driver is woken to acknowledge them.
const WAKE_EVERY: u32 = 16;
/// Scratch for payloads that are read only to be dropped.
const SCRATCH: usize = 64 << 10;

pub(crate) async fn reader(
    ctx: Arc<Context>,
    link: Arc<PeerLink>,
    lane: Arc<LaneState>,
    rd: OwnedReadHalf,
) {
    let mut closed = lane.closed.subscribe();
    let reason = tokio::select! {
        reason = read_loop(&ctx, &link, &lane, &rd) => reason,
        _ = closed.wait_for(Option::is_some) => None,
    };
    if let Some(reason) = reason {
        // Refusals were logged where they happened; every other end of a lane is logged here.
        if !matches!(reason, CloseReason::Refused(_)) {
            ctx.core.log.closed(
                link.peer,
                format!(
                    "lane {} from peer {} closed: {reason}",
                    lane.id, link.peer.0
                ),
                reason.clone(),
            );
        }
        lane.close(&reason);
    }
    link.remove(lane.id, &ctx);
}

/// Whether a refusal means the peer addressed something it may not (or is not speaking the protocol):
/// such a peer loses its lane.
fn fatal(e: &Error) -> bool {
    matches!(
        e.cause(),
        Error::Wire(_)
            | Error::OutOfBounds { .. }
            | Error::WrongKey(_)
            | Error::NotOwner { .. }
            | Error::UnknownRegion(_)
            | Error::FrameMismatch { .. }
    )
}

/// Reads frames until the lane ends; returns why.
async fn read_loop(
    ctx: &Context,
    link: &PeerLink,
    lane: &LaneState,
    rd: &OwnedReadHalf,
) -> Option<CloseReason> {
    let peer = link.peer;
    let stall = ctx.cfg.liveness.stall_timeout;
    let mut hdr = [0u8; HEADER_LEN];
    let mut have = 0usize;
    let mut scratch = vec![0u8; SCRATCH];
    let mut control: Vec<u8> = Vec::new();
    let mut quiet = 0u32;
    let mut stagers = LaneStagers::new(&ctx.staged);
    // A staged frame whose device copy may still be in flight: handed on once it has completed.
    let mut unplaced: Option<Unplaced> = None;
    let mut budgets = ReaderBudgets::new(ctx, link, lane);
    loop {
        if unplaced.is_some() && have < HEADER_LEN {
            // The lane may wait for bytes now: hand on the staged frame first.
            if let Err(why) = hand_on(ctx, lane, peer, &mut stagers, &mut unplaced) {
                return Some(why);
            }
        }
        // (`peek` waits for a byte without taking it; readiness left over from the last read does not
        // count.)
        if have == 0
            && !stagers.is_empty()
            && tokio::time::timeout(RELEASE_IDLE_STAGERS, rd.as_ref().peek(&mut [0u8; 1]))
                .await
                .is_err()
        {
            // Nothing arrived for a while: let the staging buffers go until staged bytes come again.
            stagers.release();
        }
        if let Err(e) = fill(rd, &mut hdr, &mut have, stall).await {
            return Some(CloseReason::from_error(&e));
        }
        have = 0;
        let now = Instant::now();
        *lock(&lane.last_rx) = now;
        let header = match Header::decode(&hdr) {
            Ok(h) => h,
            Err(e) => return Some(refuse(ctx, lane, peer, None, &Error::Wire(e))),
        };
        budgets.admit(&header, now).await;
        // A resend of a unit held unplaced is placed only once that frame is handed on (and then
        // discarded, as a duplicate).
        if header.kind == FrameKind::Data
            && unplaced.as_ref().is_some_and(|u| u.overlaps(&header))
            && let Err(why) = hand_on(ctx, lane, peer, &mut stagers, &mut unplaced)
        {
            return Some(why);
        }
        let placement = (header.kind == FrameKind::Data)
            .then(|| ctx.core.station.engine().destination(peer, &header));
        let staged_kind = match &placement {
            Some(Ok(Some((memory, _)))) if staged(&ctx.cfg, memory.kind()) => Some(memory.kind()),
            _ => None,
        };
        // The frame before is handed on here unless this one lands in the same stager, which hands it on
        // once this payload's first piece has landed.
        if unplaced.as_ref().map(|u| u.kind) != staged_kind
            && let Err(why) = hand_on(ctx, lane, peer, &mut stagers, &mut unplaced)
        {
            return Some(why);
        }
        let result = match placement {
            Some(Ok(Some((memory, range)))) if staged_kind.is_some() => {
                let len = range.len();
                let stager = match stagers.get(memory.kind(), ctx.cfg.buffers.stage_bytes) {
                    Ok(stager) => stager,
                    Err(e) => return Some(CloseReason::from_error(&e)),
                };
                let mut refused = None;
                let received = recv_staged(
                    rd,
                    stager,
                    &memory,
                    range,
                    &mut hdr,
                    &mut have,
                    stall,
                    &mut unplaced,
                    &mut |earlier| deliver(ctx, peer, &earlier, &mut refused),
                )
                .await;
                if let Some((h, e)) = refused {
                    return Some(refuse(ctx, lane, peer, Some(&h), &e));
                }
                let crc = match received {
                    Ok(crc) => crc,
                    Err(e) => return Some(CloseReason::from_error(&e)),
                };
                ctx.staged.add_received(len);
                unplaced = Some(Unplaced {
                    header,
                    crc,
                    kind: memory.kind(),
                });
                Ok(())
            }
            Some(Ok(Some((memory, range)))) => {
                let crc =
                    match recv_into_region(rd, &memory, range, &mut hdr, &mut have, stall).await {
                        Ok(crc) => crc,
                        Err(e) => return Some(CloseReason::from_error(&e)),
                    };
                ctx.core
                    .station
                    .engine()
                    .handle_data(Instant::now(), peer, &header, crc)
            }
            Some(Err(e)) if fatal(&e) => {
                return Some(refuse(ctx, lane, peer, Some(&header), &e));
            }
            // Nothing to place (a late duplicate, or a frame refused without costing the lane): read
            // the payload past, then hand on the duplicate (acknowledged again) or the refusal.
            Some(nothing) => {
                if let Err(e) = discard(
                    rd,
                    header.length as usize,
                    &mut scratch,
                    &mut hdr,
                    &mut have,
                    stall,
                )
                .await
                {
                    return Some(CloseReason::from_error(&e));
                }
                nothing.and_then(|_| {
                    ctx.core
                        .station
                        .engine()
                        .handle_data(Instant::now(), peer, &header, header.crc)
                })
            }
            None => {
                // Control payloads (acks, opens) are read into one buffer the lane keeps.
                control.clear();
                control.resize(header.length as usize, 0);
                let payload = &mut control[..];
                if let Err(e) = recv_exact(rd, payload, &mut hdr, &mut have, stall, None).await {
                    return Some(CloseReason::from_error(&e));
                }
                if header.kind == FrameKind::Reject && header.session == 0 {
                    ctx.core.log.error(
                        LogKind::Closed,
                        Some(peer),
                        format!(
                            "peer {} refused a frame of ours and closed the lane",
                            peer.0
                        ),
                        TransportError::Refused(String::from_utf8_lossy(payload).into_owned()),
                    );
                }
                ctx.core
                    .station
                    .engine()
                    .handle_frame(Instant::now(), peer, &header, payload)
            }
        };
        // A control buffer grown past the discard scratch (a large open) is let go, so an idle lane
        // holds little.
        if control.capacity() > SCRATCH {
            control = Vec::new();
        }
        if let Err(e) = &result
            && fatal(e)
        {
            ctx.wake.notify_one();
            return Some(refuse(ctx, lane, peer, Some(&header), e));
        }
        // Wake the driver (to acknowledge, or to send more) once the stream pauses, or every few frames
        // while it streams: acknowledgements then cover many slices each.
        quiet += 1;
        if have == 0 || quiet >= WAKE_EVERY || header.kind != FrameKind::Data {
            quiet = 0;
            ctx.wake.notify_one();
        }
    }
}

/// Hands the engine the staged frame received last, once its device copy has completed. Returns why the
/// lane must close, if it must (a failed device copy, or a refusal that costs the lane).
fn hand_on(
    ctx: &Context,
    lane: &LaneState,
    peer: PeerId,
    stagers: &mut LaneStagers,
    unplaced: &mut Option<Unplaced>,
) -> Result<(), CloseReason> {
    let Some(held) = unplaced.take() else {
        return Ok(());
    };
    stagers.flush().map_err(|e| CloseReason::from_error(&e))?;
    let mut refused = None;
    deliver(ctx, peer, &held, &mut refused);
    // The lane may wait for bytes next: the driver acknowledges what was just handed on.
    ctx.wake.notify_one();
    match refused {
        Some((header, e)) => Err(refuse(ctx, lane, peer, Some(&header), &e)),
        None => Ok(()),
    }
}

/// Hands the engine a staged frame whose device copy has completed; keeps a refusal that costs the lane.
/// (The driver is woken as for any data frame: every few frames, or when the lane waits.)
fn deliver(ctx: &Context, peer: PeerId, held: &Unplaced, refused: &mut Option<(Header, Error)>) {
    let result =
        ctx.core
            .station
            .engine()
            .handle_data(Instant::now(), peer, &held.header, held.crc);
    if let Err(e) = result
        && fatal(&e)
    {
        *refused = Some((held.header, e));
    }
}

/// Refuses a frame: counts it, logs it, sends the peer a `Reject` naming the reason, closes the lane.
fn refuse(
    ctx: &Context,
    lane: &LaneState,
    peer: PeerId,
    header: Option<&Header>,
    e: &Error,
) -> CloseReason {
    ctx.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
    let reason = format!(
        "lane closed: peer {} sent a refused frame: {}",
        peer.0,
        e.cause()
    );
    ctx.core.log.error(
        LogKind::Refused,
        Some(peer),
        format!(
            "lane {} closed: peer {} sent a refused frame",
            lane.id, peer.0
        ),
        e.clone(),
    );
    // The peer is told why before the lane closes: on the frame's session, or on session 0 when the
    // header itself could not be read.
    let bytes = super::lane_state::reject_frame(header.map_or(0, |h| h.session), &reason);
    *lock(&lane.goodbye) = Some(bytes);
    // Wake the writer so it sends the goodbye and closes.
    lane.closed.send_modify(|_| {});
    CloseReason::Refused(reason)
}

/// Reads until `hdr` holds a whole header (`have` bytes may already be there).
async fn fill(
    rd: &OwnedReadHalf,
    hdr: &mut [u8; HEADER_LEN],
    have: &mut usize,
    stall: Duration,
) -> io::Result<()> {
    while *have < HEADER_LEN {
        // Waiting for a frame to start is idling; a frame that started must keep coming.
        if *have == 0 {
            rd.readable().await?;
        } else {
            ready(rd.readable(), stall, "stopped sending mid-header").await?;
        }
        match rd.try_read(&mut hdr[*have..]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the lane",
                ));
            }
            Ok(n) => *have += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads `len` payload bytes past, a scratch buffer at a time; only the last piece's syscall may take
/// the next header's first bytes.
async fn discard(
    rd: &OwnedReadHalf,
    mut len: usize,
    scratch: &mut [u8],
    hdr: &mut [u8; HEADER_LEN],
    have: &mut usize,
    stall: Duration,
) -> io::Result<()> {
    while len > 0 {
        let n = len.min(scratch.len());
        let next: &mut [u8] = if n == len { &mut hdr[..] } else { &mut [] };
        recv_exact(rd, &mut scratch[..n], next, have, stall, None).await?;
        len -= n;
    }
    Ok(())
}

/// Receives a payload straight into `range` of `memory`, each piece viewed (its shards locked) only for
/// the non-blocking `recv` itself; the last piece's syscall also takes the next header's first bytes.
/// Returns the CRC-32C of the payload, taken over each piece right after the kernel copied it in (while it
/// is still in cache), not in a pass of its own.
async fn recv_into_region(
    rd: &OwnedReadHalf,
    memory: &MemoryRegion,
    range: std::ops::Range<usize>,
    hdr: &mut [u8; HEADER_LEN],
    have: &mut usize,
    stall: Duration,
) -> io::Result<u32> {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    let mut pos = range.start;
    while pos < range.end {
        ready(rd.readable(), stall, "stopped sending mid-frame").await?;
        let result = {
            let mut view = memory.write(pos..range.end).map_err(io::Error::other)?;
            let mut bufs = [IoSliceMut::new(&mut view), IoSliceMut::new(&mut hdr[..])];
            let got = rd.try_read_vectored(&mut bufs);
            if let Ok(n) = got {
                digest.update(&view[..n.min(view.len())]);
            }
            got
        };
        match result {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the lane mid-frame",
                ));
            }
            Ok(n) => {
                let take = n.min(range.end - pos);
                pos += take;
                *have += n - take;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(digest.finalize() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_discarded_payload_larger_than_the_scratch_leaves_the_next_header_whole() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut tx = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (rx, _) = listener.accept().await.unwrap();
        let (rd, _wr) = rx.into_split();
        let payload = 2 * SCRATCH + 1000;
        let next: Vec<u8> = (0..HEADER_LEN as u8).collect();
        let mut bytes = vec![0xAB; payload];
        bytes.extend_from_slice(&next);
        tx.write_all(&bytes).await.unwrap();
        // Everything is in the socket before the first read, so each read could take more than a piece.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (mut hdr, mut have) = ([0u8; HEADER_LEN], 0);
        let mut scratch = vec![0u8; SCRATCH];
        let stall = Duration::from_secs(5);
        discard(&rd, payload, &mut scratch, &mut hdr, &mut have, stall)
            .await
            .unwrap();
        assert!(have <= HEADER_LEN, "took {have} header bytes");
        fill(&rd, &mut hdr, &mut have, stall).await.unwrap();
        assert_eq!(
            &hdr[..],
            &next[..],
            "the next header arrives whole and in order"
        );
    }

    #[test]
    fn refusals_that_cost_a_lane() {
        assert!(fatal(&Error::WrongKey(transfer_engine::RegionId(1))));
        assert!(fatal(&Error::Wire(
            transfer_engine::WireError::HeaderChecksum
        )));
        assert!(!fatal(&Error::UnknownSession(transfer_engine::SessionId(
            1
        ))));
    }
}
