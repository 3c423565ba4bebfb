//! The TCP backend: a tokio driver for the sans-IO engine, one [`TcpNode`] per engine.
//!
//! - Lanes: a bounded pool of TCP connections per peer, opened on demand (up to
//!   [`StrangerLimits::max_lanes_per_peer`](crate::tcp::StrangerLimits::max_lanes_per_peer)), reused across transfers, and closed when idle. A lost lane is
//!   redialed with exponential backoff; what it carried and was not acknowledged is sent again by the
//!   engine's retransmit timer, and blocks that miss the session deadline are reported for recompute.
//! - Writes: each lane's writer takes a batch of frames (up to [`Buffers::batch_bytes`](crate::tcp::Buffers::batch_bytes)) and hands the
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
//!   [`Liveness::stall_timeout`](crate::tcp::Liveness::stall_timeout); a new connection group claiming an engine id ends the earlier group's
//!   sessions (recompute), so none of its frames reach them; a lane a peer dialed and then left silent,
//!   with no session live, is closed after [`Liveness::inbound_idle_timeout`](crate::tcp::Liveness::inbound_idle_timeout); one IP address holds at most
//!   [`StrangerLimits::max_connections_per_address`](crate::tcp::StrangerLimits::max_connections_per_address) connections and
//!   [`StrangerLimits::max_handshakes_per_address`](crate::tcp::StrangerLimits::max_handshakes_per_address) handshake turns (a turn is held only to check a message
//!   that arrived whole, never while waiting for one), and has at most
//!   [`StrangerLimits::max_peers_per_address`](crate::tcp::StrangerLimits::max_peers_per_address) engines connected and
//!   [`Serving::serve_bytes_per_address`](crate::tcp::Serving::serve_bytes_per_address) of served regions; every refusal at a node limit is answered
//!   with a `Reject`, at most [`StrangerLimits::max_pending_refusals`](crate::tcp::StrangerLimits::max_pending_refusals) at once (beyond, the connection is
//!   closed without one).
//! - Floods: a lane's reader hands the engine at most [`StrangerLimits::control_frames_per_sec`](crate::tcp::StrangerLimits::control_frames_per_sec) control
//!   frames a second, and the inbound lanes of one IP address together at most
//!   [`StrangerLimits::control_frames_per_sec_per_address`](crate::tcp::StrangerLimits::control_frames_per_sec_per_address) (then stops reading, so TCP holds the sender
//!   back); with [`StrangerLimits::data_bytes_per_sec_per_address`](crate::tcp::StrangerLimits::data_bytes_per_sec_per_address) and
//!   [`StrangerLimits::data_bytes_per_sec_per_peer`](crate::tcp::StrangerLimits::data_bytes_per_sec_per_peer), an address's lanes and a peer's together read at most
//!   that many payload bytes a second; and the engine queues at most
//!   [`transfer_engine::MAX_REPLIES_PER_PEER`] answers to refused frames per peer.
//!
//! # Memory a node can be made to hold
//! Whatever peers send, a node's memory stays within:
//! - the regions the caller registers, plus served regions up to [`Serving::serve_bytes`](crate::tcp::Serving::serve_bytes) (one
//!   address's peers at most [`Serving::serve_bytes_per_address`](crate::tcp::Serving::serve_bytes_per_address));
//! - queued frames up to [`Buffers::queue_bytes`](crate::tcp::Buffers::queue_bytes) plus one frame (payloads are not copied into the
//!   queue: it holds headers and references; control frames to one peer stop at
//!   [`StrangerLimits::peer_queue_bytes`](crate::tcp::StrangerLimits::peer_queue_bytes), and a peer's queue is released when it can never be sent);
//! - [`StrangerLimits::max_lanes`](crate::tcp::StrangerLimits::max_lanes) lanes, each with a 64 KiB discard buffer and at most one control payload
//!   being read (4 MiB at most, the wire's limit for control frames);
//! - [`StrangerLimits::max_handshakes`](crate::tcp::StrangerLimits::max_handshakes) handshakes in progress, each with messages of 64 KiB at most, and each
//!   ended after [`Liveness::handshake_timeout`](crate::tcp::Liveness::handshake_timeout);
//! - per peer at most `EngineConfig::max_incoming_per_peer` receiving sessions (and per address at most
//!   [`StrangerLimits::max_peers_per_address`](crate::tcp::StrangerLimits::max_peers_per_address) peers with inbound lanes), each holding state in
//!   proportion to its plan (a few bytes per slice; a plan covers at most its region once, since
//!   destination blocks are distinct);
//! - per peer at most [`transfer_engine::MAX_REPLIES_PER_PEER`] queued answers to refused frames;
//! - a link (a few hundred bytes) per peer: those this node's user named, and strangers connected now or
//!   within [`Liveness::forget_peer_after`](crate::tcp::Liveness::forget_peer_after) (then forgotten), so engine ids cycled by strangers do not
//!   accumulate;
//! - the board's bounded retention (65,536 events behind a subscriber, 4,096 finished sessions per role,
//!   4,096 unaccepted incoming sessions) and a log of 1,024 lines.

mod accept;
mod admission;
mod blocking;
mod budget;
mod config;
mod context;
mod driver;
mod forget;
mod group;
pub mod handshake;
mod lane;
mod lane_shares;
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

use std::time::Duration;

use transfer_engine::EngineConfig;

mod writer;

pub use crate::board::{IncomingSession, Outcome, Received, WaitError};
pub use crate::node::Liveness;
pub use blocking::BlockingNode;
pub use config::{Buffers, Dialing, Security, Serving, StrangerLimits, TcpConfig};
pub use handshake::Segment;
pub use node::{NodeStats, TcpDriver, TcpNode};
pub use secret::Secret;
pub use socket::SocketBuffers;
pub use state::PeerInfo;
pub use transfer_engine::Namespace;

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
