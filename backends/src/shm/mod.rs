//! The same-host backend (`shm`): two processes on one machine, each unit's bytes moved with one copy,
//! straight from the sender's region into the receiver's, by cross-memory attach (`process_vm_readv`).
//!
//! # Data path
//! Nodes reach each other over a Unix domain socket (the listener's path is the node's address); control
//! frames (open, ack, nack, close, ...) travel on it in the engine's wire format. A data unit travels as
//! its 48-byte header and the address of its payload in the sender's memory. The receiver asks its engine
//! where the unit goes and, under the destination shards' write locks, has the kernel copy the bytes from
//! the sender's address space into place (`process_vm_readv`, in chunks of [`ShmConfig::pull_chunk`]),
//! taking the CRC-32C of each chunk while it is still in cache. Meanwhile the sender checksums the same
//! source bytes under their read locks and follows with the sealed header; the receiver compares the two
//! and hands the unit to the engine, whose acknowledgements, retransmits and recompute are those of every
//! other backend. With [`ShmConfig::checksum`] off on both ends, neither pass runs and the header goes
//! sealed with a zero CRC (a torn read is then not noticed: see `docs/PERFORMANCE.md` for what each costs).
//!
//! The receiver copies, not the sender: the destination is written only under the receiver's own locks,
//! so no safe view of its memory races with the copy, and a resend over verified bytes is never placed.
//! The source is read by the kernel on the receiver's behalf, as a `write(2)` would read it; the caller's
//! rule for source blocks (unchanged while a session is live) is the one every backend states, and a
//! change shows as a CRC failure and a resend.
//!
//! # Who may connect
//! The listening socket is made mode 0600 and every connection's peer credentials (`SO_PEERCRED`, given
//! by the kernel, not by the peer) are checked against [`ShmConfig::allowed`] (the same user by default)
//! on both ends. The peer's process id comes from the same credentials, so a peer cannot point the copy
//! at any process but its own. A connection is bound to the engine id its hello names; a second
//! connection claiming an engine id that is connected is refused, so no peer can speak for another's
//! sessions. Cross-memory attach needs ptrace access to the peer (same user, no Yama restriction, or
//! `CAP_SYS_PTRACE`): each end probes it in the handshake and refuses the peer with the reason when the
//! kernel says no. Both ends must serve the same KV namespace ([`ShmConfig::namespace`]); with a
//! [`ShmConfig::secret`] each proves it holds the secret (HMAC-SHA256 both ways over both hellos, each
//! with a fresh nonce, so a recorded handshake does not verify again), as TCP lanes do.
//!
//! # Dead peers
//! A peer that exits or is killed closes its socket: its sessions end at once with recompute, reasons
//! naming the peer, and new sessions to it are refused until [`ShmNode::connect`] reaches it again. A peer
//! that stops reading loses its connection after [`Liveness::stall_timeout`].
//!
//! # Memory a node can be made to hold
//! The caller's regions; per connection a bounded queue of [`ShmConfig::queue_frames`] outgoing frames
//! (headers and references, no payloads), a 64 KiB read buffer and one control payload (4 MiB at most);
//! [`ShmConfig::max_peers`] connections and [`ShmConfig::max_handshakes`] handshakes in progress, each
//! ended after [`Liveness::handshake_timeout`]; the board's bounded retention.
//!
//! # GPU memory (feature `cuda`)
//! GPU regions are shared through CUDA IPC: the allocation holding a registered GPU region is exported
//! (`cuIpcGetMemHandle`) and its handle granted to every linked peer; a receiver opens it and moves each
//! unit with one device copy (GPU to GPU, or GPU to host), and uploads units from host memory into its
//! GPU regions. Device-sourced units are not checksummed. See the `gpu` module.

mod cma;
mod context;
mod copy_path;
mod driver;
#[allow(unsafe_code)]
mod fdpass;
mod gpu;
mod grants;
mod handshake;
mod hello;
#[cfg(test)]
mod hostile_tests;
mod link;
#[allow(unsafe_code)]
mod memfd;
mod node;
mod shared;
mod wire;

use std::path::PathBuf;

use transfer_engine::EngineConfig;

use crate::Liveness;

pub use copy_path::CopyPath;
pub use node::{ShmDriver, ShmNode, ShmStats};

/// Which peers' processes may connect, by the user id the kernel reports for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialRule {
    /// Only processes of this process's own user (the default).
    SameUser,
    /// Processes of these users (root is not implied).
    Users(Vec<u32>),
}

impl CredentialRule {
    /// Whether a peer of user `uid` may connect.
    #[must_use]
    pub fn allows(&self, uid: u32) -> bool {
        match self {
            CredentialRule::SameUser => uid == nix::unistd::getuid().as_raw(),
            CredentialRule::Users(users) => users.contains(&uid),
        }
    }
}

/// Bytes a sender keeps unacknowledged on this backend. The receiver copies every unit itself, in
/// order, so what is in flight is a queue in front of one copy: at the 0.7 GB/s a shared mapping copies
/// at on a slow virtual machine, 64 MiB (the engine's default) waits 96 ms, near the 100 ms retransmit
/// timer, and a unit at its tail was resent for nothing. 16 MiB keeps four 4 MiB blocks queued (the
/// copy never waits for the sender) and waits at most about 24 ms.
pub const SHM_WINDOW_BYTES: u64 = 16 << 20;

/// Engine settings for a same-host node: loopback's timers (nothing is lost between two processes, a
/// frame is late only when a thread was not scheduled), a window of [`SHM_WINDOW_BYTES`], and a fresh
/// seed per process, as over TCP: session ids start at a random point drawn from it, so a restarted
/// peer (same engine id) does not reuse the ids its earlier life used with the same node.
#[must_use]
pub fn shm_engine_config(engine_id: u32) -> EngineConfig {
    let mut cfg = crate::loopback::loopback_engine_config(engine_id);
    cfg.window_bytes = SHM_WINDOW_BYTES;
    cfg.rng_seed = crate::fresh_seed(u64::from(engine_id) ^ u64::from(std::process::id()) << 32);
    cfg
}

/// Settings of one same-host node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ShmConfig {
    /// The engine's settings; `engine.engine_id` is the node's identity in hellos.
    pub engine: EngineConfig,
    /// Where the node listens (a Unix socket path it creates, replacing a stale socket file there);
    /// `None` for a node that only dials.
    pub socket_path: Option<PathBuf>,
    /// Which peers may connect (checked on both ends).
    pub allowed: CredentialRule,
    /// The KV namespace served: a peer serving another is refused in the handshake.
    pub namespace: transfer_engine::Namespace,
    /// A shared secret: with one, each side proves it holds it (HMAC-SHA256 over both hellos and their
    /// fresh nonces, both ways), and a peer without it, or with another, is refused. Both sides must
    /// have one, or neither.
    pub secret: Option<crate::tcp::Secret>,
    /// Take CRC-32C of every unit (default on). Off only when both ends turn it off.
    pub checksum: bool,
    /// Bytes the receiver copies per `process_vm_readv` call, each checksummed while in cache.
    pub pull_chunk: usize,
    /// How units from a peer's granted shared memory are copied in (measured per peer by default).
    pub copy_path: CopyPath,
    /// Frames queued to one peer before more are dropped (the engine resends what is not acknowledged).
    pub queue_frames: usize,
    /// When a peer is given up on: `handshake_timeout` is the longest a handshake may take, and a peer
    /// that takes no bytes for `stall_timeout` loses its connection (a lost link is declared at once).
    pub liveness: Liveness,
    /// Connections at once.
    pub max_peers: usize,
    /// Handshakes in progress at once; more are refused at once.
    pub max_handshakes: usize,
}

impl ShmConfig {
    /// Defaults for engine `engine_id` listening at `socket_path`.
    #[must_use]
    pub fn new(engine_id: u32, socket_path: Option<PathBuf>) -> Self {
        Self {
            engine: shm_engine_config(engine_id),
            socket_path,
            allowed: CredentialRule::SameUser,
            namespace: transfer_engine::Namespace::default(),
            secret: None,
            checksum: true,
            pull_chunk: 256 << 10,
            copy_path: CopyPath::Measure,
            queue_frames: 8192,
            liveness: Liveness::default(),
            max_peers: 256,
            max_handshakes: 16,
        }
    }
}

/// A socket or system call of this backend failed: a peer that is gone is unreachable, anything else is
/// this node's own I/O.
fn io(e: std::io::Error) -> crate::TransportError {
    crate::TransportError::io("shm", &e)
}
