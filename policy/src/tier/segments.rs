//! The ARC-style recent and frequent segments of each tier: which segment a block is in, how the
//! recent segment's target share adapts, and which segment gives the next victim.

use transfer_engine::policy::BlockKey;

use super::TierManager;
use crate::heat::Heat;

impl TierManager {
    /// The segment a block with this heat belongs to (0: recent, 1: frequent). With segments off the two
    /// sets are still kept, and the victim is the colder of their coldest blocks.
    pub(super) fn segment_of(heat: &Heat) -> usize {
        usize::from(heat.sharers() >= 2)
    }

    /// ARC's adaptation: a ghost coming back from segment `seg` means that segment was cut too short,
    /// so its target share grows by one block (more when the other segment's ghosts outnumber its own).
    pub(super) fn adapt(&mut self, seg: usize) {
        if !self.cfg.adaptive_segments {
            return;
        }
        let total = self.cfg.capacities.total().max(1) as f64;
        let [g0, g1] = self.ghost_seg.map(|g| g.max(1) as f64);
        let step = if seg == 0 {
            (g1 / g0).max(1.0)
        } else {
            -(g0 / g1).max(1.0)
        };
        self.recent_share = (self.recent_share + step / total).clamp(0.0, 1.0);
    }

    /// The block to demote or evict from tier `t`: the coldest evictable block of the segment over its
    /// target share (or of whichever segment has one).
    pub(super) fn victim(&self, t: usize) -> Option<BlockKey> {
        let [recent, frequent] = &self.candidates[t];
        if !self.cfg.adaptive_segments {
            // One heat order: the colder of the two segments' coldest.
            return match (recent.first(), frequent.first()) {
                (Some(a), Some(b)) => Some(a.min(b).2),
                (a, b) => a.or(b).map(|c| c.2),
            };
        }
        let target = self.recent_share * self.cfg.capacities.get(t) as f64;
        let (first, second) = if self.seg_len[t][0] as f64 > target {
            (recent, frequent)
        } else {
            (frequent, recent)
        };
        first.first().or_else(|| second.first()).map(|c| c.2)
    }
}
