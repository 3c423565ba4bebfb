//! The nearest tier's continuation order ([`NearestOrder::Continuation`]), and whole-request calls.
//!
//! The manager keeps a [`Continuation`] whose resident set is exactly the nearest tier's blocks: every
//! block that enters the tier (stored, or promoted from a farther one) is added to it, every block that
//! leaves it (demoted, dropped with its namespace) is removed. Its groups, history and class tables
//! rank the tier's victims; the manager carries them out (demote to the next tier with room, or drop),
//! in the order the index gives (a block after its resident children). The farther tiers keep heat.
//!
//! [`TierManager::request`] stores a request's blocks in order and settles once. With the
//! continuation order it also opens the request's group (its class from the keys, the partial last
//! block and the output length). Block-level calls ([`TierManager::insert`], [`TierManager::access`])
//! join the group of the last request with the same id, or open a one-block group of their own: they
//! keep every invariant, but only whole requests teach the index which conversations come back.

use std::time::Duration;

use transfer_engine::policy::{BlockKey, RequestInfo, Tier, TierMove};

use super::{NearestOrder, TIERS, TierConfig, TierManager};
use crate::continuation::{Continuation, Metadata};

/// The continuation cache over the nearest tier.
#[derive(Debug, Clone)]
pub(super) struct Near {
    cache: Continuation,
    /// The caller's request id and the continuation group its blocks join.
    current: Option<(u64, u64)>,
    /// Scratch list of victims, reused.
    victims: Vec<BlockKey>,
}

impl Near {
    pub(super) fn new(cfg: &TierConfig) -> Option<Near> {
        match cfg.nearest {
            NearestOrder::Heat => None,
            NearestOrder::Continuation(c) => Some(Near {
                cache: Continuation::new(cfg.capacities.gpu, c),
                current: None,
                victims: Vec::new(),
            }),
        }
    }
}

/// Metadata a [`TierManager`] holds now. Bounds, for capacities `c` in all and `g` on the nearest
/// tier: `blocks` ≤ `c` after settling (plus the newest request before), `ghosts` ≤
/// [`TierConfig::ghost_factor`] × `c`, and `nearest` within [`Continuation`]'s bounds for `g` (see
/// [`crate::continuation`]: groups ≤ its blocks, requests ≤ 2 max(`g`, 64), seen keys ≤ 8 max(`g`, 64),
/// fixed class tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierMetadata {
    /// Resident blocks, all tiers.
    pub blocks: usize,
    /// Evicted blocks whose heat is remembered.
    pub ghosts: usize,
    /// The continuation order's metadata, with [`NearestOrder::Continuation`].
    pub nearest: Option<Metadata>,
}

fn millis(now: Duration) -> u64 {
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
}

impl TierManager {
    /// Stores (or touches, promoting it) every block of `info` in order, each under the one before it,
    /// then settles capacities once, so a request's blocks never push each other out.
    pub fn request(&mut self, info: &RequestInfo<'_>, now: Duration) -> Vec<TierMove> {
        let mut moves = Vec::new();
        self.request_unsettled(info, now, &mut moves);
        self.settle(&mut moves);
        moves
    }

    /// Like [`TierManager::request`] but leaves capacities to a later [`TierManager::settle`].
    pub fn request_unsettled(
        &mut self,
        info: &RequestInfo<'_>,
        now: Duration,
        moves: &mut Vec<TierMove>,
    ) {
        if let Some(near) = &mut self.near {
            near.current = near
                .cache
                .begin(
                    info.keys,
                    info.partial_last,
                    info.output_tokens,
                    millis(now),
                )
                .map(|seq| (info.id, seq));
        }
        let mut parent = None;
        for (i, &key) in info.keys.iter().enumerate() {
            let from = moves.len();
            self.insert_heat(info.ns, key, parent, info.id, now, moves);
            let tail = info.partial_last && i + 1 == info.keys.len();
            self.near_touch(key, info.id, now, tail, &moves[from..]);
            parent = Some(key);
        }
    }

    /// The metadata held now (see [`TierMetadata`] for the bounds).
    #[must_use]
    pub fn metadata(&self) -> TierMetadata {
        TierMetadata {
            blocks: self.blocks.len(),
            ghosts: self.ghosts.len(),
            nearest: self.near.as_ref().map(|n| n.cache.metadata()),
        }
    }

    /// Adds `key` (just stored or touched by `request`) and the ancestors `promoted` brought to the
    /// nearest tier to the continuation cache, in the group of `request`.
    pub(super) fn near_touch(
        &mut self,
        key: BlockKey,
        request: u64,
        now: Duration,
        tail: bool,
        promoted: &[TierMove],
    ) {
        let Some(near) = &mut self.near else {
            return;
        };
        let Some(block) = self.blocks.get(&key) else {
            return;
        };
        let seq = match near.current {
            Some((r, seq)) if r == request && near.cache.has_group(seq) => seq,
            _ => {
                let Some(seq) = near.cache.begin(&[key], false, None, millis(now)) else {
                    return;
                };
                near.current = Some((request, seq));
                seq
            }
        };
        for mv in promoted {
            if mv.to == Some(Tier::Gpu) && mv.key != key && !near.cache.contains(mv.key) {
                let parent = self.blocks.get(&mv.key).and_then(|b| b.parent);
                near.cache.add(seq, mv.key, parent, false);
            }
        }
        near.cache.add(seq, key, block.parent, tail);
    }

    /// Drops `key`, leaving the nearest tier other than by the continuation order, from its cache.
    pub(super) fn near_forget(&mut self, key: BlockKey) {
        if let Some(near) = &mut self.near {
            near.cache.remove(key);
        }
    }

    /// With the continuation order: demotes (or drops) the nearest tier's lowest-index blocks until it
    /// is within capacity.
    pub(super) fn settle_near(&mut self, moves: &mut Vec<TierMove>) {
        let Some(near) = &mut self.near else {
            return;
        };
        debug_assert_eq!(near.cache.len(), self.len[0], "the cache mirrors the tier");
        if self.len[0] <= self.cfg.capacities.gpu {
            return;
        }
        let mut victims = std::mem::take(&mut near.victims);
        near.cache.evict_into(&mut victims);
        let to = (1..TIERS.len()).find(|&n| self.cfg.capacities.get(n) > 0);
        for &key in &victims {
            debug_assert!(
                self.blocks[&key].tier == 0 && self.blocks[&key].is_leaf(),
                "a victim is a nearest-tier leaf"
            );
            moves.push(TierMove {
                key,
                from: Tier::Gpu,
                to: to.map(|n| TIERS[n]),
            });
            match to {
                Some(n) => self.relocate(key, n),
                None => self.drop_block(key),
            }
        }
        victims.clear();
        if let Some(near) = &mut self.near {
            near.victims = victims;
        }
    }
}
