//! Least-recently-used eviction: the incumbent baseline.

use std::time::Duration;

use transfer_engine::NamespaceId;
use transfer_engine::policy::{BlockKey, Tier, TierMove, TierPolicy};

use crate::cache::BlockCache;
use policy::recency::RecencyList;

/// A single-tier LRU cache of block keys.
#[derive(Debug, Clone, Default)]
pub struct Lru {
    capacity: usize,
    list: RecencyList,
}

impl Lru {
    /// An empty cache holding up to `capacity` blocks.
    #[must_use]
    pub fn new(capacity: usize) -> Lru {
        Lru {
            capacity,
            list: RecencyList::new(),
        }
    }

    /// Whether `key` is cached.
    #[must_use]
    pub fn contains(&self, key: BlockKey) -> bool {
        self.list.contains(key)
    }

    /// Blocks cached.
    #[must_use]
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether nothing is cached.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Inserts `key` or makes it the most recently used; does not evict.
    pub fn touch(&mut self, key: BlockKey) {
        self.list.push(key);
    }

    /// Evicts least recently used blocks until at most `capacity` remain; returns them, oldest first.
    pub fn evict_to_capacity(&mut self) -> Vec<BlockKey> {
        let mut evicted = Vec::new();
        while self.list.len() > self.capacity {
            let Some(key) = self.list.pop_oldest() else {
                break;
            };
            evicted.push(key);
        }
        evicted
    }

    fn drops(&mut self) -> Vec<TierMove> {
        let evicted = self.evict_to_capacity();
        evicted
            .into_iter()
            .map(|key| TierMove {
                key,
                from: Tier::Gpu,
                to: None,
            })
            .collect()
    }
}

impl BlockCache for Lru {
    fn contains(&self, key: BlockKey) -> bool {
        Lru::contains(self, key)
    }

    fn touch(&mut self, key: BlockKey) {
        Lru::touch(self, key);
    }

    fn evict_to_capacity(&mut self) -> usize {
        Lru::evict_to_capacity(self).len()
    }

    fn len(&self) -> usize {
        Lru::len(self)
    }
}

impl TierPolicy for Lru {
    fn on_insert(
        &mut self,
        _: NamespaceId,
        key: BlockKey,
        _: Option<BlockKey>,
        _: u64,
        _: Duration,
    ) -> Vec<TierMove> {
        self.touch(key);
        self.drops()
    }

    fn on_access(&mut self, key: BlockKey, _: u64, _: Duration) -> Vec<TierMove> {
        if self.contains(key) {
            self.touch(key);
        }
        Vec::new()
    }

    fn tier_of(&self, key: BlockKey) -> Option<Tier> {
        self.contains(key).then_some(Tier::Gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut lru = Lru::new(2);
        for k in [1, 2, 3] {
            lru.touch(BlockKey(k));
        }
        lru.touch(BlockKey(1)); // 2 is now the oldest
        assert_eq!(lru.evict_to_capacity(), vec![BlockKey(2)]);
        assert!(lru.contains(BlockKey(1)) && lru.contains(BlockKey(3)));
        assert_eq!(lru.len(), 2);
    }

    #[test]
    fn trait_keeps_capacity() {
        let mut lru = Lru::new(1);
        assert!(
            lru.on_insert(NamespaceId::DEFAULT, BlockKey(1), None, 0, Duration::ZERO)
                .is_empty()
        );
        let moves = lru.on_insert(NamespaceId::DEFAULT, BlockKey(2), None, 0, Duration::ZERO);
        assert_eq!(
            moves,
            vec![TierMove {
                key: BlockKey(1),
                from: Tier::Gpu,
                to: None
            }]
        );
        assert_eq!(lru.tier_of(BlockKey(2)), Some(Tier::Gpu));
        assert_eq!(lru.tier_of(BlockKey(1)), None);
    }
}
