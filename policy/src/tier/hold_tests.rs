use super::*;
use transfer_engine::policy::TierPolicy;

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

fn host_and_remote(host: usize, remote: usize) -> TierManager {
    let mut cfg = TierConfig::new(TierCapacities {
        gpu: 0,
        host,
        remote,
    });
    // One-off blocks are dropped from host memory rather than demoted: only a hold takes them down.
    cfg.demote_min_sharers = 2;
    TierManager::new(cfg).unwrap()
}

#[test]
fn a_held_block_moves_down_but_is_not_dropped() {
    let mut m = host_and_remote(1, 2);
    m.insert(NS, BlockKey(1), None, 1, T0);
    m.hold(BlockKey(1), true);
    for k in 2..20 {
        m.insert(NS, BlockKey(k), None, k, at(k));
        assert!(m.tier_of(BlockKey(1)).is_some(), "dropped by block {k}");
        assert!(m.len(Tier::Host) <= 1 && m.len(Tier::Remote) <= 2);
    }
    assert_eq!(m.tier_of(BlockKey(1)), Some(Tier::Remote));
    assert!(m.is_held(BlockKey(1)));
}

#[test]
fn a_last_tier_full_of_held_blocks_still_keeps_its_capacity() {
    let mut m = host_and_remote(1, 1);
    for k in 1..=3 {
        m.insert(NS, BlockKey(k), None, k, at(k));
        m.hold(BlockKey(k), true);
        assert!(
            m.len(Tier::Host) <= 1 && m.len(Tier::Remote) <= 1,
            "after block {k}"
        );
    }
    // Three held blocks, room for two: the farthest tier gave up its coldest held block.
    let resident = (1..=3)
        .filter(|&k| m.tier_of(BlockKey(k)).is_some())
        .count();
    assert_eq!(resident, 2);
    assert_eq!(m.tier_of(BlockKey(3)), Some(Tier::Host));
}
