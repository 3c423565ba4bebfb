//! A recency list of block keys (least to most recently pushed), the building block of the LRU-based
//! baselines: O(log n) push, remove and pop at either end, deterministic order.

use std::collections::{BTreeMap, HashMap};

use transfer_engine::policy::BlockKey;

/// Keys ordered by when they were last pushed.
#[derive(Debug, Clone, Default)]
pub struct RecencyList {
    stamp: u64,
    stamps: HashMap<BlockKey, u64>,
    order: BTreeMap<u64, BlockKey>,
}

impl RecencyList {
    /// An empty list.
    #[must_use]
    pub fn new() -> RecencyList {
        RecencyList::default()
    }

    /// Whether `key` is in the list.
    #[must_use]
    pub fn contains(&self, key: BlockKey) -> bool {
        self.stamps.contains_key(&key)
    }

    /// Keys in the list.
    #[must_use]
    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    /// Whether the list is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }

    /// Makes `key` the most recent (inserting it if absent).
    pub fn push(&mut self, key: BlockKey) {
        self.stamp += 1;
        if let Some(old) = self.stamps.insert(key, self.stamp) {
            self.order.remove(&old);
        }
        self.order.insert(self.stamp, key);
    }

    /// Removes `key`; returns whether it was there.
    pub fn remove(&mut self, key: BlockKey) -> bool {
        match self.stamps.remove(&key) {
            Some(s) => {
                self.order.remove(&s);
                true
            }
            None => false,
        }
    }

    /// The least recent key, if any.
    #[must_use]
    pub fn oldest(&self) -> Option<BlockKey> {
        self.order.first_key_value().map(|(_, k)| *k)
    }

    /// Removes and returns the least recent key.
    pub fn pop_oldest(&mut self) -> Option<BlockKey> {
        let (_, key) = self.order.pop_first()?;
        self.stamps.remove(&key);
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_reorder_and_pops_come_oldest_first() {
        let mut l = RecencyList::new();
        for k in [1, 2, 3] {
            l.push(BlockKey(k));
        }
        l.push(BlockKey(1));
        assert!(l.remove(BlockKey(3)));
        assert!(!l.remove(BlockKey(3)));
        assert_eq!(l.oldest(), Some(BlockKey(2)));
        assert_eq!(l.pop_oldest(), Some(BlockKey(2)));
        assert_eq!(l.pop_oldest(), Some(BlockKey(1)));
        assert!(l.is_empty() && l.pop_oldest().is_none());
    }
}
