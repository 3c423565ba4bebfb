//! Tier moves carried out as engine sessions by the loopback pair: blocks moved between host tiers arrive
//! whole in their new slots and are reported per move; a move with no slot, or into a tier with no region,
//! is reported failed and moves nothing; a GPU tier without a CUDA driver (or without feature `cuda`) fails
//! each of its moves with the placer's reason and places nothing.

mod common;

use std::time::Duration;

use backends::loopback::{LoopbackPair, TierRegions};
use common::ClaimsToBeGpu;
use transfer_engine::policy::{BlockKey, Tier, TierMove};
use transfer_engine::{Dtype, KvLayout, MemoryRegion};

const LAYERS: u32 = 3;
const SLOTS: u32 = 8;
const BLOCK: u64 = 16 << 10;

fn layout() -> KvLayout {
    KvLayout::new(LAYERS, SLOTS, BLOCK, 16, Dtype::F16).unwrap()
}

fn block(memory: &MemoryRegion, layer: u32, slot: u32) -> Vec<u8> {
    let at = layout().block_offset(transfer_engine::BlockId::new(layer, slot)) as usize;
    memory.read(at..at + BLOCK as usize).unwrap().to_vec()
}

fn mv(key: u64, from: Tier, to: Option<Tier>) -> TierMove {
    TierMove {
        key: BlockKey(key),
        from,
        to,
    }
}

#[test]
fn moves_between_host_tiers_arrive_whole_and_are_reported_per_move() {
    let pair = LoopbackPair::with_defaults();
    let len = layout().total_bytes() as usize;
    let host = MemoryRegion::from_vec((0..len).map(|i| (i / 4096 % 251) as u8 + 1).collect());
    let remote = MemoryRegion::zeroed(len);
    let mut tiers = TierRegions::new();
    tiers
        .register(&pair, Tier::Host, layout(), host.clone())
        .unwrap();
    tiers
        .register(&pair, Tier::Remote, layout(), remote.clone())
        .unwrap();
    // Block k lives in host slot k; in the remote tier it takes slot 7 - k. Block 9 has no remote slot.
    let locate = |key: BlockKey, tier: Tier| match (key.0, tier) {
        (9, Tier::Remote) => None,
        (k, Tier::Host) => Some(k as u32 % SLOTS),
        (k, _) => Some(7 - k as u32 % SLOTS),
    };
    let moves = [
        mv(1, Tier::Host, Some(Tier::Remote)),
        mv(2, Tier::Host, Some(Tier::Remote)),
        mv(3, Tier::Host, None),
        mv(4, Tier::Host, Some(Tier::Host)),
        mv(9, Tier::Host, Some(Tier::Remote)),
        mv(5, Tier::Host, Some(Tier::Gpu)),
    ];
    let reports = pair
        .run_tier_moves(&tiers, &moves, locate, Duration::from_secs(20))
        .unwrap();
    assert_eq!(reports.len(), moves.len());
    for (r, m) in reports.iter().zip(&moves) {
        assert_eq!(r.moved, *m);
    }
    assert!(
        reports[0].result.is_ok() && reports[1].result.is_ok(),
        "{reports:?}"
    );
    assert!(
        reports[2].result.is_ok() && reports[3].result.is_ok(),
        "drops and stays move nothing"
    );
    assert!(reports[4].result.as_ref().unwrap_err().contains("no slot"));
    assert!(
        reports[5]
            .result
            .as_ref()
            .unwrap_err()
            .contains("no region")
    );
    for (key, slot) in [(1u32, 6u32), (2, 5)] {
        for layer in 0..LAYERS {
            assert_eq!(block(&remote, layer, slot), block(&host, layer, key));
        }
    }
    // Nothing else landed in the remote tier.
    for slot in [0, 1, 2, 3, 4, 7] {
        assert!(
            block(&remote, 0, slot).iter().all(|&b| b == 0),
            "slot {slot}"
        );
    }
}

#[test]
fn gpu_tier_moves_without_a_driver_fail_per_move_and_place_nothing() {
    #[cfg(feature = "cuda")]
    if backends::cuda::driver_present() {
        println!("not run: this machine has a CUDA driver; GPU tier moves run in tests/cuda.rs");
        return;
    }
    println!("not run: GPU tier moves themselves (no CUDA driver); the refusal path is checked");
    let pair = LoopbackPair::with_defaults();
    let len = layout().total_bytes() as usize;
    let gpu = MemoryRegion::from_raw_memory(ClaimsToBeGpu(vec![7u8; len].into_boxed_slice()));
    let host = MemoryRegion::zeroed(len);
    let mut tiers = TierRegions::new();
    tiers.register(&pair, Tier::Gpu, layout(), gpu).unwrap();
    tiers
        .register(&pair, Tier::Host, layout(), host.clone())
        .unwrap();
    let moves = [
        mv(1, Tier::Gpu, Some(Tier::Host)),
        mv(2, Tier::Gpu, Some(Tier::Host)),
    ];
    let reports = pair
        .run_tier_moves(
            &tiers,
            &moves,
            |key, _| Some(key.0 as u32),
            Duration::from_millis(500),
        )
        .unwrap();
    for r in &reports {
        let why = r.result.as_ref().unwrap_err();
        assert!(why.contains("not moved"), "{why}");
        println!("{:?}: {why}", r.moved);
    }
    assert!(host.read(0..len).unwrap().iter().all(|&b| b == 0));
}
