//! The farther tiers' own entry and exit: blocks found there at start-up (a disk tier's recovered
//! records), blocks a tier lost (a failed write, a damaged read), and which victims deserve a farther
//! tier at all ([`TierConfig::demote_min_sharers`]).

use std::time::Duration;

use transfer_engine::policy::{BlockKey, Tier, TierMove};

use super::{TIERS, TierManager, idx};
use crate::heat::Heat;
use crate::namespace::NamespaceId;
#[cfg(doc)]
use crate::tier::TierConfig;

impl TierManager {
    /// Places a block that already lives in `tier` (recovered from disk, say) without promoting it or
    /// its parent, then settles. Its heat starts as one use by `request` at `now`. The parent is linked
    /// only when resident in a tier at least as near (insert chains parents first); a block already
    /// resident is left where it is. On the nearest tier this is [`TierManager::insert`].
    pub fn insert_at(
        &mut self,
        tier: Tier,
        ns: NamespaceId,
        key: BlockKey,
        parent: Option<BlockKey>,
        request: u64,
        now: Duration,
    ) -> Vec<TierMove> {
        let t = idx(tier);
        if t == 0 {
            return self.insert(ns, key, parent, request, now);
        }
        let mut moves = Vec::new();
        if self.blocks.contains_key(&key) {
            return moves;
        }
        self.clock.set_now(now);
        self.clock.count_insert();
        let heat = Heat::new(request, self.clock.tau(), &self.cfg.heat);
        let parent = parent.filter(|p| {
            self.blocks
                .get(p)
                .is_some_and(|b| b.ns == ns && b.tier <= t)
        });
        self.place(t, ns, key, parent, heat);
        self.settle(&mut moves);
        moves
    }

    /// Forgets `key` and every resident block below it in its chain (their KV is gone: a tier failed to
    /// keep it), children before parents; the moves say where each was. Not resident: nothing.
    pub fn remove(&mut self, key: BlockKey) -> Vec<TierMove> {
        if !self.blocks.contains_key(&key) {
            return Vec::new();
        }
        // Descendants, found through the parent links (a rare path: a scan is fine).
        let mut doomed = vec![key];
        let mut grew = true;
        while grew {
            grew = false;
            for (k, b) in &self.blocks {
                if b.parent.is_some_and(|p| doomed.contains(&p)) && !doomed.contains(k) {
                    doomed.push(*k);
                    grew = true;
                }
            }
        }
        doomed.sort_unstable_by_key(|k| std::cmp::Reverse(self.blocks[k].depth));
        doomed
            .into_iter()
            .map(|k| {
                let from = TIERS[self.blocks[&k].tier];
                if from == Tier::Gpu {
                    self.near_forget(k);
                }
                self.drop_block(k);
                TierMove {
                    key: k,
                    from,
                    to: None,
                }
            })
            .collect()
    }

    /// Whether victim `key`, leaving tier `t`, may move to farther tier `to` rather than be dropped:
    /// enough requests used it, or a child of it lives there or beyond (dropping it would orphan them).
    pub(super) fn admits(&self, key: BlockKey, to: usize) -> bool {
        let b = &self.blocks[&key];
        b.heat.sharers() >= self.cfg.demote_min_sharers || b.children[to..].iter().any(|&c| c > 0)
    }
}
