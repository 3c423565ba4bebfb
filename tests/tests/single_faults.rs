//! Each fault alone, in each mode: what the engine must do about it.

use std::time::Duration;

use tests::{modes, run_checked, scenario, seed};

#[test]
fn a_clean_fabric_delivers_every_block_intact_in_every_mode() {
    for mode in modes() {
        let r = run_checked(&scenario(seed(1), mode));
        let s = r.seed;
        assert_eq!(r.blocks_delivered, r.blocks_total, "seed {s}: {r:?}");
        assert_eq!(
            r.retransmits, 0,
            "seed {s}: a clean run retransmits nothing: {r:?}"
        );
    }
}

#[test]
fn one_percent_random_loss_is_fully_recovered_with_no_recompute() {
    for mode in modes() {
        for k in 0..4 {
            let mut cfg = scenario(seed(10) + k, mode);
            cfg.faults.loss = 0.01;
            let r = run_checked(&cfg);
            let s = r.seed;
            assert_eq!(r.blocks_recompute, 0, "seed {s}: {r:?}");
            assert_eq!(r.blocks_delivered, r.blocks_total, "seed {s}: {r:?}");
        }
    }
}

#[test]
fn five_percent_random_loss_is_recovered_by_retransmits() {
    let mut lost = 0;
    for mode in modes() {
        for k in 0..3 {
            let mut cfg = scenario(seed(20) + k, mode);
            cfg.faults.loss = 0.05;
            let r = run_checked(&cfg);
            let s = r.seed;
            assert_eq!(r.blocks_recompute, 0, "seed {s}: {r:?}");
            lost += r.fault_drops;
        }
    }
    assert!(
        lost > 0,
        "5% loss over nine runs lost nothing: the rule is not applied"
    );
}

#[test]
fn corrupted_slices_never_reach_the_consumer() {
    let mut caught = 0;
    for mode in modes() {
        for k in 0..4 {
            let mut cfg = scenario(seed(30) + k, mode);
            cfg.faults.corrupt = 0.1;
            let r = run_checked(&cfg);
            let s = r.seed;
            assert_eq!(r.corrupt_delivered, 0, "seed {s}: {r:?}");
            assert_eq!(r.blocks_delivered, r.blocks_total, "seed {s}: {r:?}");
            caught += r.checksum_failures + r.frames_refused;
        }
    }
    assert!(
        caught > 0,
        "10% corruption was never detected: the rule is not applied"
    );
}

#[test]
fn corrupted_headers_are_refused_before_a_byte_is_placed() {
    for mode in modes() {
        let mut cfg = scenario(seed(40), mode);
        cfg.faults.corrupt_header = 0.1;
        let r = run_checked(&cfg);
        let s = r.seed;
        assert_eq!(r.corrupt_delivered, 0, "seed {s}: {r:?}");
        assert_eq!(r.blocks_delivered, r.blocks_total, "seed {s}: {r:?}");
        assert!(
            r.frames_corrupted == 0 || r.frames_refused > 0,
            "seed {s}: a corrupted header was accepted: {r:?}"
        );
    }
}

#[test]
fn duplicates_deliver_each_block_exactly_once() {
    for mode in modes() {
        let mut cfg = scenario(seed(50), mode);
        cfg.faults.duplicate = 0.3;
        let r = run_checked(&cfg);
        let s = r.seed;
        assert!(r.frames_duplicated > 0, "seed {s}: {r:?}");
        assert_eq!(r.duplicate_deliveries, 0, "seed {s}: {r:?}");
        assert_eq!(r.blocks_delivered, r.blocks_total, "seed {s}: {r:?}");
    }
}

#[test]
fn reordering_delivers_each_block_exactly_once() {
    for mode in modes() {
        let mut cfg = scenario(seed(60), mode);
        cfg.faults.reorder = 0.3;
        cfg.faults.reorder_hold = Duration::from_micros(200);
        let r = run_checked(&cfg);
        let s = r.seed;
        assert_eq!(r.duplicate_deliveries, 0, "seed {s}: {r:?}");
        assert_eq!(r.blocks_delivered, r.blocks_total, "seed {s}: {r:?}");
        assert_eq!(r.blocks_recompute, 0, "seed {s}: {r:?}");
    }
}

#[test]
fn jitter_delays_frames_but_loses_no_block() {
    for mode in modes() {
        let mut cfg = scenario(seed(70), mode);
        cfg.faults.jitter = Duration::from_micros(300);
        let r = run_checked(&cfg);
        let s = r.seed;
        assert_eq!(r.blocks_delivered, r.blocks_total, "seed {s}: {r:?}");
        assert_eq!(r.blocks_recompute, 0, "seed {s}: {r:?}");
    }
}

#[test]
fn thirty_percent_burst_loss_ends_with_every_block_delivered_or_reported() {
    let mut lost = 0;
    for mode in modes() {
        for k in 0..3 {
            let mut cfg = scenario(seed(80) + k, mode);
            cfg.blocks = 32;
            // Gilbert-Elliott: 3% chance to enter a burst, 7% to leave it: 30% mean loss, bursts of ~14.
            cfg.faults.burst_loss = Some((0.03, 0.07));
            let r = run_checked(&cfg);
            assert_eq!(r.corrupt_delivered, 0, "seed {}: {r:?}", r.seed);
            lost += r.fault_drops;
        }
    }
    assert!(
        lost > 0,
        "30% burst loss over nine runs lost nothing: the rule is not applied"
    );
}
