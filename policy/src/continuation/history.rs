//! Recent requests: which earlier request each one continues (its turn number), and the feed of
//! fully observed outcomes to [`Survival`].
//!
//! A request continues an earlier one when its longest already-seen prefix ends where that one ended
//! (at its last block, or at the block before it when that last block was partial and so was
//! rewritten by the next turn). Seen keys live in a bounded recency set; requests are remembered in
//! a bounded window, oldest forgotten first.

use std::collections::{HashMap, VecDeque};

use transfer_engine::policy::BlockKey;

use super::survival::{BINS, Class, Survival, edges};
use crate::recency::RecencyList;

/// What the history says about a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// The request's sequence number.
    pub seq: u64,
    /// Its class.
    pub class: Class,
    /// The earlier request it continues, if any.
    pub continues: Option<u64>,
}

#[derive(Debug, Clone)]
struct Record {
    t: u64,
    class: Class,
    len: usize,
    turn: u32,
    /// Time from arrival to the first continuation.
    continued: Option<u64>,
    ends: [Option<BlockKey>; 2],
}

/// Bounded memory of recent requests and seen keys.
#[derive(Debug, Clone)]
pub struct History {
    records: VecDeque<Record>,
    /// Sequence number of `records[0]`.
    base: u64,
    max_records: usize,
    /// Per bin: the next request (sequence number) not yet observed through that bin.
    through: [u64; BINS],
    ends: HashMap<BlockKey, u64>,
    seen: RecencyList,
    max_seen: usize,
    use_output: bool,
    edges: [u64; BINS + 1],
}

impl History {
    /// Remembers up to `max_records` requests and `max_seen` keys.
    #[must_use]
    pub fn new(max_records: usize, max_seen: usize, use_output: bool) -> History {
        History {
            records: VecDeque::new(),
            base: 0,
            max_records: max_records.max(1),
            through: [0; BINS],
            ends: HashMap::new(),
            seen: RecencyList::new(),
            max_seen,
            use_output,
            edges: edges(),
        }
    }

    /// Requests and keys remembered.
    #[must_use]
    pub fn len(&self) -> (usize, usize) {
        (self.records.len(), self.seen.len())
    }

    /// Feeds `survival` every outcome observable at `now`, then forgets requests past the last bin.
    pub fn advance(&mut self, now: u64, survival: &mut Survival) {
        let end = self.base + self.records.len() as u64;
        let edges = &self.edges;
        for b in 0..BINS {
            let (lo, hi) = (edges[b], edges[b + 1]);
            while self.through[b] < end {
                let r = &self.records[(self.through[b] - self.base) as usize];
                if r.t + hi > now {
                    break;
                }
                match r.continued {
                    Some(d) if d < lo => {}
                    Some(d) if d < hi => survival.observe(r.class, b, true),
                    _ => survival.observe(r.class, b, false),
                }
                self.through[b] += 1;
            }
        }
        while !self.records.is_empty()
            && (self.through[BINS - 1] > self.base || self.records.len() > self.max_records)
        {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        let Some(r) = self.records.pop_front() else {
            return;
        };
        for k in r.ends.into_iter().flatten() {
            if self.ends.get(&k) == Some(&self.base) {
                self.ends.remove(&k);
            }
        }
        self.base += 1;
        for t in &mut self.through {
            *t = (*t).max(self.base);
        }
    }

    /// Records request `ids` arriving at `now`; says which request it continues and its class. An
    /// unknown output length is classed with the shortest.
    pub fn arrive(
        &mut self,
        ids: &[BlockKey],
        now: u64,
        output_tokens: Option<u64>,
        partial_last: bool,
    ) -> Arrival {
        let seq = self.base + self.records.len() as u64;
        let seen = ids.iter().take_while(|k| self.seen.contains(**k)).count();
        let prev = seen
            .checked_sub(1)
            .and_then(|i| self.ends.get(&ids[i]).copied())
            .filter(|&p| p >= self.base)
            .filter(|&p| {
                let len = self.records[(p - self.base) as usize].len;
                len == seen || len == seen + 1
            });
        let (turn, gap) = match prev {
            Some(p) => {
                let r = &mut self.records[(p - self.base) as usize];
                let gap = now.saturating_sub(r.t);
                r.continued.get_or_insert(gap);
                (r.turn + 1, Some(gap))
            }
            None => (1, None),
        };
        let output = output_tokens.filter(|_| self.use_output);
        let class = Class::new(turn, ids.len() - seen, output, gap);
        let last = ids.last().copied();
        let before_last = if partial_last && ids.len() >= 2 {
            Some(ids[ids.len() - 2])
        } else {
            None
        };
        for k in [last, before_last].into_iter().flatten() {
            self.ends.insert(k, seq);
        }
        self.records.push_back(Record {
            t: now,
            class,
            len: ids.len(),
            turn,
            continued: None,
            ends: [last, before_last],
        });
        for k in ids {
            self.seen.push(*k);
        }
        while self.seen.len() > self.max_seen {
            self.seen.pop_oldest();
        }
        while self.records.len() > self.max_records {
            self.pop_oldest();
        }
        Arrival {
            seq,
            class,
            continues: prev,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuation::survival::SurvivalConfig;

    fn keys(ids: &[u64]) -> Vec<BlockKey> {
        ids.iter().map(|i| BlockKey(*i)).collect()
    }

    #[test]
    fn a_turn_continues_the_request_whose_full_blocks_it_extends() {
        let mut h = History::new(100, 100, true);
        let a = h.arrive(&keys(&[1, 2, 3]), 0, Some(10), true);
        assert_eq!((a.seq, a.continues, a.class.turn), (0, None, 0));
        // Another conversation sharing only the first block does not continue it.
        let b = h.arrive(&keys(&[1, 9]), 1_000, Some(10), true);
        assert_eq!(b.continues, None);
        // The next turn rewrites the partial block 3 and extends 1, 2.
        let c = h.arrive(&keys(&[1, 2, 4, 5, 6]), 30_000, Some(10), true);
        assert_eq!((c.continues, c.class.turn, c.class.gap), (Some(0), 1, 1));
        assert_eq!(c.class.added, 1, "three new blocks");
    }

    #[test]
    fn outcomes_are_fed_once_fully_observed_and_memory_stays_bounded() {
        let mut h = History::new(4, 8, false);
        let mut s = Survival::new(SurvivalConfig::default());
        for i in 0..20u64 {
            h.arrive(&keys(&[100 + i, 200 + i]), i * 1_000, Some(0), false);
            h.advance(i * 1_000, &mut s);
            let (records, seen) = h.len();
            assert!(records <= 4 && seen <= 8);
        }
    }
}
