//! Hand-stepped retransmit tests: virtual time is advanced by the test, never by sleeping.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Action, B, Pair, layout};
use transfer_engine::wire::FrameKind;
use transfer_engine::{BlockId, Event, Role, TransferMode, TransferRequest};

fn completed(events: &[(Duration, Event)], role: Role) -> usize {
    events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Completed { role: r, .. } if *r == role))
        .count()
}

#[test]
fn dropped_and_corrupted_slices_are_retransmitted_with_backoff_and_recover() {
    let mut pair = Pair::new();
    let l = layout(2, 4, 4096);
    let (src, dst) = pair.regions(l, 11);
    // Slice 3: dropped on its first two sends. Slice 5: corrupted once, and the ack of its resend dropped.
    let mut sends: BTreeMap<u32, u32> = BTreeMap::new();
    let mut acks_seen = 0;
    pair.filter = Box::new(move |h, from| {
        if h.kind == FrameKind::Ack && from == B {
            acks_seen += 1;
            return if acks_seen == 2 {
                Action::Drop
            } else {
                Action::Pass
            };
        }
        if h.kind != FrameKind::Data {
            return Action::Pass;
        }
        let n = sends.entry(h.sequence).or_default();
        *n += 1;
        match (h.sequence, *n) {
            (3, 1 | 2) => Action::Drop,
            (5, 1) => Action::Corrupt,
            _ => Action::Pass,
        }
    });
    let req = TransferRequest::whole(B, &src, &dst)
        .unwrap()
        .with_mode(TransferMode::Packetized { slice_bytes: 2048 });
    let session = pair.a.submit(pair.now, req).unwrap();
    pair.run(Duration::from_secs(5));

    assert_eq!(pair.bytes_a(src.id), pair.bytes_b(dst.id));
    assert_eq!(completed(&pair.events_a, Role::Sender), 1);
    assert!(
        !pair
            .events_a
            .iter()
            .any(|(_, e)| matches!(e, Event::Recompute { .. }))
    );
    let stats = pair.a.stats();
    // Slice 3 twice by timeout; slice 5 once on the nack and once more by timeout after its ack was lost.
    assert_eq!(stats.retransmits, 4, "{stats:?}");
    let b = pair.b.stats();
    assert_eq!(b.checksum_failures, 1);
    assert_eq!(
        b.duplicates, 1,
        "the slice whose ack was lost arrives twice and is acknowledged again"
    );
    // Backoff: slice 3's resends wait base (5 ms) then 2 x base, each plus at most 25% jitter.
    let sends3: Vec<_> = pair
        .data_log
        .iter()
        .filter(|(_, seq, _)| *seq == 3)
        .collect();
    assert_eq!(sends3.len(), 3);
    let gap1 = sends3[1].0 - sends3[0].0;
    let gap2 = sends3[2].0 - sends3[1].0;
    assert!(
        gap1 >= Duration::from_millis(5) && gap1 <= Duration::from_micros(6250),
        "{gap1:?}"
    );
    assert!(
        gap2 >= Duration::from_millis(10) && gap2 <= Duration::from_micros(12500),
        "{gap2:?}"
    );
    assert_eq!(
        (sends3[1].2, sends3[2].2),
        (1, 2),
        "attempt numbers travel in the header"
    );
    // The corrupted slice was resent at once on the receiver's nack, not after a timeout.
    let sends5: Vec<_> = pair
        .data_log
        .iter()
        .filter(|(_, seq, _)| *seq == 5)
        .collect();
    assert_eq!(sends5.len(), 3);
    assert!(sends5[1].0 - sends5[0].0 < Duration::from_millis(5));
    assert_eq!(
        pair.a.live_sessions() + pair.b.live_sessions(),
        0,
        "{session}"
    );
}

#[test]
fn a_slice_dropped_forever_is_handed_back_as_recompute_naming_exactly_its_block() {
    let mut pair = Pair::new();
    let l = layout(3, 4, 8192);
    let (src, dst) = pair.regions(l, 5);
    // Source blocks 0,1,2,3 -> destination blocks 3,2,1,0. Slice 9 is layer 1, block index 0, second half.
    let mut req = TransferRequest::whole(B, &src, &dst)
        .unwrap()
        .with_mode(TransferMode::Packetized { slice_bytes: 4096 });
    req.dst_blocks = vec![3, 2, 1, 0];
    pair.filter = Box::new(|h, _| {
        if h.kind == FrameKind::Data && h.sequence == 9 {
            Action::Drop
        } else {
            Action::Pass
        }
    });
    pair.a.submit(pair.now, req).unwrap();
    pair.run(Duration::from_secs(30));

    let recompute = |events: &[(Duration, Event)], role| {
        events.iter().find_map(|(_, e)| match e {
            Event::Recompute {
                role: r, blocks, ..
            } if *r == role => Some(blocks.clone()),
            _ => None,
        })
    };
    let sender = recompute(&pair.events_a, Role::Sender).expect("sender reports recompute");
    let receiver = recompute(&pair.events_b, Role::Receiver).expect("receiver reports recompute");
    // Slices are layer-major, two per block: slice 9 is layer 1 (slices 8..16), index (9 - 8) / 2 = 0.
    assert_eq!(sender, vec![BlockId::new(1, 0)], "source id");
    assert_eq!(receiver, vec![BlockId::new(1, 3)], "destination id");
    let delivered: Vec<BlockId> = pair
        .events_b
        .iter()
        .filter_map(|(_, e)| match e {
            Event::BlockDelivered { block, .. } => Some(*block),
            _ => None,
        })
        .collect();
    assert_eq!(
        delivered.len(),
        11,
        "every other block is delivered exactly once"
    );
    let sorted: std::collections::BTreeSet<_> = delivered.iter().copied().collect();
    assert_eq!(sorted.len(), 11);
    assert!(!sorted.contains(&BlockId::new(1, 3)));
    // Delivered blocks are byte-identical; the undelivered one is never reported delivered.
    let src_bytes = pair.bytes_a(src.id);
    let dst_bytes = pair.bytes_b(dst.id);
    for block in &sorted {
        let src_block = BlockId::new(block.layer, 3 - block.block);
        let s = l.block_offset(src_block) as usize;
        let d = l.block_offset(*block) as usize;
        assert_eq!(src_bytes[s..s + 8192], dst_bytes[d..d + 8192], "{block:?}");
    }
    // Bounded: the slice was tried 1 + max_retries times, then given up.
    let tries = pair.data_log.iter().filter(|(_, seq, _)| *seq == 9).count();
    assert_eq!(tries as u32, 1 + pair.a.config().max_retries);
    assert_eq!(pair.a.stats().recompute_blocks, 1);
}

#[test]
fn a_session_deadline_hands_back_everything_still_missing() {
    let mut pair = Pair::new();
    let l = layout(2, 2, 4096);
    let (src, dst) = pair.regions(l, 3);
    // Layer 1 never gets through; the deadline (50 ms) is shorter than the retry schedule.
    pair.filter = Box::new(|h, _| {
        if h.kind == FrameKind::Data && h.layer == 1 {
            Action::Drop
        } else {
            Action::Pass
        }
    });
    let req = TransferRequest::whole(B, &src, &dst)
        .unwrap()
        .with_mode(TransferMode::Exclusive)
        .with_deadline(Duration::from_millis(50));
    pair.a.submit(pair.now, req).unwrap();
    pair.run(Duration::from_secs(5));
    let done_at = pair
        .events_a
        .iter()
        .find_map(|(t, e)| {
            matches!(
                e,
                Event::Completed {
                    role: Role::Sender,
                    ..
                }
            )
            .then_some(*t)
        })
        .unwrap();
    assert!(
        done_at >= Duration::from_millis(50) && done_at < Duration::from_millis(60),
        "{done_at:?}"
    );
    let blocks = pair.events_a.iter().find_map(|(_, e)| match e {
        Event::Recompute { blocks, .. } => Some(blocks.clone()),
        _ => None,
    });
    assert_eq!(blocks, Some(vec![BlockId::new(1, 0), BlockId::new(1, 1)]));
    let layers: Vec<u32> = pair
        .events_b
        .iter()
        .filter_map(|(_, e)| match e {
            Event::LayerComplete { layer, .. } => Some(*layer),
            _ => None,
        })
        .collect();
    assert_eq!(layers, vec![0], "layer 0 completes; layer 1 never does");
}
