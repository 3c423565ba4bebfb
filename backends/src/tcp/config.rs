//! Settings of a TCP node, grouped by concern: who may connect ([`Security`]), when a lane or peer is given
//! up on ([`Liveness`]), redialing ([`Dialing`]), what a stranger may take ([`StrangerLimits`]), regions
//! served on request ([`Serving`]) and buffers ([`Buffers`]). Each group has its defaults and is
//! `#[non_exhaustive]`: start from [`TcpConfig::with_engine_id`] and set what differs
//! (`cfg.limits.max_lanes = 64`).

use std::net::SocketAddr;
use std::time::Duration;

use transfer_engine::EngineConfig;

use super::{Liveness, Namespace, Secret, SocketBuffers, tcp_engine_config};

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
    /// Who may connect, and how they prove it. See [`Security`].
    pub security: Security,
    /// When an idle, silent or stalled lane or peer is given up on. See [`Liveness`].
    pub liveness: Liveness,
    /// How often a peer is dialed again. See [`Dialing`].
    pub dialing: Dialing,
    /// What any one connection, address or peer may take of the node: lanes, handshakes, control and data budgets, queue share. See [`StrangerLimits`].
    pub limits: StrangerLimits,
    /// Regions the node allocates for peers that ask for one in their handshake. See [`Serving`].
    pub serving: Serving,
    /// Bytes a lane moves at once, queues and stages. See [`Buffers`].
    pub buffers: Buffers,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            engine: tcp_engine_config(1),
            namespace: Namespace::default(),
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            security: Security::default(),
            liveness: Liveness::default(),
            dialing: Dialing::default(),
            limits: StrangerLimits::default(),
            serving: Serving::default(),
            buffers: Buffers::default(),
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

/// Who may connect, and how they prove it. Part of [`TcpConfig`] (`security`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Security {
    /// Shared secret; when set, every lane is authenticated with HMAC-SHA256 in both directions (its
    /// `Debug` never shows the bytes).
    pub secret: Option<Secret>,
    /// Allow listening on a non-loopback address without a secret (off by default).
    pub allow_unauthenticated_remote: bool,
    /// Whether a peer that names a listening port in its handshake may be dialed back (only ever at the
    /// address its connection came from).
    pub dial_back: bool,
}

impl Default for Security {
    fn default() -> Self {
        Self {
            secret: None,
            allow_unauthenticated_remote: false,
            dial_back: true,
        }
    }
}

/// How often a peer is dialed again. Part of [`TcpConfig`] (`dialing`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Dialing {
    /// First redial delay after a failed dial; doubles each failure up to `redial_max`.
    pub redial_base: Duration,
    /// Largest redial delay.
    pub redial_max: Duration,
    /// Most dials to one peer (successful or not) within `dial_window`; beyond, the next waits, so a peer
    /// whose lanes die right after each dial cannot make this node dial it in a loop.
    pub max_dials_per_window: usize,
    /// The window of `max_dials_per_window`.
    pub dial_window: Duration,
}

impl Default for Dialing {
    fn default() -> Self {
        Self {
            redial_base: Duration::from_millis(10),
            redial_max: Duration::from_secs(2),
            max_dials_per_window: 8,
            dial_window: Duration::from_secs(10),
        }
    }
}

/// What any one connection, address or peer may take of the node: lanes, handshakes, control and data budgets, queue share. Part of [`TcpConfig`] (`limits`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StrangerLimits {
    /// Most lanes of this node in all (inbound and outbound), a hard bound taken atomically at admission.
    /// At the bound an inbound lane sheds the idlest lane of the address holding the most, if that holds
    /// at least two more than the newcomer's address; otherwise it is refused with the reason. Lanes this
    /// node dials always get in, and count.
    pub max_lanes: usize,
    /// Most lanes (connections) to one peer.
    pub max_lanes_per_peer: usize,
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
    /// [`StrangerLimits::data_bytes_per_sec_per_address`] it bounds what each engine of an address may take
    /// of that address's share. 0 (the default): unlimited.
    pub data_bytes_per_sec_per_peer: u64,
    /// Frame bytes queued for one peer beyond which control frames to it (acks, nacks, progress) are
    /// dropped: a peer that floods and does not read cannot fill the node's queue for everyone.
    pub peer_queue_bytes: u64,
}

impl Default for StrangerLimits {
    fn default() -> Self {
        Self {
            max_lanes: 256,
            max_lanes_per_peer: 2,
            max_handshakes: 64,
            max_handshakes_per_address: 8,
            max_connections_per_address: 128,
            max_peers_per_address: 64,
            max_pending_refusals: 64,
            control_frames_per_sec: 100_000,
            control_frames_per_sec_per_address: 400_000,
            data_bytes_per_sec_per_address: 0,
            data_bytes_per_sec_per_peer: 0,
            peer_queue_bytes: 8 << 20,
        }
    }
}

/// Regions the node allocates for peers that ask for one in their handshake. Part of [`TcpConfig`] (`serving`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Serving {
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
}

impl Default for Serving {
    fn default() -> Self {
        Self {
            serve_bytes: 0,
            serve_bytes_per_address: None,
            served_region_grace: Duration::from_secs(10),
        }
    }
}

/// Bytes a lane moves at once, queues and stages. Part of [`TcpConfig`] (`buffers`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Buffers {
    /// Most bytes a lane hands the kernel in one vectored write.
    pub batch_bytes: usize,
    /// Frame bytes queued for lanes before the engine is asked for more.
    pub queue_bytes: u64,
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

impl Default for Buffers {
    fn default() -> Self {
        Self {
            batch_bytes: 4 << 20,
            queue_bytes: 16 << 20,
            socket_buffers: SocketBuffers::default(),
            stage_bytes: 4 << 20,
            stage_host_memory: false,
        }
    }
}
