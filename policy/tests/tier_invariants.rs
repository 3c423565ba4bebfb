//! Property tests of the tier manager's invariants, checked against a shadow model built only from the
//! moves it emits.

use std::collections::BTreeMap;
use std::time::Duration;

use policy::{NamespaceId, TierCapacities, TierConfig, TierManager};
use proptest::prelude::*;
use transfer_engine::policy::{BlockKey, RequestInfo, Tier, TierMove, TierPolicy};

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
    /// A whole request ([`TierPolicy::on_request`]): keys `start..start + len` (mod 64), chained.
    Request {
        start: u64,
        len: u64,
        ns: u64,
        partial: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..64u64, proptest::option::of(0..64usize), 0..2u64).prop_map(|(k, p, ns)| Op::Insert { k, p, ns }),
        4 => (0..64usize).prop_map(|i| Op::Access { i }),
        1 => (0..2u64).prop_map(|ns| Op::DropNamespace { ns }),
        4 => (0..64u64, 1..8u64, 0..2u64, any::<bool>())
            .prop_map(|(start, len, ns, partial)| Op::Request { start, len, ns, partial }),
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
        continuation in any::<bool>(),
        demote_min_sharers in 1..4u32,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let caps = TierCapacities { gpu, host, remote };
        let mut cfg = if continuation { TierConfig::continuation(caps) } else { TierConfig::new(caps) };
        cfg.demote_min_sharers = demote_min_sharers;
        let mut m = TierManager::new(cfg).unwrap();
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
                Op::Request { start, len, ns, partial } => {
                    let keys: Vec<BlockKey> = (start..start + len).map(|k| BlockKey(k % 64)).collect();
                    let mut parent = None;
                    for &key in &keys {
                        if let std::collections::btree_map::Entry::Vacant(e) = shadow.tiers.entry(key) {
                            e.insert(Tier::Gpu);
                            shadow.namespaces.insert(key, ns);
                            shadow.parents.remove(&key);
                            let link = parent.filter(|p| shadow.namespaces.get(p) == Some(&ns));
                            if let Some(p) = link {
                                shadow.parents.insert(key, p);
                            }
                        }
                        parent = Some(key);
                        inserted.push(key);
                    }
                    let info = RequestInfo {
                        id: request,
                        ns: NamespaceId(ns),
                        keys: &keys,
                        partial_last: partial,
                        output_tokens: None,
                    };
                    m.on_request(&info, now)
                }
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
            // The continuation order mirrors the nearest tier.
            if let Some(near) = m.metadata().nearest {
                prop_assert_eq!(near.blocks, m.len(Tier::Gpu));
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
