//! The scheduler half's use of the cluster index: one round trip says which instances hold a prompt's
//! leading blocks, and only they (with this instance's own store and its default producer) are asked,
//! instead of every peer. Without an answer (Redis down or slow) the lookup asks whom it would without
//! an index.

use std::net::SocketAddr;
use std::sync::Arc;

use cluster::{IndexClient, IndexConfig};

use super::KvScheduler;
use super::lookup::Candidate;
use crate::error::ConnectorError;
use crate::keys::ScopedKey;
use crate::producer::lock;
use crate::request::KvTransferParams;

/// Holders a lookup asks at most, longest prefix first: more rarely hold more, and each costs a round
/// trip in parallel.
const HOLDERS_ASKED: usize = 3;

impl KvScheduler {
    /// Looks prompts up in the cluster index `cfg` names (`cfg.instance`: this instance's own address
    /// there, left out of the answers; empty when it publishes nothing).
    pub fn use_index(&self, cfg: IndexConfig) -> Result<(), ConnectorError> {
        let mut cfg = cfg;
        if cfg.instance.is_empty() {
            cfg.instance = "scheduler".into();
        }
        let client = IndexClient::new(cfg).map_err(|e| ConnectorError::Config(e.to_string()))?;
        *lock(&self.index) = Some(Arc::new(client));
        Ok(())
    }

    /// The index client, if [`KvScheduler::use_index`] set one.
    pub(super) fn index(&self) -> Option<Arc<IndexClient>> {
        lock(&self.index).clone()
    }
}

/// Who a lookup of `keys` asks with the index: `always` (own store, default producer) and the holders
/// the index names; `fallback` (everyone) when the index does not answer.
pub(super) async fn candidates(
    index: &IndexClient,
    keys: &[ScopedKey],
    always: Vec<Candidate>,
    fallback: Vec<Candidate>,
) -> Vec<Candidate> {
    let Some(ns) = keys.first().map(|k| k.ns) else {
        return always;
    };
    let tier_keys: Vec<_> = keys.iter().map(ScopedKey::tier_key).collect();
    let Ok(found) = index.lookup(ns, &tier_keys).await else {
        return fallback;
    };
    let me = index.config().instance.as_str();
    let mut out = always;
    for holder in found.holders.iter().filter(|h| h.instance != me) {
        if out.len() >= HOLDERS_ASKED + 2 {
            break;
        }
        let Ok(addr) = holder.instance.parse::<SocketAddr>() else {
            continue;
        };
        if !out.iter().any(|c| c.addr == addr) {
            out.push(Candidate {
                addr,
                producer: Some(KvTransferParams::single(addr)),
                own: false,
            });
        }
    }
    out
}
