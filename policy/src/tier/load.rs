//! Loads: the blocks of one request brought to the nearest tier together.

use std::time::Duration;

use transfer_engine::policy::{BlockKey, TierMove};

use super::TierManager;

impl TierManager {
    /// Records a use of each of `keys` by `request` (one load: a prompt's blocks, in order) and promotes
    /// them all, then settles once; while another block of a tier can make room, none of `keys` is the
    /// victim of the settling their own promotions cause. Accessed one at a time instead, a prompt coming
    /// back from a farther tier into a full one can push its own first blocks out again. Keys not
    /// resident are ignored. With [`super::NearestOrder::Continuation`] the nearest tier's victims still
    /// come from its continuation order.
    pub fn access_together(
        &mut self,
        keys: &[BlockKey],
        request: u64,
        now: Duration,
    ) -> Vec<TierMove> {
        let mut moves = Vec::new();
        for &key in keys {
            self.access_unsettled(key, request, now, &mut moves);
        }
        for &key in keys {
            self.set_spared(key, true);
        }
        self.spared = keys.iter().copied().collect();
        self.settle(&mut moves);
        for key in std::mem::take(&mut self.spared) {
            self.set_spared(key, false);
        }
        moves
    }

    /// When tier `t` has nothing left to give but spared blocks: they are victims there like any (the
    /// coldest first; one moved to a farther tier is spared there again); returns the tier's victim.
    pub(super) fn unspare(&mut self, t: usize) -> Option<BlockKey> {
        let in_tier: Vec<BlockKey> = self
            .spared
            .iter()
            .copied()
            .filter(|k| self.blocks.get(k).is_some_and(|b| b.tier == t && b.spared))
            .collect();
        if in_tier.is_empty() {
            return None;
        }
        for key in in_tier {
            self.set_spared(key, false);
        }
        self.victim(t).or_else(|| self.held_victim(t))
    }

    pub(super) fn set_spared(&mut self, key: BlockKey, spared: bool) {
        if let Some(b) = self.blocks.get_mut(&key) {
            b.spared = spared;
            self.refresh(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use transfer_engine::policy::{BlockKey, Tier, TierPolicy};

    use crate::namespace::NamespaceId;
    use crate::tier::{TierCapacities, TierConfig, TierManager};

    const NS: NamespaceId = NamespaceId::DEFAULT;

    /// Host slots and a disk below, as a producer's tier store has them.
    fn host_and_disk(host: usize) -> TierManager {
        TierManager::new(TierConfig::new(TierCapacities {
            gpu: 0,
            host,
            remote: 64,
        }))
        .unwrap()
    }

    fn chain(m: &mut TierManager, keys: std::ops::Range<u64>, request: u64, secs: u64) {
        let mut parent = None;
        for k in keys {
            m.insert(NS, BlockKey(k), parent, request, Duration::from_secs(secs));
            parent = Some(BlockKey(k));
        }
    }

    #[test]
    fn a_prompt_comes_back_whole_past_hotter_blocks() {
        for segments in [true, false] {
            let mut m = host_and_disk(4);
            let mut cfg = *m.config();
            cfg.adaptive_segments = segments;
            m = TierManager::new(cfg).unwrap();
            chain(&mut m, 0..3, 1, 0);
            chain(&mut m, 3..6, 2, 1);
            chain(&mut m, 6..9, 3, 2);
            let c: Vec<BlockKey> = (6..9).map(BlockKey).collect();
            m.access_together(&c, 4, Duration::from_secs(3));
            assert_eq!(m.tier_of(BlockKey(0)), Some(Tier::Remote));
            let a: Vec<BlockKey> = (0..3).map(BlockKey).collect();
            m.access_together(&a, 5, Duration::from_secs(4));
            for k in &a {
                assert_eq!(
                    m.tier_of(*k),
                    Some(Tier::Host),
                    "{k:?}, segments {segments}"
                );
            }
            assert_eq!(m.len(Tier::Host), 4);
        }
    }

    #[test]
    fn a_load_longer_than_the_tier_keeps_its_capacity() {
        let mut m = host_and_disk(4);
        chain(&mut m, 0..6, 1, 0);
        chain(&mut m, 6..10, 2, 1);
        let all: Vec<BlockKey> = (0..6).map(BlockKey).collect();
        m.access_together(&all, 3, Duration::from_secs(2));
        assert_eq!(m.len(Tier::Host), 4);
        assert_eq!(m.len(Tier::Remote), 6);
        // Parents stay nearer than their children: the prompt's head is what stayed.
        for k in 0..4 {
            assert_eq!(m.tier_of(BlockKey(k)), Some(Tier::Host), "block {k}");
        }
        // Spared only for that load: the next one can push them out.
        let other: Vec<BlockKey> = (6..10).map(BlockKey).collect();
        m.access_together(&other, 4, Duration::from_secs(3));
        assert!(other.iter().all(|k| m.tier_of(*k) == Some(Tier::Host)));
    }
}
