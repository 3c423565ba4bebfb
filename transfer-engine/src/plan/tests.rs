//! Tests of the unit plan.

use super::*;

fn total(plan: &Plan) -> u64 {
    plan.units.iter().map(|u| u64::from(u.len)).sum()
}

#[test]
fn packetized_cuts_blocks_into_slices() {
    let plan = Plan::build(
        &BlockShape::whole(1000),
        0..2,
        &[0, 1],
        &[5, 6],
        TransferMode::Packetized { slice_bytes: 256 },
    )
    .unwrap();
    assert_eq!(plan.units.len(), 2 * 2 * 4);
    assert_eq!(total(&plan), 4000);
    assert_eq!(plan.units[3].len, 1000 - 3 * 256);
    assert!(plan.units_per_slot.iter().all(|&n| n == 4));
}

#[test]
fn exclusive_sends_whole_blocks() {
    let plan = Plan::build(
        &BlockShape::whole(4096),
        3..5,
        &[0, 9, 2],
        &[1, 2, 3],
        TransferMode::Exclusive,
    )
    .unwrap();
    assert_eq!(plan.units.len(), 6);
    assert!(
        plan.units
            .iter()
            .all(|u| u.exclusive && u.len == 4096 && u.blocks == 1)
    );
    assert_eq!(plan.slot_position(4), (4, 1));
}

#[test]
fn auto_merges_large_contiguous_runs_and_slices_the_rest() {
    let mode = TransferMode::Auto {
        slice_bytes: 1024,
        exclusive_min_bytes: 8192,
    };
    // 0..4 -> 10..14 is contiguous on both sides (16 KiB); 7 -> 3 stands alone (4 KiB).
    let plan = Plan::build(
        &BlockShape::whole(4096),
        0..1,
        &[0, 1, 2, 3, 7],
        &[10, 11, 12, 13, 3],
        mode,
    )
    .unwrap();
    assert_eq!(
        plan.units[0],
        Unit {
            layer: 0,
            first: 0,
            blocks: 4,
            offset: 0,
            len: 16384,
            exclusive: true
        }
    );
    assert_eq!(plan.units.len(), 1 + 4);
    assert!(
        plan.units[1..]
            .iter()
            .all(|u| !u.exclusive && u.len == 1024)
    );
    assert_eq!(total(&plan), 5 * 4096);
    // A frame may coalesce the four slices of block 7, never the exclusive unit before them, and
    // nothing runs past the last unit.
    assert_eq!(plan.frame_units(1, 4096), Some(1..5));
    assert_eq!(plan.frame_units(0, 16384 + 1024), None);
    assert!(!plan.follows(0, 1));
    assert_eq!(plan.frame_units(4, 2048), None);
    assert_eq!(plan.frame_units(5, 1024), None);
}

#[test]
fn bad_requests_are_refused() {
    assert!(
        Plan::build(
            &BlockShape::whole(1024),
            0..1,
            &[0],
            &[0, 1],
            TransferMode::Exclusive
        )
        .is_err()
    );
    assert!(
        Plan::build(
            &BlockShape::whole(1024),
            0..1,
            &[],
            &[],
            TransferMode::Exclusive
        )
        .is_err()
    );
    assert!(
        Plan::build(
            &BlockShape::whole(1024),
            0..1,
            &[0],
            &[0],
            TransferMode::Packetized { slice_bytes: 1 }
        )
        .is_err()
    );
    assert!(
        Plan::build(
            &BlockShape::whole(2 << 30),
            0..1,
            &[0],
            &[0],
            TransferMode::Exclusive
        )
        .is_err()
    );
}
