//! The sender's state machine on its own: open, send, acknowledgement, close; refusal; deadline.

use std::collections::VecDeque;
use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::plan::BlockShape;
use crate::tests_support::epoch;
use crate::{BlockId, Dtype, EngineConfig, Event, KvLayout, RetransmitBudget, TransferMode};

/// What a session borrows from its engine.
struct World {
    cfg: EngineConfig,
    rng: ChaCha8Rng,
    budget: RetransmitBudget,
    events: VecDeque<Event>,
}

impl World {
    fn new() -> Self {
        Self {
            cfg: EngineConfig::default(),
            rng: ChaCha8Rng::seed_from_u64(1),
            budget: RetransmitBudget::default(),
            events: VecDeque::new(),
        }
    }

    fn ctx(&mut self) -> Ctx<'_> {
        Ctx {
            cfg: &self.cfg,
            rng: &mut self.rng,
            budget: &mut self.budget,
            events: &mut self.events,
        }
    }
}

/// A sender of source blocks 0 and 1 of 2 layers (1 KiB each, exclusive: 4 units).
fn sender() -> SenderSession {
    let layout = KvLayout::new(2, 4, 1024, 16, Dtype::F16).unwrap();
    let plan = Plan::build(
        &BlockShape::whole(1024),
        0..2,
        &[0, 1],
        &[2, 3],
        TransferMode::Exclusive,
    )
    .unwrap();
    SenderSession::new(SenderSpec {
        id: SessionId(9),
        peer: PeerId(2),
        class: TrafficClass::BulkKv,
        src_region: RegionId(1),
        src_layout: layout,
        src_blocks: vec![0, 1],
        dst_blocks: vec![2, 3],
        plan,
        open_payload: vec![1, 2, 3],
        deadline: epoch() + Duration::from_secs(10),
        prefetch_depth: None,
        written_until: u32::MAX,
    })
}

fn kinds(s: &mut SenderSession, w: &mut World) -> Vec<FrameKind> {
    let now = epoch();
    std::iter::from_fn(|| s.poll_transmit(now, &mut w.ctx()).map(|t| t.header.kind)).collect()
}

#[test]
fn opens_sends_is_acknowledged_and_closes() {
    let (mut s, mut w) = (sender(), World::new());
    assert_eq!(
        kinds(&mut s, &mut w),
        vec![FrameKind::Open],
        "nothing before the open is accepted"
    );
    s.on_open_ack();
    assert_eq!(s.state, SenderState::Sending);
    assert_eq!(kinds(&mut s, &mut w), vec![FrameKind::Data; 4]);
    s.on_ack(epoch(), std::slice::from_ref(&(0..4)), &mut w.ctx())
        .unwrap();
    assert!(
        matches!(w.events.back(), Some(Event::Completed { stats, .. }) if stats.recompute_blocks == 0)
    );
    assert_eq!(s.state, SenderState::Closing);
    assert_eq!(kinds(&mut s, &mut w), vec![FrameKind::Close]);
    s.on_close_ack();
    assert!(s.is_done());
    // An ack naming units the session never had is refused, not applied.
    let mut fresh = sender();
    fresh.on_open_ack();
    assert!(
        fresh
            .on_ack(epoch(), std::slice::from_ref(&(3..9)), &mut w.ctx())
            .is_err()
    );
}

#[test]
fn a_refused_open_hands_every_block_back() {
    let (mut s, mut w) = (sender(), World::new());
    kinds(&mut s, &mut w);
    s.on_reject("no room".into(), &mut w.ctx());
    assert!(s.is_done());
    let blocks = w.events.iter().find_map(|e| match e {
        Event::Recompute { blocks, .. } => Some(blocks.len()),
        _ => None,
    });
    assert_eq!(blocks, Some(4));
    assert!(
        w.events
            .iter()
            .any(|e| matches!(e, Event::Refused { reason, .. } if reason == "no room"))
    );
}

#[test]
fn the_deadline_hands_back_exactly_the_unacknowledged_blocks() {
    let (mut s, mut w) = (sender(), World::new());
    kinds(&mut s, &mut w);
    s.on_open_ack();
    kinds(&mut s, &mut w);
    // Units 0 and 1 are layer 0's two blocks.
    s.on_ack(epoch(), std::slice::from_ref(&(0..2)), &mut w.ctx())
        .unwrap();
    s.handle_timeout(epoch() + Duration::from_secs(11), &mut w.ctx());
    let blocks = w.events.iter().find_map(|e| match e {
        Event::Recompute { blocks, .. } => Some(blocks.clone()),
        _ => None,
    });
    assert_eq!(blocks, Some(vec![BlockId::new(1, 0), BlockId::new(1, 1)]));
    assert_eq!(s.state, SenderState::Closing);
}

#[test]
fn layers_go_out_only_as_the_producer_writes_them() {
    let (mut s, mut w) = (sender(), World::new());
    s.spec.written_until = 0;
    kinds(&mut s, &mut w);
    s.on_open_ack();
    assert!(kinds(&mut s, &mut w).is_empty(), "nothing is written yet");
    s.layers_written(1);
    let layers = |s: &mut SenderSession, w: &mut World| -> Vec<u32> {
        std::iter::from_fn(|| {
            s.poll_transmit(epoch(), &mut w.ctx())
                .map(|t| t.header.layer)
        })
        .collect()
    };
    assert_eq!(layers(&mut s, &mut w), vec![0, 0], "layer 0's two blocks");
    s.layers_written(0); // never moves back
    assert!(layers(&mut s, &mut w).is_empty());
    s.layers_written(2);
    assert_eq!(layers(&mut s, &mut w), vec![1, 1]);
}

#[test]
fn coalesced_frames_stop_at_the_block_the_limit_and_the_window() {
    let mut w = World::new();
    // One layer of blocks 0 and 1, 4 KiB each in 1 KiB slices: units 0..4 and 4..8.
    let layout = KvLayout::new(1, 2, 4096, 16, Dtype::F16).unwrap();
    let mode = TransferMode::Packetized { slice_bytes: 1024 };
    let plan = Plan::build(&BlockShape::whole(4096), 0..1, &[0, 1], &[0, 1], mode).unwrap();
    let mut s = SenderSession::new(SenderSpec {
        plan,
        src_layout: layout,
        ..sender().spec
    });
    kinds(&mut s, &mut w);
    s.on_open_ack();
    let frames = |s: &mut SenderSession, w: &mut World| -> Vec<(u32, u32)> {
        std::iter::from_fn(|| {
            s.poll_transmit(epoch(), &mut w.ctx())
                .map(|t| (t.header.sequence, t.header.length))
        })
        .collect()
    };
    // Up to 3 KiB a frame and 6 KiB in flight: block 0 goes as 3 + 1 slices, and the window cuts the
    // third frame short.
    (w.cfg.coalesce_bytes, w.cfg.window_bytes) = (3072, 6144);
    assert_eq!(
        frames(&mut s, &mut w),
        vec![(0, 3072), (3, 1024), (4, 2048)]
    );
    s.on_ack(epoch(), std::slice::from_ref(&(0..4)), &mut w.ctx())
        .unwrap();
    assert_eq!(frames(&mut s, &mut w), vec![(6, 2048)]);
    // One timer covers a frame's slices: when it goes off, each unacknowledged one is resent alone.
    s.handle_timeout(epoch() + Duration::from_secs(1), &mut w.ctx());
    assert_eq!(
        frames(&mut s, &mut w),
        vec![(4, 1024), (5, 1024), (6, 1024), (7, 1024)]
    );
}

#[test]
fn a_coalesced_frame_never_exceeds_the_largest_payload() {
    let mut w = World::new();
    // One block of two 1 GiB slices: together they would pass the wire's 1 GiB payload limit.
    let block = 2u64 << 30;
    let layout = KvLayout::new(1, 1, block, 16, Dtype::F16).unwrap();
    let mode = TransferMode::Packetized {
        slice_bytes: crate::wire::MAX_PAYLOAD,
    };
    let plan = Plan::build(&BlockShape::whole(block), 0..1, &[0], &[0], mode).unwrap();
    let mut s = SenderSession::new(SenderSpec {
        plan,
        src_layout: layout,
        src_blocks: vec![0],
        dst_blocks: vec![0],
        ..sender().spec
    });
    (w.cfg.coalesce_bytes, w.cfg.window_bytes) = (u32::MAX, u64::MAX);
    kinds(&mut s, &mut w);
    s.on_open_ack();
    let lengths: Vec<u32> = std::iter::from_fn(|| {
        s.poll_transmit(epoch(), &mut w.ctx())
            .map(|t| t.header.length)
    })
    .collect();
    assert_eq!(lengths, vec![crate::wire::MAX_PAYLOAD; 2]);
}
