//! Discovery through an etcd cluster: records under `{prefix}/peers/{engine}` and
//! `{prefix}/segments/{owner}/{name}`, each bound to an etcd lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{Client, GetOptions, PutOptions};

use super::seal::{open, seal};
use super::{Discovery, DiscoveryError, Lease, PeerRecord, SegmentRecord};
use crate::tcp::Secret;

/// An etcd-backed registry. Clones share the connection.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    prefix: String,
    /// The cluster's secret: records are sealed with it and read only when they verify.
    secret: Option<Secret>,
    /// Records refused because they did not verify.
    refused: Arc<AtomicU64>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("prefix", &self.prefix)
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

fn unavailable(e: etcd_client::Error) -> DiscoveryError {
    DiscoveryError::Unavailable(format!("etcd: {e}"))
}

/// An error of a call naming `lease`: "not found" means it expired or was revoked.
fn lease_error(e: etcd_client::Error, lease: Lease) -> DiscoveryError {
    let not_found = match &e {
        etcd_client::Error::GRpcStatus(s) => s.message().contains("not found"),
        other => other.to_string().contains("lease not found"),
    };
    if not_found {
        DiscoveryError::UnknownLease(lease)
    } else {
        unavailable(e)
    }
}

impl Etcd {
    /// Connects to etcd at `endpoints` (for example `http://127.0.0.1:2379`); keys live under `prefix`.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<Self, DiscoveryError> {
        let client = tokio::time::timeout(Duration::from_secs(5), Client::connect(endpoints, None))
            .await
            .map_err(|_| {
                DiscoveryError::Unavailable(format!(
                    "etcd at {endpoints:?} did not answer within 5 s"
                ))
            })?
            .map_err(unavailable)?;
        Ok(Self {
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
            secret: None,
            refused: Arc::default(),
        })
    }

    /// Seals every record this client writes with the cluster's `secret` and reads only records sealed
    /// with it: a record written without it, or altered, is refused as malformed (skipped by
    /// [`Discovery::peers`], and counted in [`Etcd::refused_records`]).
    #[must_use]
    pub fn with_secret(mut self, secret: Secret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// Records refused so far because they were not sealed with this client's secret.
    #[must_use]
    pub fn refused_records(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The text of the record stored under `key`, its seal checked (a refusal is counted).
    fn opened<'a>(&self, key: &str, stored: &'a str) -> Result<&'a str, DiscoveryError> {
        open(key, stored, self.secret.as_ref()).map_err(|reason| {
            self.refused.fetch_add(1, Ordering::Relaxed);
            DiscoveryError::Malformed {
                key: key.into(),
                reason,
            }
        })
    }

    fn peer_key(&self, engine_id: u32) -> String {
        format!("{}/peers/{engine_id:010}", self.prefix)
    }

    fn segment_key(&self, owner: u32, name: &str) -> String {
        format!("{}/segments/{owner:010}/{name}", self.prefix)
    }

    async fn get_one(&self, key: &str) -> Result<Option<String>, DiscoveryError> {
        let resp = self
            .client
            .clone()
            .get(key, None)
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }
}

impl Discovery for Etcd {
    async fn grant(&self, ttl: Duration) -> Result<Lease, DiscoveryError> {
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let resp = self
            .client
            .clone()
            .lease_grant(secs, None)
            .await
            .map_err(unavailable)?;
        Ok(Lease(resp.id()))
    }

    async fn keep_alive(&self, lease: Lease) -> Result<(), DiscoveryError> {
        let (mut keeper, mut stream) = self
            .client
            .clone()
            .lease_keep_alive(lease.0)
            .await
            .map_err(|e| lease_error(e, lease))?;
        keeper
            .keep_alive()
            .await
            .map_err(|e| lease_error(e, lease))?;
        match stream.message().await.map_err(|e| lease_error(e, lease))? {
            Some(resp) if resp.ttl() > 0 => Ok(()),
            _ => Err(DiscoveryError::UnknownLease(lease)),
        }
    }

    async fn revoke(&self, lease: Lease) -> Result<(), DiscoveryError> {
        match self.client.clone().lease_revoke(lease.0).await {
            Ok(_) => Ok(()),
            Err(e) => match lease_error(e, lease) {
                DiscoveryError::UnknownLease(_) => Ok(()),
                other => Err(other),
            },
        }
    }

    async fn put_peer(&self, peer: &PeerRecord, lease: Lease) -> Result<(), DiscoveryError> {
        let opts = PutOptions::new().with_lease(lease.0);
        let key = self.peer_key(peer.engine_id);
        let text = seal(&key, &peer.encode(), self.secret.as_ref());
        match self.client.clone().put(key, text, Some(opts)).await {
            Ok(_) => Ok(()),
            Err(e) => Err(lease_error(e, lease)),
        }
    }

    async fn peer(&self, engine_id: u32) -> Result<Option<PeerRecord>, DiscoveryError> {
        let key = self.peer_key(engine_id);
        self.get_one(&key)
            .await?
            .map(|v| PeerRecord::decode(&key, self.opened(&key, &v)?))
            .transpose()
    }

    async fn peers(&self) -> Result<Vec<PeerRecord>, DiscoveryError> {
        let prefix = format!("{}/peers/", self.prefix);
        let resp = self
            .client
            .clone()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        // A record that does not verify is skipped (and counted): one forged entry must not hide the rest.
        let mut peers = Vec::new();
        for kv in resp.kvs() {
            let (key, value) = (
                String::from_utf8_lossy(kv.key()),
                String::from_utf8_lossy(kv.value()),
            );
            if let Ok(text) = self.opened(&key, &value) {
                peers.push(PeerRecord::decode(&key, text)?);
            }
        }
        Ok(peers)
    }

    async fn put_segment(
        &self,
        segment: &SegmentRecord,
        lease: Lease,
    ) -> Result<(), DiscoveryError> {
        let opts = PutOptions::new().with_lease(lease.0);
        let key = self.segment_key(segment.owner, &segment.name);
        let text = seal(&key, &segment.encode(), self.secret.as_ref());
        match self.client.clone().put(key, text, Some(opts)).await {
            Ok(_) => Ok(()),
            Err(e) => Err(lease_error(e, lease)),
        }
    }

    async fn segment(
        &self,
        owner: u32,
        name: &str,
    ) -> Result<Option<SegmentRecord>, DiscoveryError> {
        let key = self.segment_key(owner, name);
        self.get_one(&key)
            .await?
            .map(|v| SegmentRecord::decode(&key, self.opened(&key, &v)?))
            .transpose()
    }
}
