//! Lanes: the TCP connections to one peer, each with a writer task (vectored batches of sealed frames)
//! and a reader task (headers decoded, payloads received straight into their destination).

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;
use transfer_engine::wire::{FrameKind, HEADER_LEN, Header};
use transfer_engine::{
    Body, Error, KvLayout, Lane, MemoryRegion, PeerId, Placement, RegionId, Transmit,
};

use super::TcpError;
use super::handshake::{self, TOKEN_LEN};
use super::node::{PeerInfo, Shared, lock};

/// Most frames in one vectored write.
const MAX_BATCH_FRAMES: usize = 128;
/// Most buffers handed to one `sendmsg` (Linux allows 1024).
const MAX_IOV: usize = 512;
/// Data frames received back to back before the driver is woken to acknowledge them.
const WAKE_EVERY: u32 = 16;
/// Scratch for payloads that are read only to be dropped.
const SCRATCH: usize = 64 << 10;

/// Everything about one peer: its queue of frames, its lanes, its address and dial state.
pub(crate) struct Link {
    pub(crate) peer: PeerId,
    queue: Mutex<VecDeque<Transmit>>,
    pub(crate) queued_bytes: AtomicU64,
    /// Wakes a writer of this peer: frames were queued.
    pub(crate) ready: Notify,
    addr: Mutex<Option<SocketAddr>>,
    lanes: Mutex<BTreeMap<u64, LaneHandle>>,
    dial: Mutex<DialState>,
    pub(crate) reach: Mutex<Reach>,
    /// The token of the peer's connection group, once a handshake with it completed.
    token: Mutex<Option<[u8; TOKEN_LEN]>>,
}

struct DialState {
    dialing: bool,
    failures: u32,
    next_at: Instant,
    last_error: Option<String>,
}

/// Whether a peer can be reached, as the driver judges it from its lanes and dials.
#[derive(Debug, Default)]
pub(crate) struct Reach {
    /// Since when the peer has had no lane while sessions with it were live.
    pub(crate) lost_since: Option<Instant>,
    /// Set once the peer was declared unreachable (its sessions were ended); cleared when a lane opens.
    pub(crate) unreachable: Option<String>,
}

struct LaneHandle {
    state: Arc<LaneState>,
    tasks: Vec<AbortHandle>,
}

impl Link {
    pub(crate) fn new(peer: PeerId) -> Self {
        Self {
            peer,
            queue: Mutex::new(VecDeque::new()),
            queued_bytes: AtomicU64::new(0),
            ready: Notify::new(),
            addr: Mutex::new(None),
            lanes: Mutex::new(BTreeMap::new()),
            dial: Mutex::new(DialState {
                dialing: false,
                failures: 0,
                next_at: Instant::now(),
                last_error: None,
            }),
            reach: Mutex::new(Reach::default()),
            token: Mutex::new(None),
        }
    }

    /// The connection group's token, if a handshake with the peer completed.
    pub(crate) fn token(&self) -> Option<[u8; TOKEN_LEN]> {
        *lock(&self.token)
    }

    /// Records the connection group's token.
    pub(crate) fn set_token(&self, token: [u8; TOKEN_LEN]) {
        *lock(&self.token) = Some(token);
    }

    /// The address lanes to this peer are dialed at, if known.
    pub(crate) fn addr(&self) -> Option<SocketAddr> {
        *lock(&self.addr)
    }

    /// Failed dials since the last success, and the last one's error.
    pub(crate) fn dial_failures(&self) -> (u32, Option<String>) {
        let d = lock(&self.dial);
        (d.failures, d.last_error.clone())
    }

    /// Drops every queued frame (the peer is gone; the engine has given their sessions up).
    pub(crate) fn clear_queue(&self, shared: &Shared) {
        let dropped: u64 = lock(&self.queue)
            .drain(..)
            .map(|t| t.wire_len() as u64)
            .sum();
        self.queued_bytes.fetch_sub(dropped, Ordering::Relaxed);
        shared.total_queued.fetch_sub(dropped, Ordering::Relaxed);
    }

    pub(crate) fn set_addr(&self, addr: SocketAddr) {
        *lock(&self.addr) = Some(addr);
    }

    pub(crate) fn lane_count(&self) -> usize {
        lock(&self.lanes).len()
    }

    /// Whether frames for this peer can go anywhere: a lane is open or an address is known.
    pub(crate) fn routable(&self) -> bool {
        self.lane_count() > 0 || lock(&self.addr).is_some()
    }

    pub(crate) fn push(&self, t: Transmit) {
        self.queued_bytes
            .fetch_add(t.wire_len() as u64, Ordering::Relaxed);
        lock(&self.queue).push_back(t);
    }

    /// The address to dial now, if a dial is due (not already dialing, backoff elapsed); marks dialing.
    pub(crate) fn dial_due(&self, now: Instant) -> Option<SocketAddr> {
        let addr = (*lock(&self.addr))?;
        let mut d = lock(&self.dial);
        if d.dialing || now < d.next_at {
            return None;
        }
        d.dialing = true;
        Some(addr)
    }

    fn dial_done(&self, result: Result<(), String>, shared: &Shared) {
        let mut d = lock(&self.dial);
        d.dialing = false;
        match result {
            Ok(()) => {
                d.failures = 0;
                d.last_error = None;
            }
            Err(e) => {
                let factor = 1u32 << d.failures.min(16);
                let delay = shared
                    .cfg
                    .redial_base
                    .saturating_mul(factor)
                    .min(shared.cfg.redial_max);
                d.failures += 1;
                d.next_at = Instant::now() + delay;
                d.last_error = Some(e);
            }
        }
    }

    /// Takes frames for one vectored write: up to `max_bytes`, or one exclusive unit alone.
    fn take_batch(&self, shared: &Shared, out: &mut Vec<Transmit>) {
        let mut q = lock(&self.queue);
        let mut bytes = 0usize;
        while let Some(t) = q.front() {
            let exclusive = t.lane == Lane::Exclusive;
            if !out.is_empty()
                && (exclusive
                    || bytes + t.wire_len() > shared.cfg.batch_bytes
                    || out.len() >= MAX_BATCH_FRAMES)
            {
                break;
            }
            bytes += t.wire_len();
            out.extend(q.pop_front());
            if exclusive {
                break;
            }
        }
        let more = !q.is_empty();
        drop(q);
        self.queued_bytes.fetch_sub(bytes as u64, Ordering::Relaxed);
        shared
            .total_queued
            .fetch_sub(bytes as u64, Ordering::Relaxed);
        if more {
            self.ready.notify_one();
        }
    }

    /// Closes every lane now (their sockets are dropped).
    pub(crate) fn abort_all(&self, shared: &Shared) {
        let lanes: Vec<LaneHandle> = std::mem::take(&mut *lock(&self.lanes))
            .into_values()
            .collect();
        for lane in lanes {
            lane.state.close("closed locally");
            for t in &lane.tasks {
                t.abort();
            }
            shared.counters.lanes_closed.fetch_add(1, Ordering::Relaxed);
        }
        if self.addr().is_none() {
            self.clear_queue(shared);
        }
        shared.wake.notify_one();
    }

    fn remove(&self, id: u64, shared: &Shared) {
        let mut lanes = lock(&self.lanes);
        if lanes.remove(&id).is_some() {
            shared.counters.lanes_closed.fetch_add(1, Ordering::Relaxed);
        }
        // With no lane left and no address to redial, nothing queued for the peer can ever leave: release
        // it now (the engines resend or give up what mattered).
        if lanes.is_empty() && self.addr().is_none() {
            drop(lanes);
            self.clear_queue(shared);
        }
        shared.wake.notify_one();
    }
}

/// One lane's shared state between its reader and writer.
struct LaneState {
    id: u64,
    outbound: bool,
    closed: watch::Sender<Option<String>>,
    goodbye: Mutex<Option<Vec<u8>>>,
    last_rx: Mutex<Instant>,
}

impl LaneState {
    fn close(&self, reason: &str) {
        self.closed.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason.to_string());
                true
            } else {
                false
            }
        });
    }
}

/// Dials `addr`, handshakes and starts a lane; the peer's id comes from its hello (checked against
/// `expect` if given).
pub(crate) async fn dial(
    shared: &Arc<Shared>,
    addr: SocketAddr,
    expect: Option<PeerId>,
    want: Option<KvLayout>,
) -> Result<PeerInfo, TcpError> {
    let limit = shared.cfg.handshake_timeout;
    let mut stream = tokio::time::timeout(limit, TcpStream::connect(addr))
        .await
        .map_err(|_| TcpError::Timeout {
            what: format!("connecting to {addr}"),
            waited: limit,
        })??;
    stream.set_nodelay(true)?;
    let mut hello = shared.hello()?;
    hello.want = want;
    // A later lane to a peer proves it belongs to the peer's connection group with the group's token.
    let known = match expect {
        Some(peer) => Some(shared.link(peer)),
        None => shared.link_at(addr),
    };
    if let Some(token) = known.and_then(|l| l.token()) {
        hello.token = token;
    }
    let expect = expect.map(|p| p.0 as u32);
    let accepted = handshake::dial(&mut stream, &hello, shared.secret(), expect, limit)
        .await
        .inspect_err(|e| shared.log(format!("dialing {addr}: {e}")))?;
    let peer = PeerId(u64::from(accepted.peer.engine_id));
    let link = shared.link(peer);
    link.set_addr(addr);
    link.set_token(accepted.token);
    start(shared, &link, stream, true);
    Ok(PeerInfo {
        peer,
        segments: accepted.segments,
    })
}

/// A dial the driver asked for; failures back off.
pub(crate) async fn redial(shared: Arc<Shared>, link: Arc<Link>, addr: SocketAddr) {
    let result = dial(&shared, addr, Some(link.peer), None)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    link.dial_done(result, &shared);
    shared.wake.notify_one();
}

/// Starts the reader and writer of a lane on a handshaken stream.
pub(crate) fn start(shared: &Arc<Shared>, link: &Arc<Link>, stream: TcpStream, outbound: bool) {
    let id = shared.next_lane.fetch_add(1, Ordering::Relaxed);
    let state = Arc::new(LaneState {
        id,
        outbound,
        closed: watch::Sender::new(None),
        goodbye: Mutex::new(None),
        last_rx: Mutex::new(Instant::now()),
    });
    let (rd, wr) = stream.into_split();
    let mut lanes = lock(&link.lanes);
    let r = tokio::spawn(reader(shared.clone(), link.clone(), state.clone(), rd));
    let w = tokio::spawn(writer(shared.clone(), link.clone(), state.clone(), wr));
    lanes.insert(
        id,
        LaneHandle {
            state,
            tasks: vec![r.abort_handle(), w.abort_handle()],
        },
    );
    drop(lanes);
    shared.counters.lanes_opened.fetch_add(1, Ordering::Relaxed);
    shared.wake.notify_one();
}

// ---- writer ----

async fn writer(shared: Arc<Shared>, link: Arc<Link>, lane: Arc<LaneState>, wr: OwnedWriteHalf) {
    let reason = write_loop(&shared, &link, &lane, &wr).await;
    lane.close(&reason);
    link.remove(lane.id, &shared);
}

async fn write_loop(shared: &Shared, link: &Link, lane: &LaneState, wr: &OwnedWriteHalf) -> String {
    let mut closed = lane.closed.subscribe();
    let mut batch = Vec::new();
    loop {
        let goodbye = lock(&lane.goodbye).take();
        if let Some(bytes) = goodbye {
            let frames = [Frame::Bytes(&bytes)];
            let _ = write_all(wr, &frames, &[], shared.cfg.stall_timeout).await;
            return "closed after refusing a frame".into();
        }
        if closed.borrow().is_some() {
            return closed.borrow().clone().unwrap_or_default();
        }
        batch.clear();
        link.take_batch(shared, &mut batch);
        if batch.is_empty() {
            let idle = shared.cfg.idle_timeout;
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
        if let Err(e) = send_batch(shared, &mut batch, wr).await {
            return format!("write failed: {e}");
        }
        shared.wake.notify_one();
    }
}

enum Frame<'a> {
    Bytes(&'a [u8]),
    Region(usize, std::ops::Range<usize>),
}

async fn send_batch(
    shared: &Shared,
    batch: &mut [Transmit],
    wr: &OwnedWriteHalf,
) -> io::Result<()> {
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
                    None => shared.station.engine().memory(p.region).ok().map(|m| {
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
    write_all(wr, &frames, &regions, shared.cfg.stall_timeout).await
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

// ---- reader ----

async fn reader(shared: Arc<Shared>, link: Arc<Link>, lane: Arc<LaneState>, rd: OwnedReadHalf) {
    let mut closed = lane.closed.subscribe();
    let reason = tokio::select! {
        reason = read_loop(&shared, &link, &lane, &rd) => reason,
        _ = closed.wait_for(Option::is_some) => None,
    };
    if let Some(reason) = reason {
        lane.close(&reason);
    }
    link.remove(lane.id, &shared);
}

/// Whether a refusal means the peer addressed something it may not (or is not speaking the protocol):
/// such a peer loses its lane.
fn fatal(e: &Error) -> bool {
    matches!(
        e,
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
    shared: &Shared,
    link: &Link,
    lane: &LaneState,
    rd: &OwnedReadHalf,
) -> Option<String> {
    let peer = link.peer;
    let stall = shared.cfg.stall_timeout;
    let mut hdr = [0u8; HEADER_LEN];
    let mut have = 0usize;
    let mut scratch = vec![0u8; SCRATCH];
    let mut quiet = 0u32;
    loop {
        if let Err(e) = fill(rd, &mut hdr, &mut have, stall).await {
            return Some(e.to_string());
        }
        have = 0;
        *lock(&lane.last_rx) = Instant::now();
        let header = match Header::decode(&hdr) {
            Ok(h) => h,
            Err(e) => return Some(refuse(shared, lane, peer, None, &Error::Wire(e))),
        };
        let result = if header.kind == FrameKind::Data {
            let placement = {
                let mut engine = shared.station.engine();
                engine.placement(peer, &header).and_then(|p| match p {
                    Placement::Write {
                        region,
                        offset,
                        len,
                    } => {
                        let range = offset as usize..offset as usize + len as usize;
                        // The engine checked the range against the region, and a region is never
                        // longer than its memory.
                        Ok(Some((engine.memory(region)?.clone(), range)))
                    }
                    Placement::Discard => Ok(None),
                })
            };
            match placement {
                Ok(Some((memory, range))) => {
                    if let Err(e) =
                        recv_into_region(rd, &memory, range.clone(), &mut hdr, &mut have, stall)
                            .await
                    {
                        return Some(e.to_string());
                    }
                    let crc = memory.crc32c(range).unwrap_or(!header.crc);
                    shared
                        .station
                        .engine()
                        .handle_data(Instant::now(), peer, &header, crc)
                }
                Ok(None) => {
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
                        return Some(e.to_string());
                    }
                    shared
                        .station
                        .engine()
                        .handle_data(Instant::now(), peer, &header, header.crc)
                }
                Err(e) => {
                    if fatal(&e) {
                        return Some(refuse(shared, lane, peer, Some(&header), &e));
                    }
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
                        return Some(e.to_string());
                    }
                    Err(e)
                }
            }
        } else {
            let mut payload = vec![0u8; header.length as usize];
            if let Err(e) = recv_exact(rd, &mut payload, &mut hdr, &mut have, stall).await {
                return Some(e.to_string());
            }
            if header.kind == FrameKind::Reject && header.session == 0 {
                shared.log(format!(
                    "peer {} refused a frame of ours and closed the lane: {}",
                    peer.0,
                    String::from_utf8_lossy(&payload)
                ));
            }
            shared
                .station
                .engine()
                .handle_frame(Instant::now(), peer, &header, &payload)
        };
        if let Err(e) = &result
            && fatal(e)
        {
            shared.wake.notify_one();
            return Some(refuse(shared, lane, peer, Some(&header), e));
        }
        // Wake the driver (to acknowledge, or to send more) once the stream pauses, or every few frames
        // while it streams: acknowledgements then cover many slices each.
        quiet += 1;
        if have == 0 || quiet >= WAKE_EVERY || header.kind != FrameKind::Data {
            quiet = 0;
            shared.wake.notify_one();
        }
    }
}

/// Refuses a frame: counts it, logs it, sends the peer a `Reject` naming the reason, closes the lane.
fn refuse(
    shared: &Shared,
    lane: &LaneState,
    peer: PeerId,
    header: Option<&Header>,
    e: &Error,
) -> String {
    shared.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
    let reason = format!("lane closed: peer {} sent a refused frame: {e}", peer.0);
    shared.log(reason.clone());
    // The peer is told why before the lane closes: on the frame's session, or on session 0 when the
    // header itself could not be read.
    let text = reason.clone().into_bytes();
    let mut reject = Header::new(FrameKind::Reject, header.map_or(0, |h| h.session));
    reject.length = text.len() as u32;
    reject.crc = transfer_engine::crc32c(&text);
    let mut bytes = reject.encode().to_vec();
    bytes.extend_from_slice(&text);
    *lock(&lane.goodbye) = Some(bytes);
    // Wake the writer so it sends the goodbye and closes.
    lane.closed.send_modify(|_| {});
    reason
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

/// Receives into `dst`, and the next header's first bytes in the same syscall once `dst` is nearly full.
async fn recv_exact(
    rd: &OwnedReadHalf,
    dst: &mut [u8],
    hdr: &mut [u8; HEADER_LEN],
    have: &mut usize,
    stall: Duration,
) -> io::Result<()> {
    let mut pos = 0;
    while pos < dst.len() {
        ready(rd.readable(), stall, "stopped sending mid-frame").await?;
        let mut bufs = [
            IoSliceMut::new(&mut dst[pos..]),
            IoSliceMut::new(&mut hdr[..]),
        ];
        match rd.try_read_vectored(&mut bufs) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the lane mid-frame",
                ));
            }
            Ok(n) => {
                let take = n.min(dst.len() - pos);
                pos += take;
                *have += n - take;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

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
        recv_exact(rd, &mut scratch[..n], hdr, have, stall).await?;
        len -= n;
    }
    Ok(())
}

/// Receives a payload straight into `range` of `memory`, each piece viewed (its shards locked) only for
/// the non-blocking `recv` itself; the last piece's syscall also takes the next header's first bytes.
async fn recv_into_region(
    rd: &OwnedReadHalf,
    memory: &MemoryRegion,
    range: std::ops::Range<usize>,
    hdr: &mut [u8; HEADER_LEN],
    have: &mut usize,
    stall: Duration,
) -> io::Result<()> {
    let mut pos = range.start;
    while pos < range.end {
        ready(rd.readable(), stall, "stopped sending mid-frame").await?;
        let result = {
            let mut view = memory.write(pos..range.end).map_err(io::Error::other)?;
            let mut bufs = [IoSliceMut::new(&mut view), IoSliceMut::new(&mut hdr[..])];
            rd.try_read_vectored(&mut bufs)
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
    Ok(())
}

/// Waits for a socket to be ready, at most `stall`: a peer that makes no progress for that long is
/// reported as having `what` (and loses its lane).
async fn ready(
    wait: impl std::future::Future<Output = io::Result<()>>,
    stall: Duration,
    what: &str,
) -> io::Result<()> {
    match tokio::time::timeout(stall, wait).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the peer {what} for {} s", stall.as_secs_f64()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

