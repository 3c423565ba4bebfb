//! The TCP backend: a tokio driver for the sans-IO engine, one [`TcpNode`] per engine.
//!
//! - Lanes: a bounded pool of TCP connections per peer, opened on demand (up to
//!   [`TcpConfig::max_lanes_per_peer`]), reused across transfers, and closed when idle. A lost lane is
//!   redialed with exponential backoff; what it carried and was not acknowledged is sent again by the
//!   engine's retransmit timer, and blocks that miss the session deadline are reported for recompute.
//! - Writes: each lane's writer takes a batch of frames (up to [`TcpConfig::batch_bytes`]) and hands the
//!   kernel their sealed headers and payloads in one vectored `sendmsg`, the payloads read straight from
//!   the source region. An exclusive-lane unit is a batch of its own.
//! - Sockets: `TCP_NODELAY`, and a small send buffer when the peer is on this host, so the bytes the
//!   kernel queues are still in cache when they are copied out; across hosts the kernel's autotuning
//!   ([`SocketBuffers`]).
//! - Reads: each lane's reader decodes a header, asks the engine where the payload goes and receives it
//!   with `recv` straight into the destination region (no intermediate buffer), reading the next header in
//!   the same syscall; the CRC is taken over the bytes where they landed.
//! - Handshake ([`handshake`]): protocol version, engine identity and KV [`Namespace`], optionally
//!   authenticated by HMAC-SHA256 over fresh challenges with a shared secret. Without a secret a node only
//!   listens on loopback unless told otherwise.
//! - Safety: a peer reaches memory only through registered regions and their keys, bounds-checked by the
//!   engine; a frame that fails to decode or addresses anything else is refused, counted, answered with a
//!   `Reject` naming the reason (on session 0 when the header itself is unreadable), and its lane is
//!   closed. The wire protocol is written down in `docs/PROTOCOL.md`.
//! - Strangers: a peer's lanes are bound to the connection group of its first handshake by a
//!   token; served regions belong to the peer that asked; dial-back goes only to the address a connection
//!   came from; a peer that stalls mid-frame or stops reading loses its lane after
//!   [`TcpConfig::stall_timeout`]; a new connection group claiming an engine id ends the earlier group's
//!   sessions (recompute), so none of its frames reach them; a lane a peer dialed and then left silent,
//!   with no session live, is closed after [`TcpConfig::inbound_idle_timeout`]; one IP address holds at most
//!   [`TcpConfig::max_connections_per_address`] connections and
//!   [`TcpConfig::max_handshakes_per_address`] handshake turns (a turn is held only to check a message
//!   that arrived whole, never while waiting for one), and has at most
//!   [`TcpConfig::max_peers_per_address`] engines connected and
//!   [`TcpConfig::serve_bytes_per_address`] of served regions; every refusal at a node limit is answered
//!   with a `Reject`, at most [`TcpConfig::max_pending_refusals`] at once (beyond, the connection is
//!   closed without one).
//! - Floods: a lane's reader hands the engine at most [`TcpConfig::control_frames_per_sec`] control
//!   frames a second, and the inbound lanes of one IP address together at most
//!   [`TcpConfig::control_frames_per_sec_per_address`] (then stops reading, so TCP holds the sender
//!   back); with [`TcpConfig::data_bytes_per_sec_per_address`] and
//!   [`TcpConfig::data_bytes_per_sec_per_peer`], an address's lanes and a peer's together read at most
//!   that many payload bytes a second; and the engine queues at most
//!   [`transfer_engine::MAX_REPLIES_PER_PEER`] answers to refused frames per peer.
//!
//! # Memory a node can be made to hold
//! Whatever peers send, a node's memory stays within:
//! - the regions the caller registers, plus served regions up to [`TcpConfig::serve_bytes`] (one
//!   address's peers at most [`TcpConfig::serve_bytes_per_address`]);
//! - queued frames up to [`TcpConfig::queue_bytes`] plus one frame (payloads are not copied into the
//!   queue: it holds headers and references; control frames to one peer stop at
//!   [`TcpConfig::peer_queue_bytes`], and a peer's queue is released when it can never be sent);
//! - [`TcpConfig::max_lanes`] lanes, each with a 64 KiB discard buffer and at most one control payload
//!   being read (4 MiB at most, the wire's limit for control frames);
//! - [`TcpConfig::max_handshakes`] handshakes in progress, each with messages of 64 KiB at most, and each
//!   ended after [`TcpConfig::handshake_timeout`];
//! - per peer at most `EngineConfig::max_incoming_per_peer` receiving sessions (and per address at most
//!   [`TcpConfig::max_peers_per_address`] peers with inbound lanes), each holding state in
//!   proportion to its plan (a few bytes per slice; a plan covers at most its region once, since
//!   destination blocks are distinct);
//! - per peer at most [`transfer_engine::MAX_REPLIES_PER_PEER`] queued answers to refused frames;
//! - a link (a few hundred bytes) per peer: those this node's user named, and strangers connected now or
//!   within [`TcpConfig::forget_peer_after`] (then forgotten), so engine ids cycled by strangers do not
//!   accumulate;
//! - the board's bounded retention (65,536 events behind a subscriber, 4,096 finished sessions per role,
//!   4,096 unaccepted incoming sessions) and a log of 1,024 lines.

mod accept;
mod admission;
mod blocking;
mod budget;
mod context;
mod driver;
mod forget;
mod group;
pub mod handshake;
mod lane;
mod lane_state;
mod node;
mod peer_link;
mod reach;
mod reader;
mod reader_budgets;
mod secret;
mod served;
mod served_region;
mod socket;
mod socket_io;
mod stage;
mod staged_io;
mod state;

use std::net::SocketAddr;
use std::time::Duration;

use transfer_engine::{EngineConfig, PeerId};

mod writer;

pub use crate::board::{IncomingSession, Outcome, Received, WaitError};
pub use blocking::BlockingNode;
pub use handshake::Segment;
pub use node::{NodeStats, TcpDriver, TcpNode};
pub use secret::Secret;
pub use socket::SocketBuffers;
pub use state::PeerInfo;
pub use transfer_engine::Namespace;

/// Settings of one TCP node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TcpConfig {
    /// The engine's settings; `engine.engine_id` is the node's identity on the wire.
    pub engine: EngineConfig,
    /// The KV namespace this node serves; peers must match it exactly.
    pub namespace: Namespace,
    /// Address to listen on (`127.0.0.1:0` picks a free port); `None` for a node that only dials.
    pub listen: Option<SocketAddr>,
    /// Shared secret; when set, every lane is authenticated with HMAC-SHA256 in both directions (its
    /// `Debug` never shows the bytes).
    pub secret: Option<Secret>,
    /// Allow listening on a non-loopback address without a secret (off by default).
    pub allow_unauthenticated_remote: bool,
    /// Most lanes (connections) to one peer.
    pub max_lanes_per_peer: usize,
    /// A lane this node dialed, with nothing to write and nothing received for this long, is closed.
    pub idle_timeout: Duration,
    /// A lane a peer dialed, with nothing to write, nothing received for this long and no session with
    /// that peer, is closed (`None`: never), so a peer that connects and then says nothing does not hold
    /// a lane forever. Longer than `idle_timeout` by default: an honest dialer closes its idle lanes first.
    pub inbound_idle_timeout: Option<Duration>,
    /// A peer that connected here (one this node's user never dialed, added or sent a transfer to), with
    /// no lane, nothing queued and no session for this long (and at least `served_region_grace`), is
    /// forgotten with any region served to it, so strangers cycling through engine ids cannot grow the
    /// node's memory without bound. When it connects again it is a new connection group.
    pub forget_peer_after: Duration,
    /// First redial delay after a failed dial; doubles each failure up to `redial_max`.
    pub redial_base: Duration,
    /// Most dials to one peer (successful or not) within `dial_window`; beyond, the next waits, so a peer
    /// whose lanes die right after each dial cannot make this node dial it in a loop.
    pub max_dials_per_window: usize,
    /// The window of `max_dials_per_window`.
    pub dial_window: Duration,
    /// Largest redial delay.
    pub redial_max: Duration,
    /// How long a peer with live sessions may have no lane, with redialing refused (or impossible), before
    /// its sessions end with recompute and new transfers to it are refused.
    pub unreachable_after: Duration,
    /// How long new transfers to a peer declared unreachable fail at once. Nothing redials it meanwhile
    /// (a lane it opens to this node clears the verdict); the first transfer after this dials it again and
    /// is judged afresh by `unreachable_after`.
    pub unreachable_hold: Duration,
    /// Time allowed for connecting and the handshake.
    pub handshake_timeout: Duration,
    /// Most bytes a lane hands the kernel in one vectored write.
    pub batch_bytes: usize,
    /// Frame bytes queued for lanes before the engine is asked for more.
    pub queue_bytes: u64,
    /// Bytes of regions this node will allocate for peers that ask for one in the handshake (0: none).
    pub serve_bytes: u64,
    /// Most of `serve_bytes` the peers of one IP address may hold (`None`: all of it). With clients on
    /// several hosts, a share keeps one host (or a stranger asking under many engine ids) from taking
    /// every region.
    pub serve_bytes_per_address: Option<u64>,
    /// A served region whose peer has lost its lanes stays its peer's, not freed for another asker, for
    /// this long after its last lane closed, so a client that reconnects finds it (a new connection
    /// group of the same engine id frees it at once).
    pub served_region_grace: Duration,
    /// A peer that starts a frame and then sends nothing for this long, or does not read what this node
    /// writes for this long, loses its lane.
    pub stall_timeout: Duration,
    /// Frame bytes queued for one peer beyond which control frames to it (acks, nacks, progress) are
    /// dropped: a peer that floods and does not read cannot fill the node's queue for everyone.
    pub peer_queue_bytes: u64,
    /// Control frames (everything but Data) one lane's reader hands the engine per second, in bursts of
    /// up to a tenth of that; beyond it the reader waits, so the lane's sender is held back by TCP and a
    /// peer flooding control frames costs the engine a bounded share of its time, not everyone's
    /// transfers. 0: unlimited. An honest lane sends far fewer (acknowledgements cover many slices).
    pub control_frames_per_sec: u64,
    /// Control frames the inbound lanes of one IP address together hand the engine per second, on top
    /// of each lane's own budget, so a peer opening many lanes cannot multiply its flood. 0: unlimited.
    pub control_frames_per_sec_per_address: u64,
    /// Payload bytes of Data frames the inbound lanes of one IP address together hand the engine per
    /// second, in bursts of a tenth of that (at least 1 MiB); beyond it their readers wait, so TCP holds
    /// the sender back and the address holds that share of the node's receiving, whatever its peers
    /// send. 0 (the default): unlimited, each lane reads as fast as it can. On a node that receives from
    /// addresses it does not trust, set it to the share of the NIC one address may take.
    pub data_bytes_per_sec_per_address: u64,
    /// Payload bytes of Data frames the lanes of one peer (one engine id, inbound and outbound lanes
    /// together) hand the engine per second, in the same bursts; beyond it their readers wait. With
    /// [`TcpConfig::data_bytes_per_sec_per_address`] it bounds what each engine of an address may take
    /// of that address's share. 0 (the default): unlimited.
    pub data_bytes_per_sec_per_peer: u64,
    /// Most lanes of this node in all (inbound and outbound); a connection beyond it is closed at once.
    pub max_lanes: usize,
    /// Most handshake checks in progress at once; more connections wait for a turn (within the
    /// handshake time limit). A connection holds a turn only to check a handshake message that has
    /// arrived whole and answer it, never while it waits for the peer's next one, so connections that
    /// send nothing, part of a message, or a Hello and no Auth hold none.
    pub max_handshakes: usize,
    /// Most of those turns one IP address may hold at once; its other connections wait (within the
    /// handshake time limit), so one address cannot hold every turn.
    pub max_handshakes_per_address: usize,
    /// Most inbound connections (handshakes and lanes together) one IP address may hold; beyond it a
    /// connection is refused with a Reject naming the reason. Keeps one address from taking every lane.
    pub max_connections_per_address: usize,
    /// Most engines (connection groups) one IP address may have connected here at once; a lane of
    /// another is refused with a Reject naming the reason. With `EngineConfig::max_incoming_per_peer`
    /// it bounds the sessions one address can hold open here.
    pub max_peers_per_address: usize,
    /// Most refused connections being told why at once (each is answered with a Reject within about a
    /// second); beyond it a refused connection is closed at once without a reason, and counted in
    /// `NodeStats::refusals_unanswered`. Keeps a connect flood from holding a task and a socket per
    /// refusal.
    pub max_pending_refusals: usize,
    /// Whether a peer that names a listening port in its handshake may be dialed back (only ever at the
    /// address its connection came from).
    pub dial_back: bool,
    /// Kernel socket buffers of lanes: small send buffers between nodes on one host, the kernel's
    /// autotuning across hosts (see [`SocketBuffers`]).
    pub socket_buffers: SocketBuffers,
    /// Bytes of each of a lane's two staging buffers, through which GPU regions are sent and received
    /// (feature `cuda`: pinned buffers). A frame larger than this is staged a buffer at a time.
    pub stage_bytes: usize,
    /// Stage host regions too, through host buffers, as GPU regions are through pinned ones: the staged
    /// path then runs (and can be measured) without a GPU. Off by default: host regions are sent from and
    /// received into in place.
    pub stage_host_memory: bool,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            engine: tcp_engine_config(1),
            namespace: Namespace::default(),
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            secret: None,
            allow_unauthenticated_remote: false,
            max_lanes_per_peer: 2,
            idle_timeout: Duration::from_secs(30),
            inbound_idle_timeout: Some(Duration::from_secs(120)),
            forget_peer_after: Duration::from_secs(60),
            redial_base: Duration::from_millis(10),
            redial_max: Duration::from_secs(2),
            max_dials_per_window: 8,
            dial_window: Duration::from_secs(10),
            unreachable_after: Duration::from_secs(1),
            unreachable_hold: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            batch_bytes: 4 << 20,
            queue_bytes: 16 << 20,
            serve_bytes: 0,
            serve_bytes_per_address: None,
            served_region_grace: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(10),
            peer_queue_bytes: 8 << 20,
            control_frames_per_sec: 100_000,
            control_frames_per_sec_per_address: 400_000,
            data_bytes_per_sec_per_address: 0,
            data_bytes_per_sec_per_peer: 0,
            dial_back: true,
            max_lanes: 256,
            max_handshakes: 64,
            max_handshakes_per_address: 8,
            max_connections_per_address: 128,
            max_peers_per_address: 64,
            max_pending_refusals: 64,
            socket_buffers: SocketBuffers::default(),
            stage_bytes: 4 << 20,
            stage_host_memory: false,
        }
    }
}

impl TcpConfig {
    /// Default settings for engine `engine_id` (other engine settings default).
    #[must_use]
    pub fn with_engine_id(engine_id: u32) -> Self {
        Self {
            engine: tcp_engine_config(engine_id),
            ..Self::default()
        }
    }
}

/// Most payload bytes in one coalesced data frame on a TCP lane: 512 KiB, the size the writer takes each
/// group's CRC over before the kernel copies it. On the 2-core development VM, 4 MiB blocks in 64 KiB slices
/// moved 5.9-7.9 GB/s one slice a frame and 8.0-9.3 coalesced (4 alternating pairs); 256 KiB, 1 MiB and
/// 2 MiB did about as well as 512 KiB (docs/PERFORMANCE.md, "TCP beside a steady socket limit").
pub const TCP_COALESCE_BYTES: u32 = writer::FOLD_BYTES as u32;

/// Engine settings suited to TCP: TCP itself never loses a byte on a live connection, so the engine only
/// needs to resend after a lane is lost. Its retransmit floor starts at 100 ms (the measured round trip
/// takes over once acks arrive, but includes the frames queued ahead in lanes and socket buffers, which a
/// 5 ms floor mistakes for loss before the first sample). Slices sent for the first time travel coalesced,
/// up to [`TCP_COALESCE_BYTES`] a frame: on a stream each frame costs the sender, the receiver and both
/// kernels work of its own, and slices matter only as the unit of resending and progress, which coalescing
/// keeps.
#[must_use]
pub fn tcp_engine_config(engine_id: u32) -> EngineConfig {
    let mut cfg = EngineConfig::default();
    cfg.engine_id = engine_id;
    cfg.rng_seed = crate::fresh_seed(u64::from(engine_id));
    cfg.backoff =
        transfer_engine::Backoff::new(Duration::from_millis(100), Duration::from_secs(2), 0.25);
    cfg.coalesce_bytes = TCP_COALESCE_BYTES;
    cfg
}

/// Errors of the TCP backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpError {
    /// A socket operation failed.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    /// The engine refused a command.
    #[error(transparent)]
    Engine(#[from] transfer_engine::Error),
    /// A wait on the receiving or sending side ended without its answer.
    #[error(transparent)]
    Wait(#[from] crate::board::WaitError),
    /// The handshake failed; the reason says which side must change what.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// The configuration is not usable.
    #[error("invalid TCP configuration: {0}")]
    Config(String),
    /// The peer was declared unreachable (its connections lost and redialing refused); the reason says
    /// for how long and why. Transfers to it are refused until a lane to it opens again.
    #[error("{0}")]
    Unreachable(String),
    /// No lane to the peer and no address to dial it.
    #[error("no route to peer {0:?}: connect to it first or add its address")]
    NoRoute(PeerId),
    /// A wait ran out of time.
    #[error("{what} did not finish within {waited:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// The node is shut down.
    #[error("the node is shut down")]
    Closed,
}
