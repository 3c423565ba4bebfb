//! Holds on stored blocks: blocks a producer saved for a decode that has not loaded them yet are not
//! dropped (a disk tier may take them) until a load of them completes or their deadline passes.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::TierStore;
use crate::keys::ScopedKey;

/// The store's holds: each held key's deadline, and the deadlines in the order they were set.
#[derive(Debug, Default)]
pub(super) struct Holds {
    deadlines: HashMap<ScopedKey, Duration>,
    /// `(deadline, key)` as set; an entry whose key was released or held again later is skipped.
    order: VecDeque<(Duration, ScopedKey)>,
    expired: u64,
}

impl TierStore {
    /// Holds the blocks of `keys` this store holds (in host memory or on disk) until `deadline` (callers
    /// give deadlines in rising order: now plus a fixed timeout), or until
    /// [`TierStore::release_holds`]: a held block may move to the disk tier (where lookups and loads still
    /// find it), but is dropped only when the last tier has nothing else to give; without a disk tier, a
    /// save that finds every slot held is dropped instead. Holding a held block again keeps the later
    /// deadline. Returns the blocks held.
    pub fn hold(&mut self, keys: &[ScopedKey], deadline: Duration) -> usize {
        let mut held = 0;
        for key in keys {
            if !self.tiers.hold(key.tier_key(), true) {
                continue;
            }
            held += 1;
            let at = self.holds.deadlines.entry(*key).or_insert(deadline);
            *at = (*at).max(deadline);
            self.holds.order.push_back((deadline, *key));
        }
        held
    }

    /// Ends the holds on `keys` (a load of them completed).
    pub fn release_holds(&mut self, keys: &[ScopedKey]) {
        for key in keys {
            if self.holds.deadlines.remove(key).is_some() {
                self.tiers.hold(key.tier_key(), false);
            }
        }
        self.compact_holds();
    }

    /// Ends the holds whose deadline is at or before `now`, counting those of blocks still stored
    /// ([`TierStore::holds_expired`]). Run before every slot is claimed.
    pub fn expire_holds(&mut self, now: Duration) {
        while let Some(&(at, key)) = self.holds.order.front() {
            if at > now {
                break;
            }
            self.holds.order.pop_front();
            if self.holds.deadlines.get(&key).is_some_and(|&d| d <= now) {
                self.holds.deadlines.remove(&key);
                if self.tiers.hold(key.tier_key(), false) {
                    self.holds.expired += 1;
                }
            }
        }
    }

    /// Blocks held now.
    #[must_use]
    pub fn held(&self) -> usize {
        self.holds
            .deadlines
            .keys()
            .filter(|k| self.tiers.is_held(k.tier_key()))
            .count()
    }

    /// Holds that ran out before a load of their block completed (no decode came in time).
    #[must_use]
    pub fn holds_expired(&self) -> u64 {
        self.holds.expired
    }

    /// Rebuilds the deadline order once released entries outnumber live ones, so it stays bounded by the
    /// holds set within one timeout.
    fn compact_holds(&mut self) {
        let h = &mut self.holds;
        if h.order.len() > 64 && h.order.len() > 2 * h.deadlines.len() {
            let mut live: Vec<(Duration, ScopedKey)> =
                h.deadlines.iter().map(|(k, d)| (*d, *k)).collect();
            live.sort_unstable_by_key(|&(d, _)| d);
            h.order = live.into();
        }
    }
}
