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

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use transfer_engine::{
    BlockId, Engine, Event, KvLayout, PeerId, RegionHandle, RegionId, Role, SessionId,
    TransferRequest,
};

use super::handshake::{self, Hello, Message, Segment};
use super::lane::{self, Link};
use super::memory::{SharedMemory, SharedRegion};
use super::{TcpConfig, TcpError};

/// Events and log lines kept for the user (oldest dropped first).
const KEEP_EVENTS: usize = 1 << 16;
const KEEP_LOG: usize = 1024;

/// What a finished transfer reports (sender side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The session.
    pub session: SessionId,
    /// Blocks to recompute (source ids); empty when every block was delivered and acknowledged.
    pub recompute: Vec<BlockId>,
    /// The peer's reason, if it refused the session.
    pub refused: Option<String>,
    /// Time from submit until the sender learned the session was over.
    pub elapsed: Duration,
}

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
}

pub(crate) struct Core {
    pub(crate) engine: Engine,
    events: VecDeque<Event>,
    outcomes: BTreeMap<SessionId, Outcome>,
    started: BTreeMap<SessionId, Instant>,
    recompute: BTreeMap<SessionId, Vec<BlockId>>,
    refused: BTreeMap<SessionId, String>,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) lanes_opened: AtomicU64,
    pub(crate) lanes_closed: AtomicU64,
    pub(crate) handshakes_refused: AtomicU64,
    pub(crate) bad_frames: AtomicU64,
    pub(crate) unroutable: AtomicU64,
}

/// State shared by the node handle, the driver and every lane.
pub(crate) struct Shared {
    pub(crate) cfg: TcpConfig,
    pub(crate) core: Mutex<Core>,
    pub(crate) memory: SharedMemory,
    /// Wakes the driver: new input, freed queue space, a lane came or went.
    pub(crate) wake: Notify,
    pub(crate) links: Mutex<BTreeMap<PeerId, Arc<Link>>>,
    pub(crate) total_queued: AtomicU64,
    pub(crate) counters: Counters,
    pub(crate) next_lane: AtomicU64,
    pub(crate) listen: Option<SocketAddr>,
    log: Mutex<VecDeque<String>>,
    segments: Mutex<Vec<Segment>>,
    served: Mutex<Vec<Segment>>,
    done: watch::Sender<u64>,
    pub(crate) shutdown: watch::Sender<bool>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn core(&self) -> MutexGuard<'_, Core> {
        lock(&self.core)
    }

    pub(crate) fn log(&self, line: String) {
        let mut log = lock(&self.log);
        if log.len() >= KEEP_LOG {
            log.pop_front();
        }
        log.push_back(line);
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
        let mut core = self.core();
        if core.engine.poll_timeout().is_some_and(|t| t <= now) {
            core.engine.handle_timeout(now);
        }
        let mut touched: Vec<Arc<Link>> = Vec::new();
        while self.total_queued.load(Ordering::Relaxed) < self.cfg.queue_bytes {
            let Some(t) = core.engine.poll_transmit(now) else {
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
            let len = t.wire_len() as u64;
            link.push(t);
            self.total_queued.fetch_add(len, Ordering::Relaxed);
        }
        let mut finished = false;
        while let Some(event) = core.engine.poll_event() {
            match &event {
                Event::Recompute {
                    session,
                    role: Role::Sender,
                    blocks,
                } => {
                    core.recompute.insert(*session, blocks.clone());
                }
                Event::Refused { session, reason } => {
                    core.refused.insert(*session, reason.clone());
                }
                Event::Completed {
                    session,
                    role: Role::Sender,
                    ..
                } => {
                    let session = *session;
                    let elapsed = core
                        .started
                        .remove(&session)
                        .map_or(Duration::ZERO, |t| t.elapsed());
                    let outcome = Outcome {
                        session,
                        recompute: core.recompute.remove(&session).unwrap_or_default(),
                        refused: core.refused.remove(&session),
                        elapsed,
                    };
                    core.outcomes.insert(session, outcome);
                    finished = true;
                }
                _ => {}
            }
            if core.events.len() >= KEEP_EVENTS {
                core.events.pop_front();
            }
            core.events.push_back(event);
        }
        let next = core.engine.poll_timeout();
        drop(core);
        for link in &touched {
            link.ready.notify_one();
        }
        if finished {
            self.done.send_modify(|n| *n += 1);
        }
        next
    }

    /// Dials more lanes where frames wait: a first lane to any peer with queued frames, more (up to the
    /// pool's bound) while more than a batch waits.
    fn ensure_lanes(self: &Arc<Self>) {
        let links: Vec<Arc<Link>> = lock(&self.links).values().cloned().collect();
        let now = Instant::now();
        for link in links {
            let queued = link.queued_bytes.load(Ordering::Relaxed);
            if queued == 0 {
                continue;
            }
            let lanes = link.lane_count();
            let want = lanes == 0
                || (queued > self.cfg.batch_bytes as u64 && lanes < self.cfg.max_lanes_per_peer);
            if want && let Some(addr) = link.dial_due(now) {
                tokio::spawn(lane::redial(self.clone(), link, addr));
            }
        }
    }

    /// Segments offered to a dialer (allocating one of `want`'s layout if asked and allowed).
    pub(crate) fn offer(&self, want: Option<KvLayout>) -> Result<Vec<Segment>, String> {
        let mut segments = lock(&self.segments).clone();
        if let Some(layout) = want {
            segments.push(self.serve(layout)?);
        }
        Ok(segments)
    }

    fn serve(&self, layout: KvLayout) -> Result<Segment, String> {
        let bytes = layout.total_bytes();
        if bytes > self.cfg.serve_bytes {
            return Err(format!(
                "a region of {bytes} bytes was asked for but this node serves at most {} bytes: \
                 start it with a larger serve size",
                self.cfg.serve_bytes
            ));
        }
        let mut served = lock(&self.served);
        if let Some(s) = served.iter().find(|s| s.handle.layout == Some(layout)) {
            return Ok(s.clone());
        }
        let mut total: u64 = served.iter().map(|s| s.handle.len).sum();
        let mut core = self.core();
        let mut i = 0;
        while total + bytes > self.cfg.serve_bytes && i < served.len() {
            let id = served[i].handle.id;
            if core.engine.unregister_region(id).is_ok() {
                self.memory.free(id);
                total -= served[i].handle.len;
                served.remove(i);
            } else {
                i += 1;
            }
        }
        if total + bytes > self.cfg.serve_bytes {
            return Err(
                "every served region is busy: try again when running transfers finish".into(),
            );
        }
        let handle = core
            .engine
            .register_kv_region(layout)
            .map_err(|e| e.to_string())?;
        self.memory.alloc(&handle).map_err(|e| e.to_string())?;
        let seg = Segment {
            name: "served".into(),
            handle,
        };
        served.push(seg.clone());
        Ok(seg)
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
            core: Mutex::new(Core {
                engine: Engine::new(cfg.engine.clone()),
                events: VecDeque::new(),
                outcomes: BTreeMap::new(),
                started: BTreeMap::new(),
                recompute: BTreeMap::new(),
                refused: BTreeMap::new(),
            }),
            cfg,
            memory: SharedMemory::default(),
            wake: Notify::new(),
            links: Mutex::new(BTreeMap::new()),
            total_queued: AtomicU64::new(0),
            counters: Counters::default(),
            next_lane: AtomicU64::new(1),
            listen,
            log: Mutex::new(VecDeque::new()),
            segments: Mutex::new(Vec::new()),
            served: Mutex::new(Vec::new()),
            done: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
        });
        tokio::spawn(drive(shared.clone()));
        if let Some(listener) = listener {
            tokio::spawn(accept_loop(shared.clone(), listener));
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

    /// The node's regions' bytes.
    #[must_use]
    pub fn memory(&self) -> &SharedMemory {
        &self.shared.memory
    }

    /// A region's bytes.
    pub fn region(&self, id: RegionId) -> Result<Arc<SharedRegion>, TcpError> {
        Ok(self.shared.memory.get(id)?)
    }

    /// Counters of the engine and the lanes.
    #[must_use]
    pub fn stats(&self) -> NodeStats {
        let c = &self.shared.counters;
        NodeStats {
            engine: self.shared.core().engine.stats(),
            lanes_opened: c.lanes_opened.load(Ordering::Relaxed),
            lanes_closed: c.lanes_closed.load(Ordering::Relaxed),
            handshakes_refused: c.handshakes_refused.load(Ordering::Relaxed),
            lanes_closed_for_bad_frames: c.bad_frames.load(Ordering::Relaxed),
            unroutable_frames: c.unroutable.load(Ordering::Relaxed),
        }
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
        lock(&self.shared.log).iter().cloned().collect()
    }

    /// Takes the engine events recorded so far (the newest 65536).
    #[must_use]
    pub fn take_events(&self) -> Vec<Event> {
        self.shared.core().events.drain(..).collect()
    }

    /// Live sessions (both roles).
    #[must_use]
    pub fn live_sessions(&self) -> usize {
        self.shared.core().engine.live_sessions()
    }

    // ---- commands ----

    /// Registers a KV region and allocates its bytes.
    pub fn register_kv_region(&self, layout: KvLayout) -> Result<RegionHandle, TcpError> {
        let handle = self.shared.core().engine.register_kv_region(layout)?;
        self.shared.memory.alloc(&handle)?;
        Ok(handle)
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
    pub fn submit(&self, req: TransferRequest) -> Result<SessionId, TcpError> {
        let now = Instant::now();
        let mut core = self.shared.core();
        let id = core.engine.submit(now, req)?;
        core.started.insert(id, now);
        drop(core);
        self.shared.wake.notify_one();
        Ok(id)
    }

    /// Waits until `session` is over (delivered and acknowledged, or reported for recompute).
    pub async fn wait(&self, session: SessionId, limit: Duration) -> Result<Outcome, TcpError> {
        let mut rx = self.shared.done.subscribe();
        let run = async {
            loop {
                if let Some(o) = self.shared.core().outcomes.remove(&session) {
                    return Ok(o);
                }
                if rx.changed().await.is_err() {
                    return Err(TcpError::Closed);
                }
            }
        };
        tokio::time::timeout(limit, run)
            .await
            .map_err(|_| TcpError::Timeout {
                what: format!("session {session}"),
                waited: limit,
            })?
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

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let mut stop = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, from)) => {
                    tokio::spawn(inbound(shared.clone(), stream, from));
                }
                Err(e) => {
                    shared.log(format!("accept failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = stop.changed() => return,
        }
    }
}

async fn inbound(shared: Arc<Shared>, mut stream: TcpStream, from: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let limit = shared.cfg.handshake_timeout;
    let result = async {
        let hello = shared.hello()?;
        let run = handshake::accept_hello(&mut stream, &hello, shared.secret());
        let peer = tokio::time::timeout(limit, run)
            .await
            .map_err(|_| TcpError::Handshake(format!("no handshake within {limit:?}")))??;
        match shared.offer(peer.want) {
            Ok(segments) => handshake::send(&mut stream, &Message::Welcome(segments)).await?,
            Err(reason) => {
                let _ = handshake::send(&mut stream, &Message::Reject(reason.clone())).await;
                return Err(TcpError::Handshake(reason));
            }
        }
        Ok(peer)
    }
    .await;
    match result {
        Ok(peer) => {
            let link = shared.link(PeerId(u64::from(peer.engine_id)));
            if let Some(addr) = peer.listen.as_deref().and_then(|a| a.parse().ok()) {
                link.set_addr(addr);
            }
            lane::start(&shared, &link, stream, false);
        }
        Err(e) => {
            shared
                .counters
                .handshakes_refused
                .fetch_add(1, Ordering::Relaxed);
            shared.log(format!("refused connection from {from}: {e}"));
        }
    }
}
