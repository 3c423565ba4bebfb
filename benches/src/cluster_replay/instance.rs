//! One simulated instance of `te-bench cluster`: a real cache of block keys (an LRU, or the policy
//! crate's tier manager) whose changes a real publisher sends to the index.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cache_research::lru::Lru;
use cluster::{Holdings, IndexClient, IndexConfig, IndexEvent, IndexTier, Publisher};
use policy::continuation::BLOCK_TOKENS;
use policy::tier::{TierCapacities, TierConfig, TierManager};
use transfer_engine::NamespaceId;
use transfer_engine::policy::{BlockKey, RequestInfo, TierPolicy};

/// The namespace every replayed block lives in.
pub(crate) const NS: NamespaceId = NamespaceId(0x7e_6c_75_73);

/// Which cache each instance keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum CacheKind {
    /// Least recently used (the reference figures).
    Lru,
    /// The policy crate's tier manager with the conversation-continuation order (the connector's store).
    Tier,
    /// The policy crate's tier manager with its heat order.
    Heat,
}

enum Cache {
    Lru(Lru),
    Tier(Box<TierManager>),
}

/// The blocks an instance holds, as its re-syncs read them.
#[derive(Default)]
struct Held(Mutex<HashSet<BlockKey>>);

impl Holdings for Held {
    fn snapshot(&self) -> Vec<(NamespaceId, BlockKey, IndexTier)> {
        let held = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.iter().map(|&k| (NS, k, IndexTier::Host)).collect()
    }
}

/// An instance: its cache, what it holds, its publisher, and its simulated work.
pub(crate) struct Instance {
    pub(crate) name: String,
    cache: Cache,
    held: Arc<Held>,
    pub(crate) publisher: Publisher,
    pub(crate) client: Arc<IndexClient>,
    /// Simulated seconds at which the work queued so far ends.
    pub(crate) busy_until: f64,
    /// Prompt tokens it computed.
    pub(crate) computed_tokens: u64,
}

impl Instance {
    pub(crate) fn start(
        url: &str,
        prefix: &str,
        name: String,
        kind: CacheKind,
        capacity: usize,
    ) -> anyhow::Result<Instance> {
        let mut cfg = IndexConfig::new(url, name.clone());
        cfg.prefix = prefix.into();
        cfg.timeout = Duration::from_secs(2);
        let client = Arc::new(IndexClient::new(cfg)?);
        let held = Arc::new(Held::default());
        let publisher = Publisher::start(Arc::clone(&client), &[NS], held.clone());
        let cache = match kind {
            CacheKind::Lru => Cache::Lru(Lru::new(capacity)),
            CacheKind::Tier | CacheKind::Heat => {
                let capacities = TierCapacities {
                    gpu: capacity,
                    host: 0,
                    remote: 0,
                };
                let cfg = if kind == CacheKind::Tier {
                    TierConfig::continuation(capacities)
                } else {
                    TierConfig::new(capacities)
                };
                Cache::Tier(Box::new(TierManager::new(cfg)?))
            }
        };
        Ok(Instance {
            name,
            cache,
            held,
            publisher,
            client,
            busy_until: 0.0,
            computed_tokens: 0,
        })
    }

    /// Leading blocks of `keys` it holds (what its own store answers).
    pub(crate) fn prefix(&self, keys: &[BlockKey]) -> usize {
        keys.iter()
            .take_while(|&&k| match &self.cache {
                Cache::Lru(lru) => lru.contains(k),
                Cache::Tier(tm) => tm.tier_of(k).is_some(),
            })
            .count()
    }

    /// Uses `keys` (a request's prefix chain, all stored or touched here), then evicts to capacity and
    /// publishes what changed.
    pub(crate) fn store(
        &mut self,
        keys: &[BlockKey],
        request: u64,
        input_tokens: u64,
        now: Duration,
    ) {
        let mut removed = Vec::new();
        match &mut self.cache {
            Cache::Lru(lru) => {
                for &k in keys {
                    lru.touch(k);
                }
                removed = lru.evict_to_capacity();
            }
            Cache::Tier(tm) => {
                let info = RequestInfo {
                    id: request,
                    ns: NS,
                    keys,
                    partial_last: input_tokens < BLOCK_TOKENS * keys.len() as u64,
                    output_tokens: None,
                };
                for m in tm.on_request(&info, now) {
                    if m.to.is_none() {
                        removed.push(m.key);
                    }
                }
            }
        }
        let mut held = self
            .held
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for &k in keys {
            if self.holds(k) && held.insert(k) {
                self.publisher.send(IndexEvent::Stored {
                    ns: NS,
                    key: k,
                    tier: IndexTier::Host,
                });
            }
        }
        for k in removed {
            if !self.holds(k) && held.remove(&k) {
                self.publisher.send(IndexEvent::Removed { ns: NS, key: k });
            }
        }
    }

    /// Touches `keys` it serves to another instance (a load counts as a use), without storing any.
    pub(crate) fn serve(&mut self, keys: &[BlockKey], request: u64, now: Duration) {
        let mut removed = Vec::new();
        match &mut self.cache {
            Cache::Lru(lru) => {
                for &k in keys {
                    if lru.contains(k) {
                        lru.touch(k);
                    }
                }
            }
            Cache::Tier(tm) => {
                for &k in keys {
                    let moves = tm.access(k, request, now);
                    removed.extend(moves.iter().filter(|m| m.to.is_none()).map(|m| m.key));
                }
            }
        }
        let mut held = self
            .held
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for k in removed {
            if held.remove(&k) {
                self.publisher.send(IndexEvent::Removed { ns: NS, key: k });
            }
        }
    }

    /// Whether it holds `k`.
    pub(crate) fn holds(&self, k: BlockKey) -> bool {
        match &self.cache {
            Cache::Lru(lru) => lru.contains(k),
            Cache::Tier(tm) => tm.tier_of(k).is_some(),
        }
    }
}
