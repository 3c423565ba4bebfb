//! Conversation-continuation eviction: keep the blocks of conversations likely to come back soon.
//!
//! Blocks belong to the last request that touched them (its *group*). [`History`] tells which earlier
//! request a new one continues, which gives each request a turn number and a class (turn, blocks added,
//! output length, gap since its previous turn). [`Survival`] learns online, per class, the chance that
//! a conversation continues and when, and turns it into an eviction index per block-second. At eviction
//! each group's blocks are ranked by that index at the group's age, lowest first, deepest block first,
//! with three adjustments:
//! - a request's partial last block, and the blocks a continued conversation left behind (its dead
//!   tail), go first (index 0);
//! - blocks at or above a point where chains are known to branch (a shared prefix) get their index
//!   multiplied by [`ContinuationConfig::shared_boost`];
//! - a block is evicted only once no resident block hangs below it, so chains lose their tails first.
//!
//! Metadata is bounded (see [`Continuation::metadata`]): the resident blocks and their groups, at most
//! [`ContinuationConfig::history_factor`] × capacity requests and [`ContinuationConfig::seen_factor`] ×
//! capacity seen keys, and fixed-size class tables. Time is the trace's (milliseconds, passed in).

mod config;
pub mod history;
pub mod survival;

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};

use transfer_engine::policy::BlockKey;

use crate::trace::Request;
pub use config::ContinuationConfig;
use history::History;
use survival::Survival;

/// Tokens per block in the Mooncake traces (a request whose input is not a multiple of it ends in a
/// partial block).
pub const BLOCK_TOKENS: u64 = 512;

/// How much metadata the cache holds now (each at most its bound, see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Metadata {
    /// Resident blocks.
    pub blocks: usize,
    /// Groups with resident blocks.
    pub groups: usize,
    /// Keys listed by those groups (at most twice their resident blocks plus the newest request).
    pub group_keys: usize,
    /// Requests remembered.
    pub requests: usize,
    /// Seen keys remembered.
    pub seen: usize,
}

#[derive(Debug, Clone)]
struct Block {
    parent: Option<BlockKey>,
    children: u32,
    owner: u64,
    tail: bool,
    shared: bool,
    /// The first child linked and whether it was a partial last block (replaced by the next turn).
    first_child: Option<(BlockKey, bool)>,
}

#[derive(Debug, Clone)]
struct Group {
    t: u64,
    class: survival::Class,
    dead: bool,
    resident: usize,
    /// The request's keys (a superset of the blocks the group still owns).
    keys: Vec<BlockKey>,
    index: f64,
    /// Whether the group may own a shared block (set when one is owned or marked; never cleared).
    may_share: bool,
}

/// Which blocks of a group an eviction unit covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Tail,
    Deep,
    Shared,
}

/// An eviction unit's rank: index, then older groups first, then kind.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Unit(f64, u64, u64, Kind);

impl Eq for Unit {}

impl PartialOrd for Unit {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Unit {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0
            .total_cmp(&o.0)
            .then(self.1.cmp(&o.1))
            .then(self.2.cmp(&o.2))
            .then(self.3.cmp(&o.3))
    }
}

/// A single-tier cache ranked by the conversation-continuation index. See the module docs.
#[derive(Debug, Clone)]
pub struct Continuation {
    cfg: ContinuationConfig,
    capacity: usize,
    now: u64,
    blocks: HashMap<BlockKey, Block>,
    groups: HashMap<u64, Group>,
    history: History,
    survival: Survival,
    since_refit: u64,
}

impl Continuation {
    /// An empty cache of `capacity` blocks.
    #[must_use]
    pub fn new(capacity: usize, cfg: ContinuationConfig) -> Continuation {
        let scale = capacity.max(64);
        Continuation {
            cfg,
            capacity,
            now: 0,
            blocks: HashMap::new(),
            groups: HashMap::new(),
            history: History::new(
                cfg.history_factor * scale,
                cfg.seen_factor * scale,
                cfg.use_output,
            ),
            survival: Survival::new(cfg.survival),
            since_refit: 0,
        }
    }

    /// Whether `key` is resident.
    #[must_use]
    pub fn contains(&self, key: BlockKey) -> bool {
        self.blocks.contains_key(&key)
    }

    /// Blocks resident.
    #[must_use]
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether nothing is resident.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The metadata held now.
    #[must_use]
    pub fn metadata(&self) -> Metadata {
        let (requests, seen) = self.history.len();
        Metadata {
            blocks: self.blocks.len(),
            groups: self.groups.len(),
            group_keys: self.groups.values().map(|g| g.keys.len()).sum(),
            requests,
            seen,
        }
    }

    /// Stores (or touches) every block of `req`, which now owns them; does not evict.
    pub fn on_request(&mut self, req: &Request) {
        let ids: Vec<BlockKey> = req.hash_ids.iter().map(|id| BlockKey(*id)).collect();
        let partial = req.input_length < BLOCK_TOKENS * ids.len() as u64;
        let Some(seq) = self.begin(&ids, partial, Some(req.output_length), req.timestamp) else {
            return;
        };
        for (i, &key) in ids.iter().enumerate() {
            let parent = i.checked_sub(1).map(|p| ids[p]);
            self.add(seq, key, parent, partial && i + 1 == ids.len());
        }
    }

    /// Starts request `ids` arriving at `now_ms` (trace milliseconds): classes it and opens its group;
    /// returns the group to [`Continuation::add`] its blocks to, or `None` for an empty request. Used
    /// by hosts that store the blocks themselves (the tier manager); [`Continuation::on_request`] does
    /// both steps.
    pub fn begin(
        &mut self,
        ids: &[BlockKey],
        partial_last: bool,
        output_tokens: Option<u64>,
        now_ms: u64,
    ) -> Option<u64> {
        self.now = self.now.max(now_ms);
        self.history.advance(self.now, &mut self.survival);
        if ids.is_empty() {
            return None;
        }
        let arrival = self
            .history
            .arrive(ids, self.now, output_tokens, partial_last);
        if let Some(p) = arrival.continues
            && let Some(g) = self.groups.get_mut(&p)
        {
            g.dead = true;
        }
        let seq = arrival.seq;
        self.groups.insert(
            seq,
            Group {
                t: self.now,
                class: arrival.class,
                dead: false,
                resident: 0,
                keys: Vec::with_capacity(ids.len()),
                index: 0.0,
                may_share: false,
            },
        );
        self.since_refit += 1;
        Some(seq)
    }

    /// Whether group `seq` (from [`Continuation::begin`]) still owns blocks or was just opened.
    #[must_use]
    pub fn has_group(&self, seq: u64) -> bool {
        self.groups.contains_key(&seq)
    }

    /// Stores (or touches) `key` for the open group `seq`, which now owns it; links it under `parent`
    /// when that is resident. `tail`: it is the request's partial last block. Does not evict; a group
    /// that no longer exists is ignored.
    pub fn add(&mut self, seq: u64, key: BlockKey, parent: Option<BlockKey>, tail: bool) {
        let Some(g) = self.groups.get_mut(&seq) else {
            return;
        };
        if let Some(b) = self.blocks.get_mut(&key) {
            let old = std::mem::replace(&mut b.owner, seq);
            b.tail = tail;
            if old == seq {
                return;
            }
            g.keys.push(key);
            self.release(old);
        } else {
            g.keys.push(key);
            self.blocks.insert(
                key,
                Block {
                    parent: parent.filter(|p| self.blocks.contains_key(p)),
                    children: 0,
                    owner: seq,
                    tail,
                    shared: false,
                    first_child: None,
                },
            );
            if let Some(p) = parent {
                self.link(p, key, tail);
            }
        }
        let shared = self.blocks.get(&key).is_some_and(|b| b.shared);
        let g = self.groups.get_mut(&seq).expect("checked above");
        g.resident += 1;
        g.may_share |= shared;
    }

    /// Removes resident leaf `key` (one with no resident child), e.g. when its host drops or moves
    /// it; returns whether it was resident.
    pub fn remove(&mut self, key: BlockKey) -> bool {
        let Some(b) = self.blocks.remove(&key) else {
            return false;
        };
        debug_assert_eq!(b.children, 0, "only leaves are removed");
        if let Some(p) = b.parent.and_then(|p| self.blocks.get_mut(&p)) {
            p.children -= 1;
        }
        self.release(b.owner);
        true
    }

    /// Evicts the lowest-index blocks until the capacity holds; returns how many.
    pub fn evict_to_capacity(&mut self) -> usize {
        self.evict_into(&mut Vec::new())
    }

    /// Like [`Continuation::evict_to_capacity`], and appends the evicted keys to `out` in eviction
    /// order (a block always after its resident children).
    pub fn evict_into(&mut self, out: &mut Vec<BlockKey>) -> usize {
        if self.blocks.len() <= self.capacity {
            return 0;
        }
        if self.since_refit >= self.cfg.refit_every {
            self.survival.refit();
            self.since_refit = 0;
        }
        let boost = self.cfg.shared_boost;
        let tails_first = self.cfg.tails_first;
        let blocks = &self.blocks;
        let tails = TailProbe {
            blocks,
            tails_first,
        };
        let mut units = Vec::with_capacity(3 * self.groups.len());
        for (&seq, g) in &mut self.groups {
            g.index = if g.dead && self.cfg.tails_first {
                0.0
            } else {
                self.survival.index(g.class, self.now.saturating_sub(g.t))
            };
            let kinds = [
                (Kind::Tail, g.keys.last().is_some_and(|k| tails.contains(k))),
                (Kind::Deep, true),
                (Kind::Shared, g.may_share),
            ];
            for (kind, _) in kinds.into_iter().filter(|(_, any)| *any) {
                units.push(Reverse(Unit(value(g.index, kind, boost), g.t, seq, kind)));
            }
        }
        // Only the lowest few units are needed: heapify (linear) and pop lazily instead of sorting.
        let mut units = BinaryHeap::from(units);
        let mut evicted = 0;
        while self.blocks.len() > self.capacity {
            let Some(Reverse(unit)) = units.pop() else {
                break;
            };
            let Some(g) = self.groups.get(&unit.2) else {
                continue;
            };
            // A tail unit is at most the request's last block.
            let keys = if unit.3 == Kind::Tail {
                g.keys.last().copied().into_iter().collect()
            } else {
                g.keys.clone()
            };
            for key in keys.into_iter().rev() {
                if self.blocks.len() <= self.capacity {
                    break;
                }
                let Some(b) = self.blocks.get(&key) else {
                    continue;
                };
                if b.owner == unit.2 && b.children == 0 && self.kind(b) == unit.3 {
                    evicted += self.evict_chain(key, unit, out);
                }
            }
        }
        evicted
    }

    fn kind(&self, b: &Block) -> Kind {
        if b.tail && self.cfg.tails_first {
            Kind::Tail
        } else if b.shared {
            Kind::Shared
        } else {
            Kind::Deep
        }
    }

    /// The unit a resident block belongs to now.
    fn unit_of(&self, key: BlockKey) -> Option<Unit> {
        let b = self.blocks.get(&key)?;
        let g = self.groups.get(&b.owner)?;
        let kind = self.kind(b);
        Some(Unit(
            value(g.index, kind, self.cfg.shared_boost),
            g.t,
            b.owner,
            kind,
        ))
    }

    /// Evicts leaf `key`, then each ancestor that becomes a leaf and ranks no higher than `unit`.
    fn evict_chain(&mut self, key: BlockKey, unit: Unit, out: &mut Vec<BlockKey>) -> usize {
        let mut n = 0;
        let mut cur = Some(key);
        while let Some(k) = cur {
            if self.blocks.len() <= self.capacity {
                break;
            }
            let b = self.blocks.remove(&k).expect("resident");
            debug_assert_eq!(b.children, 0, "only leaves are evicted");
            out.push(k);
            n += 1;
            self.release(b.owner);
            cur = b.parent.filter(|p| {
                let Some(pb) = self.blocks.get_mut(p) else {
                    return false;
                };
                pb.children -= 1;
                pb.children == 0
            });
            cur = cur.filter(|p| self.unit_of(*p).is_some_and(|u| u <= unit));
        }
        n
    }

    /// One block less for group `seq`; drops the group when it owns none, compacts its key list (to
    /// the keys it owns, each once) when it owns fewer than half of them.
    fn release(&mut self, seq: u64) {
        let Some(g) = self.groups.get_mut(&seq) else {
            return;
        };
        g.resident -= 1;
        if g.resident == 0 {
            self.groups.remove(&seq);
        } else if 2 * g.resident < g.keys.len() {
            let blocks = &self.blocks;
            let mut kept = HashSet::with_capacity(g.resident);
            g.keys
                .retain(|k| blocks.get(k).is_some_and(|b| b.owner == seq) && kept.insert(*k));
        }
    }

    /// Links a new child under `parent`, marking the chain above a branch point as shared.
    fn link(&mut self, parent: BlockKey, child: BlockKey, child_tail: bool) {
        let Some(p) = self.blocks.get_mut(&parent) else {
            return;
        };
        p.children += 1;
        let branch = match p.first_child {
            None => {
                p.first_child = Some((child, child_tail));
                false
            }
            Some((first, _)) if first == child => false,
            Some((_, true)) => {
                p.first_child = Some((child, child_tail));
                false
            }
            Some(_) => true,
        };
        let mut cur = branch.then_some(parent);
        while let Some(k) = cur {
            let Some(b) = self.blocks.get_mut(&k) else {
                break;
            };
            if b.shared {
                break;
            }
            b.shared = true;
            cur = b.parent;
            if let Some(g) = self.groups.get_mut(&b.owner) {
                g.may_share = true;
            }
        }
    }
}

/// Whether a key is a resident partial last block (with tails first on).
struct TailProbe<'a> {
    blocks: &'a HashMap<BlockKey, Block>,
    tails_first: bool,
}

impl TailProbe<'_> {
    fn contains(&self, key: &BlockKey) -> bool {
        self.tails_first && self.blocks.get(key).is_some_and(|b| b.tail)
    }
}

/// A unit's index: 0 for tails, boosted for shared blocks.
fn value(index: f64, kind: Kind, boost: f64) -> f64 {
    match kind {
        Kind::Tail => 0.0,
        Kind::Deep => index,
        Kind::Shared => index * boost,
    }
}

#[cfg(test)]
mod tests;
