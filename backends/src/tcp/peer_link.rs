//! The link to one peer: its queue of frames, its lanes, its address, dial state, reachability and group
//! token.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;
use tokio::task::AbortHandle;
use transfer_engine::{Channel, PeerId, TokenBucket, Transmit};

use super::context::{Context, lock};
use super::handshake::TOKEN_LEN;
use super::lane_state::LaneState;

/// Most frames in one vectored write.
const MAX_BATCH_FRAMES: usize = 128;

/// Everything about one peer: its queue of frames, its lanes, its address and dial state.
pub(crate) struct PeerLink {
    pub(crate) peer: PeerId,
    queue: Mutex<VecDeque<Transmit>>,
    pub(crate) queued_bytes: AtomicU64,
    /// Wakes a writer of this peer: frames were queued.
    pub(crate) ready: Notify,
    addr: Mutex<Option<SocketAddr>>,
    pub(crate) lanes: Mutex<BTreeMap<u64, LaneHandle>>,
    dial: Mutex<DialState>,
    /// Since when the peer has had no lane while sessions with it were live (see `reach.rs`).
    pub(crate) lost_since: Mutex<Option<Instant>>,
    /// The token of the peer's connection group, once a handshake with it completed.
    token: Mutex<Option<[u8; TOKEN_LEN]>>,
    /// When it last lost its last lane.
    last_lane_closed: Mutex<Option<Instant>>,
    /// The Data byte budget its lanes share (`StrangerLimits::data_bytes_per_sec_per_peer`; `None`: unlimited).
    data_budget: Option<Mutex<TokenBucket>>,
    /// Whether this node's own user named the peer (dialed it, added its address, or sent it a transfer):
    /// such a link is never forgotten.
    pinned: AtomicBool,
    /// When the link was made.
    created: Instant,
}

struct DialState {
    dialing: bool,
    failures: u32,
    next_at: Instant,
    last_error: Option<String>,
    /// When the dials of the last `Dialing::dial_window` started (at most `max_dials_per_window`).
    recent: VecDeque<Instant>,
}

pub(crate) struct LaneHandle {
    pub(crate) state: Arc<LaneState>,
    pub(crate) tasks: Vec<AbortHandle>,
    /// An inbound lane's hold on its address's connections, released with the lane.
    pub(crate) _slot: Option<super::admission::ConnectionSlot>,
    /// A dialed lane's seat among the node's lanes, released with the lane.
    pub(crate) _outbound: Option<super::admission::OutboundSeat>,
}

impl PeerLink {
    pub(crate) fn new(peer: PeerId, data_bytes_per_sec: u64) -> Self {
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
                recent: VecDeque::new(),
            }),
            lost_since: Mutex::new(None),
            token: Mutex::new(None),
            last_lane_closed: Mutex::new(None),
            data_budget: super::budget::data_budget(data_bytes_per_sec).map(Mutex::new),
            pinned: AtomicBool::new(false),
            created: Instant::now(),
        }
    }

    /// Marks the peer as one this node's user named: its link is kept however long it idles.
    pub(crate) fn pin(&self) {
        self.pinned.store(true, Ordering::Relaxed);
    }

    /// Whether the link is a stranger's that has had no lane, nothing queued and no dial since before
    /// `cutoff` (sessions are the engine's to tell).
    pub(crate) fn idle_stranger_since(&self, cutoff: Instant) -> bool {
        !self.pinned.load(Ordering::Relaxed)
            && self.lane_count() == 0
            && self.queued_bytes.load(Ordering::Relaxed) == 0
            && !lock(&self.dial).dialing
            && self.last_lane_closed().unwrap_or(self.created) <= cutoff
    }

    /// The Data byte budget the peer's lanes share, if the node limits one.
    pub(crate) fn data_budget(&self) -> Option<&Mutex<TokenBucket>> {
        self.data_budget.as_ref()
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

    /// Forgets the failed dials of an earlier episode (the dial window stays): the next dial is due now.
    pub(crate) fn reset_dial_failures(&self, now: Instant) {
        let mut d = lock(&self.dial);
        d.failures = 0;
        d.last_error = None;
        d.next_at = now;
    }

    /// Failed dials since the last success, and the last one's error.
    pub(crate) fn dial_failures(&self) -> (u32, Option<String>) {
        let d = lock(&self.dial);
        (d.failures, d.last_error.clone())
    }

    /// Drops every queued frame (the peer is gone, or no session needs it); returns how many.
    pub(crate) fn clear_queue(&self, ctx: &Context) -> usize {
        let mut queue = lock(&self.queue);
        let frames = queue.len();
        let dropped: u64 = queue.drain(..).map(|t| t.wire_len() as u64).sum();
        drop(queue);
        self.queued_bytes.fetch_sub(dropped, Ordering::Relaxed);
        ctx.total_queued.fetch_sub(dropped, Ordering::Relaxed);
        frames
    }

    pub(crate) fn set_addr(&self, addr: SocketAddr) {
        *lock(&self.addr) = Some(addr);
    }

    /// When it last lost its last lane (`None` if it never has); see [`Self::lane_count`] for now.
    pub(crate) fn last_lane_closed(&self) -> Option<Instant> {
        *lock(&self.last_lane_closed)
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

    /// The address to dial now, if a dial is due (not already dialing, backoff elapsed, fewer than
    /// `max_dials_per_window` dials in the last `dial_window`, successful or not); marks dialing.
    pub(crate) fn dial_due(&self, now: Instant, ctx: &Context) -> Option<SocketAddr> {
        let addr = (*lock(&self.addr))?;
        let mut d = lock(&self.dial);
        if d.dialing || now < d.next_at {
            return None;
        }
        let window = ctx.cfg.dialing.dial_window;
        while d
            .recent
            .front()
            .is_some_and(|&t| now.duration_since(t) >= window)
        {
            d.recent.pop_front();
        }
        if d.recent.len() >= ctx.cfg.dialing.max_dials_per_window.max(1) {
            // A peer whose lanes keep dying right after each dial (or that makes them die) waits.
            d.next_at = d.recent[0] + window;
            return None;
        }
        d.recent.push_back(now);
        d.dialing = true;
        Some(addr)
    }

    pub(crate) fn dial_done(&self, result: Result<(), String>, ctx: &Context) {
        let mut d = lock(&self.dial);
        d.dialing = false;
        match result {
            Ok(()) => {
                d.failures = 0;
                d.last_error = None;
            }
            Err(e) => {
                let factor = 1u32 << d.failures.min(16);
                let delay = ctx
                    .cfg
                    .dialing
                    .redial_base
                    .saturating_mul(factor)
                    .min(ctx.cfg.dialing.redial_max);
                d.failures += 1;
                d.next_at = Instant::now() + delay;
                d.last_error = Some(e);
            }
        }
    }

    /// Takes frames for one vectored write: up to `max_bytes`, or one exclusive unit alone.
    pub(crate) fn take_batch(&self, ctx: &Context, out: &mut Vec<Transmit>) {
        let mut q = lock(&self.queue);
        let mut bytes = 0usize;
        while let Some(t) = q.front() {
            let exclusive = t.channel == Channel::Exclusive;
            if !out.is_empty()
                && (exclusive
                    || bytes + t.wire_len() > ctx.cfg.buffers.batch_bytes
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
        ctx.total_queued.fetch_sub(bytes as u64, Ordering::Relaxed);
        if more {
            self.ready.notify_one();
        }
    }

    /// Closes every lane now (their sockets are dropped).
    pub(crate) fn abort_all(&self, ctx: &Context) {
        let lanes: Vec<LaneHandle> = std::mem::take(&mut *lock(&self.lanes))
            .into_values()
            .collect();
        for lane in lanes {
            lane.state.close(&crate::transport::CloseReason::Local);
            for t in &lane.tasks {
                t.abort();
            }
            ctx.counters.lanes_closed.fetch_add(1, Ordering::Relaxed);
        }
        *lock(&self.last_lane_closed) = Some(Instant::now());
        if self.addr().is_none() {
            self.clear_queue(ctx);
        }
        ctx.wake.notify_one();
    }

    pub(crate) fn remove(&self, id: u64, ctx: &Context) {
        let mut lanes = lock(&self.lanes);
        if lanes.remove(&id).is_some() {
            ctx.counters.lanes_closed.fetch_add(1, Ordering::Relaxed);
            if lanes.is_empty() {
                *lock(&self.last_lane_closed) = Some(Instant::now());
            }
        }
        // With no lane left and no address to redial, nothing queued for the peer can ever leave: release
        // it now (the engines resend or give up what mattered).
        if lanes.is_empty() && self.addr().is_none() {
            drop(lanes);
            self.clear_queue(ctx);
        }
        ctx.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::TcpConfig;
    use super::*;

    #[test]
    fn dials_to_a_peer_are_limited_per_window_even_when_each_succeeds() {
        let mut cfg = TcpConfig::default();
        cfg.dialing.max_dials_per_window = 3;
        cfg.dialing.dial_window = Duration::from_secs(10);
        let ctx = Context::new(cfg);
        let link = PeerLink::new(PeerId(7), 0);
        link.set_addr("127.0.0.1:9".parse().unwrap());
        let t0 = Instant::now();
        for i in 0..3 {
            let now = t0 + Duration::from_millis(i);
            assert!(link.dial_due(now, &ctx).is_some(), "dial {i}");
            link.dial_done(Ok(()), &ctx);
        }
        // Three successful dials in the window: the fourth waits for the first to leave it.
        assert_eq!(link.dial_due(t0 + Duration::from_secs(1), &ctx), None);
        assert_eq!(link.dial_due(t0 + Duration::from_millis(9_999), &ctx), None);
        assert!(link.dial_due(t0 + Duration::from_secs(10), &ctx).is_some());
    }
}
