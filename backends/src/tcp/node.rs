//! A TCP node: one engine, its regions, its listener, its lanes, and the driver task that polls the engine.
//!
//! The engine sits behind one mutex that is only ever held for short, non-blocking calls: the driver task
//! polls transmits, timers and events; lane readers ask for placements and hand in received frames. All
//! socket work happens outside it.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{Notify, broadcast, watch};
use transfer_engine::{
    Body, Event, KvLayout, MemoryRegion, PeerId, RegionHandle, RegionId, SessionId, TransferRequest,
};

use super::accept;
use super::handshake::{Hello, Segment};
use super::lane;
use super::link::Link;
use super::reach;
use super::{TcpConfig, TcpError};
use crate::board::{IncomingSession, Outcome, Received};
use crate::station::Station;

/// Log lines kept for the user (oldest dropped first).
const KEEP_LOG: usize = 1024;

/// A peer reached by [`TcpNode::connect`].
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The peer (its engine id).
    pub peer: PeerId,
    /// Segments it offers, including `served` if a region was asked for.
    pub segments: Vec<Segment>,
}

impl PeerInfo {
    /// The offered segment called `name`.
    #[must_use]
    pub fn segment(&self, name: &str) -> Option<&RegionHandle> {
        self.segments
            .iter()
            .find(|s| s.name == name)
            .map(|s| &s.handle)
    }
}

/// Lane and refusal counters of a node, beside the engine's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// The engine's counters.
    pub engine: transfer_engine::Counters,
    /// Lanes opened (both directions).
    pub lanes_opened: u64,
    /// Lanes closed.
    pub lanes_closed: u64,
    /// Connections refused in the handshake.
    pub handshakes_refused: u64,
    /// Lanes closed because their peer sent a frame that failed to decode or addressed memory it may not.
    pub lanes_closed_for_bad_frames: u64,
    /// Frames dropped because no lane to their peer existed or could be dialed.
    pub unroutable_frames: u64,
    /// Frame bytes queued for lanes right now (bounded by `queue_bytes` plus one frame).
    pub queued_bytes: u64,
    /// Control frames dropped because their peer's queue was over its share (a peer not reading).
    pub control_frames_dropped: u64,
    /// Incoming sessions whose notice was dropped because nobody accepted them in time (their transfers
    /// ran all the same).
    pub incoming_dropped: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) lanes_opened: AtomicU64,
    pub(crate) lanes_closed: AtomicU64,
    pub(crate) handshakes_refused: AtomicU64,
    pub(crate) bad_frames: AtomicU64,
    pub(crate) unroutable: AtomicU64,
    pub(crate) control_dropped: AtomicU64,
}

/// State shared by the node handle, the driver and every lane.
pub(crate) struct Shared {
    pub(crate) cfg: TcpConfig,
    pub(crate) station: Station,
    /// Wakes the driver: new input, freed queue space, a lane came or went.
    pub(crate) wake: Notify,
    pub(crate) links: Mutex<BTreeMap<PeerId, Arc<Link>>>,
    pub(crate) total_queued: AtomicU64,
    pub(crate) counters: Counters,
    pub(crate) next_lane: AtomicU64,
    pub(crate) listen: Option<SocketAddr>,
    /// The newest log lines, each with its number (counting from 1).
    log: Mutex<VecDeque<(u64, String)>>,
    logged: AtomicU64,
    pub(crate) segments: Mutex<Vec<Segment>>,
    /// Regions allocated for peers that asked in their handshake, with the peer each belongs to.
    pub(crate) served: Mutex<Vec<(PeerId, Segment)>>,
    pub(crate) shutdown: watch::Sender<bool>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn log(&self, line: String) {
        let mut log = lock(&self.log);
        if log.len() >= KEEP_LOG {
            log.pop_front();
        }
        let n = self.logged.fetch_add(1, Ordering::Relaxed) + 1;
        log.push_back((n, line));
    }

    pub(crate) fn hello(&self) -> Result<Hello, TcpError> {
        let mut h = Hello::new(self.cfg.engine.engine_id, self.cfg.namespace.clone())?;
        h.listen = self.listen.map(|a| a.to_string());
        h.authenticated = self.cfg.secret.is_some();
        Ok(h)
    }

    pub(crate) fn secret(&self) -> Option<&[u8]> {
        self.cfg.secret.as_deref()
    }

    /// The link whose dial address is `addr`, if any.
    pub(crate) fn link_at(&self, addr: SocketAddr) -> Option<Arc<Link>> {
        lock(&self.links)
            .values()
            .find(|l| l.addr() == Some(addr))
            .cloned()
    }

    /// The link to `peer`, created if needed.
    pub(crate) fn link(&self, peer: PeerId) -> Arc<Link> {
        lock(&self.links)
            .entry(peer)
            .or_insert_with(|| Arc::new(Link::new(peer)))
            .clone()
    }

    /// One pass of the driver: timers, transmits routed to links, events. Returns the next timer.
    fn step(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut engine = self.station.engine();
        if engine.poll_timeout().is_some_and(|t| t <= now) {
            engine.handle_timeout(now);
        }
        let mut touched: Vec<Arc<Link>> = Vec::new();
        while self.total_queued.load(Ordering::Relaxed) < self.cfg.queue_bytes {
            let Some(t) = engine.poll_transmit(now) else {
                break;
            };
            let link = match touched.iter().find(|l| l.peer == t.peer) {
                Some(l) => l.clone(),
                None => {
                    let l = self.link(t.peer);
                    touched.push(l.clone());
                    l
                }
            };
            if !link.routable() {
                self.counters.unroutable.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // A peer that does not read its acks and nacks (or floods to make them) cannot fill the queue
            // everyone shares: beyond its own share, control frames to it are dropped (the engines' timers
            // recover what matters). Data frames are bounded by the sessions' windows.
            if !matches!(t.body, Body::Payload(_))
                && link.queued_bytes.load(Ordering::Relaxed) >= self.cfg.peer_queue_bytes
            {
                self.counters
                    .control_dropped
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let len = t.wire_len() as u64;
            link.push(t);
            self.total_queued.fetch_add(len, Ordering::Relaxed);
        }
        self.station.drain_events(&mut engine);
        let next = engine.poll_timeout();
        drop(engine);
        for link in &touched {
            link.ready.notify_one();
        }
        next
    }

    /// Dials more lanes where they are needed: a first lane to any peer with queued frames or live
    /// sessions, more (up to the pool's bound) while more than a batch waits; ends the sessions of peers
    /// found unreachable (see [`super::reach`]).
    fn ensure_lanes(self: &Arc<Self>) {
        let links: Vec<Arc<Link>> = lock(&self.links).values().cloned().collect();
        let now = Instant::now();
        for link in links {
            let redial = reach::judge(self, &link, now) == reach::Verdict::Redial;
            let queued = link.queued_bytes.load(Ordering::Relaxed);
            let lanes = link.lane_count();
            let want = (lanes == 0 && (queued > 0 || redial))
                || (queued > self.cfg.batch_bytes as u64 && lanes < self.cfg.max_lanes_per_peer);
            if want && let Some(addr) = link.dial_due(now) {
                tokio::spawn(lane::redial(self.clone(), link, addr));
            }
        }
    }
}

/// A TCP node: an engine, the memory behind its regions, a listener and lanes to its peers.
///
/// Methods come in the engine's kinds: getters ([`TcpNode::stats`], [`TcpNode::local_addr`], ...),
/// commands ([`TcpNode::register_kv_region`], [`TcpNode::connect`], [`TcpNode::submit`], ...) and waits
/// ([`TcpNode::wait`], [`TcpNode::transfer`]). Dropping the node stops its tasks and closes its lanes.
pub struct TcpNode {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TcpNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpNode")
            .field("engine_id", &self.shared.cfg.engine.engine_id)
            .field("listen", &self.shared.listen)
            .finish_non_exhaustive()
    }
}

impl TcpNode {
    /// Starts a node: binds its listener (if any) and spawns its driver on the current tokio runtime.
    pub async fn start(cfg: TcpConfig) -> Result<Self, TcpError> {
        if cfg.max_lanes_per_peer == 0 || cfg.batch_bytes == 0 {
            return Err(TcpError::Config(
                "max_lanes_per_peer and batch_bytes must be at least 1".into(),
            ));
        }
        let listener = match cfg.listen {
            Some(addr) => {
                if !addr.ip().is_loopback()
                    && cfg.secret.is_none()
                    && !cfg.allow_unauthenticated_remote
                {
                    return Err(TcpError::Config(format!(
                        "refusing to listen on {addr} without a shared secret: set a secret, listen on \
                         127.0.0.1, or set allow_unauthenticated_remote"
                    )));
                }
                Some(TcpListener::bind(addr).await?)
            }
            None => None,
        };
        let listen = listener.as_ref().map(TcpListener::local_addr).transpose()?;
        let shared = Arc::new(Shared {
            station: Station::new(cfg.engine.clone()),
            cfg,
            wake: Notify::new(),
            links: Mutex::new(BTreeMap::new()),
            total_queued: AtomicU64::new(0),
            counters: Counters::default(),
            next_lane: AtomicU64::new(1),
            listen,
            log: Mutex::new(VecDeque::new()),
            logged: AtomicU64::new(0),
            segments: Mutex::new(Vec::new()),
            served: Mutex::new(Vec::new()),
            shutdown: watch::Sender::new(false),
        });
        tokio::spawn(drive(shared.clone()));
        if let Some(listener) = listener {
            tokio::spawn(accept::accept_loop(shared.clone(), listener));
        }
        Ok(Self { shared })
    }

    // ---- getters ----

    /// The address the node listens on.
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.listen
    }

    /// This node's engine id; peers know it as `PeerId(engine_id)`.
    #[must_use]
    pub fn engine_id(&self) -> u32 {
        self.shared.cfg.engine.engine_id
    }

    /// The memory behind a registered region.
    pub fn memory(&self, id: RegionId) -> Result<MemoryRegion, TcpError> {
        Ok(self.shared.station.engine().memory(id)?.clone())
    }

    /// Counters of the engine and the lanes.
    #[must_use]
    pub fn stats(&self) -> NodeStats {
        let c = &self.shared.counters;
        NodeStats {
            engine: self.shared.station.engine().stats(),
            lanes_opened: c.lanes_opened.load(Ordering::Relaxed),
            lanes_closed: c.lanes_closed.load(Ordering::Relaxed),
            handshakes_refused: c.handshakes_refused.load(Ordering::Relaxed),
            lanes_closed_for_bad_frames: c.bad_frames.load(Ordering::Relaxed),
            unroutable_frames: c.unroutable.load(Ordering::Relaxed),
            incoming_dropped: self.shared.station.board.incoming_dropped(),
            control_frames_dropped: c.control_dropped.load(Ordering::Relaxed),
            queued_bytes: self.shared.total_queued.load(Ordering::Relaxed),
        }
    }

    /// The address lanes to `peer` are dialed at, if known (for a peer that connected here: the address
    /// its connection came from, with the port its handshake named).
    #[must_use]
    pub fn peer_addr(&self, peer: PeerId) -> Option<SocketAddr> {
        lock(&self.shared.links).get(&peer).and_then(|l| l.addr())
    }

    /// Open lanes to `peer`.
    #[must_use]
    pub fn lanes(&self, peer: PeerId) -> usize {
        lock(&self.shared.links)
            .get(&peer)
            .map_or(0, |l| l.lane_count())
    }

    /// Connection-level refusals and errors, oldest first (the newest 1024).
    #[must_use]
    pub fn log(&self) -> Vec<String> {
        lock(&self.shared.log)
            .iter()
            .map(|(_, l)| l.clone())
            .collect()
    }

    /// The log lines numbered after `seen` (still kept), and the newest line's number: call again with
    /// it to print each line once.
    #[must_use]
    pub fn log_after(&self, seen: u64) -> (Vec<String>, u64) {
        let log = lock(&self.shared.log);
        let lines = log
            .iter()
            .filter(|(n, _)| *n > seen)
            .map(|(_, l)| l.clone())
            .collect();
        (lines, log.back().map_or(seen, |(n, _)| *n))
    }

    /// Every engine event from now on (a subscriber more than [`crate::board::KEEP_EVENTS`] behind is
    /// told how many it missed).
    #[must_use]
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.shared.station.board.subscribe()
    }

    /// Live sessions (both roles).
    #[must_use]
    pub fn live_sessions(&self) -> usize {
        self.shared.station.engine().live_sessions()
    }

    // ---- commands ----

    /// Registers the caller's `memory` as a KV region of `layout`: lanes send from it and receive into it
    /// in place (see [`MemoryRegion`] for who may touch which bytes while transfers run).
    pub fn register_kv_region(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<RegionHandle, TcpError> {
        Ok(self.shared.station.register_kv_region(layout, memory)?)
    }

    /// Registers a KV region of `layout` over zeroed host memory the node allocates.
    pub fn kv_region(&self, layout: KvLayout) -> Result<RegionHandle, TcpError> {
        let len = usize::try_from(layout.total_bytes())
            .map_err(|_| TcpError::Config("the layout does not fit in memory".into()))?;
        self.register_kv_region(layout, MemoryRegion::zeroed(len))
    }

    /// Unregisters a region no live session uses and hands back its memory.
    pub fn unregister_region(&self, id: RegionId) -> Result<MemoryRegion, TcpError> {
        Ok(self.shared.station.engine().unregister_region(id)?)
    }

    /// Offers a region to peers under `name`: it is listed in the handshake's welcome.
    pub fn publish_segment(&self, name: &str, handle: RegionHandle) {
        let mut segs = lock(&self.shared.segments);
        segs.retain(|s| s.name != name);
        segs.push(Segment {
            name: name.into(),
            handle,
        });
    }

    /// Records `peer`'s address so lanes to it are dialed on demand.
    pub fn add_peer(&self, peer: PeerId, addr: SocketAddr) {
        self.shared.link(peer).set_addr(addr);
    }

    /// Dials `addr`, runs the handshake and opens a first lane. With `want`, asks the peer to provide a
    /// region of that layout (offered back as segment `served`).
    pub async fn connect(
        &self,
        addr: SocketAddr,
        want: Option<KvLayout>,
    ) -> Result<PeerInfo, TcpError> {
        lane::dial(&self.shared, addr, None, want).await
    }

    /// Closes every lane to `peer` at once, as a lost connection would. Transfers in flight carry on over
    /// new lanes if the peer's address is known, or end with recompute at their deadline.
    pub fn disconnect(&self, peer: PeerId) {
        if let Some(link) = lock(&self.shared.links).get(&peer) {
            link.abort_all(&self.shared);
        }
    }

    /// Starts a transfer; see [`TcpNode::wait`].
    ///
    /// Fails at once when the peer cannot be reached: no lane and no address to dial, or declared
    /// unreachable after its connections were lost (until a lane to it opens again).
    pub fn submit(&self, req: TransferRequest) -> Result<SessionId, TcpError> {
        let link = self.shared.link(req.peer);
        if let Some(reason) = lock(&link.reach).unreachable.clone() {
            return Err(TcpError::Unreachable(reason));
        }
        if !link.routable() {
            return Err(TcpError::NoRoute(req.peer));
        }
        let id = self.shared.station.submit(req)?;
        self.shared.wake.notify_one();
        Ok(id)
    }

    /// Waits until sending session `session` is over (delivered and acknowledged, or reported for
    /// recompute).
    pub async fn wait(&self, session: SessionId, limit: Duration) -> Result<Outcome, TcpError> {
        let run = self.shared.station.board.wait_sent(session);
        Ok(tokio::time::timeout(limit, run)
            .await
            .map_err(|_| TcpError::Timeout {
                what: format!("session {session}"),
                waited: limit,
            })??)
    }

    /// The next incoming session nobody has accepted yet, waiting for one: who sends it and where it lands.
    pub async fn accept(&self) -> Result<IncomingSession, TcpError> {
        Ok(self.shared.station.board.accept().await?)
    }

    /// Waits until `layer` of receiving session `session` has arrived whole and verified (an error names
    /// the layer's blocks to recompute if the session ended without it).
    pub async fn wait_layer(&self, session: SessionId, layer: u32) -> Result<(), TcpError> {
        Ok(self.shared.station.board.wait_layer(session, layer).await?)
    }

    /// Waits until receiving session `session` is over.
    pub async fn wait_received(&self, session: SessionId) -> Result<Received, TcpError> {
        Ok(self.shared.station.board.wait_received(session).await?)
    }

    /// The consumer is about to compute `layer` of receiving session `session` (layers in order): the
    /// sender may then keep up to its prefetch depth of layers beyond it in flight, and a layer not yet
    /// whole becomes urgent. Returns whether the layer is complete.
    pub fn consume_layer(&self, session: SessionId, layer: u32) -> Result<bool, TcpError> {
        let complete = self.shared.station.consume_layer(session, layer)?;
        self.shared.wake.notify_one();
        Ok(complete)
    }

    /// Submits and waits.
    pub async fn transfer(
        &self,
        req: TransferRequest,
        limit: Duration,
    ) -> Result<Outcome, TcpError> {
        let id = self.submit(req)?;
        self.wait(id, limit).await
    }

    /// Stops the node: its driver, listener and lanes.
    pub fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
        self.shared.station.board.close();
        let links: Vec<Arc<Link>> = lock(&self.shared.links).values().cloned().collect();
        for link in links {
            link.abort_all(&self.shared);
        }
    }
}

impl Drop for TcpNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn drive(shared: Arc<Shared>) {
    let mut stop = shared.shutdown.subscribe();
    loop {
        let next = shared.step();
        shared.ensure_lanes();
        let nap = next.map_or(Duration::from_millis(50), |t| {
            t.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50))
        });
        tokio::select! {
            () = shared.wake.notified() => {}
            () = tokio::time::sleep(nap) => {}
            _ = stop.changed() => return,
        }
    }
}
