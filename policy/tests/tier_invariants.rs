//! Property tests of the tier manager's invariants, checked against a shadow model built only from the
//! moves it emits.

use std::collections::BTreeMap;
use std::time::Duration;

use policy::{NamespaceId, TierCapacities, TierConfig, TierManager};
use proptest::prelude::*;
use transfer_engine::policy::{BlockKey, Tier, TierMove, TierPolicy};

#[derive(Debug, Clone)]
enum Op {
    /// Insert key `k` under the parent at index `p` of the keys inserted so far (if any).
    Insert {
        k: u64,
        p: Option<usize>,
        ns: u64,
    },
    Access {
        i: usize,
    },
    DropNamespace {
        ns: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..64u64, proptest::option::of(0..64usize), 0..2u64).prop_map(|(k, p, ns)| Op::Insert { k, p, ns }),
        4 => (0..64usize).prop_map(|i| Op::Access { i }),
        1 => (0..2u64).prop_map(|ns| Op::DropNamespace { ns }),
    ]
}

struct Shadow {
    tiers: BTreeMap<BlockKey, Tier>,
    parents: BTreeMap<BlockKey, BlockKey>,
    namespaces: BTreeMap<BlockKey, u64>,
}

impl Shadow {
    fn apply(&mut self, moves: &[TierMove]) {
        for mv in moves {
            assert_eq!(
                self.tiers.get(&mv.key),
                Some(&mv.from),
                "move from where the block is: {mv:?}"
            );
            match mv.to {
                Some(to) => {
                    self.tiers.insert(mv.key, to);
                }
                None => {
                    self.tiers.remove(&mv.key);
                    let orphan = self
                        .parents
                        .iter()
                        .find(|(c, p)| **p == mv.key && self.tiers.contains_key(*c));
                    assert!(
                        orphan.is_none(),
                        "parent {:?} evicted while child stays",
                        mv.key
                    );
                    self.parents.remove(&mv.key);
                    self.namespaces.remove(&mv.key);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn capacities_chains_and_moves_stay_consistent(
        gpu in 0..6usize, host in 0..6usize, remote in 0..6usize,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let caps = TierCapacities { gpu, host, remote };
        let mut m = TierManager::new(TierConfig::new(caps)).unwrap();
        let mut shadow = Shadow {
            tiers: BTreeMap::new(),
            parents: BTreeMap::new(),
            namespaces: BTreeMap::new(),
        };
        let mut inserted: Vec<BlockKey> = Vec::new();
        for (t, op) in ops.into_iter().enumerate() {
            let now = Duration::from_millis(t as u64 * 10);
            let request = t as u64 / 3;
            let moves = match op {
                Op::Insert { k, p, ns } => {
                    let key = BlockKey(k);
                    let parent = p.and_then(|i| inserted.get(i % inserted.len().max(1)).copied())
                        .filter(|p| *p != key);
                    let fresh = m.tier_of(key).is_none();
                    // Linked only to a resident parent of the same namespace; otherwise a chain root.
                    let link = parent.filter(|p| {
                        shadow.tiers.contains_key(p) && shadow.namespaces.get(p) == Some(&ns)
                    });
                    if fresh {
                        shadow.tiers.insert(key, Tier::Gpu);
                        shadow.namespaces.insert(key, ns);
                        shadow.parents.remove(&key);
                        if let Some(p) = link {
                            shadow.parents.insert(key, p);
                        }
                    }
                    let moves = m.insert(NamespaceId(ns), key, parent, request, now);
                    if fresh && m.tier_of(key).is_some() {
                        prop_assert_eq!(m.parent_of(key), link);
                    }
                    inserted.push(key);
                    moves
                }
                Op::Access { i } => match inserted.get(i % inserted.len().max(1)) {
                    Some(&key) => m.on_access(key, request, now),
                    None => Vec::new(),
                },
                Op::DropNamespace { ns } => {
                    let moves = m.drop_namespace(NamespaceId(ns));
                    let left = shadow.namespaces.iter().filter(|(k, n)| **n == ns && !moves.iter().any(|mv| mv.key == **k)).count();
                    prop_assert_eq!(left, 0, "dropping a namespace frees all its blocks");
                    moves
                }
            };
            shadow.apply(&moves);
            // Every block in at most one tier, and the manager agrees with the moves it emitted.
            for k in 0..64 {
                prop_assert_eq!(m.tier_of(BlockKey(k)), shadow.tiers.get(&BlockKey(k)).copied());
            }
            // No tier above capacity.
            for (tier, cap) in [(Tier::Gpu, gpu), (Tier::Host, host), (Tier::Remote, remote)] {
                let n = shadow.tiers.values().filter(|t| **t == tier).count();
                prop_assert!(n <= cap, "{:?} holds {} > {}", tier, n, cap);
                prop_assert_eq!(m.len(tier), n);
            }
            // A resident child's parent is resident and at least as near.
            for (child, parent) in &shadow.parents {
                if let Some(ct) = shadow.tiers.get(child) {
                    let pt = shadow.tiers.get(parent);
                    prop_assert!(pt.is_some_and(|pt| pt <= ct), "child {:?} in {:?}, parent {:?} in {:?}", child, ct, parent, pt);
                }
            }
        }
    }
}
