//! The tier manager: capacities per tier, heat-ranked promotions, demotions and evictions.
//!
//! Invariants, kept after every public call that settles:
//! - no tier holds more blocks than its capacity;
//! - every block lives in at most one tier;
//! - a parent lives in a tier at least as near as each of its children, so a parent is never evicted
//!   while a child stays (chain tails go first, an evicted parent would orphan its children).
//!
//! Victims are the coldest blocks by [`Heat::rank`] among those with no child in the same or a nearer
//! tier (deepest first on ties); a victim moves to the next tier with room, or is dropped from the last.
//! Dropped blocks leave their heat behind in a bounded ghost table, so a block that comes back resumes its
//! history (a second chance against one-off scans).
//!
//! A held block ([`TierManager::hold`]: one saved for a consumer that has not loaded it yet) is demoted
//! like any other (admitted below whatever its sharers), but never dropped from the farthest tier while
//! another block there can be; the nearest tier's continuation order ignores holds.
//!
//! With [`TierConfig::adaptive_segments`] (the default) each tier is split ARC-style into a *recent*
//! segment (blocks only one request has used) and a *frequent* one (blocks two or more requests used).
//! The victim comes from the recent segment while it holds more than its target share of the tier, else
//! from the frequent one (heat order, leaves only, inside each). The share is learned online from the
//! ghosts: a ghost evicted from the recent segment coming back means recent blocks were cut too early
//! (the share grows), one from the frequent segment means the opposite (it shrinks), with ARC's step
//! sizes. Nothing is fitted to a trace: the share starts at one half and follows the traffic.
//!
//! With [`NearestOrder::Continuation`] the nearest tier's victims come from the conversation-continuation
//! index instead ([`crate::continuation`], see [below](self#continuation-order)); the
//! farther tiers keep heat. Drive it with [`TierManager::request`] (the
//! [`TierPolicy::on_request`](transfer_engine::policy::TierPolicy::on_request) hook) so it sees whole requests.
//!
//! # Continuation order
//!
//! The manager keeps a continuation cache whose resident set is exactly the nearest tier; blocks that
//! enter the tier are added to it, blocks that leave other than by its order are removed, and its
//! victims are demoted (or dropped) leaves first. Metadata is bounded: see [`TierMetadata`].

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::Duration;

use transfer_engine::policy::{BlockKey, Tier, TierMove};

use crate::error::PolicyError;
use crate::heat::{Heat, HeatClock};
use crate::namespace::NamespaceId;

mod block;
mod config;
mod farther;
mod hold;
mod load;
mod near;
mod policy;
mod segments;

use block::{Block, Candidate, Rank};
pub use config::{NearestOrder, TierCapacities, TierConfig};
use near::Near;
pub use near::TierMetadata;

const TIERS: [Tier; 3] = [Tier::Gpu, Tier::Host, Tier::Remote];

fn idx(t: Tier) -> usize {
    match t {
        Tier::Gpu => 0,
        Tier::Host => 1,
        Tier::Remote => 2,
    }
}

/// Decides where blocks live across GPU, host and remote tiers. See the module docs.
#[derive(Debug, Clone)]
pub struct TierManager {
    cfg: TierConfig,
    clock: HeatClock,
    blocks: HashMap<BlockKey, Block>,
    /// Evictable blocks per tier and segment.
    candidates: [[BTreeSet<Candidate>; 2]; 3],
    len: [usize; 3],
    /// Resident blocks per tier and segment.
    seg_len: [[usize; 2]; 3],
    /// Target share of each tier for the recent segment, in [0, 1] (adapted online).
    recent_share: f64,
    /// Ghosts per segment they were evicted from.
    ghost_seg: [usize; 2],
    ghosts: HashMap<BlockKey, (Heat, u64)>,
    ghost_order: VecDeque<(BlockKey, u64)>,
    ghost_capacity: usize,
    ghost_stamp: u64,
    /// The continuation order of the nearest tier, with [`NearestOrder::Continuation`].
    near: Option<Near>,
    /// Blocks one load is bringing near together (see [`TierManager::access_together`]).
    spared: HashSet<BlockKey>,
}

impl TierManager {
    /// A manager with these capacities and weights.
    pub fn new(cfg: TierConfig) -> Result<TierManager, PolicyError> {
        if !(cfg.ghost_factor.is_finite() && cfg.ghost_factor >= 0.0) {
            return Err(PolicyError::InvalidConfig(
                "ghost_factor must be a finite, non-negative multiple of the capacity".into(),
            ));
        }
        let clock = HeatClock::new(cfg.heat, cfg.capacities.total())?;
        Ok(TierManager {
            ghost_capacity: (cfg.ghost_factor * cfg.capacities.total() as f64) as usize,
            cfg,
            clock,
            blocks: HashMap::new(),
            candidates: Default::default(),
            len: [0; 3],
            seg_len: [[0; 2]; 3],
            recent_share: 0.5,
            ghost_seg: [0; 2],
            ghosts: HashMap::new(),
            ghost_order: VecDeque::new(),
            ghost_stamp: 0,
            near: Near::new(&cfg),
            spared: HashSet::new(),
        })
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &TierConfig {
        &self.cfg
    }

    /// Blocks resident in `tier`.
    #[must_use]
    pub fn len(&self, tier: Tier) -> usize {
        self.len[idx(tier)]
    }

    /// Whether no block is resident anywhere.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// A resident block's heat.
    #[must_use]
    pub fn heat(&self, key: BlockKey) -> Option<&Heat> {
        self.blocks.get(&key).map(|b| &b.heat)
    }

    /// A resident block's parent, as linked at insert time.
    #[must_use]
    pub fn parent_of(&self, key: BlockKey) -> Option<BlockKey> {
        self.blocks.get(&key).and_then(|b| b.parent)
    }

    /// Stores a new block in namespace `ns` at the nearest tier and settles capacities.
    pub fn insert(
        &mut self,
        ns: NamespaceId,
        key: BlockKey,
        parent: Option<BlockKey>,
        request: u64,
        now: Duration,
    ) -> Vec<TierMove> {
        let mut moves = Vec::new();
        self.insert_unsettled(ns, key, parent, request, now, &mut moves);
        self.settle(&mut moves);
        moves
    }

    /// Records a use of a resident block, promotes it (and any farther ancestors) to the nearest tier
    /// and settles capacities. A block that is not resident is ignored.
    pub fn access(&mut self, key: BlockKey, request: u64, now: Duration) -> Vec<TierMove> {
        let mut moves = Vec::new();
        self.access_unsettled(key, request, now, &mut moves);
        self.settle(&mut moves);
        moves
    }

    /// Like [`TierManager::insert`] but leaves capacities to a later [`TierManager::settle`], so a whole
    /// request can be stored before anything is evicted. A parent that is not resident (or lives in
    /// another namespace) is not linked: the block becomes a chain root. A resident key is accessed
    /// instead.
    pub fn insert_unsettled(
        &mut self,
        ns: NamespaceId,
        key: BlockKey,
        parent: Option<BlockKey>,
        request: u64,
        now: Duration,
        moves: &mut Vec<TierMove>,
    ) {
        let from = moves.len();
        self.insert_heat(ns, key, parent, request, now, moves);
        self.near_touch(key, request, now, false, &moves[from..]);
    }

    /// The heat part of [`TierManager::insert_unsettled`].
    fn insert_heat(
        &mut self,
        ns: NamespaceId,
        key: BlockKey,
        parent: Option<BlockKey>,
        request: u64,
        now: Duration,
        moves: &mut Vec<TierMove>,
    ) {
        if self.blocks.contains_key(&key) {
            self.access_heat(key, request, now, moves);
            return;
        }
        self.clock.set_now(now);
        self.clock.count_insert();
        let tau = self.clock.tau();
        let cfg = self.cfg.heat;
        let heat = match self.ghosts.remove(&key) {
            Some((mut h, _)) => {
                let seg = Self::segment_of(&h);
                self.ghost_seg[seg] -= 1;
                self.adapt(seg);
                h.touch(request, tau, &cfg);
                h
            }
            None => Heat::new(request, tau, &cfg),
        };
        let parent = parent.filter(|p| self.blocks.get(p).is_some_and(|b| b.ns == ns));
        if let Some(p) = parent {
            self.promote_chain(p, moves);
        }
        self.place(0, ns, key, parent, heat);
    }

    /// Files a new block `key` in tier `t` under `parent` (resident, or `None`): counts, the parent's
    /// children, its place in the eviction order.
    fn place(
        &mut self,
        t: usize,
        ns: NamespaceId,
        key: BlockKey,
        parent: Option<BlockKey>,
        heat: Heat,
    ) {
        let depth = parent.map_or(0, |p| self.blocks[&p].depth + 1);
        let seg = Self::segment_of(&heat);
        let block = Block {
            tier: t,
            parent,
            children: [0; 3],
            depth,
            ns,
            heat,
            seg,
            entry: None,
            held: false,
            spared: false,
        };
        self.blocks.insert(key, block);
        self.len[t] += 1;
        self.seg_len[t][seg] += 1;
        if let Some(p) = parent {
            self.adjust_child(p, t, 1);
        }
        self.refresh(key);
    }

    /// Like [`TierManager::access`] but leaves capacities to a later [`TierManager::settle`].
    pub fn access_unsettled(
        &mut self,
        key: BlockKey,
        request: u64,
        now: Duration,
        moves: &mut Vec<TierMove>,
    ) {
        let from = moves.len();
        self.access_heat(key, request, now, moves);
        self.near_touch(key, request, now, false, &moves[from..]);
    }

    /// The heat part of [`TierManager::access_unsettled`].
    fn access_heat(
        &mut self,
        key: BlockKey,
        request: u64,
        now: Duration,
        moves: &mut Vec<TierMove>,
    ) {
        self.clock.set_now(now);
        let tau = self.clock.tau();
        let cfg = self.cfg.heat;
        let Some(block) = self.blocks.get_mut(&key) else {
            return;
        };
        block.heat.touch(request, tau, &cfg);
        self.promote_chain(key, moves);
        self.refresh(key);
    }

    /// Demotes and evicts the coldest evictable blocks (on the nearest tier, the lowest continuation
    /// index first when so configured) until every tier is within capacity.
    pub fn settle(&mut self, moves: &mut Vec<TierMove>) {
        self.settle_near(moves);
        for (t, &tier) in TIERS.iter().enumerate() {
            while self.len[t] > self.cfg.capacities.get(t) {
                // Held blocks go only when nothing else can (a tier full of them).
                let Some(victim) = self
                    .victim(t)
                    .or_else(|| self.held_victim(t))
                    .or_else(|| self.unspare(t))
                else {
                    unreachable!("a non-empty tier always has a leaf (parents are nearer)");
                };
                if t == 0 {
                    self.near_forget(victim);
                }
                // A held block moves down whatever its sharers: there it stays loadable.
                let to = (t + 1..TIERS.len())
                    .find(|&n| self.cfg.capacities.get(n) > 0)
                    .filter(|&n| t == 0 || self.blocks[&victim].held || self.admits(victim, n));
                moves.push(TierMove {
                    key: victim,
                    from: tier,
                    to: to.map(|n| TIERS[n]),
                });
                match to {
                    Some(n) => {
                        self.relocate(victim, n);
                        // Spared again in the tier it moved to.
                        if self.spared.contains(&victim) {
                            self.set_spared(victim, true);
                        }
                    }
                    None => self.drop_block(victim),
                }
            }
        }
    }

    /// Evicts every block of namespace `ns` (children before parents), e.g. after a weight update.
    pub fn drop_namespace(&mut self, ns: NamespaceId) -> Vec<TierMove> {
        let mut victims: Vec<(Reverse<u32>, BlockKey)> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.ns == ns)
            .map(|(k, b)| (Reverse(b.depth), *k))
            .collect();
        victims.sort_unstable();
        victims
            .into_iter()
            .map(|(_, key)| {
                let from = TIERS[self.blocks[&key].tier];
                if from == Tier::Gpu {
                    self.near_forget(key);
                }
                self.drop_block(key);
                self.ghosts.remove(&key);
                TierMove {
                    key,
                    from,
                    to: None,
                }
            })
            .collect()
    }

    /// Moves `key` and every ancestor that lives farther away to the nearest tier.
    fn promote_chain(&mut self, key: BlockKey, moves: &mut Vec<TierMove>) {
        let mut chain = Vec::new();
        let mut cur = Some(key);
        while let Some(k) = cur {
            let b = &self.blocks[&k];
            if b.tier == 0 {
                break;
            }
            chain.push(k);
            cur = b.parent;
        }
        for k in chain.into_iter().rev() {
            moves.push(TierMove {
                key: k,
                from: TIERS[self.blocks[&k].tier],
                to: Some(Tier::Gpu),
            });
            self.relocate(k, 0);
        }
    }

    fn relocate(&mut self, key: BlockKey, to: usize) {
        let b = self
            .blocks
            .get_mut(&key)
            .expect("relocating a resident block");
        let (from, parent, seg) = (b.tier, b.parent, b.seg);
        b.tier = to;
        self.len[from] -= 1;
        self.len[to] += 1;
        self.seg_len[from][seg] -= 1;
        self.seg_len[to][seg] += 1;
        if let Some(e) = b.entry.take() {
            self.candidates[from][seg].remove(&e);
        }
        if let Some(p) = parent {
            self.adjust_child(p, from, -1);
            self.adjust_child(p, to, 1);
        }
        self.refresh(key);
    }

    fn drop_block(&mut self, key: BlockKey) {
        let b = self.blocks.remove(&key).expect("dropping a resident block");
        debug_assert!(
            b.children.iter().all(|&c| c == 0),
            "a parent is never dropped before its children"
        );
        self.len[b.tier] -= 1;
        self.seg_len[b.tier][b.seg] -= 1;
        if let Some(e) = b.entry {
            self.candidates[b.tier][b.seg].remove(&e);
        }
        if let Some(p) = b.parent {
            self.adjust_child(p, b.tier, -1);
        }
        if self.ghost_capacity > 0 {
            self.ghost_stamp += 1;
            self.ghost_seg[b.seg] += 1;
            if let Some((old, _)) = self.ghosts.insert(key, (b.heat, self.ghost_stamp)) {
                self.ghost_seg[Self::segment_of(&old)] -= 1;
            }
            self.ghost_order.push_back((key, self.ghost_stamp));
            while self.ghosts.len() > self.ghost_capacity {
                let Some((k, stamp)) = self.ghost_order.pop_front() else {
                    break;
                };
                if self.ghosts.get(&k).is_some_and(|&(_, s)| s == stamp) {
                    let (h, _) = self.ghosts.remove(&k).expect("present");
                    self.ghost_seg[Self::segment_of(&h)] -= 1;
                }
            }
        }
    }

    fn adjust_child(&mut self, parent: BlockKey, tier: usize, delta: i32) {
        if let Some(p) = self.blocks.get_mut(&parent) {
            p.children[tier] = p.children[tier]
                .checked_add_signed(delta)
                .expect("child count");
            self.refresh(parent);
        }
    }

    /// Re-files `key` in its tier's eviction order after its heat, tier or children changed.
    fn refresh(&mut self, key: BlockKey) {
        let (cfg, caps) = (self.cfg.heat, self.cfg.capacities);
        let Some(b) = self.blocks.get_mut(&key) else {
            return;
        };
        let seg = Self::segment_of(&b.heat);
        let farther = (b.tier + 1..TIERS.len()).any(|n| caps.get(n) > 0);
        let want = b
            .evictable(farther)
            .then(|| (Rank(b.heat.rank(&cfg)), Reverse(b.depth), key));
        if want != b.entry || seg != b.seg {
            if let Some(old) = b.entry.take() {
                self.candidates[b.tier][b.seg].remove(&old);
            }
            self.seg_len[b.tier][b.seg] -= 1;
            self.seg_len[b.tier][seg] += 1;
            b.seg = seg;
            if let Some(new) = want {
                self.candidates[b.tier][seg].insert(new);
            }
            b.entry = want;
        }
    }
}

#[cfg(test)]
mod hold_tests;
#[cfg(test)]
mod tests;
