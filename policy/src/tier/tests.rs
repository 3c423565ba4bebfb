use super::*;
use transfer_engine::policy::{RequestInfo, TierPolicy};

const T0: Duration = Duration::ZERO;

fn manager(gpu: usize, host: usize, remote: usize) -> TierManager {
    TierManager::new(TierConfig::new(TierCapacities { gpu, host, remote })).unwrap()
}

#[test]
fn demotes_through_the_tiers_then_evicts() {
    let mut m = manager(1, 1, 0);
    assert!(
        m.on_insert(NamespaceId::DEFAULT, BlockKey(1), None, 1, T0)
            .is_empty()
    );
    let moves = m.on_insert(NamespaceId::DEFAULT, BlockKey(2), None, 2, T0);
    assert_eq!(moves.len(), 1);
    assert_eq!((moves[0].from, moves[0].to), (Tier::Gpu, Some(Tier::Host)));
    let moves = m.on_insert(NamespaceId::DEFAULT, BlockKey(3), None, 3, T0);
    assert_eq!(
        moves.iter().filter(|mv| mv.to.is_none()).count(),
        1,
        "{moves:?}"
    );
    assert_eq!(
        (m.len(Tier::Gpu), m.len(Tier::Host), m.len(Tier::Remote)),
        (1, 1, 0)
    );
}

#[test]
fn access_promotes_the_block_and_its_farther_ancestors() {
    let mut m = manager(2, 4, 0);
    m.on_insert(NamespaceId::DEFAULT, BlockKey(1), None, 1, T0);
    m.on_insert(NamespaceId::DEFAULT, BlockKey(2), Some(BlockKey(1)), 1, T0);
    // Two unrelated roots push the chain down to the host tier, tail first.
    m.on_insert(NamespaceId::DEFAULT, BlockKey(10), None, 2, T0);
    m.on_insert(NamespaceId::DEFAULT, BlockKey(11), None, 3, T0);
    assert_eq!(m.tier_of(BlockKey(1)), Some(Tier::Host));
    assert_eq!(m.tier_of(BlockKey(2)), Some(Tier::Host));
    let moves = m.on_access(BlockKey(2), 4, T0);
    let promoted: Vec<_> = moves
        .iter()
        .filter(|mv| mv.to == Some(Tier::Gpu))
        .map(|mv| mv.key)
        .collect();
    assert_eq!(
        promoted,
        vec![BlockKey(1), BlockKey(2)],
        "parent first: {moves:?}"
    );
    assert_eq!(m.len(Tier::Gpu), 2);
}

#[test]
fn chain_tails_are_evicted_before_parents() {
    let mut m = manager(3, 0, 0);
    let mut parent = None;
    for k in 1..=3 {
        m.on_insert(NamespaceId::DEFAULT, BlockKey(k), parent, 1, T0);
        parent = Some(BlockKey(k));
    }
    // A hot unrelated block used by many requests.
    m.on_insert(NamespaceId::DEFAULT, BlockKey(9), None, 2, T0);
    for r in 3..10 {
        m.on_access(BlockKey(9), r, T0);
    }
    assert_eq!(m.tier_of(BlockKey(3)), None, "the tail went first");
    assert_eq!(m.tier_of(BlockKey(1)), Some(Tier::Gpu));
    assert_eq!(m.parent_of(BlockKey(2)), Some(BlockKey(1)));
}

#[test]
fn dropping_a_namespace_frees_exactly_its_blocks_children_first() {
    let mut m = manager(10, 0, 0);
    let (a, b) = (NamespaceId(1), NamespaceId(2));
    m.insert(a, BlockKey(1), None, 1, T0);
    m.insert(a, BlockKey(2), Some(BlockKey(1)), 1, T0);
    m.insert(b, BlockKey(3), None, 2, T0);
    // The trait carries the namespace: a root of `a` lands in `a`, not in the default one.
    m.on_insert(a, BlockKey(4), Some(BlockKey(2)), 1, T0);
    m.on_insert(a, BlockKey(5), None, 1, T0);
    let moves = m.drop_namespace(a);
    let keys: Vec<_> = moves.iter().map(|mv| mv.key).collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert!(keys.contains(&BlockKey(5)));
    let pos = |k| keys.iter().position(|x| *x == BlockKey(k)).unwrap();
    assert!(
        pos(4) < pos(2) && pos(2) < pos(1),
        "children first: {keys:?}"
    );
    assert!(moves.iter().all(|mv| mv.to.is_none()));
    assert_eq!(m.tier_of(BlockKey(3)), Some(Tier::Gpu));
    assert_eq!(m.len(Tier::Gpu), 1);
}

#[test]
fn evicted_blocks_remember_their_heat() {
    let mut m = manager(1, 0, 0);
    m.on_insert(NamespaceId::DEFAULT, BlockKey(1), None, 1, T0);
    m.on_access(BlockKey(1), 2, T0);
    m.on_insert(NamespaceId::DEFAULT, BlockKey(2), None, 3, T0);
    let back = if m.tier_of(BlockKey(1)).is_some() {
        BlockKey(2)
    } else {
        BlockKey(1)
    };
    m.on_insert(NamespaceId::DEFAULT, back, None, 4, T0);
    if let Some(h) = m.heat(back) {
        assert!(h.sharers() >= 2, "a returning block resumes its history");
    }
}

#[test]
fn a_block_shared_by_two_requests_survives_a_scan_of_one_off_blocks() {
    let mut m = manager(4, 0, 0);
    m.on_insert(NamespaceId::DEFAULT, BlockKey(1), None, 1, T0);
    m.on_access(BlockKey(1), 2, T0);
    for k in 10..40 {
        m.on_insert(NamespaceId::DEFAULT, BlockKey(k), None, k, T0);
    }
    assert_eq!(m.tier_of(BlockKey(1)), Some(Tier::Gpu));
}

#[test]
fn ghosts_coming_back_from_the_recent_segment_grow_its_share() {
    let mut m = manager(4, 0, 0);
    let before = m.recent_share;
    for k in 0..12 {
        m.on_insert(NamespaceId::DEFAULT, BlockKey(k), None, k, T0);
    }
    // Blocks 0..8 were evicted from the recent segment; bring two back.
    m.on_insert(NamespaceId::DEFAULT, BlockKey(0), None, 100, T0);
    m.on_insert(NamespaceId::DEFAULT, BlockKey(1), None, 101, T0);
    assert!(m.recent_share > before);
    // They come back shared (two requests used them), so they are frequent now.
    assert_eq!(m.blocks[&BlockKey(1)].seg, 1);
}

#[test]
fn bad_configs_are_refused_with_a_hint() {
    let mut cfg = TierConfig::new(TierCapacities {
        gpu: 1,
        host: 0,
        remote: 0,
    });
    cfg.ghost_factor = f64::NAN;
    assert!(
        TierManager::new(cfg)
            .unwrap_err()
            .to_string()
            .contains("ghost_factor")
    );
}

#[test]
fn the_default_request_hook_stores_every_block_in_order() {
    let mut p = transfer_engine::policy::NoTiering::default();
    let keys = [BlockKey(1), BlockKey(2)];
    let info = RequestInfo {
        id: 1,
        ns: NamespaceId::DEFAULT,
        keys: &keys,
        partial_last: false,
        output_tokens: None,
    };
    assert!(p.on_request(&info, T0).is_empty());
    assert!(keys.iter().all(|k| p.tier_of(*k) == Some(Tier::Gpu)));
}

#[test]
fn a_heat_request_settles_once_and_drops_its_tail() {
    let mut m = manager(2, 0, 0);
    let keys = [BlockKey(1), BlockKey(2), BlockKey(3)];
    let info = RequestInfo {
        id: 1,
        ns: NamespaceId::DEFAULT,
        keys: &keys,
        partial_last: false,
        output_tokens: None,
    };
    let moves = m.on_request(&info, T0);
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!((moves[0].key, moves[0].to), (BlockKey(3), None));
    assert_eq!(m.parent_of(BlockKey(2)), Some(BlockKey(1)));
}

mod continuation_order {
    use super::*;
    use crate::trace::Request;

    fn hosted(gpu: usize, host: usize, remote: usize) -> TierManager {
        TierManager::new(TierConfig::continuation(TierCapacities {
            gpu,
            host,
            remote,
        }))
        .unwrap()
    }

    /// Conversations sharing a few roots, some ending in a partial block (deterministic LCG).
    fn conversations(n: usize, seed: u64) -> Vec<Request> {
        let mut x = seed;
        let mut rnd = move |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let mut convs: Vec<Vec<u64>> = Vec::new();
        let mut next_id = 1000;
        (0..n)
            .map(|i| {
                let c = rnd(convs.len() as u64 + 3) as usize;
                if c >= convs.len() {
                    convs.push(vec![rnd(4)]);
                }
                let at = c.min(convs.len() - 1);
                let conv = &mut convs[at];
                for _ in 0..=rnd(5) {
                    conv.push(next_id);
                    next_id += 1;
                }
                Request {
                    timestamp: i as u64 * 3_000,
                    input_length: conv.len() as u64 * 512 - rnd(2) * 100,
                    output_length: rnd(2000),
                    hash_ids: conv.clone(),
                }
            })
            .collect()
    }

    fn send(m: &mut TierManager, i: usize, r: &Request) -> Vec<TierMove> {
        let keys: Vec<BlockKey> = r.hash_ids.iter().map(|k| BlockKey(*k)).collect();
        let info = RequestInfo {
            id: i as u64,
            ns: NamespaceId::DEFAULT,
            keys: &keys,
            partial_last: r.input_length < 512 * keys.len() as u64,
            output_tokens: Some(r.output_length),
        };
        m.on_request(&info, Duration::from_millis(r.timestamp))
    }

    #[test]
    fn capacities_chains_and_metadata_hold_across_tiers() {
        for (gpu, host, remote) in [
            (0, 0, 0),
            (1, 0, 0),
            (5, 0, 0),
            (8, 8, 0),
            (3, 0, 6),
            (20, 10, 5),
        ] {
            let mut m = hosted(gpu, host, remote);
            for (i, r) in conversations(300, gpu as u64 + 3).iter().enumerate() {
                let moves = send(&mut m, i, r);
                for mv in &moves {
                    assert!(mv.to.is_none_or(|to| to != mv.from), "{mv:?}");
                }
                for (tier, cap) in [(Tier::Gpu, gpu), (Tier::Host, host), (Tier::Remote, remote)] {
                    assert!(m.len(tier) <= cap, "{tier:?} over capacity");
                }
                for (k, b) in &m.blocks {
                    if let Some(p) = b.parent {
                        let pt = m.tier_of(p);
                        assert!(
                            pt.is_some_and(|pt| idx(pt) <= b.tier),
                            "{k:?} above its parent"
                        );
                    }
                }
                let md = m.metadata();
                let near = md.nearest.expect("continuation order");
                let scale = gpu.max(64);
                assert_eq!(near.blocks, m.len(Tier::Gpu), "the cache mirrors the tier");
                assert!(md.blocks <= gpu + host + remote);
                assert!(md.ghosts <= 8 * (gpu + host + remote));
                assert!(near.groups <= near.blocks.max(1));
                assert!(near.group_keys <= 2 * near.blocks + r.hash_ids.len());
                assert!(
                    near.requests <= 2 * scale && near.seen <= 8 * scale,
                    "{near:?}"
                );
            }
        }
    }

    #[test]
    fn chain_tails_leave_the_nearest_tier_before_their_parents() {
        let mut m = hosted(4, 0, 0);
        let chain = [1, 2, 3, 4].map(BlockKey);
        let info = |id, keys: &'static [BlockKey]| RequestInfo {
            id,
            ns: NamespaceId::DEFAULT,
            keys,
            partial_last: false,
            output_tokens: None,
        };
        static CHAIN: [BlockKey; 4] = [BlockKey(1), BlockKey(2), BlockKey(3), BlockKey(4)];
        static OTHER: [BlockKey; 2] = [BlockKey(7), BlockKey(8)];
        assert!(m.on_request(&info(1, &CHAIN), T0).is_empty());
        let moves = m.on_request(&info(2, &OTHER), Duration::from_secs(1));
        let gone: Vec<BlockKey> = moves.iter().map(|mv| mv.key).collect();
        assert_eq!(gone.len(), 2, "{moves:?}");
        // Whatever went, the chain's resident part is a prefix and leaves went before their parents.
        let resident = chain
            .iter()
            .take_while(|k| m.tier_of(**k).is_some())
            .count();
        assert!(chain[resident..].iter().all(|k| m.tier_of(*k).is_none()));
        for w in chain.windows(2) {
            if let (Some(p), Some(c)) = (
                gone.iter().position(|k| *k == w[0]),
                gone.iter().position(|k| *k == w[1]),
            ) {
                assert!(c < p, "child before parent: {gone:?}");
            }
        }
    }

    #[test]
    fn the_partial_last_block_is_demoted_first() {
        let mut m = hosted(3, 4, 0);
        static A: [BlockKey; 2] = [BlockKey(1), BlockKey(2)];
        static B: [BlockKey; 2] = [BlockKey(3), BlockKey(4)];
        let info = |id, keys: &'static [BlockKey], partial_last| RequestInfo {
            id,
            ns: NamespaceId::DEFAULT,
            keys,
            partial_last,
            output_tokens: Some(100),
        };
        m.on_request(&info(1, &A, false), T0);
        let moves = m.on_request(&info(2, &B, true), Duration::from_millis(10));
        assert_eq!(
            moves,
            vec![TierMove {
                key: BlockKey(4),
                from: Tier::Gpu,
                to: Some(Tier::Host)
            }]
        );
        // Using it again brings it back to the GPU tier.
        let moves = m.on_request(&info(3, &B, false), Duration::from_millis(20));
        assert!(moves.contains(&TierMove {
            key: BlockKey(4),
            from: Tier::Host,
            to: Some(Tier::Gpu)
        }));
        assert_eq!(m.len(Tier::Gpu), 3);
    }

    #[test]
    fn block_level_calls_keep_the_cache_in_step() {
        let mut m = hosted(3, 2, 0);
        let mut parent = None;
        for k in 1..=6 {
            m.on_insert(NamespaceId::DEFAULT, BlockKey(k), parent, 1, T0);
            parent = Some(BlockKey(k));
        }
        for r in 2..40 {
            m.on_access(BlockKey(r % 7), r, Duration::from_millis(r * 100));
            let near = m.metadata().nearest.unwrap();
            assert_eq!(near.blocks, m.len(Tier::Gpu));
            assert!(near.group_keys <= 2 * near.blocks + 1, "{near:?}");
        }
        let moves = m.drop_namespace(NamespaceId::DEFAULT);
        assert_eq!(moves.len(), 5);
        assert_eq!(m.metadata().nearest.unwrap().blocks, 0);
    }
}

#[test]
fn host_victims_used_by_one_request_are_dropped_when_admission_wants_two() {
    let mut cfg = TierConfig::new(TierCapacities {
        gpu: 0,
        host: 2,
        remote: 64,
    });
    cfg.demote_min_sharers = 2;
    let mut m = TierManager::new(cfg).unwrap();
    let ns = NamespaceId::DEFAULT;
    let (mut demoted, mut dropped) = (0, 0);
    for k in 0..40u64 {
        m.insert(ns, BlockKey(k), None, 2 * k, T0);
        if k % 3 == 0 {
            m.access(BlockKey(k), 2 * k + 1, T0); // a second request
        }
        let sharers: HashMap<BlockKey, u32> = m
            .blocks
            .iter()
            .map(|(key, b)| (*key, b.heat.sharers()))
            .collect();
        let moves = m.insert(ns, BlockKey(1000 + k), None, 10_000 + k, T0);
        for mv in moves.iter().filter(|mv| mv.from == Tier::Host) {
            let uses = sharers.get(&mv.key).copied().unwrap_or(1);
            assert_eq!(mv.to.is_some(), uses >= 2, "{mv:?} used by {uses}");
            if mv.to.is_some() {
                demoted += 1;
            } else {
                dropped += 1;
            }
        }
    }
    assert!(
        demoted > 0 && dropped > 0,
        "{demoted} demoted, {dropped} dropped"
    );
}

#[test]
fn a_victim_whose_child_lives_below_is_admitted_whatever_its_uses() {
    let mut cfg = TierConfig::new(TierCapacities {
        gpu: 0,
        host: 4,
        remote: 4,
    });
    cfg.demote_min_sharers = u32::MAX;
    let mut m = TierManager::new(cfg).unwrap();
    let ns = NamespaceId::DEFAULT;
    m.insert_at(Tier::Remote, ns, BlockKey(5), None, 0, T0);
    m.insert_at(Tier::Remote, ns, BlockKey(6), Some(BlockKey(5)), 0, T0);
    m.insert(ns, BlockKey(7), None, 1, T0);
    // A use of the root brings it up; its child stays below.
    m.access(BlockKey(5), 1, T0);
    assert_eq!(m.tier_of(BlockKey(5)), Some(Tier::Host));
    assert_eq!(m.tier_of(BlockKey(6)), Some(Tier::Remote));
    assert!(
        m.admits(BlockKey(5), 2),
        "dropping it would orphan its child"
    );
    assert!(!m.admits(BlockKey(7), 2));
}

#[test]
fn blocks_placed_below_stay_there_and_a_removed_block_takes_its_chain() {
    let mut m = manager(0, 2, 8);
    let ns = NamespaceId::DEFAULT;
    for k in 1..=4 {
        let parent = (k > 1).then(|| BlockKey(k - 1));
        assert!(
            m.insert_at(Tier::Remote, ns, BlockKey(k), parent, 0, T0)
                .is_empty()
        );
    }
    assert_eq!((m.len(Tier::Host), m.len(Tier::Remote)), (0, 4));
    assert_eq!(m.parent_of(BlockKey(3)), Some(BlockKey(2)));
    // Already resident: left alone.
    assert!(
        m.insert_at(Tier::Remote, ns, BlockKey(2), None, 0, T0)
            .is_empty()
    );
    let gone: Vec<BlockKey> = m.remove(BlockKey(2)).iter().map(|mv| mv.key).collect();
    assert_eq!(
        gone,
        vec![BlockKey(4), BlockKey(3), BlockKey(2)],
        "children first"
    );
    assert_eq!(m.len(Tier::Remote), 1);
    assert!(m.remove(BlockKey(99)).is_empty());
}
