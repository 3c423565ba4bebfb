//! The receiving session's state machine, driven by hand.

use super::*;
use crate::plan::BlockShape;
use crate::tests_support::epoch;
use crate::{Dtype, TransferMode};

/// A receiver of 2 layers x 2 blocks of 1 KiB in exclusive units (4 units), and the data headers of
/// its units with the CRC of `payload`.
fn receiver() -> (ReceiverSession, Vec<Header>) {
    let layout = KvLayout::new(2, 4, 1024, 16, Dtype::F16).unwrap();
    let plan = Plan::build(
        &BlockShape::whole(1024),
        0..2,
        &[0, 1],
        &[2, 3],
        TransferMode::Exclusive,
    )
    .unwrap();
    let headers = plan
        .units
        .iter()
        .enumerate()
        .map(|(seq, u)| {
            let mut h = Header::new(FrameKind::Data, 7);
            (h.layer, h.block, h.offset, h.length) =
                (u.layer, [2, 3][u.first as usize], u.offset, u.len);
            h.sequence = seq as u32;
            h.crc = crate::crc32c(&[5; 1024]);
            h
        })
        .collect();
    (session(layout, plan, vec![2, 3]), headers)
}

/// Session 7 from peer 1 into region 1, expiring 10 s after the epoch.
fn session(dst_layout: KvLayout, plan: Plan, dst_blocks: Vec<u32>) -> ReceiverSession {
    ReceiverSession::new(ReceiverSpec {
        id: SessionId(7),
        peer: PeerId(1),
        dst_region: RegionId(1),
        dst_layout,
        dst_blocks,
        plan,
        expires: epoch() + Duration::from_secs(10),
    })
}

fn drain(rx: &mut ReceiverSession) -> Vec<FrameKind> {
    std::iter::from_fn(|| rx.poll_transmit().map(|t| t.header.kind)).collect()
}

#[test]
fn delivered_then_closed_then_acknowledged() {
    let (mut rx, headers) = receiver();
    let mut events = VecDeque::new();
    assert_eq!(drain(&mut rx), vec![FrameKind::OpenAck]);
    for h in &headers {
        assert!(matches!(rx.placement(h), Ok(Placement::Write { .. })));
        rx.on_data(h, h.crc, &mut events).unwrap();
    }
    assert_eq!(rx.state, RxState::Resolved);
    assert!(matches!(events.back(), Some(Event::Completed { .. })));
    assert_eq!(drain(&mut rx), vec![FrameKind::Ack]);
    // A late duplicate is acknowledged again, never placed.
    assert_eq!(rx.placement(&headers[0]), Ok(Placement::Discard));
    rx.on_data(&headers[0], headers[0].crc, &mut events)
        .unwrap();
    rx.on_close(&mut events);
    assert_eq!(rx.state, RxState::Closing);
    assert!(!rx.is_done());
    assert_eq!(drain(&mut rx), vec![FrameKind::Ack, FrameKind::CloseAck]);
    assert!(rx.is_done());
}

#[test]
fn a_corrupt_slice_is_nacked_once_and_an_expired_session_reports_what_is_missing() {
    let (mut rx, headers) = receiver();
    let mut events = VecDeque::new();
    drain(&mut rx);
    for _ in 0..3 {
        rx.on_data(&headers[1], !headers[1].crc, &mut events)
            .unwrap();
    }
    assert_eq!(
        drain(&mut rx),
        vec![FrameKind::Nack],
        "one nack however often it is corrupted"
    );
    rx.on_data(&headers[0], headers[0].crc, &mut events)
        .unwrap();
    rx.expire(&mut events);
    assert!(rx.is_done());
    let missing = events.iter().find_map(|e| match e {
        Event::Recompute { blocks, .. } => Some(blocks.clone()),
        _ => None,
    });
    // Units 1..4 never verified: block 3 of layer 0 and both blocks of layer 1.
    assert_eq!(
        missing,
        Some(vec![
            BlockId::new(0, 3),
            BlockId::new(1, 2),
            BlockId::new(1, 3)
        ])
    );
    assert_eq!(rx.placement(&headers[2]), Ok(Placement::Discard));
}

/// A receiver of 1 layer x 2 blocks, each of `slices` slices of 256 bytes (packetized), and the header of a
/// frame carrying `count` slices from unit `first` (offset and block of unit `first`).
fn packetized(slices: u64) -> (ReceiverSession, impl Fn(u32, u32) -> Header) {
    let block_bytes = 256 * slices;
    let layout = KvLayout::new(1, 2, block_bytes, 16, Dtype::F16).unwrap();
    let mode = TransferMode::Packetized { slice_bytes: 256 };
    let plan = Plan::build(
        &BlockShape::whole(block_bytes),
        0..1,
        &[0, 1],
        &[0, 1],
        mode,
    )
    .unwrap();
    let units = plan.units.clone();
    let header = move |first: u32, count: u32| {
        let u = units[first as usize];
        let mut h = Header::new(FrameKind::Data, 7);
        (h.layer, h.block, h.offset, h.length) = (u.layer, u.first, u.offset, 256 * count);
        h.sequence = first;
        h.crc = 99;
        h
    };
    (session(layout, plan, vec![0, 1]), header)
}

/// The units acknowledged by the next frame out, which must be an ack.
fn acked(rx: &mut ReceiverSession) -> Vec<u32> {
    let t = rx.poll_transmit().expect("an ack is due");
    assert_eq!(t.header.kind, FrameKind::Ack);
    let Body::Control(payload) = t.body else {
        panic!("an ack carries ranges");
    };
    crate::wire::control::decode_ranges(&payload)
        .unwrap()
        .into_iter()
        .flatten()
        .collect()
}

#[test]
fn a_coalesced_frame_lands_whole_and_verifies_each_of_its_slices() {
    let (mut rx, header) = packetized(4);
    let mut events = VecDeque::new();
    drain(&mut rx);
    // Slices 1..4 of block 0, back to back after slice 0.
    let run = header(1, 3);
    assert_eq!(
        rx.placement(&run),
        Ok(Placement::Write {
            region: RegionId(1),
            offset: 256,
            len: 768
        })
    );
    rx.on_data(&run, run.crc, &mut events).unwrap();
    assert_eq!(acked(&mut rx), vec![1, 2, 3]);
    assert!(events.is_empty(), "block 0 still misses slice 0");
    let first = header(0, 1);
    rx.on_data(&first, first.crc, &mut events).unwrap();
    assert!(matches!(
        events.pop_front(),
        Some(Event::BlockDelivered { block, .. }) if block == BlockId::new(0, 0)
    ));
    // A frame any of whose slices verified is not placed; only the verified ones are acknowledged again.
    let resent = header(5, 1);
    rx.on_data(&resent, resent.crc, &mut events).unwrap();
    drain(&mut rx);
    let late = header(4, 3);
    assert_eq!(rx.placement(&late), Ok(Placement::Discard));
    rx.on_data(&late, late.crc, &mut events).unwrap();
    assert_eq!(acked(&mut rx), vec![5]);
    assert_eq!(rx.stats.duplicates, 1);
}

#[test]
fn a_corrupt_coalesced_frame_nacks_each_of_its_slices() {
    let (mut rx, header) = packetized(4);
    let mut events = VecDeque::new();
    drain(&mut rx);
    let run = header(4, 4);
    rx.on_data(&run, !run.crc, &mut events).unwrap();
    let nacked: Vec<u32> =
        std::iter::from_fn(|| rx.poll_transmit().map(|t| t.header.sequence)).collect();
    assert_eq!(nacked, vec![4, 5, 6, 7]);
    assert_eq!(rx.stats.checksum_failures, 1);
}

#[test]
fn a_frame_is_refused_unless_it_carries_whole_following_slices_of_one_block() {
    let (rx, header) = packetized(4);
    let refused = |h: &Header| matches!(rx.placement(h), Err(Error::FrameMismatch { .. }));
    assert!(!refused(&header(0, 4)), "a whole block of slices");
    assert!(
        refused(&header(2, 3)),
        "slices 2..5 run into the next block"
    );
    let mut partial = header(0, 2);
    partial.length -= 1;
    assert!(refused(&partial), "a slice and part of the next");
    let mut wrong_offset = header(1, 2);
    wrong_offset.offset = 0;
    assert!(refused(&wrong_offset));
    assert!(refused(&header(7, 2)), "past the plan's last unit");

    let (rx, header) = packetized(MAX_COALESCED_SLICES as u64 + 1);
    let most = MAX_COALESCED_SLICES as u32;
    assert!(rx.placement(&header(0, most)).is_ok());
    assert!(
        matches!(
            rx.placement(&header(0, most + 1)),
            Err(Error::FrameMismatch { .. })
        ),
        "more slices than one frame may carry"
    );
}
