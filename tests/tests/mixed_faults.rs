//! Faults together, the retransmit budget under a storm, determinism, and background traffic.

use std::time::Duration;

use fabric_sim::CrossTraffic;
use tests::{modes, ms, run_checked, scenario, seed};
use transfer_engine::RetransmitBudget;

#[test]
fn mixed_faults_keep_every_invariant_in_every_mode() {
    for mode in modes() {
        for k in 0..4 {
            let mut cfg = scenario(seed(200) + k, mode);
            cfg.faults.loss = 0.02;
            cfg.faults.corrupt = 0.02;
            cfg.faults.duplicate = 0.05;
            cfg.faults.reorder = 0.05;
            cfg.faults.jitter = Duration::from_micros(50);
            let r = run_checked(&cfg);
            assert_eq!(r.blocks_recompute, 0, "seed {}: {r:?}", r.seed);
        }
    }
}

#[test]
fn a_retransmit_storm_under_thirty_percent_burst_loss_stays_within_the_retransmit_budget() {
    for mode in modes() {
        let mut cfg = scenario(seed(210), mode);
        cfg.blocks = 32;
        cfg.faults.burst_loss = Some((0.03, 0.07));
        cfg.engine.retransmit_budget = RetransmitBudget::new(32.0, 0.2);
        let r = run_checked(&cfg);
        let s = r.seed;
        assert!(
            r.retransmits as f64 <= r.retransmit_budget_limit,
            "seed {s}: {} retransmits exceed the budget of {}: {r:?}",
            r.retransmits,
            r.retransmit_budget_limit
        );
    }
}

#[test]
fn a_spent_retransmit_budget_turns_losses_into_recompute_not_retries() {
    let mut cfg = scenario(seed(220), modes()[1]);
    cfg.faults.loss = 0.3;
    cfg.engine.retransmit_budget = RetransmitBudget::new(2.0, 0.0).with_refill(0.0);
    let r = run_checked(&cfg);
    let s = r.seed;
    assert!(r.retransmits <= 2, "seed {s}: {r:?}");
    assert!(r.budget_exhausted > 0, "seed {s}: {r:?}");
    assert!(r.blocks_recompute > 0, "seed {s}: {r:?}");
}

#[test]
fn one_seed_replays_the_same_run() {
    for mode in modes() {
        let mut cfg = scenario(seed(230), mode);
        cfg.faults.loss = 0.03;
        cfg.faults.corrupt = 0.03;
        cfg.faults.duplicate = 0.05;
        cfg.faults.reorder = 0.05;
        cfg.faults.burst_loss = Some((0.01, 0.2));
        let first = format!("{:?}", run_checked(&cfg));
        let second = format!("{:?}", run_checked(&cfg));
        assert_eq!(first, second, "seed {}: two runs differ", cfg.seed);
        cfg.seed += 1;
        let other = format!("{:?}", run_checked(&cfg));
        assert_ne!(
            first, other,
            "seed {}: a new seed changed nothing",
            cfg.seed
        );
    }
}

#[test]
fn scattered_block_mapping_puts_each_block_in_its_own_destination() {
    for mode in modes() {
        let mut cfg = scenario(seed(240), mode);
        cfg.reverse_blocks = true;
        cfg.dst_shift = 5;
        cfg.faults.loss = 0.02;
        cfg.faults.reorder = 0.1;
        let r = run_checked(&cfg);
        assert_eq!(r.blocks_delivered, r.blocks_total, "seed {}: {r:?}", r.seed);
    }
}

#[test]
fn background_traffic_sharing_the_link_slows_the_transfer_but_breaks_nothing() {
    for mode in modes() {
        let clean = run_checked(&scenario(seed(250), mode));
        let mut cfg = scenario(seed(250), mode);
        cfg.cross_traffic = Some(CrossTraffic {
            rate: 10_000_000_000,
            packet_bytes: 64 << 10,
            start: Duration::ZERO,
            end: ms(5),
        });
        let r = run_checked(&cfg);
        let s = r.seed;
        assert_eq!(r.blocks_delivered, r.blocks_total, "seed {s}: {r:?}");
        assert!(
            r.virtual_ms > clean.virtual_ms,
            "seed {s}: sharing the link cost nothing: {r:?} vs {clean:?}"
        );
    }
}

/// Regression: when the engine-wide budget is spent, units waiting for a retransmit used to keep their
/// place in the session window while the budget refilled only on first sends, which the full window
/// blocked: the session sent nothing until its deadline. Parked resends now leave the window.
#[test]
fn a_spent_retransmit_budget_does_not_stop_first_sends_until_the_deadline() {
    let mut cfg = scenario(seed(260), modes()[1]);
    cfg.engine.window_bytes = 64 << 10;
    cfg.engine.retransmit_budget = RetransmitBudget::new(4.0, 0.5);
    cfg.faults.loss = 0.3;
    let r = run_checked(&cfg);
    let units = r.payload_bytes / 4096;
    assert_eq!(
        r.first_sends, units,
        "seed {}: only {} of {units} slices were ever sent: {r:?}",
        r.seed, r.first_sends
    );
    assert!(
        r.virtual_ms < r.deadline_ms / 2.0,
        "seed {}: stalled until the deadline: {r:?}",
        r.seed
    );
}
