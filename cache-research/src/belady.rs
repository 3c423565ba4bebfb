//! Belady's offline optimum: evict the block whose next use is furthest in the future.

use std::collections::{BTreeSet, HashMap};

use policy::trace::Trace;

/// Request index meaning "never used again".
pub const NEVER: u32 = u32::MAX;

/// For every block of every request, the index of the next request that uses the same block.
#[derive(Debug, Clone)]
pub struct NextUse {
    next: Vec<Vec<u32>>,
}

impl NextUse {
    /// Computes next uses with one backward pass over the trace.
    #[must_use]
    pub fn new(trace: &Trace) -> NextUse {
        let mut seen: HashMap<u64, u32> = HashMap::new();
        let mut next: Vec<Vec<u32>> = vec![Vec::new(); trace.requests().len()];
        for (i, req) in trace.requests().iter().enumerate().rev() {
            let i = u32::try_from(i).expect("fewer than 2^32 requests");
            next[i as usize] = req
                .hash_ids
                .iter()
                .map(|id| seen.insert(*id, i).unwrap_or(NEVER))
                .collect();
        }
        NextUse { next }
    }

    /// Next uses of request `i`'s blocks, in its order.
    #[must_use]
    pub fn of(&self, i: usize) -> &[u32] {
        &self.next[i]
    }
}

/// Which of several blocks with the same next use Belady evicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TieBreak {
    /// The least recently touched (within a request: the shallowest). This is the reference
    /// implementation's rule: 0.326 on the conversation trace at 4,985 blocks.
    #[default]
    LeastRecent,
    /// The deepest prefix position (a block only hits if its whole prefix does): 0.329 there. Still not
    /// the optimum under prefix hits, which no per-block rule is.
    Deepest,
}

/// A cache that knows the future: evicts the block used furthest ahead.
#[derive(Debug, Clone, Default)]
pub struct Belady {
    capacity: usize,
    tie_break: TieBreak,
    stamp: u64,
    cached: HashMap<u64, (u32, u64)>,
    order: BTreeSet<(u32, u64, u64)>,
}

impl Belady {
    /// An empty cache holding up to `capacity` blocks.
    #[must_use]
    pub fn new(capacity: usize) -> Belady {
        Belady {
            capacity,
            ..Belady::default()
        }
    }

    /// An empty cache with another tie-break rule.
    #[must_use]
    pub fn with_tie_break(capacity: usize, tie_break: TieBreak) -> Belady {
        Belady {
            capacity,
            tie_break,
            ..Belady::default()
        }
    }

    /// Whether block `id` is cached.
    #[must_use]
    pub fn contains(&self, id: u64) -> bool {
        self.cached.contains_key(&id)
    }

    /// Inserts or touches `id` at prefix position `depth`, next used by request `next` ([`NEVER`]).
    pub fn touch(&mut self, id: u64, depth: u32, next: u32) {
        self.stamp += 1;
        let tie = match self.tie_break {
            TieBreak::LeastRecent => u64::MAX - self.stamp,
            TieBreak::Deepest => u64::from(depth),
        };
        if let Some((n, t)) = self.cached.insert(id, (next, tie)) {
            self.order.remove(&(n, t, id));
        }
        self.order.insert((next, tie, id));
    }

    /// Evicts the blocks used furthest ahead until at most `capacity` remain; returns how many.
    pub fn evict_to_capacity(&mut self) -> usize {
        let mut n = 0;
        while self.cached.len() > self.capacity {
            let Some((_, _, id)) = self.order.pop_last() else {
                break;
            };
            self.cached.remove(&id);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_furthest_next_use_and_breaks_ties_as_configured() {
        let mut b = Belady::new(2);
        b.touch(1, 0, 5);
        b.touch(2, 1, 5);
        b.touch(3, 2, 5);
        b.evict_to_capacity();
        assert!(
            !b.contains(1),
            "same next use: the least recently touched goes"
        );
        let mut b = Belady::with_tie_break(2, TieBreak::Deepest);
        b.touch(1, 0, 5);
        b.touch(2, 1, 9);
        b.touch(3, 0, 7);
        assert_eq!(b.evict_to_capacity(), 1);
        assert!(!b.contains(2));
        b.touch(4, 1, 7);
        b.evict_to_capacity();
        assert!(
            b.contains(3) && !b.contains(4),
            "same next use: the deeper block goes"
        );
    }

    #[test]
    fn next_use_looks_ahead() {
        let t = Trace::parse(
            "t",
            "{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1,2]}\n\
             {\"timestamp\":1,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\n\
             {\"timestamp\":2,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1,2]}\n",
        )
        .unwrap();
        let n = NextUse::new(&t);
        assert_eq!(n.of(0), &[1, 2]);
        assert_eq!(n.of(1), &[2]);
        assert_eq!(n.of(2), &[NEVER, NEVER]);
    }
}
