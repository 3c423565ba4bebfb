//! A full-size transfer over the loopback backend: 1 GiB of KV (32 layers x 128 blocks x 256 KiB) in each
//! mode must arrive byte-identical, every block and layer reported exactly once.

use std::collections::BTreeSet;
use std::time::Duration;

use backends::loopback::{CONSUMER, LoopbackPair};
use transfer_engine::{BlockId, Dtype, Event, KvLayout, Role, TransferMode, TransferRequest};

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
    let mut pair = LoopbackPair::with_defaults();
    let src = pair.producer.kv_region(layout).unwrap();
    let dst = pair.consumer.kv_region(layout).unwrap();
    fill(pair.producer.memory.region_mut(src.id).unwrap(), seed);
    let req = TransferRequest::whole(CONSUMER, &src, &dst)
        .unwrap()
        .with_mode(mode);
    let out = pair.transfer(req, Duration::from_secs(300)).unwrap();
    let stats = pair.producer.engine.stats();
    assert!(
        out.recompute.is_empty(),
        "{mode:?}: {} blocks to recompute; {stats:?}",
        out.recompute.len()
    );
    assert!(
        pair.producer.memory.region(src.id).unwrap()
            == pair.consumer.memory.region(dst.id).unwrap(),
        "{mode:?}: destination differs from source"
    );
    let blocks: Vec<BlockId> = pair
        .consumer
        .events
        .iter()
        .filter_map(|e| match e {
            Event::BlockDelivered { block, .. } => Some(*block),
            _ => None,
        })
        .collect();
    assert_eq!(blocks.len(), 32 * 128, "{mode:?}: each block reported once");
    assert_eq!(blocks.iter().collect::<BTreeSet<_>>().len(), 32 * 128);
    let layers: Vec<u32> = pair
        .consumer
        .events
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
    let sender = pair.producer.events.iter().find_map(|e| match e {
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
    assert!(pair.producer.refused.is_empty() && pair.consumer.refused.is_empty());
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
