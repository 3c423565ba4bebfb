//! The worker half's KV events ([`crate::ConnectorConfig::kv_events`]): what its store reports, for a
//! serving engine's event stream (vLLM's `get_kv_connector_kv_cache_events`).

use super::KvWorker;
use crate::producer::lock;
use crate::request::BlockSpec;
use crate::store::KvEvent;

impl KvWorker {
    /// The store's KV events since the last call, oldest first: each block that became loadable from
    /// host memory or disk (with its tokens and parent, as its save carried them) or left one. Empty
    /// without [`crate::ConnectorConfig::kv_events`] or a store.
    pub fn take_kv_events(&self) -> Vec<KvEvent> {
        match &self.producer {
            Some(core) => lock(&core.store).take_kv_events(),
            None => Vec::new(),
        }
    }

    /// KV events dropped because they were not taken in time.
    #[must_use]
    pub fn kv_events_dropped(&self) -> u64 {
        self.producer
            .as_ref()
            .map_or(0, |core| lock(&core.store).kv_events_dropped())
    }

    /// Hands the store the origins of this step's saves (their events carry them).
    pub(super) fn describe_saves(&self, saves: &[BlockSpec]) {
        let Some(core) = self.producer.as_ref().filter(|_| self.cfg.kv_events) else {
            return;
        };
        let mut store = lock(&core.store);
        let block = self.cfg.namespace.block_size as usize;
        for s in saves {
            store.describe_saves(&s.keys, &s.engine_hashes, s.parent, &s.tokens, block);
        }
    }

    /// The step is over: origins of saves that did not complete are forgotten.
    pub(super) fn end_described_saves(&self) {
        if let Some(core) = self.producer.as_ref().filter(|_| self.cfg.kv_events) {
            lock(&core.store).end_described_saves();
        }
    }
}
