//! Coalesced data frames (`EngineConfig::coalesce_bytes`), hand-stepped: first sends carry several slices,
//! and a lost or corrupt frame comes back slice by slice.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{A, Action, B, Pair, config, layout};
use transfer_engine::wire::FrameKind;
use transfer_engine::{EngineConfig, Event, RegionHandle, TransferMode, TransferRequest};

fn coalescing(engine_id: u32) -> EngineConfig {
    let mut cfg = config(engine_id);
    cfg.coalesce_bytes = 6 * 1024;
    cfg
}

/// Moves every block of `src` into `dst` in 2 KiB slices, and runs the pair until it is done.
fn move_packetized(pair: &mut Pair, src: &RegionHandle, dst: &RegionHandle) {
    let req = TransferRequest::whole(B, src, dst)
        .unwrap()
        .with_mode(TransferMode::Packetized { slice_bytes: 2048 });
    pair.a.submit(pair.now, req).unwrap();
    pair.run(Duration::from_secs(5));
}

#[test]
fn first_sends_travel_coalesced_and_a_lost_or_corrupt_frame_comes_back_slice_by_slice() {
    let mut pair = Pair::with_configs(coalescing(1), coalescing(2));
    // 2 layers x 4 blocks of 8 KiB in 2 KiB slices: each block goes as a frame of 3 slices and one of 1.
    let (src, dst) = pair.regions(layout(2, 4, 8192), 5);
    let mut firsts: BTreeMap<u32, u32> = BTreeMap::new();
    pair.filter = Box::new(move |h, _| {
        if h.kind != FrameKind::Data {
            return Action::Pass;
        }
        let n = firsts.entry(h.sequence).or_default();
        *n += 1;
        match (h.sequence, *n) {
            // Block 0's first frame is lost; block 1's first frame is corrupted.
            (0, 1) => Action::Drop,
            (4, 1) => Action::Corrupt,
            _ => Action::Pass,
        }
    });
    move_packetized(&mut pair, &src, &dst);

    assert_eq!(pair.bytes_a(src.id), pair.bytes_b(dst.id));
    assert!(
        !pair
            .events_a
            .iter()
            .any(|(_, e)| matches!(e, Event::Recompute { .. }))
    );
    let data: Vec<_> = pair
        .frames
        .iter()
        .filter(|(_, from, h)| *from == A && h.kind == FrameKind::Data)
        .map(|(_, _, h)| (h.sequence, h.attempt, h.length))
        .collect();
    let firsts: Vec<_> = data
        .iter()
        .filter(|(_, attempt, _)| *attempt == 0)
        .collect();
    assert_eq!(firsts.len(), 16, "two frames a block: {firsts:?}");
    assert!(
        firsts
            .iter()
            .all(|(seq, _, len)| *len == if seq % 4 == 0 { 6144 } else { 2048 }),
        "{firsts:?}"
    );
    let mut resent: Vec<_> = data.iter().filter(|(_, attempt, _)| *attempt > 0).collect();
    resent.sort();
    assert_eq!(
        resent,
        [0, 1, 2, 4, 5, 6]
            .map(|seq| (seq, 1, 2048))
            .iter()
            .collect::<Vec<_>>(),
        "each slice of the lost and the corrupt frame, once, alone"
    );
    let (a, b) = (pair.a.stats(), pair.b.stats());
    assert_eq!((a.slices_sent, a.retransmits), (32 + 6, 6), "{a:?}");
    assert_eq!((b.slices_received, b.checksum_failures), (32, 1), "{b:?}");
    assert_eq!(pair.a.live_sessions() + pair.b.live_sessions(), 0);
}

#[test]
fn without_coalescing_every_frame_carries_one_slice() {
    let mut pair = Pair::new();
    let (src, dst) = pair.regions(layout(1, 2, 8192), 6);
    move_packetized(&mut pair, &src, &dst);
    assert_eq!(pair.bytes_a(src.id), pair.bytes_b(dst.id));
    let lengths: Vec<u32> = pair
        .frames
        .iter()
        .filter(|(_, _, h)| h.kind == FrameKind::Data)
        .map(|(_, _, h)| h.length)
        .collect();
    assert_eq!(lengths, vec![2048; 8]);
}
