//! ARC (Megiddo and Modha, FAST 2003): a recency list `T1` and a frequency list `T2`, each with a ghost
//! list (`B1`, `B2`) of keys it evicted; a ghost hit moves the target size `p` of `T1` toward the list
//! that was cut too short.
//!
//! Adapted to evicting after a whole request is stored: a touch adapts `p` and moves lists, and
//! [`BlockCache::evict_to_capacity`] runs ARC's REPLACE until `|T1| + |T2| <= c`, then trims the ghosts
//! to ARC's bounds (`|T1| + |B1| <= c`, all four lists `<= 2c`).

use transfer_engine::policy::BlockKey;

use crate::cache::BlockCache;
use policy::recency::RecencyList;

/// An ARC cache of block keys.
#[derive(Debug, Clone)]
pub struct Arc {
    capacity: usize,
    /// Target size of `t1`.
    p: f64,
    t1: RecencyList,
    t2: RecencyList,
    b1: RecencyList,
    b2: RecencyList,
}

impl Arc {
    /// An empty cache of `capacity` blocks.
    #[must_use]
    pub fn new(capacity: usize) -> Arc {
        Arc {
            capacity,
            p: 0.0,
            t1: RecencyList::new(),
            t2: RecencyList::new(),
            b1: RecencyList::new(),
            b2: RecencyList::new(),
        }
    }

    /// The current target size of the recency list.
    #[must_use]
    pub fn target_recent(&self) -> f64 {
        self.p
    }

    fn replace(&mut self) {
        let over_target = self.t1.len() as f64 > self.p;
        if !self.t1.is_empty() && (over_target || self.t2.is_empty()) {
            let k = self.t1.pop_oldest().expect("non-empty");
            self.b1.push(k);
        } else if let Some(k) = self.t2.pop_oldest() {
            self.b2.push(k);
        }
    }
}

impl BlockCache for Arc {
    fn contains(&self, key: BlockKey) -> bool {
        self.t1.contains(key) || self.t2.contains(key)
    }

    fn touch(&mut self, key: BlockKey) {
        let c = self.capacity as f64;
        if self.t1.remove(key) || self.t2.contains(key) {
            self.t2.push(key);
        } else if self.b1.remove(key) {
            let step = (self.b2.len() as f64 / self.b1.len().max(1) as f64).max(1.0);
            self.p = (self.p + step).min(c);
            self.t2.push(key);
        } else if self.b2.remove(key) {
            let step = (self.b1.len() as f64 / self.b2.len().max(1) as f64).max(1.0);
            self.p = (self.p - step).max(0.0);
            self.t2.push(key);
        } else {
            self.t1.push(key);
        }
    }

    fn evict_to_capacity(&mut self) -> usize {
        let mut n = 0;
        while self.len() > self.capacity {
            self.replace();
            n += 1;
        }
        while self.t1.len() + self.b1.len() > self.capacity && self.b1.pop_oldest().is_some() {}
        while self.len() + self.b1.len() + self.b2.len() > 2 * self.capacity
            && self.b2.pop_oldest().is_some()
        {}
        n
    }

    fn len(&self) -> usize {
        self.t1.len() + self.t2.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(arc: &mut Arc, keys: &[u64]) {
        for k in keys {
            arc.touch(BlockKey(*k));
            arc.evict_to_capacity();
        }
    }

    #[test]
    fn a_block_used_twice_survives_a_scan() {
        let mut arc = Arc::new(3);
        run(&mut arc, &[1, 1, 2, 3, 4, 5, 6, 7]);
        assert!(arc.contains(BlockKey(1)), "T2 holds the frequent block");
        assert_eq!(arc.len(), 3);
    }

    #[test]
    fn ghost_hits_move_the_target() {
        let mut arc = Arc::new(2);
        run(&mut arc, &[1, 1, 2, 3]); // 1 is in T2; 2 leaves T1 for B1
        assert_eq!(arc.target_recent(), 0.0);
        assert!(!arc.contains(BlockKey(2)));
        run(&mut arc, &[2]); // a B1 hit grows p and brings 2 back into T2
        assert_eq!(arc.target_recent(), 1.0);
        assert!(arc.contains(BlockKey(2)) && arc.contains(BlockKey(3)) && arc.len() == 2);
    }
}
