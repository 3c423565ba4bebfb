//! LIRS (Jiang and Zhang, SIGMETRICS 2002): blocks with a low inter-reference recency (LIR) hold 99% of
//! the capacity; the other 1% is a FIFO `Q` of resident high-IRR (HIR) blocks. The stack `S` orders
//! blocks by recency and keeps non-resident HIR keys, so a block whose reuse distance is shorter than
//! the oldest LIR block's becomes LIR when it comes back.
//!
//! Adapted to evicting after a whole request is stored: insertion never evicts;
//! [`BlockCache::evict_to_capacity`] evicts from the front of `Q`. Non-resident keys in `S` are bounded
//! to twice the capacity (the oldest are forgotten first).

use std::collections::HashMap;

use transfer_engine::policy::BlockKey;

use crate::cache::BlockCache;
use policy::recency::RecencyList;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Lir,
    HirResident,
    HirNonResident,
}

/// A LIRS cache of block keys.
#[derive(Debug, Clone)]
pub struct Lirs {
    capacity: usize,
    lir_cap: usize,
    lir_len: usize,
    status: HashMap<BlockKey, Status>,
    stack: RecencyList,
    queue: RecencyList,
    non_resident: RecencyList,
}

impl Lirs {
    /// An empty cache of `capacity` blocks (1% of it, at least one block, for resident HIR blocks).
    #[must_use]
    pub fn new(capacity: usize) -> Lirs {
        let hir_cap = (capacity / 100).max(1).min(capacity);
        Lirs {
            capacity,
            lir_cap: capacity - hir_cap,
            lir_len: 0,
            status: HashMap::new(),
            stack: RecencyList::new(),
            queue: RecencyList::new(),
            non_resident: RecencyList::new(),
        }
    }

    /// Whether `key` is a resident LIR block.
    #[must_use]
    pub fn is_lir(&self, key: BlockKey) -> bool {
        self.status.get(&key) == Some(&Status::Lir)
    }

    /// Removes HIR entries from the bottom of the stack until its bottom is a LIR block.
    fn prune(&mut self) {
        while let Some(k) = self.stack.oldest() {
            match self.status[&k] {
                Status::Lir => break,
                Status::HirResident => {}
                Status::HirNonResident => {
                    self.status.remove(&k);
                    self.non_resident.remove(k);
                }
            }
            self.stack.pop_oldest();
        }
    }

    /// Demotes bottom LIR blocks to resident HIR until the LIR set fits its share.
    fn demote(&mut self) {
        while self.lir_len > self.lir_cap {
            let Some(k) = self.stack.pop_oldest() else {
                break;
            };
            self.status.insert(k, Status::HirResident);
            self.queue.push(k);
            self.lir_len -= 1;
            self.prune();
        }
    }

    fn promote(&mut self, key: BlockKey) {
        self.status.insert(key, Status::Lir);
        self.lir_len += 1;
        self.stack.push(key);
        self.demote();
        self.prune();
    }
}

impl BlockCache for Lirs {
    fn contains(&self, key: BlockKey) -> bool {
        matches!(
            self.status.get(&key),
            Some(Status::Lir | Status::HirResident)
        )
    }

    fn touch(&mut self, key: BlockKey) {
        match self.status.get(&key).copied() {
            Some(Status::Lir) => {
                self.stack.push(key);
                self.prune();
            }
            Some(Status::HirResident) if self.stack.contains(key) => {
                self.queue.remove(key);
                self.promote(key);
            }
            Some(Status::HirResident) => {
                self.stack.push(key);
                self.queue.push(key);
            }
            Some(Status::HirNonResident) => {
                self.non_resident.remove(key);
                self.promote(key);
            }
            None if self.lir_len < self.lir_cap => self.promote(key),
            None => {
                self.status.insert(key, Status::HirResident);
                self.stack.push(key);
                self.queue.push(key);
            }
        }
    }

    fn evict_to_capacity(&mut self) -> usize {
        let mut n = 0;
        while self.len() > self.capacity {
            let Some(k) = self.queue.pop_oldest() else {
                break;
            };
            n += 1;
            if self.stack.contains(k) {
                self.status.insert(k, Status::HirNonResident);
                self.non_resident.push(k);
                while self.non_resident.len() > 2 * self.capacity {
                    let old = self.non_resident.pop_oldest().expect("non-empty");
                    self.stack.remove(old);
                    self.status.remove(&old);
                }
            } else {
                self.status.remove(&k);
            }
        }
        n
    }

    fn len(&self) -> usize {
        self.lir_len + self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(c: &mut Lirs, keys: &[u64]) {
        for k in keys {
            c.touch(BlockKey(*k));
            c.evict_to_capacity();
        }
    }

    #[test]
    fn the_classic_example_keeps_the_low_irr_blocks() {
        // Capacity 3: two LIR blocks and one HIR slot (the capacity is below 100, so one block).
        let mut c = Lirs::new(3);
        run(&mut c, &[1, 2, 3, 1, 2, 4, 1, 2, 5]);
        assert!(c.is_lir(BlockKey(1)) && c.is_lir(BlockKey(2)));
        assert!(c.contains(BlockKey(5)) && !c.contains(BlockKey(3)) && !c.contains(BlockKey(4)));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn a_non_resident_block_reused_soon_becomes_lir() {
        let mut c = Lirs::new(3);
        run(&mut c, &[1, 2, 3, 4]); // 3 is evicted but stays in S as non-resident HIR
        assert!(!c.contains(BlockKey(3)));
        run(&mut c, &[3]);
        assert!(
            c.is_lir(BlockKey(3)),
            "its reuse distance beat the oldest LIR block's"
        );
        assert!(!c.is_lir(BlockKey(1)));
        assert_eq!(c.len(), 3);
    }
}
