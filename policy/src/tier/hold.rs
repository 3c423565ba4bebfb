//! Holds: blocks that may move to a farther tier but are not dropped while another block can be, until
//! released, such as blocks a producer saved for a consumer that has not loaded them yet.

use std::cmp::Reverse;

use transfer_engine::policy::BlockKey;

use super::{Rank, TierManager};

impl TierManager {
    /// Holds `key` (`true`) or releases it (`false`). A held block may be demoted to a farther tier (it
    /// stays there, admitted whatever its sharers), but is not dropped while its tier has another block to
    /// give (one with no child in that tier or a nearer one); a last tier full of held blocks gives up its
    /// coldest held leaf, so capacities always hold. Its parents stay, as for any block with a child.
    /// Returns whether `key` is resident (holding an absent block does nothing).
    pub fn hold(&mut self, key: BlockKey, held: bool) -> bool {
        let Some(b) = self.blocks.get_mut(&key) else {
            return false;
        };
        b.held = held;
        self.refresh(key);
        true
    }

    /// Whether `key` is resident and held.
    #[must_use]
    pub fn is_held(&self, key: BlockKey) -> bool {
        self.blocks.get(&key).is_some_and(|b| b.held)
    }

    /// The coldest held leaf of tier `t` (deepest first on ties), for when no other block can go. A scan:
    /// it runs only while a tier holds nothing but held blocks and their parents.
    pub(super) fn held_victim(&self, t: usize) -> Option<BlockKey> {
        let cfg = self.cfg.heat;
        self.blocks
            .iter()
            .filter(|(_, b)| b.tier == t && b.held && b.is_leaf())
            .map(|(&k, b)| (Rank(b.heat.rank(&cfg)), Reverse(b.depth), k))
            .min()
            .map(|(_, _, k)| k)
    }
}
