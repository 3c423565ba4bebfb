//! W-TinyLFU (Einziger, Friedman and Manes, 2017; Caffeine's policy): a window LRU (1% of the capacity)
//! in front of a segmented LRU main space (20% probation, 80% protected). A block leaving the window is
//! admitted to the main space only if a count-min sketch says it is used more often than the main
//! space's victim. The sketch (four rows of 16 counters per cached block, capped at 15) halves every
//! counter after ten capacities of uses, so old popularity fades.
//!
//! Adapted to evicting after a whole request is stored: insertion never evicts;
//! [`BlockCache::evict_to_capacity`] runs the admission duel until the capacity holds.

use transfer_engine::policy::BlockKey;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::cache::BlockCache;
use policy::namespace::HASH_SEED;
use policy::recency::RecencyList;

/// Frequency estimates with periodic halving.
#[derive(Debug, Clone)]
struct Sketch {
    rows: [Vec<u8>; 4],
    mask: u64,
    samples: usize,
    reset_at: usize,
}

impl Sketch {
    fn new(capacity: usize) -> Sketch {
        // Caffeine's sizing: 16 four-bit counters per cached entry in each row.
        let width = (16 * capacity.max(1)).next_power_of_two();
        Sketch {
            rows: std::array::from_fn(|_| vec![0; width]),
            mask: width as u64 - 1,
            samples: 0,
            reset_at: 10 * capacity.max(1),
        }
    }

    fn slot(&self, row: usize, key: BlockKey) -> usize {
        (xxh3_64_with_seed(&key.0.to_le_bytes(), HASH_SEED ^ row as u64) & self.mask) as usize
    }

    fn frequency(&self, key: BlockKey) -> u8 {
        (0..4)
            .map(|r| self.rows[r][self.slot(r, key)])
            .min()
            .unwrap_or(0)
    }

    fn increment(&mut self, key: BlockKey) {
        for r in 0..4 {
            let s = self.slot(r, key);
            self.rows[r][s] = (self.rows[r][s] + 1).min(15);
        }
        self.samples += 1;
        if self.samples >= self.reset_at {
            for row in &mut self.rows {
                row.iter_mut().for_each(|c| *c /= 2);
            }
            self.samples /= 2;
        }
    }
}

/// A W-TinyLFU cache of block keys.
#[derive(Debug, Clone)]
pub struct WTinyLfu {
    capacity: usize,
    window_cap: usize,
    protected_cap: usize,
    window: RecencyList,
    probation: RecencyList,
    protected: RecencyList,
    sketch: Sketch,
}

impl WTinyLfu {
    /// An empty cache of `capacity` blocks.
    #[must_use]
    pub fn new(capacity: usize) -> WTinyLfu {
        let window_cap = (capacity / 100).max(1).min(capacity);
        WTinyLfu {
            capacity,
            window_cap,
            protected_cap: (capacity - window_cap) * 4 / 5,
            window: RecencyList::new(),
            probation: RecencyList::new(),
            protected: RecencyList::new(),
            sketch: Sketch::new(capacity),
        }
    }

    fn main_len(&self) -> usize {
        self.probation.len() + self.protected.len()
    }

    /// The main space's victim: the oldest probation block, else the oldest protected one.
    fn main_victim(&self) -> Option<BlockKey> {
        self.probation.oldest().or_else(|| self.protected.oldest())
    }

    fn remove_main(&mut self, key: BlockKey) {
        if !self.probation.remove(key) {
            self.protected.remove(key);
        }
    }
}

impl BlockCache for WTinyLfu {
    fn contains(&self, key: BlockKey) -> bool {
        self.window.contains(key) || self.probation.contains(key) || self.protected.contains(key)
    }

    fn touch(&mut self, key: BlockKey) {
        self.sketch.increment(key);
        if self.probation.remove(key) {
            self.protected.push(key);
            while self.protected.len() > self.protected_cap {
                let k = self.protected.pop_oldest().expect("non-empty");
                self.probation.push(k);
            }
        } else if self.protected.contains(key) {
            self.protected.push(key);
        } else {
            self.window.push(key);
        }
    }

    fn evict_to_capacity(&mut self) -> usize {
        let mut n = 0;
        while self.len() > self.capacity {
            if self.window.len() > self.window_cap {
                let cand = self.window.pop_oldest().expect("non-empty");
                if self.main_len() < self.capacity - self.window_cap {
                    self.probation.push(cand);
                    continue;
                }
                n += 1;
                let Some(victim) = self.main_victim() else {
                    continue;
                };
                if self.sketch.frequency(cand) > self.sketch.frequency(victim) {
                    self.remove_main(victim);
                    self.probation.push(cand);
                }
            } else {
                let victim = self.main_victim().or_else(|| self.window.oldest());
                let Some(victim) = victim else { break };
                if !self.window.remove(victim) {
                    self.remove_main(victim);
                }
                n += 1;
            }
        }
        n
    }

    fn len(&self) -> usize {
        self.window.len() + self.main_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(c: &mut WTinyLfu, keys: &[u64]) {
        for k in keys {
            c.touch(BlockKey(*k));
            c.evict_to_capacity();
        }
    }

    #[test]
    fn a_frequent_block_is_not_displaced_by_a_scan() {
        let mut c = WTinyLfu::new(10);
        run(&mut c, &[1, 1, 1, 1]);
        run(&mut c, &(100..200).collect::<Vec<_>>());
        assert!(
            c.contains(BlockKey(1)),
            "the scan loses every admission duel"
        );
        assert_eq!(c.len(), 10);
    }

    #[test]
    fn the_sketch_counts_and_halves() {
        let mut s = Sketch::new(1);
        for _ in 0..5 {
            s.increment(BlockKey(7));
        }
        assert_eq!(s.frequency(BlockKey(7)), 5);
        for _ in 0..5 {
            s.increment(BlockKey(7));
        }
        // Reset after 10 samples: the count was halved once on the way.
        assert!(s.frequency(BlockKey(7)) < 10);
    }
}
