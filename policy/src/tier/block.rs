//! One block as the tier manager tracks it, and the order its eviction candidates are ranked in.

use std::cmp::{Ordering, Reverse};

use transfer_engine::policy::BlockKey;

use crate::heat::Heat;
use crate::namespace::NamespaceId;

/// Orders f64 ranks totally (NaN never occurs: configs are validated).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Rank(pub(super) f64);

impl Eq for Rank {}

impl PartialOrd for Rank {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Rank {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Eviction order inside a tier: coldest first, then deepest, then by key (deterministic).
pub(super) type Candidate = (Rank, Reverse<u32>, BlockKey);

#[derive(Debug, Clone)]
pub(super) struct Block {
    pub(super) tier: usize,
    pub(super) parent: Option<BlockKey>,
    /// Resident children per tier.
    pub(super) children: [u32; 3],
    pub(super) depth: u32,
    pub(super) ns: NamespaceId,
    pub(super) heat: Heat,
    /// 0: recent (one request used it), 1: frequent.
    pub(super) seg: usize,
    /// The entry in `candidates[tier]`, if the block is evictable from its tier.
    pub(super) entry: Option<Candidate>,
    /// Held ([`TierManager::hold`]): demoted to a farther tier like any block, but not dropped from the
    /// farthest while another block can be.
    pub(super) held: bool,
    /// Brought near by the load running ([`TierManager::access_together`]): not a victim while another
    /// block of its tier can go.
    pub(super) spared: bool,
}

impl Block {
    /// No child lives in this tier or a nearer one.
    pub(super) fn is_leaf(&self) -> bool {
        self.children[..=self.tier].iter().all(|&c| c == 0)
    }

    /// A candidate victim of its tier (`farther`: a tier beyond it has room to take it).
    pub(super) fn evictable(&self, farther: bool) -> bool {
        self.is_leaf() && !self.spared && (farther || !self.held)
    }
}
