//! The tier manager as the transfer engine's [`TierPolicy`]: each hook is the manager's own call.

use std::time::Duration;

use transfer_engine::policy::{BlockKey, RequestInfo, Tier, TierMove, TierPolicy};

use super::{TIERS, TierManager};
use crate::namespace::NamespaceId;

impl TierPolicy for TierManager {
    /// Inserts in namespace `ns`; a parent of another namespace is not linked (see
    /// [`TierManager::insert_unsettled`]).
    fn on_insert(
        &mut self,
        ns: NamespaceId,
        key: BlockKey,
        parent: Option<BlockKey>,
        request: u64,
        now: Duration,
    ) -> Vec<TierMove> {
        self.insert(ns, key, parent, request, now)
    }

    fn on_access(&mut self, key: BlockKey, request: u64, now: Duration) -> Vec<TierMove> {
        self.access(key, request, now)
    }

    fn tier_of(&self, key: BlockKey) -> Option<Tier> {
        self.blocks.get(&key).map(|b| TIERS[b.tier])
    }

    /// Stores or touches the whole request, then settles once (see [`TierManager::request`]).
    fn on_request(&mut self, request: &RequestInfo<'_>, now: Duration) -> Vec<TierMove> {
        self.request(request, now)
    }
}
