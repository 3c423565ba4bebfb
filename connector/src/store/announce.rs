//! What the store tells the cluster index: each block that becomes loadable, moves between host memory
//! and disk, or leaves, as it happens (an event per change, in order, so the last one about a block is
//! where it is), and everything it holds when the publisher re-syncs.

use std::sync::Arc;

use cluster::{IndexEvent, IndexTier, Publisher};
use policy::NamespaceId;
use transfer_engine::policy::BlockKey;

use super::TierStore;
use crate::keys::ScopedKey;

/// The publisher a store announces to (none until [`TierStore::announce_to`]).
#[derive(Default)]
pub(super) struct Announcer(Option<Arc<Publisher>>);

impl std::fmt::Debug for Announcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Announcer(index)"
        } else {
            "Announcer(none)"
        })
    }
}

impl TierStore {
    /// Announces every change of what the store holds to `publisher` from now on (it re-syncs the rest).
    pub fn announce_to(&mut self, publisher: Arc<Publisher>) {
        self.announcer = Announcer(Some(publisher));
    }

    /// Every block the store holds whole, with its tier: what a re-sync publishes.
    #[must_use]
    pub fn holdings(&self) -> Vec<(NamespaceId, BlockKey, IndexTier)> {
        self.by_tier
            .iter()
            .filter_map(|(&tk, key)| Some((key.ns, tk, self.placement(key)?)))
            .collect()
    }

    /// Whether host memory holds `key` whole (every layer saved).
    pub(super) fn whole_in_host(&self, key: &ScopedKey) -> bool {
        self.index
            .get(key)
            .is_some_and(|e| e.layers == self.layout.layers)
    }

    /// Where `key` is loadable from now: host memory (stored whole), disk, or nowhere.
    fn placement(&self, key: &ScopedKey) -> Option<IndexTier> {
        if self.whole_in_host(key) {
            Some(IndexTier::Host)
        } else if self.disk_holds(key) {
            Some(IndexTier::Disk)
        } else {
            None
        }
    }

    /// Tells the publisher where `key` is now, and the KV-event log where it is held (called after every
    /// change of it).
    pub(super) fn announce(&mut self, key: &ScopedKey) {
        self.announce_event(key);
        let Some(publisher) = &self.announcer.0 else {
            return;
        };
        let (ns, tk) = (key.ns, key.tier_key());
        publisher.send(match self.placement(key) {
            Some(tier) => IndexEvent::Stored { ns, key: tk, tier },
            None => IndexEvent::Removed { ns, key: tk },
        });
    }
}
