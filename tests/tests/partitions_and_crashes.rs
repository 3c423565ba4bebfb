//! Partitions and crashes: nothing hangs, and every block that could not arrive is reported for recompute
//! in time.

use std::time::Duration;

use fabric_sim::{CrashPlan, Side};
use tests::{modes, ms, run, run_checked, scenario, seed};

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

#[test]
fn a_permanent_partition_reports_every_undelivered_block_for_recompute_within_the_deadline() {
    for mode in modes() {
        for start in [us(0), us(20), us(40)] {
            let mut cfg = scenario(seed(100), mode);
            cfg.faults.partition = Some((start, None));
            let r = run_checked(&cfg);
            let s = r.seed;
            assert_eq!(
                r.blocks_delivered + r.blocks_recompute,
                r.blocks_total,
                "seed {s}, partition from {start:?}: {r:?}"
            );
            assert!(
                r.virtual_ms <= r.deadline_ms,
                "seed {s}: resolved after the deadline: {r:?}"
            );
            if start.is_zero() {
                assert_eq!(r.blocks_recompute, r.blocks_total, "seed {s}: {r:?}");
            }
        }
    }
}

#[test]
fn a_partition_that_heals_before_retries_run_out_delivers_everything() {
    for mode in modes() {
        let mut cfg = scenario(seed(110), mode);
        cfg.faults.partition = Some((us(20), Some(ms(30))));
        let r = run_checked(&cfg);
        let s = r.seed;
        assert_eq!(r.blocks_delivered, r.blocks_total, "seed {s}: {r:?}");
        assert!(r.retransmits > 0, "seed {s}: {r:?}");
    }
}

#[test]
fn a_partition_longer_than_the_deadline_is_cut_short_by_the_deadline() {
    for mode in modes() {
        // Retries alone would outlast the partition (30 of up to 100 ms); the 50 ms deadline must not.
        let mut cfg = scenario(seed(120), mode).with_deadline(ms(50));
        cfg.engine.max_retries = 30;
        cfg.faults.partition = Some((us(0), Some(ms(500))));
        // The closing handshake may retry past the deadline (bounded by max_retries): allow it to end.
        cfg.limit = Duration::from_secs(10);
        let r = run_checked(&cfg);
        let s = r.seed;
        assert_eq!(r.blocks_recompute, r.blocks_total, "seed {s}: {r:?}");
        assert!(r.virtual_ms <= 50.0, "seed {s}: {r:?}");
    }
}

#[test]
fn a_receiver_crash_mid_transfer_ends_in_recompute_not_a_hang() {
    for mode in modes() {
        for restart in [None, Some(ms(2))] {
            let mut cfg = scenario(seed(130), mode);
            cfg.crash = Some(CrashPlan {
                side: Side::Receiver,
                at: us(30),
                restart_at: restart,
            });
            let r = run_checked(&cfg);
            let s = r.seed;
            assert_eq!(
                r.blocks_delivered + r.blocks_recompute,
                r.blocks_total,
                "seed {s}, restart {restart:?}: {r:?}"
            );
        }
    }
}

#[test]
fn a_sender_crash_is_reported_by_the_receiver_when_its_session_expires() {
    for mode in modes() {
        let mut cfg = scenario(seed(140), mode);
        cfg.crash = Some(CrashPlan {
            side: Side::Sender,
            at: us(30),
            restart_at: Some(ms(1)),
        });
        let r = run(&cfg);
        let s = r.seed;
        assert!(r.idle, "seed {s}: a session outlived its expiry: {r:?}");
        assert_eq!(r.corrupt_delivered, 0, "seed {s}: {r:?}");
        assert_eq!(
            r.blocks_delivered + r.blocks_recompute,
            r.blocks_total,
            "seed {s}: {r:?}"
        );
        // The receiver cannot know the sender died; it hands back what is missing when its session expires.
        assert_eq!(
            r.receiver_recompute,
            r.blocks_total - r.blocks_delivered,
            "seed {s}: {r:?}"
        );
    }
}
