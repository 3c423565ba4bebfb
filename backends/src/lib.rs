//! I/O drivers for the KV-cache transfer engine. Each drives the sans-IO [`transfer_engine::Engine`]
//! state machines and moves the bytes they point at.
//!
//! - [`loopback`]: two engines in one process; payload is copied once, straight from the producer's region
//!   into the consumer's.
//! - [`tcp`]: a tokio TCP node per engine: pooled lanes per peer, vectored writes, handshake with version,
//!   identity, KV namespace and optional shared-secret authentication, bounds-checked remote access.
//! - `rdma` (feature `rdma`): libfabric (OFI) nodes: one-sided RDMA writes with remote CQ data into the peer's
//!   registered region, CRC verified in place; runs over `verbs`, `efa`, and here over `tcp` and `shm`.
//! - [`shm`] (Linux): two processes on one host: control frames on a Unix socket, each unit copied once,
//!   straight from the sender's memory into the receiver's region (cross-memory attach), peers checked by
//!   their kernel credentials.
//! - [`discovery`]: where peers and segments live, behind one trait: an embedded in-process registry, and
//!   etcd (feature `etcd`) with leases so a dead peer's entries expire.
//! - `cuda` (feature `cuda`): GPU and pinned host memory as region memory (through `cudarc`, loaded at run
//!   time), a stream copy engine between host and GPU regions, and double-buffered pinned staging for TCP.
//!
//! Every backend registers regions over the caller's own memory ([`transfer_engine::MemoryRegion`]) and
//! offer the same receiving side ([`board`]): take notices of incoming sessions, await them layer by layer
//! while consuming layers (so the producer's prefetch window follows), await them whole, subscribe to events.
//!
//! A prefill instance pushes one request's blocks into a decode instance's KV pool over TCP; the decode
//! side computes each layer as soon as it has arrived:
//!
//! ```
//! use std::time::Duration;
//! use backends::tcp::{TcpConfig, TcpNode};
//! use transfer_engine::{BlockId, Dtype, KvLayout, MemoryRegion, TransferRequest};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Each instance's KV pool: 4 layers x 64 blocks of 64 KiB.
//! let layout = KvLayout::new(4, 64, 64 << 10, 16, Dtype::Bf16)?;
//! let bytes = layout.total_bytes() as usize;
//!
//! // Decode: listens, and registers its own pool in place (no copy in or out of the engine).
//! let decode = TcpNode::start(TcpConfig::with_engine_id(2)).await?;
//! let decode_pool = MemoryRegion::zeroed(bytes);
//! let dst = decode.register_kv_region(layout, decode_pool.clone())?;
//! decode.publish_segment("kv", dst)?;
//!
//! // Prefill: hands over the buffer its KV was computed into, and connects.
//! let mut cfg = TcpConfig::with_engine_id(1);
//! cfg.listen = None; // dials only
//! let prefill = TcpNode::start(cfg).await?;
//! let src = prefill.register_kv_region(layout, MemoryRegion::from_vec(vec![7; bytes]))?;
//! let peer = prefill.connect(decode.local_addr().unwrap(), None).await?;
//! let dst = *peer.segment("kv").unwrap();
//!
//! // One request's blocks as the block tables hand them out: 3, 17, 42 there, 5, 6, 7 here.
//! let req = TransferRequest::blocks(peer.peer, &src, vec![3, 17, 42], &dst, vec![5, 6, 7], 0..4)?
//!     .with_prefetch_depth(2);
//! let session = prefill.submit(req)?;
//!
//! // Decode: take the incoming session's notice, then compute layer by layer as each arrives whole.
//! let incoming = decode.next_incoming().await?;
//! for layer in incoming.layers.clone() {
//!     decode.consume_layer(incoming.session, layer)?; // about to compute it: the window moves on
//!     decode.wait_layer(incoming.session, layer).await?;
//!     let at = layout.block_offset(BlockId::new(layer, 6)) as usize;
//!     assert!(decode_pool.read(at..at + (64 << 10))?.iter().all(|&b| b == 7)); // attention runs here
//! }
//! let sent = prefill.wait(session, Duration::from_secs(10)).await?;
//! assert!(sent.recompute.is_empty());
//! # Ok(())
//! # }
//! ```
// `deny`, not `forbid`: the FFI modules behind features `rdma` (libfabric) and `cuda` (CUDA driver) hold the
// crate's only `unsafe` and allow it there; everything else stays free of it.
#![deny(unsafe_code)]

pub mod board;
mod codec;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod discovery;
mod gpu_support;
mod lock;
pub mod loopback;
pub mod node;
#[cfg(feature = "rdma")]
pub mod rdma;
#[cfg(target_os = "linux")]
pub mod shm;
pub mod staging;
pub mod tcp;
pub mod transport;

pub use board::{IncomingSession, Outcome, Received, WaitError};
pub use gpu_support::{NO_GPU_SUPPORT, check_gpu};
pub use node::Liveness;
pub use transport::{Fault, PeerAddress, PeerInfo, Segment, Transport, TransportError};

/// A fresh engine seed for this process (`fallback` where the system has no randomness): session ids start
/// at a random point drawn from it, so a restarted peer (same engine id) does not reuse the ids its earlier
/// life used with the same node.
pub(crate) fn fresh_seed(fallback: u64) -> u64 {
    let mut seed = [0u8; 8];
    match getrandom::fill(&mut seed) {
        Ok(()) => u64::from_le_bytes(seed),
        Err(_) => fallback,
    }
}
