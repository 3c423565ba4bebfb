//! Hand-stepped tests of traffic shaping and layer-wise streaming: the KV cap, strict priority with
//! anti-starvation, and the prefetch window driven by the consumer.

mod common;

use std::time::Duration;

use common::{A, Action, B, Pair, layout};
use transfer_engine::wire::FrameKind;
use transfer_engine::{
    Event, SessionId, ShapingConfig, TrafficClass, TransferMode, TransferRequest,
};

fn shaped(link: u64, kv_share: f64) -> ShapingConfig {
    let mut cfg = ShapingConfig::default();
    cfg.link_bytes_per_sec = Some(link);
    cfg.kv_share = kv_share;
    cfg.burst_bytes = 1 << 20;
    cfg
}

fn data_bytes_of(pair: &Pair, session: SessionId) -> Vec<(Duration, u64)> {
    pair.frames
        .iter()
        .filter(|(_, from, h)| *from == A && h.kind == FrameKind::Data && h.session == session.0)
        .map(|(t, _, h)| (*t, u64::from(h.length)))
        .collect()
}

#[test]
fn kv_never_exceeds_its_share_of_the_link() {
    let mut pair = Pair::new();
    pair.a.set_shaping(shaped(1_000_000_000, 0.4)).unwrap();
    let (src, dst) = pair.regions(layout(8, 20, 256 << 10), 1); // 40 MiB
    let req = TransferRequest::whole(B, &src, &dst)
        .unwrap()
        .with_mode(TransferMode::packetized());
    let session = pair.a.submit(pair.now, req).unwrap();
    pair.run(Duration::from_secs(5));
    let sent = data_bytes_of(&pair, session);
    let total: u64 = sent.iter().map(|(_, b)| b).sum();
    assert_eq!(total, 40 << 20);
    // After the 1 MiB burst, 39 MiB at 400 MB/s takes 102 ms.
    let last = sent.last().unwrap().0.as_secs_f64();
    let expected = (39.0 * 1048576.0) / 4e8;
    assert!(
        (last - expected).abs() / expected < 0.02,
        "last slice at {last:.4}s, expected {expected:.4}s"
    );
    // No 10 ms window carries more than the cap plus one burst.
    for window_start in sent.iter().map(|(t, _)| *t) {
        let in_window: u64 = sent
            .iter()
            .filter(|(t, _)| *t >= window_start && *t < window_start + Duration::from_millis(10))
            .map(|(_, b)| b)
            .sum();
        assert!(
            in_window <= 4_000_000 + (1 << 20) + 65536,
            "{in_window} bytes in 10 ms from {window_start:?}"
        );
    }
    assert_eq!(pair.bytes_a(src.id), pair.bytes_b(dst.id));
}

#[test]
fn urgent_kv_goes_first_but_bulk_kv_is_never_starved() {
    let mut pair = Pair::new();
    pair.a.set_shaping(shaped(1_000_000_000, 1.0)).unwrap();
    let (src, dst) = pair.regions(layout(4, 16, 128 << 10), 2); // 8 MiB each
    let bulk = TransferRequest::whole(B, &src, &dst)
        .unwrap()
        .with_mode(TransferMode::packetized())
        .with_class(TrafficClass::BulkKv);
    let (src2, dst2) = pair.regions(layout(4, 16, 128 << 10), 3);
    let urgent = TransferRequest::whole(B, &src2, &dst2)
        .unwrap()
        .with_mode(TransferMode::packetized())
        .with_class(TrafficClass::UrgentKv);
    let bulk = pair.a.submit(pair.now, bulk).unwrap();
    let urgent = pair.a.submit(pair.now, urgent).unwrap();
    pair.run(Duration::from_secs(5));
    let u = data_bytes_of(&pair, urgent);
    let b = data_bytes_of(&pair, bulk);
    let urgent_done = u.last().unwrap().0;
    let bulk_during: Vec<_> = b.iter().filter(|(t, _)| *t < urgent_done).collect();
    // Strict priority: urgent takes nearly all of the link while it has data...
    let bulk_bytes: u64 = bulk_during.iter().map(|(_, n)| n).sum();
    assert!(
        bulk_bytes < (8 << 20) / 10,
        "bulk took {bulk_bytes} bytes while urgent was sending"
    );
    // ...but bulk gets a turn at least every starvation limit (5 ms) plus one slice time.
    let mut last = Duration::ZERO;
    for (t, _) in &bulk_during {
        assert!(
            *t - last <= Duration::from_micros(5_200),
            "bulk waited {:?} at {t:?}",
            *t - last
        );
        last = *t;
    }
    assert!(urgent_done - last <= Duration::from_micros(5_200));
    assert!(!bulk_during.is_empty());
    assert_eq!(pair.bytes_a(src.id), pair.bytes_b(dst.id));
    assert_eq!(pair.bytes_a(src2.id), pair.bytes_b(dst2.id));
}

fn layers_complete(pair: &Pair) -> Vec<u32> {
    pair.events_b
        .iter()
        .filter_map(|(_, e)| match e {
            Event::LayerComplete { layer, .. } => Some(*layer),
            _ => None,
        })
        .collect()
}

#[test]
fn streaming_keeps_prefetch_depth_layers_ahead_of_the_consumer() {
    let mut pair = Pair::new();
    let (src, dst) = pair.regions(layout(8, 4, 16 << 10), 4);
    let req = TransferRequest::whole(B, &src, &dst)
        .unwrap()
        .with_mode(TransferMode::Exclusive)
        .with_prefetch_depth(2);
    let session = pair.a.submit(pair.now, req).unwrap();
    pair.run_for(Duration::from_millis(100));
    // The consumer has not started: layers 0..=2 (current + 2 ahead) arrive, nothing more is sent.
    assert_eq!(layers_complete(&pair), vec![0, 1, 2]);
    assert!(pair.a.live_sessions() == 1 && pair.a.poll_timeout().is_some());
    // Computing layer 1 opens layer 3.
    assert!(
        pair.b.consume_layer(pair.now, session, 1).unwrap(),
        "layer 1 is complete"
    );
    pair.run_for(Duration::from_millis(100));
    assert_eq!(layers_complete(&pair), vec![0, 1, 2, 3]);
    // Jumping to layer 6 (not there yet) blocks the consumer: the sender may run to layer 8, and the
    // blocked layer rides as urgent KV.
    assert!(!pair.b.consume_layer(pair.now, session, 6).unwrap());
    pair.run(Duration::from_secs(1));
    assert_eq!(layers_complete(&pair), (0..8).collect::<Vec<_>>());
    assert_eq!(pair.bytes_a(src.id), pair.bytes_b(dst.id));
}

#[test]
fn a_lost_progress_frame_is_sent_again_while_the_consumer_is_blocked() {
    let mut pair = Pair::new();
    let (src, dst) = pair.regions(layout(4, 2, 16 << 10), 5);
    let req = TransferRequest::whole(B, &src, &dst)
        .unwrap()
        .with_prefetch_depth(0);
    let session = pair.a.submit(pair.now, req).unwrap();
    pair.run_for(Duration::from_millis(100));
    assert_eq!(layers_complete(&pair), vec![0]);
    let mut dropped = 0;
    pair.filter = Box::new(move |h, _| {
        if h.kind == FrameKind::Progress && dropped < 2 {
            dropped += 1;
            return Action::Drop;
        }
        Action::Pass
    });
    assert!(!pair.b.consume_layer(pair.now, session, 1).unwrap());
    let asked = pair.now;
    pair.run_for(Duration::from_millis(100));
    assert!(
        layers_complete(&pair).contains(&1),
        "layer 1 arrived despite two lost progress frames"
    );
    let progress: Vec<_> = pair
        .frames
        .iter()
        .filter(|(_, from, h)| *from == B && h.kind == FrameKind::Progress)
        .collect();
    assert!(progress.len() >= 3, "{progress:?}");
    assert!(
        progress[2].0 - (asked - pair.start) >= Duration::from_millis(10),
        "resent after the backoff base"
    );
}
