use super::*;

const T0: Duration = Duration::ZERO;
const NS: NamespaceId = NamespaceId::DEFAULT;

fn host_only(host: usize) -> TierManager {
    TierManager::new(TierConfig::new(TierCapacities {
        gpu: 0,
        host,
        remote: 0,
    }))
    .unwrap()
}

fn at(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

#[test]
fn a_held_block_outlives_newer_blocks_until_released() {
    let mut m = host_only(3);
    m.insert(NS, BlockKey(1), None, 1, T0);
    assert!(m.hold(BlockKey(1), true));
    assert!(m.is_held(BlockKey(1)));
    for k in 2..40 {
        m.insert(NS, BlockKey(k), None, k, at(k));
        assert_eq!(m.tier_of(BlockKey(1)), Some(Tier::Host), "after block {k}");
        assert_eq!(m.len(Tier::Host), (k as usize).min(3));
    }
    assert!(m.hold(BlockKey(1), false));
    // Released, the oldest and coldest block is the next to go.
    m.insert(NS, BlockKey(100), None, 100, at(100));
    assert_eq!(m.tier_of(BlockKey(1)), None);
}

#[test]
fn a_tier_full_of_held_blocks_turns_the_newcomer_away() {
    let mut m = host_only(2);
    m.insert(NS, BlockKey(1), None, 1, T0);
    m.insert(NS, BlockKey(2), None, 2, T0);
    m.hold(BlockKey(1), true);
    m.hold(BlockKey(2), true);
    let moves = m.insert(NS, BlockKey(3), None, 3, at(1));
    let last = moves.last().expect("a move");
    assert_eq!((last.key, last.to), (BlockKey(3), None), "{moves:?}");
    assert!(moves.iter().all(|mv| mv.key == BlockKey(3)), "{moves:?}");
    assert_eq!(m.tier_of(BlockKey(1)), Some(Tier::Host));
    assert_eq!(m.tier_of(BlockKey(2)), Some(Tier::Host));
}

#[test]
fn a_held_tail_keeps_its_chain() {
    let mut m = host_only(4);
    m.insert(NS, BlockKey(1), None, 1, T0);
    m.insert(NS, BlockKey(2), Some(BlockKey(1)), 1, T0);
    m.hold(BlockKey(2), true);
    for k in 10..30 {
        m.insert(NS, BlockKey(k), None, k, at(k));
    }
    assert_eq!(m.tier_of(BlockKey(1)), Some(Tier::Host));
    assert_eq!(m.tier_of(BlockKey(2)), Some(Tier::Host));
}

#[test]
fn holding_an_absent_block_does_nothing() {
    let mut m = host_only(2);
    assert!(!m.hold(BlockKey(9), true));
    assert!(!m.is_held(BlockKey(9)));
}

#[test]
fn a_tier_with_only_held_blocks_still_keeps_its_capacity() {
    // Two held blocks fill the host tier; a third, held while it sits on the remote tier, is promoted
    // by an access: the tier gives up its coldest held block rather than exceed its capacity.
    let mut m = TierManager::new(TierConfig::new(TierCapacities {
        gpu: 0,
        host: 2,
        remote: 4,
    }))
    .unwrap();
    m.insert(NS, BlockKey(1), None, 1, T0);
    m.insert(NS, BlockKey(2), None, 2, T0);
    m.hold(BlockKey(1), true);
    m.hold(BlockKey(2), true);
    m.insert(NS, BlockKey(3), None, 3, at(1));
    assert_eq!(m.tier_of(BlockKey(3)), Some(Tier::Remote));
    m.hold(BlockKey(3), true);
    for r in 4..8 {
        m.access(BlockKey(3), r, at(r));
    }
    assert_eq!(m.len(Tier::Host), 2);
    assert_eq!(m.len(Tier::Remote), 1);
    assert_eq!(m.tier_of(BlockKey(3)), Some(Tier::Host));
    assert!(m.is_held(BlockKey(1)) && m.is_held(BlockKey(2)) && m.is_held(BlockKey(3)));
}
