//! A driver that loses a peer for good ends every session with it at once, on both ends.

mod common;

use std::time::Duration;

use common::{A, Action, B, Pair, layout};
use transfer_engine::wire::FrameKind;
use transfer_engine::{Event, Role, TransferMode, TransferRequest};

#[test]
fn aborting_a_peer_ends_its_sessions_with_recompute_for_exactly_what_is_missing() {
    let mut pair = Pair::new();
    let (src, dst) = pair.regions(layout(2, 8, 4096), 5);
    let req = TransferRequest::whole(B, &src, &dst)
        .unwrap()
        .with_mode(TransferMode::Packetized { slice_bytes: 4096 });
    let session = pair.a.submit(pair.now, req).unwrap();
    // Let the open and the first four slices (layer 0, blocks 0..4) through, then cut the wire.
    let mut data = 0;
    pair.filter = Box::new(move |h, _| {
        if h.kind == FrameKind::Data {
            data += 1;
            if data > 4 {
                return Action::Drop;
            }
        }
        Action::Pass
    });
    pair.run_for(Duration::from_millis(1));
    assert_eq!(pair.a.abort_peer(B, "peer 2 is unreachable"), 1);
    assert_eq!(pair.b.abort_peer(A, "peer 1 is unreachable"), 1);
    pair.collect();
    assert_eq!(pair.a.live_sessions() + pair.b.live_sessions(), 0);
    for (events, role) in [
        (&pair.events_a, Role::Sender),
        (&pair.events_b, Role::Receiver),
    ] {
        let events: Vec<&Event> = events.iter().map(|(_, e)| e).collect();
        let aborted = events.iter().position(|e| {
            matches!(e, Event::Aborted { session: s, role: r, reason }
                if *s == session && *r == role && reason.contains("unreachable"))
        });
        let recompute = events.iter().find_map(|e| match e {
            Event::Recompute {
                session: s,
                role: r,
                blocks,
            } if *s == session && *r == role => Some(blocks.len()),
            _ => None,
        });
        let completed = events.iter().position(|e| {
            matches!(e, Event::Completed { session: s, role: r, .. } if *s == session && *r == role)
        });
        assert!(
            aborted.is_some() && aborted < completed,
            "{role:?}: {events:?}"
        );
        // 16 blocks in all, 4 delivered (the sender may not have seen their acks: at most 16 to recompute).
        let n = recompute.expect("a recompute report");
        match role {
            Role::Receiver => assert_eq!(n, 12),
            Role::Sender => assert!((12..=16).contains(&n), "{n}"),
        }
    }
    // Nothing more goes out for the ended sessions.
    assert!(pair.a.poll_transmit(pair.now).is_none());
    assert!(pair.b.poll_transmit(pair.now).is_none());
}
