//! A full-size transfer over the loopback backend: 1 GiB of KV (32 layers x 128 blocks x 256 KiB) in each
//! mode must arrive byte-identical, every block and layer reported exactly once.

use std::collections::BTreeSet;
use std::time::Duration;

use backends::loopback::{CONSUMER, LoopbackPair};
use transfer_engine::{
    BlockId, Dtype, Event, KvLayout, MemoryRegion, Role, TransferMode, TransferRequest,
};

fn fill(bytes: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in bytes.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
}

fn one_gib(mode: TransferMode, seed: u64) {
    let layout = KvLayout::new(32, 128, 256 << 10, 16, Dtype::Bf16).unwrap();
    assert_eq!(layout.total_bytes(), 1 << 30);
    let pair = LoopbackPair::with_defaults();
    // The caller's own buffers, registered as they are: the producer's KV pool and the consumer's.
    let mut kv = vec![0u8; layout.total_bytes() as usize];
    fill(&mut kv, seed);
    let src_memory = MemoryRegion::from_vec(kv);
    let dst_memory = MemoryRegion::zeroed(layout.total_bytes() as usize);
    let src = pair
        .producer()
        .register_kv_region(layout, src_memory.clone())
        .unwrap();
    let dst = pair
        .consumer()
        .register_kv_region(layout, dst_memory.clone())
        .unwrap();
    let (mut sent_events, mut received_events) =
        (pair.producer().subscribe(), pair.consumer().subscribe());
    let req = TransferRequest::whole(CONSUMER, &src, &dst)
        .unwrap()
        .with_mode(mode);
    let out = pair.transfer(req, Duration::from_secs(300)).unwrap();
    let received = pair
        .block_on(pair.consumer().wait_received(out.session))
        .unwrap();
    assert!(received.recompute.is_empty());
    let stats = pair.producer().stats();
    assert!(
        out.recompute.is_empty(),
        "{mode:?}: {} blocks to recompute; {stats:?}",
        out.recompute.len()
    );
    assert!(
        *src_memory.read(0..src_memory.len()).unwrap()
            == *dst_memory.read(0..dst_memory.len()).unwrap(),
        "{mode:?}: destination differs from source"
    );
    let drain = |rx: &mut tokio::sync::broadcast::Receiver<Event>| {
        std::iter::from_fn(|| rx.try_recv().ok()).collect::<Vec<_>>()
    };
    let (sent_events, received_events) = (drain(&mut sent_events), drain(&mut received_events));
    let blocks: Vec<BlockId> = received_events
        .iter()
        .filter_map(|e| match e {
            Event::BlockDelivered { block, .. } => Some(*block),
            _ => None,
        })
        .collect();
    assert_eq!(blocks.len(), 32 * 128, "{mode:?}: each block reported once");
    assert_eq!(blocks.iter().collect::<BTreeSet<_>>().len(), 32 * 128);
    let layers: Vec<u32> = received_events
        .iter()
        .filter_map(|e| match e {
            Event::LayerComplete { layer, .. } => Some(*layer),
            _ => None,
        })
        .collect();
    assert_eq!(
        layers,
        (0..32).collect::<Vec<_>>(),
        "{mode:?}: layers complete in order"
    );
    let sender = sent_events.iter().find_map(|e| match e {
        Event::Completed {
            role: Role::Sender,
            stats,
            ..
        } => Some(*stats),
        _ => None,
    });
    let stats = sender.expect("sender completed");
    assert_eq!(stats.recompute_blocks, 0);
    assert_eq!(
        stats.bytes_acked,
        1 << 30,
        "{mode:?}: completion means every byte acknowledged"
    );
    let refused = |end: &backends::loopback::LoopbackNode| {
        end.log_entries()
            .iter()
            .filter(|e| e.kind == backends::node::LogKind::Refused)
            .map(|e| e.times)
            .sum::<u64>()
    };
    assert_eq!(refused(pair.producer()) + refused(pair.consumer()), 0);
}

#[test]
fn one_gib_arrives_byte_identical_in_exclusive_mode() {
    one_gib(TransferMode::Exclusive, 1);
}

#[test]
fn one_gib_arrives_byte_identical_in_packetized_mode() {
    one_gib(TransferMode::packetized(), 2);
}

#[test]
fn one_gib_arrives_byte_identical_in_auto_mode() {
    one_gib(TransferMode::auto(), 3);
}
