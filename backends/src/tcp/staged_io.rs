//! Payloads moved through a lane's staging buffers, for regions lanes cannot use in place (GPU memory).
//!
//! Sending: a frame's header carries its payload's CRC-32C, taken on the staged copy, so a unit is staged
//! before its header is written. Frames of at most one buffer are pipelined: the device copy of frame N+1
//! runs while frame N is on the socket. A larger frame is staged twice, a buffer at a time: once for its
//! CRC, once to send (the price of a header that comes first; lanes meet it only with exclusive units
//! larger than [`super::Buffers::stage_bytes`]).
//!
//! Receiving: a payload lands in a buffer a piece at a time, its CRC folded into the receive; each piece's
//! device copy starts once it has landed. A frame is handed to the engine only once its device copy has
//! completed: when the next staged frame's first piece has landed (so that copy overlapped the receive),
//! or before the lane handles anything else or waits for more bytes.

use std::io::{self, IoSlice};
use std::ops::Range;
use std::time::{Duration, Instant};

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use transfer_engine::MemoryRegion;
use transfer_engine::wire::{HEADER_LEN, Header};

use super::context::Context;
use super::lane_state::ready;
use super::socket_io::{advance, recv_exact};
use crate::staging::{AnyStager, StagingError};

/// A received frame whose payload's device copy may still be in flight.
pub(crate) struct Unplaced {
    pub(crate) header: Header,
    /// The CRC-32C its payload arrived with.
    pub(crate) crc: u32,
    /// The memory it is placed into (whose stager holds the copy).
    pub(crate) kind: transfer_engine::MemoryKind,
}

impl Unplaced {
    /// Whether data frame `next` carries any byte this frame carries (a resend of one of its units: the
    /// frame may be a coalesced run of several).
    pub(crate) fn overlaps(&self, next: &Header) -> bool {
        let (held, end) = (&self.header, |h: &Header| h.offset + u64::from(h.length));
        (held.session, held.layer, held.block) == (next.session, next.layer, next.block)
            && held.offset < end(next)
            && next.offset < end(held)
    }
}

fn staging(e: StagingError) -> io::Error {
    io::Error::other(e)
}

/// Cuts `range` into pieces of at most `cap` bytes.
fn pieces(range: Range<usize>, cap: usize) -> Vec<Range<usize>> {
    (range.start..range.end)
        .step_by(cap)
        .map(|a| a..(a + cap).min(range.end))
        .collect()
}

/// Waits, without blocking the executor, until the oldest prefetched unit's device copy has completed.
async fn settled(stager: &mut AnyStager, stall: Duration) -> io::Result<()> {
    let since = Instant::now();
    while !stager.ready().map_err(staging)? {
        if since.elapsed() > stall {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "a staging copy did not complete",
            ));
        }
        tokio::task::yield_now().await;
    }
    Ok(())
}

/// Writes `parts` whole, in order.
async fn write_parts(wr: &OwnedWriteHalf, parts: &[&[u8]], stall: Duration) -> io::Result<()> {
    let (mut first, mut skip) = (0usize, 0usize);
    while first < parts.len() {
        ready(wr.writable(), stall, "did not read what this node wrote").await?;
        let slices: Vec<IoSlice<'_>> = parts[first..]
            .iter()
            .enumerate()
            .map(|(i, p)| IoSlice::new(if i == 0 { &p[skip..] } else { p }))
            .collect();
        match wr.try_write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => advance(|i| parts[i].len(), parts.len(), n, &mut first, &mut skip),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A staged frame to send: its header (CRC still to fill in) and its payload's memory and range.
pub(crate) struct Outgoing {
    pub(crate) header: Header,
    pub(crate) memory: MemoryRegion,
    pub(crate) range: Range<usize>,
}

/// Sends staged frames in order, through `stager` (one per kind of memory: every frame's memory is of
/// the stager's kind). Returns the payload bytes sent.
pub(crate) async fn send_staged(
    ctx: &Context,
    stager: &mut AnyStager,
    frames: &mut [Outgoing],
    wr: &OwnedWriteHalf,
) -> io::Result<usize> {
    let (cap, stall) = (stager.unit_capacity(), ctx.cfg.liveness.stall_timeout);
    let mut sent = 0;
    // Whether frame i's unit was prefetched while frame i - 1 was sent.
    let mut prefetched = false;
    for i in 0..frames.len() {
        let (memory, range) = (frames[i].memory.clone(), frames[i].range.clone());
        if range.len() > cap {
            // Staged twice: once for the CRC the header carries, once to send.
            frames[i].header.crc = staged_crc(stager, &memory, range.clone(), stall).await?;
            write_parts(wr, &[&frames[i].header.encode()], stall).await?;
            // Each piece's device copy runs while the one before is on the socket.
            let pieces = pieces(range.clone(), cap);
            stager
                .prefetch(&memory, pieces[0].clone())
                .map_err(staging)?;
            for k in 0..pieces.len() {
                if let Some(next) = pieces.get(k + 1) {
                    stager.prefetch(&memory, next.clone()).map_err(staging)?;
                }
                settled(stager, stall).await?;
                let unit = stager.take().map_err(staging)?;
                write_parts(wr, &[unit.bytes()], stall).await?;
            }
            prefetched = false;
        } else {
            if !prefetched {
                stager.prefetch(&memory, range.clone()).map_err(staging)?;
            }
            prefetched = match frames.get(i + 1) {
                Some(next) if next.range.len() <= cap => {
                    stager
                        .prefetch(&next.memory, next.range.clone())
                        .map_err(staging)?;
                    true
                }
                _ => false,
            };
            settled(stager, stall).await?;
            let unit = stager.take().map_err(staging)?;
            frames[i].header.crc = unit.crc32c();
            write_parts(wr, &[&frames[i].header.encode(), unit.bytes()], stall).await?;
        }
        sent += range.len();
    }
    Ok(sent)
}

/// The CRC-32C of `range` of `memory`, staged a buffer at a time (the next buffer's copy in flight while
/// one is checksummed), combined from the pieces' CRCs.
async fn staged_crc(
    stager: &mut AnyStager,
    memory: &MemoryRegion,
    range: Range<usize>,
    stall: Duration,
) -> io::Result<u32> {
    let pieces = pieces(range, stager.unit_capacity());
    let mut crc = transfer_engine::crc32c(&[]);
    stager
        .prefetch(memory, pieces[0].clone())
        .map_err(staging)?;
    for i in 0..pieces.len() {
        if let Some(next) = pieces.get(i + 1) {
            stager.prefetch(memory, next.clone()).map_err(staging)?;
        }
        settled(stager, stall).await?;
        let unit = stager.take().map_err(staging)?;
        crc = transfer_engine::crc32c_combine(crc, unit.crc32c(), unit.bytes().len());
    }
    Ok(crc)
}

/// Receives a payload through `stager` into `range` of `memory` and returns its CRC-32C (folded into the
/// receive). If `before` holds the frame received before this one (through the same stager), that frame
/// is given to `hand_on` as soon as its device copy has completed: once this payload's first piece has
/// landed.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn recv_staged(
    rd: &OwnedReadHalf,
    stager: &mut AnyStager,
    memory: &MemoryRegion,
    range: Range<usize>,
    hdr: &mut [u8; HEADER_LEN],
    have: &mut usize,
    stall: Duration,
    before: &mut Option<Unplaced>,
    hand_on: &mut (dyn FnMut(Unplaced) + Send),
) -> io::Result<u32> {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    if range.is_empty()
        && let Some(earlier) = before.take()
    {
        stager.flush().map_err(staging)?;
        hand_on(earlier);
    }
    let end = range.end;
    for piece in pieces(range, stager.unit_capacity()) {
        let mut landing = stager.receive().map_err(staging)?;
        let buffer = landing.buffer().map_err(staging)?;
        // Only the last piece's syscall may take the next header's first bytes.
        let next: &mut [u8] = if piece.end == end {
            &mut hdr[..]
        } else {
            &mut []
        };
        recv_exact(
            rd,
            &mut buffer[..piece.len()],
            next,
            have,
            stall,
            Some(&mut digest),
        )
        .await?;
        if let Some(earlier) = before.take() {
            landing.settle_other().map_err(staging)?;
            hand_on(earlier);
        }
        landing
            .push(memory, piece.start, piece.len())
            .map_err(staging)?;
    }
    Ok(digest.finalize() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::wire::FrameKind;

    fn data(session: u64, block: u32, offset: u64, length: u32) -> Header {
        let mut h = Header::new(FrameKind::Data, session);
        (h.layer, h.block, h.offset, h.length) = (3, block, offset, length);
        h
    }

    #[test]
    fn a_resend_of_any_unit_of_a_held_coalesced_frame_overlaps_it() {
        // Held: slices 2..6 of 1 KiB (bytes 2048..6144) of block 7, as one frame.
        let held = Unplaced {
            header: data(9, 7, 2048, 4096),
            crc: 0,
            kind: transfer_engine::MemoryKind::Host,
        };
        for offset in [2048, 3072, 5120] {
            assert!(held.overlaps(&data(9, 7, offset, 1024)), "{offset}");
        }
        for other in [
            data(9, 7, 1024, 1024),
            data(9, 7, 6144, 1024),
            data(9, 8, 3072, 1024),
            data(10, 7, 3072, 1024),
        ] {
            assert!(!held.overlaps(&other), "{other:?}");
        }
    }
}
