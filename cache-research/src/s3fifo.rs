//! S3-FIFO (Yang et al., SOSP 2023): a small FIFO `S` (10% of the capacity) that filters one-hit
//! blocks, a main FIFO `M` with lazy promotion (a 2-bit use counter gives a block another round), and a
//! ghost FIFO `G` of keys evicted from `S` (as many as `M` holds) that sends a returning key straight
//! to `M`.
//!
//! Adapted to evicting after a whole request is stored: insertion never evicts;
//! [`BlockCache::evict_to_capacity`] evicts from `S` while it is over its share, else from `M`.

use std::collections::{HashMap, VecDeque};

use transfer_engine::policy::BlockKey;

use crate::cache::BlockCache;

/// Largest value of the per-block use counter.
const MAX_FREQ: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

/// An S3-FIFO cache of block keys.
#[derive(Debug, Clone)]
pub struct S3Fifo {
    capacity: usize,
    small_cap: usize,
    resident: HashMap<BlockKey, (Queue, u8)>,
    small: VecDeque<BlockKey>,
    main: VecDeque<BlockKey>,
    small_len: usize,
    /// Ghost keys with the stamp of their entry in `ghost_order`.
    ghosts: HashMap<BlockKey, u64>,
    ghost_order: VecDeque<(BlockKey, u64)>,
    ghost_stamp: u64,
}

impl S3Fifo {
    /// An empty cache of `capacity` blocks.
    #[must_use]
    pub fn new(capacity: usize) -> S3Fifo {
        S3Fifo {
            capacity,
            small_cap: capacity.div_ceil(10),
            resident: HashMap::new(),
            small: VecDeque::new(),
            main: VecDeque::new(),
            small_len: 0,
            ghosts: HashMap::new(),
            ghost_order: VecDeque::new(),
            ghost_stamp: 0,
        }
    }

    fn remember(&mut self, key: BlockKey) {
        self.ghost_stamp += 1;
        self.ghosts.insert(key, self.ghost_stamp);
        self.ghost_order.push_back((key, self.ghost_stamp));
        let bound = self.capacity - self.small_cap.min(self.capacity);
        while self.ghosts.len() > bound.max(1) {
            let Some((k, s)) = self.ghost_order.pop_front() else {
                break;
            };
            if self.ghosts.get(&k) == Some(&s) {
                self.ghosts.remove(&k);
            }
        }
    }

    /// Evicts one block from `S` (or moves it to `M` if it was used again); true if one left the cache.
    fn evict_small(&mut self) -> bool {
        let Some(k) = self.small.pop_front() else {
            return false;
        };
        self.small_len -= 1;
        let freq = self.resident[&k].1;
        if freq >= 1 {
            self.resident.insert(k, (Queue::Main, 0));
            self.main.push_back(k);
            false
        } else {
            self.resident.remove(&k);
            self.remember(k);
            true
        }
    }

    /// Evicts one block from `M` (giving used ones another round); true if one left the cache.
    fn evict_main(&mut self) -> bool {
        while let Some(k) = self.main.pop_front() {
            let entry = self.resident.get_mut(&k).expect("main keys are resident");
            if entry.1 > 0 {
                entry.1 -= 1;
                self.main.push_back(k);
            } else {
                self.resident.remove(&k);
                return true;
            }
        }
        false
    }
}

impl BlockCache for S3Fifo {
    fn contains(&self, key: BlockKey) -> bool {
        self.resident.contains_key(&key)
    }

    fn touch(&mut self, key: BlockKey) {
        if let Some(entry) = self.resident.get_mut(&key) {
            entry.1 = (entry.1 + 1).min(MAX_FREQ);
        } else if self.ghosts.remove(&key).is_some() {
            self.resident.insert(key, (Queue::Main, 0));
            self.main.push_back(key);
        } else {
            self.resident.insert(key, (Queue::Small, 0));
            self.small.push_back(key);
            self.small_len += 1;
        }
    }

    fn evict_to_capacity(&mut self) -> usize {
        let mut n = 0;
        while self.resident.len() > self.capacity {
            let gone = if self.small_len > self.small_cap || self.main.is_empty() {
                self.evict_small()
            } else {
                self.evict_main()
            };
            n += usize::from(gone);
        }
        n
    }

    fn len(&self) -> usize {
        self.resident.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(c: &mut S3Fifo, keys: &[u64]) {
        for k in keys {
            c.touch(BlockKey(*k));
            c.evict_to_capacity();
        }
    }

    #[test]
    fn one_hit_blocks_leave_from_the_small_queue() {
        let mut c = S3Fifo::new(10);
        // 1 and 2 are used twice while in S, so they move to M; the scan passes through S only.
        run(&mut c, &[1, 2, 1, 2]);
        run(&mut c, &(100..140).collect::<Vec<_>>());
        assert!(c.contains(BlockKey(1)) && c.contains(BlockKey(2)));
        assert_eq!(c.len(), 10);
    }

    #[test]
    fn a_ghost_comes_back_into_main() {
        let mut c = S3Fifo::new(10);
        run(&mut c, &(0..12).collect::<Vec<_>>()); // 0 and 1 evicted from S into G
        assert!(!c.contains(BlockKey(0)));
        run(&mut c, &[0]);
        assert_eq!(c.resident[&BlockKey(0)].0, Queue::Main);
    }
}
