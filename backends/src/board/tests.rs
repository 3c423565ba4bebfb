//! The board's bookkeeping of incoming sessions and outcomes, without a backend.
use super::*;

fn incoming(session: u64) -> Event {
    Event::Incoming {
        session: SessionId(session),
        peer: PeerId(1),
        region: RegionId(1),
        layers: 2..4,
        blocks: vec![5, 6],
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn layers_sessions_and_incoming_are_awaited_and_lost_layers_name_their_blocks() {
    let board = Board::default();
    board.observe(&incoming(7));
    let got = block_on(board.next_incoming()).unwrap();
    assert_eq!((got.session, got.layers), (SessionId(7), 2..4));
    board.observe(&Event::LayerComplete {
        session: SessionId(7),
        layer: 2,
    });
    block_on(board.wait_layer(SessionId(7), 2)).unwrap();
    assert!(matches!(
        block_on(board.wait_layer(SessionId(7), 4)),
        Err(WaitError::NoSuchLayer { .. })
    ));
    board.observe(&Event::Recompute {
        session: SessionId(7),
        role: Role::Receiver,
        blocks: vec![BlockId::new(3, 6)],
    });
    board.observe(&Event::Completed {
        session: SessionId(7),
        role: Role::Receiver,
        stats: Counters::default(),
    });
    let lost = block_on(board.wait_layer(SessionId(7), 3)).unwrap_err();
    assert_eq!(
        lost,
        WaitError::LayerLost {
            session: SessionId(7),
            layer: 3,
            blocks: vec![BlockId::new(3, 6)],
            reason: None
        }
    );
    let received = block_on(board.wait_received(SessionId(7))).unwrap();
    assert_eq!(received.recompute, vec![BlockId::new(3, 6)]);
    assert_eq!(
        block_on(board.wait_sent(SessionId(7))),
        Err(WaitError::UnknownSession(SessionId(7)))
    );
}

#[test]
fn a_waiter_wakes_when_its_layer_arrives_from_another_thread() {
    let board = std::sync::Arc::new(Board::default());
    board.observe(&incoming(9));
    let feeder = board.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        feeder.observe(&Event::LayerComplete {
            session: SessionId(9),
            layer: 3,
        });
    });
    block_on(board.wait_layer(SessionId(9), 3)).unwrap();
    t.join().unwrap();
    board.close();
    assert_eq!(block_on(board.next_incoming()), Err(WaitError::Closed));
}

#[test]
fn retention_is_bounded() {
    let board = Board::default();
    for i in 0..(KEEP_INCOMING + KEEP_FINISHED + 10) as u64 {
        board.observe(&incoming(i));
        board.observe(&Event::Completed {
            session: SessionId(i),
            role: Role::Receiver,
            stats: Counters::default(),
        });
    }
    let s = board.state();
    assert_eq!(s.incoming.len(), KEEP_INCOMING);
    assert_eq!(s.receiving.len(), KEEP_FINISHED);
    assert_eq!(s.incoming_dropped, (KEEP_FINISHED + 10) as u64);
}

#[test]
fn a_closed_board_stays_closed_whatever_events_follow() {
    let board = Board::default();
    board.close();
    // A node being torn down may still hand its board the events of sessions it aborts.
    board.observe(&incoming(9));
    assert_eq!(block_on(board.next_incoming()), Err(WaitError::Closed));
    assert_eq!(
        block_on(board.wait_announced(SessionId(9))),
        Err(WaitError::Closed)
    );
}
