//! The interface the single-tier baselines share, and the replay loop that scores them.
//!
//! Each baseline is a cache of block keys with a capacity in blocks. Replay follows
//! `data/traces/README.md`: look up a request's prefix, then [`BlockCache::touch`] every block of it,
//! then [`BlockCache::evict_to_capacity`]. Evicting only after the whole request is stored keeps one
//! request's blocks from pushing each other out; each baseline documents how it adapts to that.

use transfer_engine::policy::BlockKey;

use policy::trace::Trace;

/// A single-tier cache of block keys: one classic replacement policy.
pub trait BlockCache {
    /// Whether `key` is resident.
    fn contains(&self, key: BlockKey) -> bool;
    /// Records a use of `key`: inserts it if absent (without evicting) or updates its state.
    fn touch(&mut self, key: BlockKey);
    /// Evicts until at most the capacity is resident; returns how many blocks were evicted.
    fn evict_to_capacity(&mut self) -> usize;
    /// Blocks resident.
    fn len(&self) -> usize;
    /// Whether nothing is resident.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Replays `trace` against `cache`; returns the prefix hit blocks.
pub fn replay_cache(trace: &Trace, cache: &mut impl BlockCache) -> u64 {
    let mut hits = 0;
    for req in trace.requests() {
        hits += req
            .hash_ids
            .iter()
            .take_while(|id| cache.contains(BlockKey(**id)))
            .count() as u64;
        for id in &req.hash_ids {
            cache.touch(BlockKey(*id));
        }
        cache.evict_to_capacity();
    }
    hits
}
