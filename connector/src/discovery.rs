//! Finding producers through the backends' discovery registry (embedded in-process, or etcd).
//!
//! A producer announces its control address as a peer record under its engine id with
//! [`CONTROL_ID_BIT`] set (the engine's own record, if any, keeps the plain id); a consumer looks it up by
//! the producer's engine id. Records live under a lease: a producer that stops renewing it disappears.

use std::net::SocketAddr;

use backends::discovery::{Discovery, Lease, PeerRecord};

use crate::error::ConnectorError;
use crate::worker::KvWorker;

/// Set in the engine id under which a connector's control address is registered.
pub const CONTROL_ID_BIT: u32 = 1 << 31;

fn registry_error(e: impl std::fmt::Display) -> ConnectorError {
    ConnectorError::Control {
        peer: "discovery".into(),
        message: e.to_string(),
    }
}

impl KvWorker {
    /// Registers this producer worker's control address under `engine_id` (with [`CONTROL_ID_BIT`]) and
    /// `lease`.
    pub async fn announce<D: Discovery>(
        &self,
        discovery: &D,
        engine_id: u32,
        lease: Lease,
    ) -> Result<(), ConnectorError> {
        let addr = self.control_addr().ok_or(ConnectorError::WrongRole {
            call: "announce",
            role: self.role().name(),
        })?;
        let record = PeerRecord {
            engine_id: engine_id | CONTROL_ID_BIT,
            addr: addr.to_string(),
            namespace: format!(
                "kv-connector control, model '{}' weights v{}",
                self.namespace().model,
                self.namespace().weight_version
            ),
        };
        discovery
            .put_peer(&record, lease)
            .await
            .map_err(registry_error)
    }
}

/// The control address the producer with engine id `engine_id` announced.
pub async fn find_producer<D: Discovery>(
    discovery: &D,
    engine_id: u32,
) -> Result<SocketAddr, ConnectorError> {
    let record = discovery
        .peer(engine_id | CONTROL_ID_BIT)
        .await
        .map_err(registry_error)?
        .ok_or_else(|| {
            registry_error(format!(
                "no connector producer with engine id {engine_id} is registered"
            ))
        })?;
    record
        .addr
        .parse()
        .map_err(|_| registry_error(format!("{:?} is not a socket address", record.addr)))
}
