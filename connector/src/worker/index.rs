//! A saving worker's half of the cluster index: its store announces every change to a publisher that
//! keeps the index (and this instance's lease) true, re-syncing from the store when it must.

use std::sync::{Arc, Weak};

use cluster::{Holdings, IndexClient, IndexConfig, IndexTier, Publisher};
use policy::NamespaceId;
use transfer_engine::policy::BlockKey;

use super::KvWorker;
use crate::error::ConnectorError;
use crate::producer::{ProducerCore, lock};

/// The store of a producer, read whole for a re-sync (weakly: the store owns the publisher).
struct StoreHoldings(Weak<ProducerCore>);

impl Holdings for StoreHoldings {
    fn snapshot(&self) -> Vec<(NamespaceId, BlockKey, IndexTier)> {
        self.0
            .upgrade()
            .map(|core| lock(&core.store).holdings())
            .unwrap_or_default()
    }
}

impl KvWorker {
    /// Publishes what this worker's store holds to the cluster index `cfg` names, from now until the
    /// worker drops (then its lease lapses). `cfg.instance` empty: this worker's control address. Only a
    /// role that saves has a store to publish; with tensor parallelism, rank 0 publishes for the
    /// instance.
    pub fn publish_to_index(&self, mut cfg: IndexConfig) -> Result<(), ConnectorError> {
        let Some(core) = &self.producer else {
            return Err(ConnectorError::Config(format!(
                "a {} keeps no store to publish to the cluster index",
                self.cfg.role.name()
            )));
        };
        if cfg.instance.is_empty() {
            let addr = self.control_addr.ok_or_else(|| {
                ConnectorError::Config("no control address to name this instance by".into())
            })?;
            cfg.instance = addr.to_string();
        }
        let client =
            Arc::new(IndexClient::new(cfg).map_err(|e| ConnectorError::Config(e.to_string()))?);
        *lock(&self.index_stats) = Some(client.stats().clone());
        let namespace = *lock(&core.namespace);
        let holdings = Arc::new(StoreHoldings(Arc::downgrade(core)));
        let _entered = self.rt.enter();
        let publisher = Arc::new(Publisher::start(client, &[namespace], holdings));
        lock(&core.store).announce_to(publisher);
        Ok(())
    }
}
