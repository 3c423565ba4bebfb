//! Unit tests of the tier store.

use super::*;
use crate::config::namespace;
use crate::keys::{BlockHash, scoped};
use transfer_engine::Dtype;

fn layout(blocks: u32) -> KvLayout {
    KvLayout::new(2, blocks, 64, 16, Dtype::Bf16).unwrap()
}

fn keys(ns_version: u64, ids: &[u8]) -> Vec<ScopedKey> {
    let hashes: Vec<BlockHash> = ids.iter().map(|&i| BlockHash([i; 32])).collect();
    scoped(&namespace("m", ns_version, 16), &hashes)
}

fn save_all(store: &mut TierStore, keys: &[ScopedKey], src: &MemoryRegion, req: u64) {
    save_at(store, keys, src, req, 0);
}

#[test]
fn a_block_is_loadable_only_once_every_layer_is_in() {
    let mut store = TierStore::new(layout(4)).unwrap();
    let src = MemoryRegion::from_vec((0..8 * 2 * 64).map(|i| i as u8).collect());
    let k = keys(1, &[1, 2]);
    let r = store
        .save_layer(
            &k,
            SourceBlocks {
                memory: &src,
                layout: &layout(8),
                blocks: &[0, 1],
            },
            0,
            1,
            Duration::ZERO,
        )
        .unwrap();
    assert_eq!((r.copied, r.completed), (2, 0));
    assert_eq!(store.lookup(&k), 0);
    let r = store
        .save_layer(
            &k,
            SourceBlocks {
                memory: &src,
                layout: &layout(8),
                blocks: &[0, 1],
            },
            1,
            1,
            Duration::ZERO,
        )
        .unwrap();
    assert_eq!((r.copied, r.completed), (2, 2));
    assert_eq!(store.lookup(&k), 2);
    // Bytes landed in the slots, layer by layer.
    let slots = store.pin(&k, 2, Duration::ZERO);
    let l = layout(4);
    let at = l.block_offset(BlockId::new(1, slots[1])) as usize;
    let src_at = layout(8).block_offset(BlockId::new(1, 1)) as usize;
    assert_eq!(
        &store.memory().read(at..at + 64).unwrap()[..],
        &src.read(src_at..src_at + 64).unwrap()[..]
    );
}

#[test]
fn lookup_stops_at_the_first_missing_block() {
    let mut store = TierStore::new(layout(8)).unwrap();
    let src = MemoryRegion::zeroed(8 * 2 * 64);
    save_all(&mut store, &keys(1, &[1, 2]), &src, 1);
    save_all(&mut store, &keys(1, &[4]), &src, 2);
    assert_eq!(store.lookup(&keys(1, &[1, 2, 3, 4])), 2);
    assert_eq!(store.lookup(&keys(1, &[3, 4])), 0);
}

#[test]
fn capacity_holds_and_tails_go_first() {
    let mut store = TierStore::new(layout(3)).unwrap();
    let src = MemoryRegion::zeroed(8 * 2 * 64);
    save_all(&mut store, &keys(1, &[1, 2, 3]), &src, 1);
    save_all(&mut store, &keys(1, &[9]), &src, 2);
    assert!(store.used() <= 3);
    // The chain's tail made room; its head and middle stay.
    assert_eq!(store.lookup(&keys(1, &[1, 2, 3])), 2);
    assert_eq!(store.lookup(&keys(1, &[9])), 1);
}

#[test]
fn a_pinned_block_keeps_its_slot_until_unpinned_but_is_not_served() {
    let mut store = TierStore::new(layout(2)).unwrap();
    let src = MemoryRegion::zeroed(8 * 2 * 64);
    let old = keys(1, &[1]);
    save_all(&mut store, &old, &src, 1);
    let slots = store.pin(&old, 2, Duration::ZERO);
    assert_eq!(store.drop_namespace(old[0].ns), 1);
    assert_eq!(store.lookup(&old), 0, "dropped: never served again");
    assert_eq!(store.used(), 1, "the load still reads its slot");
    store.unpin(&slots);
    assert_eq!(store.used(), 0);
}

#[test]
fn blocks_being_saved_stream_and_an_early_end_abandons_them() {
    let mut store = TierStore::new(layout(8)).unwrap();
    let src = MemoryRegion::zeroed(8 * 2 * 64);
    let (k, l8) = (keys(1, &[1, 2, 3]), layout(8));
    let src_blocks = SourceBlocks {
        memory: &src,
        layout: &l8,
        blocks: &[0, 1, 2],
    };
    save_all(&mut store, &k[..1], &src, 1);
    store
        .save_layer(&k[1..], src_blocks_of(&src_blocks, 1), 0, 2, Duration::ZERO)
        .unwrap();
    assert_eq!(store.lookup(&k), 1, "whole only");
    assert_eq!(store.lookup_streaming(&k), 3, "being saved counts");
    let slots = store.pin_streaming(&k, 3, Duration::ZERO);
    assert_eq!(slots.len(), 3);
    assert_eq!(store.layers_saved(&k, &slots), Some(1));
    store
        .save_layer(&k[1..], src_blocks_of(&src_blocks, 1), 1, 2, Duration::ZERO)
        .unwrap();
    assert_eq!(store.layers_saved(&k, &slots), Some(2), "both layers in");
    let swapped = [slots[1], slots[0], slots[2]];
    assert_eq!(
        store.layers_saved(&k, &swapped),
        None,
        "only the slot a block is stored in counts"
    );
    // A save that ends after layer 0 leaves its blocks partial: abandoned, never served.
    let late = keys(1, &[7]);
    store
        .save_layer(&late, src_blocks_of(&src_blocks, 2), 0, 4, Duration::ZERO)
        .unwrap();
    let late_slot = store.pin_streaming(&late, 4, Duration::ZERO);
    assert_eq!(store.layers_saved(&late, &late_slot), Some(1));
    assert_eq!(
        store.abandon_partial(&[k[0], late[0]]),
        1,
        "the whole block stays"
    );
    assert_eq!(store.layers_saved(&late, &late_slot), None);
    assert_eq!(store.lookup_streaming(&late), 0);
    store.unpin(&slots);
    store.unpin(&late_slot);
    assert_eq!(store.used(), 3);
}

fn src_blocks_of<'a>(s: &SourceBlocks<'a>, skip: usize) -> SourceBlocks<'a> {
    SourceBlocks {
        blocks: &s.blocks[skip..],
        ..*s
    }
}

#[test]
fn a_new_weight_version_never_sees_old_blocks() {
    let mut store = TierStore::new(layout(8)).unwrap();
    let src = MemoryRegion::zeroed(8 * 2 * 64);
    save_all(&mut store, &keys(1, &[1, 2]), &src, 1);
    assert_eq!(store.lookup(&keys(2, &[1, 2])), 0);
    assert_eq!(store.lookup(&keys(1, &[1, 2])), 2);
}

/// Saves `keys` from blocks `0..` of `src`, every layer, at `secs`; returns layer 0's report.
fn save_at(
    store: &mut TierStore,
    keys: &[ScopedKey],
    src: &MemoryRegion,
    req: u64,
    secs: u64,
) -> SaveReport {
    let blocks: Vec<u32> = (0..keys.len() as u32).collect();
    let mut first = SaveReport::default();
    for layer in 0..2 {
        let report = store
            .save_layer(
                keys,
                SourceBlocks {
                    memory: src,
                    layout: &layout(8),
                    blocks: &blocks,
                },
                layer,
                req,
                Duration::from_secs(secs),
            )
            .unwrap();
        if layer == 0 {
            first = report;
        }
    }
    first
}

#[test]
fn a_held_block_outlives_newer_saves_until_a_load_releases_it() {
    let mut store = TierStore::new(layout(2)).unwrap();
    let src = MemoryRegion::zeroed(8 * 2 * 64);
    let held = keys(1, &[1]);
    save_at(&mut store, &held, &src, 1, 0);
    assert_eq!(store.hold(&held, Duration::from_secs(60)), 1);
    for i in 2..10u8 {
        save_at(&mut store, &keys(1, &[i]), &src, u64::from(i), u64::from(i));
        assert!(store.contains(&held[0]), "evicted by block {i}");
    }
    assert_eq!(store.held(), 1);
    store.release_holds(&held);
    assert_eq!(store.held(), 0);
    save_at(&mut store, &keys(1, &[20]), &src, 20, 20);
    save_at(&mut store, &keys(1, &[21]), &src, 21, 21);
    assert!(
        !store.contains(&held[0]),
        "released, the coldest block goes"
    );
    assert_eq!(store.holds_expired(), 0);
}

#[test]
fn a_store_full_of_held_blocks_drops_new_saves() {
    let mut store = TierStore::new(layout(2)).unwrap();
    let src = MemoryRegion::zeroed(8 * 2 * 64);
    let (a, b) = (keys(1, &[1]), keys(1, &[2]));
    save_at(&mut store, &a, &src, 1, 0);
    save_at(&mut store, &b, &src, 2, 0);
    store.hold(&a, Duration::from_secs(60));
    store.hold(&b, Duration::from_secs(60));
    let report = save_at(&mut store, &keys(1, &[3]), &src, 3, 1);
    assert_eq!((report.copied, report.dropped), (0, 1));
    assert!(store.contains(&a[0]) && store.contains(&b[0]));
}

#[test]
fn a_hold_ends_at_its_deadline() {
    let mut store = TierStore::new(layout(2)).unwrap();
    let src = MemoryRegion::zeroed(8 * 2 * 64);
    let held = keys(1, &[1]);
    save_at(&mut store, &held, &src, 1, 0);
    store.hold(&held, Duration::from_secs(5));
    save_at(&mut store, &keys(1, &[2]), &src, 2, 1);
    save_at(&mut store, &keys(1, &[3]), &src, 3, 4);
    assert!(store.contains(&held[0]), "held until 5 s");
    assert_eq!(store.holds_expired(), 0);
    save_at(&mut store, &keys(1, &[4]), &src, 4, 6);
    assert_eq!((store.holds_expired(), store.held()), (1, 0));
    save_at(&mut store, &keys(1, &[5]), &src, 5, 7);
    assert!(
        !store.contains(&held[0]),
        "no longer held, the coldest block goes"
    );
}
