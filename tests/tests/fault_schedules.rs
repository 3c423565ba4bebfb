//! Property tests over random fault schedules and seeds: whatever the network does, no corrupt or
//! duplicate block reaches the consumer, every block is delivered or reported for recompute, and the run
//! finishes. `FABRIC_CASES` sets the number of cases (256 by default).

use std::time::Duration;

use fabric_sim::{CrashPlan, FaultSpec, Side};
use proptest::prelude::*;
use tests::{modes, run, scenario};

fn cases() -> u32 {
    std::env::var("FABRIC_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn prob(max: f64) -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), 0.0..max]
}

fn faults() -> impl Strategy<Value = FaultSpec> {
    (
        (
            prob(0.2),
            proptest::option::of((0.001..0.1f64, 0.05..0.5f64)),
        ),
        (prob(0.1), prob(0.05), prob(0.3), prob(0.3)),
        (0u64..300, 0u64..300),
        proptest::option::of((0u64..2_000, proptest::option::of(1u64..200_000))),
    )
        .prop_map(
            |(
                (loss, burst),
                (corrupt, corrupt_header, duplicate, reorder),
                (hold, jitter),
                part,
            )| {
                let mut f = FaultSpec::default();
                (f.loss, f.burst_loss) = (loss, burst);
                (f.corrupt, f.corrupt_header) = (corrupt, corrupt_header);
                (f.duplicate, f.reorder) = (duplicate, reorder);
                f.reorder_hold = Duration::from_micros(hold);
                f.jitter = Duration::from_micros(jitter);
                f.partition = part.map(|(start, len)| {
                    (
                        Duration::from_micros(start),
                        len.map(|l| Duration::from_micros(start + l)),
                    )
                });
                f
            },
        )
}

fn crash() -> impl Strategy<Value = Option<CrashPlan>> {
    proptest::option::weighted(
        0.15,
        (any::<bool>(), 0u64..200, proptest::option::of(0u64..5_000)).prop_map(
            |(sender, at, restart)| CrashPlan {
                side: if sender { Side::Sender } else { Side::Receiver },
                at: Duration::from_micros(at),
                restart_at: restart.map(|r| Duration::from_micros(at + r)),
            },
        ),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_fault_schedules_never_deliver_corrupt_or_duplicate_blocks_and_always_finish(
        seed in any::<u64>(),
        mode in 0usize..3,
        faults in faults(),
        crash in crash(),
        reverse in any::<bool>(),
    ) {
        let mut cfg = scenario(seed, modes()[mode]);
        cfg.faults = faults;
        cfg.crash = crash;
        cfg.reverse_blocks = reverse;
        let r = run(&cfg);
        let s = r.seed;
        prop_assert_eq!(r.corrupt_delivered, 0, "seed {}: {:?}", s, r);
        prop_assert_eq!(r.duplicate_deliveries, 0, "seed {}: {:?}", s, r);
        prop_assert_eq!(r.blocks_delivered + r.blocks_recompute, r.blocks_total, "seed {}: {:?}", s, r);
        prop_assert!(r.idle, "seed {}: sessions alive at the run limit: {:?}", s, r);
        prop_assert!(r.finished, "seed {}: not resolved by the deadline: {:?}", s, r);
    }
}
