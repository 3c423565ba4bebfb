//! Bad input gets a clear error and loses nothing: every case runs beside a good transfer that must still
//! arrive byte-identical.

mod common;

use std::time::Duration;

use common::{A, B, KvZeroed, Offer, Pair, layout};
use transfer_engine::wire::{FrameKind, HEADER_LEN, Header, WireError, encode_frame};
use transfer_engine::{
    AccessKey, Dtype, Error, Event, KvLayout, MemoryRegion, Role, SessionId, TransferMode,
    TransferRequest,
};

/// Starts a good packetized transfer and moves it part way.
fn pair_with_good_transfer() -> (
    Pair,
    transfer_engine::RegionHandle,
    transfer_engine::RegionHandle,
) {
    // A small window keeps the good transfer in flight across many steps.
    let small_window = |id| {
        let mut cfg = common::config(id);
        cfg.window_bytes = 8192;
        cfg
    };
    let mut pair = Pair::with_configs(small_window(1), small_window(2));
    let (src, dst) = pair.regions(layout(4, 8, 8192), 42);
    let req = TransferRequest::whole(B, &src, &dst)
        .unwrap()
        .with_mode(TransferMode::Packetized { slice_bytes: 1024 });
    pair.a.submit(pair.now, req).unwrap();
    pair.step();
    pair.step();
    assert_eq!(
        pair.a.live_sessions(),
        1,
        "the good transfer is still in flight"
    );
    (pair, src, dst)
}

fn finish_and_check_good_transfer(
    mut pair: Pair,
    src: transfer_engine::RegionHandle,
    dst: transfer_engine::RegionHandle,
) {
    pair.run(Duration::from_secs(10));
    assert_eq!(
        pair.bytes_a(src.id),
        pair.bytes_b(dst.id),
        "good transfer corrupted"
    );
    let ok = pair.events_a.iter().any(|(_, e)| matches!(e, Event::Completed { role: Role::Sender, stats, .. } if stats.recompute_blocks == 0 && stats.blocks_delivered == 32));
    assert!(
        ok,
        "the good transfer must complete with every block delivered: {:?}",
        pair.events_a
    );
}

#[test]
fn mismatched_block_size_is_refused_at_submit_naming_both_values() {
    let mut pair = Pair::new();
    let src_layout = KvLayout::new(2, 4, 4096, 32, Dtype::F16).unwrap();
    let dst_layout = KvLayout::new(2, 4, 4096, 16, Dtype::F16).unwrap();
    let src = pair.a.kv_zeroed(src_layout).unwrap();
    let dst = pair.b.kv_zeroed(dst_layout).unwrap();
    let err = pair
        .a
        .submit(pair.now, TransferRequest::whole(B, &src, &dst).unwrap())
        .unwrap_err();
    assert_eq!(
        err,
        Error::LayoutMismatch {
            field: "block size (tokens per block)",
            local: 32,
            remote: 16
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("32") && text.contains("16") && text.contains("same block size"),
        "{text}"
    );
    assert_eq!(pair.a.live_sessions(), 0);

    let wide = KvLayout::new(2, 4, 8192, 16, Dtype::F16).unwrap();
    let dst = pair.b.kv_zeroed(wide).unwrap();
    let src = pair
        .a
        .kv_zeroed(KvLayout::new(2, 4, 4096, 16, Dtype::F16).unwrap())
        .unwrap();
    let err = pair
        .a
        .submit(pair.now, TransferRequest::whole(B, &src, &dst).unwrap())
        .unwrap_err();
    assert!(
        err.to_string().contains("4096") && err.to_string().contains("8192"),
        "{err}"
    );
}

#[test]
fn a_receiver_refuses_a_layout_that_disagrees_with_its_region() {
    let (mut pair, src, dst) = pair_with_good_transfer();
    // The sender believes the destination holds 32-token blocks; the receiver registered 16.
    let theirs = pair.b.kv_zeroed(layout(4, 8, 8192)).unwrap();
    let mut lying = TransferRequest::whole(B, &src, &theirs).unwrap();
    lying.src_layout.tokens_per_block = 32;
    lying.dst_layout.tokens_per_block = 32;
    let mine = pair.a.kv_zeroed(lying.src_layout).unwrap();
    lying.src_region = mine.id;
    pair.a.submit(pair.now, lying).unwrap();
    pair.step();
    assert!(
        pair.refused_b.iter().any(|e| matches!(
            e,
            Error::LayoutMismatch {
                local: 16,
                remote: 32,
                ..
            }
        )),
        "{:?}",
        pair.refused_b
    );
    assert!(
        pair.events_a
            .iter()
            .any(|(_, e)| matches!(e, Event::Refused { reason, .. } if reason.contains("32")))
    );
    finish_and_check_good_transfer(pair, src, dst);
}

#[test]
fn a_wrong_access_key_is_refused_and_the_sender_hands_everything_back() {
    let (mut pair, src, dst) = pair_with_good_transfer();
    let target = pair.b.kv_zeroed(layout(4, 8, 8192)).unwrap();
    let mut req = TransferRequest::whole(B, &src, &target).unwrap();
    req.dst_key = AccessKey(target.key.0 ^ 1);
    let bad = pair.a.submit(pair.now, req).unwrap();
    pair.step();
    assert!(
        pair.refused_b.contains(&Error::WrongKey(target.id)),
        "{:?}",
        pair.refused_b
    );
    let refused = pair.events_a.iter().find_map(|(_, e)| match e {
        Event::Refused { session, reason } if *session == bad => Some(reason.clone()),
        _ => None,
    });
    assert!(refused.is_some_and(|r| r.contains("wrong access key")));
    let recompute = pair.events_a.iter().find_map(|(_, e)| match e {
        Event::Recompute {
            session, blocks, ..
        } if *session == bad => Some(blocks.len()),
        _ => None,
    });
    assert_eq!(
        recompute,
        Some(32),
        "every block of a refused session goes back for recompute"
    );
    assert!(
        pair.bytes_b(target.id).iter().all(|&b| b == 0),
        "nothing was written"
    );
    finish_and_check_good_transfer(pair, src, dst);
}

#[test]
fn out_of_bounds_addresses_are_refused() {
    let (mut pair, src, dst) = pair_with_good_transfer();
    // A region smaller than the layout the sender claims for it.
    let small = pair.b.register_region(MemoryRegion::zeroed(1000)).unwrap();
    let mut req = TransferRequest::whole(B, &src, &dst).unwrap();
    req.dst_region = small.id;
    req.dst_key = small.key;
    pair.a.submit(pair.now, req).unwrap();
    pair.step();
    assert!(
        pair.refused_b.iter().any(
            |e| matches!(e, Error::OutOfBounds { region, len: 1000, .. } if *region == small.id)
        ),
        "{:?}",
        pair.refused_b
    );
    // A data frame of the good session addressing bytes its plan does not hold.
    let session = good_session(&pair);
    let mut h = Header::new(FrameKind::Data, session.0);
    h.layer = 0;
    h.block = 0;
    h.offset = 1 << 40;
    h.sequence = 0;
    let err = pair
        .b
        .offer(pair.now, A, &encode_frame(&h, &[0u8; 1024]))
        .unwrap_err();
    assert!(matches!(err, Error::FrameMismatch { .. }), "{err}");
    h.offset = 0;
    h.sequence = 1 << 30;
    let err = pair
        .b
        .offer(pair.now, A, &encode_frame(&h, &[0u8; 1024]))
        .unwrap_err();
    assert!(err.to_string().contains("unit 1073741824"), "{err}");
    // Locally: a source region too small for its layout.
    let tiny = pair.a.register_region(MemoryRegion::zeroed(10)).unwrap();
    let mut req = TransferRequest::whole(B, &src, &dst).unwrap();
    req.src_region = tiny.id;
    assert!(matches!(
        pair.a.submit(pair.now, req),
        Err(Error::OutOfBounds { .. })
    ));
    finish_and_check_good_transfer(pair, src, dst);
}

fn good_session(pair: &Pair) -> SessionId {
    pair.events_b
        .iter()
        .find_map(|(_, e)| match e {
            Event::Incoming { session, .. } => Some(*session),
            _ => None,
        })
        .unwrap()
}

#[test]
fn unknown_sessions_and_malformed_frames_get_clear_errors() {
    let (mut pair, src, dst) = pair_with_good_transfer();
    let now = pair.now;
    let data = |session: u64| {
        let mut h = Header::new(FrameKind::Data, session);
        h.sequence = 0;
        encode_frame(&h, &[1, 2, 3])
    };
    let b = &mut pair.b;
    assert_eq!(
        b.offer(now, A, &data(999)),
        Err(Error::UnknownSession(SessionId(999)))
    );
    let ack = encode_frame(&Header::new(FrameKind::Ack, 12345), &[0, 0, 0, 0]);
    assert_eq!(
        pair.a.offer(now, B, &ack),
        Err(Error::UnknownSession(SessionId(12345)))
    );
    // The good session's id from the wrong peer is unknown too: sessions are bound to their peer.
    let session = good_session(&pair);
    let from_stranger = encode_frame(&Header::new(FrameKind::Close, session.0), &[]);
    assert_eq!(
        pair.b
            .offer(now, transfer_engine::PeerId(77), &from_stranger),
        Err(Error::UnknownSession(session))
    );

    let good = data(1);
    let b = &mut pair.b;
    let truncated = b.offer(now, A, &good[..HEADER_LEN - 1]).unwrap_err();
    assert_eq!(
        truncated,
        Error::Wire(WireError::Truncated {
            needed: HEADER_LEN,
            got: HEADER_LEN - 1
        })
    );
    let short_payload = b.offer(now, A, &good[..good.len() - 1]).unwrap_err();
    assert!(matches!(
        short_payload,
        Error::Wire(WireError::Truncated { .. })
    ));
    let mut long = good.clone();
    long.extend_from_slice(&[0; 5]);
    assert_eq!(
        b.offer(now, A, &long),
        Err(Error::Wire(WireError::TrailingBytes { extra: 5 }))
    );
    let mut huge = Header::new(FrameKind::Open, 5);
    huge.length = u32::MAX;
    let err = b.offer(now, A, &huge.encode()).unwrap_err();
    assert!(
        matches!(err, Error::Wire(WireError::Oversized { .. })),
        "{err}"
    );
    let mut v9 = good.clone();
    v9[2] = 9;
    let err = b.offer(now, A, &v9).unwrap_err();
    assert_eq!(
        err,
        Error::Wire(WireError::UnsupportedVersion {
            got: 9,
            supported: transfer_engine::wire::VERSION
        })
    );
    assert!(err.to_string().contains("upgrade"), "{err}");
    let mut flipped = good.clone();
    flipped[20] ^= 1;
    assert_eq!(
        b.offer(now, A, &flipped),
        Err(Error::Wire(WireError::HeaderChecksum))
    );
    let garbage: Vec<u8> = (0..200u8).collect();
    assert!(b.offer(now, A, &garbage).is_err());
    // A malformed open and a malformed ack.
    let open = encode_frame(&Header::new(FrameKind::Open, 77), &[1, 2, 3]);
    assert!(matches!(
        b.offer(now, A, &open),
        Err(Error::Wire(WireError::BadControl { what: "open" }))
    ));
    let bad_ack = encode_frame(&Header::new(FrameKind::Ack, session.0), &[9, 9]);
    let err = pair.a.offer(now, B, &bad_ack).unwrap_err();
    assert_eq!(err, Error::Wire(WireError::BadControl { what: "ack" }));
    assert!(pair.b.stats().frames_refused >= 10);
    finish_and_check_good_transfer(pair, src, dst);
}

#[test]
fn regions_in_use_cannot_be_unregistered_and_unknown_regions_are_named() {
    let (mut pair, src, dst) = pair_with_good_transfer();
    assert!(matches!(
        pair.a.unregister_region(src.id),
        Err(Error::RegionBusy { .. })
    ));
    let mut req = TransferRequest::whole(B, &src, &dst).unwrap();
    req.src_region = transfer_engine::RegionId(99);
    let err = pair.a.submit(pair.now, req).unwrap_err();
    assert_eq!(err, Error::UnknownRegion(transfer_engine::RegionId(99)));
    assert!(err.to_string().contains("#99"));
    finish_and_check_good_transfer(pair, src, dst);
}

#[test]
fn a_restarted_peer_that_reuses_a_session_id_is_refused_at_once() {
    let mut pair = Pair::new();
    let l = layout(2, 2, 4096);
    let (src, dst) = pair.regions(l, 9);
    let first = pair
        .a
        .submit(pair.now, TransferRequest::whole(B, &src, &dst).unwrap())
        .unwrap();
    pair.run(Duration::from_secs(5));
    // The producer restarts with the same engine id and seed: its session ids repeat.
    pair.a = transfer_engine::Engine::new(common::config(1));
    let src = pair.a.kv_zeroed(l).unwrap();
    let again = pair
        .a
        .submit(pair.now, TransferRequest::whole(B, &src, &dst).unwrap())
        .unwrap();
    assert_eq!(again, first, "same seed, same first session id");
    pair.step();
    assert!(
        pair.refused_b
            .iter()
            .any(|e| e.to_string().contains("reused its session ids")),
        "{:?}",
        pair.refused_b
    );
    let refused = pair.events_a.iter().any(|(_, e)| {
        matches!(e, Event::Refused { session, reason } if *session == again && reason.contains("rng_seed"))
    });
    assert!(
        refused,
        "the sender learns at once, not at its deadline: {:?}",
        pair.events_a
    );
}

#[test]
fn a_region_reserved_for_another_peer_refuses_the_open() {
    let mut pair = Pair::new();
    let l = layout(2, 4, 4096);
    let src = pair.a.kv_zeroed(l).unwrap();
    let dst = pair.b.kv_zeroed(l).unwrap();
    pair.b
        .set_region_owner(dst.id, Some(transfer_engine::PeerId(99)))
        .unwrap();
    let session = pair
        .a
        .submit(pair.now, TransferRequest::whole(B, &src, &dst).unwrap())
        .unwrap();
    pair.run(std::time::Duration::from_secs(30));
    assert!(
        pair.refused_b
            .iter()
            .any(|e| matches!(e, Error::NotOwner { region, .. } if *region == dst.id)),
        "{:?}",
        pair.refused_b
    );
    let refused = pair.events_a.iter().any(|(_, e)| {
        matches!(e, Event::Refused { session: s, reason } if *s == session && reason.contains("belongs to another peer"))
    });
    assert!(refused, "the sender learns why");
    // The owner itself may write.
    pair.b.set_region_owner(dst.id, Some(A)).unwrap();
    pair.a
        .submit(pair.now, TransferRequest::whole(B, &src, &dst).unwrap())
        .unwrap();
    let before = pair.refused_b.len();
    pair.run(std::time::Duration::from_secs(60));
    assert_eq!(pair.refused_b.len(), before);
}

#[test]
fn a_peer_cannot_open_more_sessions_than_its_bound() {
    let mut b = common::config(2);
    b.max_incoming_per_peer = 2;
    let mut pair = Pair::with_configs(common::config(1), b);
    let l = layout(2, 4, 4096);
    let src = pair.a.kv_zeroed(l).unwrap();
    let dst = pair.b.kv_zeroed(l).unwrap();
    for _ in 0..3 {
        let req = TransferRequest::whole(B, &src, &dst).unwrap();
        pair.a.submit(pair.now, req).unwrap();
    }
    // Deliver the three opens without letting any session finish.
    pair.filter = Box::new(|h, _| {
        if h.kind == transfer_engine::wire::FrameKind::Data {
            common::Action::Drop
        } else {
            common::Action::Pass
        }
    });
    pair.step();
    assert_eq!(pair.b.live_sessions(), 2);
    assert!(
        pair.refused_b
            .iter()
            .any(|e| e.to_string().contains("already has 2 sessions open here")),
        "{:?}",
        pair.refused_b
    );
}
