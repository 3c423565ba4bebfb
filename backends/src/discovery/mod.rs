//! Peer and segment discovery: where engines listen and which regions they offer, behind one trait.
//!
//! - [`Embedded`]: an in-process registry (the default): one machine, no server. Two processes can also
//!   skip a registry altogether: [`Transport::connect`] returns the segments the peer offers.
//! - `Etcd` (feature `etcd`): an etcd cluster; entries live under a prefix and are bound to leases.
//!
//! Every entry is put under a [`Lease`] with a time to live: a peer that stops calling
//! [`Discovery::keep_alive`] (it crashed, or lost its network) has its entries expire.
//!
//! No record carries a secret or an access key (a region's key travels only in the authenticated
//! handshake). With the cluster's shared secret (`Etcd::with_secret`) every record is sealed with a MAC
//! over its key and text, and a record that does not verify is refused (counted and skipped in
//! [`Discovery::peers`]), so whoever can write to etcd without the secret cannot redirect peers.
//!
//! [`announce`] and [`connect`] work for a node of every backend: a peer is registered under its
//! [`PeerAddress`] as text (`IP:PORT`, `rdma:PROVIDER:HEX`, `shm:PATH`), and reached by it through
//! [`Transport::connect`].

mod embedded;
#[cfg(feature = "etcd")]
mod etcd;
mod record;
#[cfg(feature = "etcd")]
mod seal;

use std::future::Future;
use std::time::Duration;

pub use embedded::Embedded;
#[cfg(feature = "etcd")]
pub use etcd::Etcd;
pub use record::{PeerRecord, SegmentRecord};

use crate::transport::{PeerAddress, PeerInfo, Transport, TransportError};

/// A lease: entries put under it expire together when it is not kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lease(pub i64);

/// Errors of a discovery backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// The registry could not be reached or answered with an error.
    #[error("registry unavailable: {0}")]
    Unavailable(String),
    /// The lease does not exist (it expired or was revoked): grant a new one and put the entries again.
    #[error("lease {0:?} is unknown or expired: grant a new lease and register again")]
    UnknownLease(Lease),
    /// A stored record could not be read.
    #[error("malformed registry entry {key}: {reason}")]
    Malformed {
        /// The entry's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// Announcing this node or connecting to a discovered peer failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The peer is not registered (or its entries expired).
    #[error("engine {0} is not registered: is it running, and does it keep its lease alive?")]
    NotFound(u32),
}

/// Where peers listen and which segments they offer. Implemented by [`Embedded`] and `Etcd`.
pub trait Discovery: Send + Sync {
    /// Grants a lease of `ttl`.
    fn grant(&self, ttl: Duration) -> impl Future<Output = Result<Lease, DiscoveryError>> + Send;
    /// Renews a lease for another time to live.
    fn keep_alive(&self, lease: Lease) -> impl Future<Output = Result<(), DiscoveryError>> + Send;
    /// Revokes a lease: its entries disappear now.
    fn revoke(&self, lease: Lease) -> impl Future<Output = Result<(), DiscoveryError>> + Send;
    /// Registers (or replaces) a peer under `lease`.
    fn put_peer(
        &self,
        peer: &PeerRecord,
        lease: Lease,
    ) -> impl Future<Output = Result<(), DiscoveryError>> + Send;
    /// The peer with this engine id, if registered.
    fn peer(
        &self,
        engine_id: u32,
    ) -> impl Future<Output = Result<Option<PeerRecord>, DiscoveryError>> + Send;
    /// Every registered peer, by engine id.
    fn peers(&self) -> impl Future<Output = Result<Vec<PeerRecord>, DiscoveryError>> + Send;
    /// Registers (or replaces) a segment under `lease`.
    fn put_segment(
        &self,
        segment: &SegmentRecord,
        lease: Lease,
    ) -> impl Future<Output = Result<(), DiscoveryError>> + Send;
    /// The segment `name` of engine `owner`, if registered.
    fn segment(
        &self,
        owner: u32,
        name: &str,
    ) -> impl Future<Output = Result<Option<SegmentRecord>, DiscoveryError>> + Send;
}

/// Registers `node` (its address and namespace) under `lease`. A node that only dials (no address) is
/// refused.
pub async fn announce<D: Discovery, T: Transport + ?Sized>(
    discovery: &D,
    node: &T,
    namespace: &transfer_engine::Namespace,
    lease: Lease,
) -> Result<(), DiscoveryError> {
    let addr = node.address().ok_or_else(|| TransportError::Config {
        backend: node.backend(),
        message: "a node without an address (one that only dials) cannot be announced".into(),
    })?;
    discovery
        .put_peer(
            &PeerRecord {
                engine_id: node.engine_id(),
                addr: addr.to_string(),
                namespace: namespace.to_string(),
            },
            lease,
        )
        .await
}

/// Looks up engine `engine_id` and connects `node` to it (a peer of another backend, or on another RDMA
/// provider, is refused with a clear error).
pub async fn connect<D: Discovery, T: Transport + ?Sized>(
    discovery: &D,
    node: &T,
    engine_id: u32,
) -> Result<PeerInfo, DiscoveryError> {
    let rec = discovery
        .peer(engine_id)
        .await?
        .ok_or(DiscoveryError::NotFound(engine_id))?;
    let addr: PeerAddress = rec.addr.parse().map_err(|e| DiscoveryError::Malformed {
        key: format!("peer {engine_id}"),
        reason: format!("{e}"),
    })?;
    Ok(node.connect(&addr).await?)
}
