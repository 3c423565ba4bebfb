//! Unit tests of the tier store over a disk tier.

use std::path::PathBuf;

use super::*;
use crate::config::namespace;
use crate::disk::{BlockFormat, DiskConfig};
use crate::keys::{BlockHash, scoped};
use transfer_engine::Dtype;

const LAYERS: u32 = 2;
const BYTES: u64 = 4096;

fn layout(blocks: u32) -> KvLayout {
    KvLayout::new(LAYERS, blocks, BYTES, 16, Dtype::Bf16).unwrap()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kv-store-disk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn disk(d: &PathBuf, blocks: u64) -> DiskTier {
    let format = BlockFormat {
        layers: LAYERS,
        layer_bytes: BYTES,
        tokens_per_block: 16,
        dtype: Dtype::Bf16,
    };
    DiskTier::open(DiskConfig::new(d, blocks * format.record_bytes()), format).unwrap()
}

fn store(host: u32, d: &PathBuf, disk_blocks: u64, min_sharers: u32) -> TierStore {
    TierStore::new(layout(host))
        .unwrap()
        .with_disk(disk(d, disk_blocks), min_sharers)
        .unwrap()
}

/// The caller's KV caches: 16 blocks, each byte naming its block and layer.
fn caches() -> MemoryRegion {
    let l = layout(16);
    MemoryRegion::from_vec(
        (0..l.total_bytes())
            .map(|i| (i * 7 + i / BYTES * 13) as u8)
            .collect(),
    )
}

fn keys(ids: std::ops::Range<u8>) -> Vec<ScopedKey> {
    let hashes: Vec<BlockHash> = ids.map(|i| BlockHash([i; 32])).collect();
    scoped(&namespace("m", 1, 16), &hashes)
}

/// Saves `keys` from cache blocks `first..` (one request, layer by layer).
fn save(store: &mut TierStore, keys: &[ScopedKey], first: u32, src: &MemoryRegion, request: u64) {
    let blocks: Vec<u32> = (first..first + keys.len() as u32).collect();
    for layer in 0..LAYERS {
        let src = SourceBlocks {
            memory: src,
            layout: &layout(16),
            blocks: &blocks,
        };
        store
            .save_layer(keys, src, layer, request, Duration::ZERO)
            .unwrap();
    }
}

/// Checks that the store slots hold cache blocks `first..` of `src`, every layer.
fn assert_holds(store: &TierStore, slots: &[u32], first: u32, src: &MemoryRegion) {
    for (i, &slot) in slots.iter().enumerate() {
        for layer in 0..LAYERS {
            let at = store.layout().block_offset(BlockId::new(layer, slot)) as usize;
            let from = layout(16).block_offset(BlockId::new(layer, first + i as u32)) as usize;
            let held = store.memory().read(at..at + BYTES as usize).unwrap();
            let want = src.read(from..from + BYTES as usize).unwrap();
            assert!(held[..] == want[..], "block {i}, layer {layer} differs");
        }
    }
}

#[test]
fn host_victims_go_to_disk_and_come_back_byte_for_byte_when_used() {
    let d = dir("round-trip");
    let mut s = store(4, &d, 16, 1);
    let src = caches();
    let (first, second) = (keys(0..4), keys(4..8));
    save(&mut s, &first, 0, &src, 1);
    save(&mut s, &second, 4, &src, 2); // pushes the first request's blocks down
    assert_eq!((s.resident(), s.on_disk()), (4, 4));
    assert_eq!(s.lookup(&first), 4, "lookups cover the disk");
    s.disk.as_ref().unwrap().flush();
    let slots = s.pin(&first, 3, Duration::ZERO);
    assert_eq!(slots.len(), 4);
    assert_holds(&s, &slots, 0, &src);
    let st = s.disk_stats().unwrap();
    assert_eq!(
        (st.demoted, st.promoted, st.promote_failed),
        (8, 4, 0),
        "{st:?}"
    );
    assert_eq!(
        st.disk.disk_hits, 4,
        "read from the disk, not the queue: {st:?}"
    );
    s.unpin(&slots);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_restarted_store_serves_what_its_disk_recovered() {
    let d = dir("restart");
    let src = caches();
    let (first, second) = (keys(0..4), keys(4..8));
    {
        let mut s = store(4, &d, 16, 1);
        save(&mut s, &first, 0, &src, 1);
        save(&mut s, &second, 4, &src, 2);
        assert_eq!(s.on_disk(), 4);
    } // the disk writes what is queued when the store drops
    let mut s = store(8, &d, 16, 1);
    let st = s.disk_stats().unwrap();
    assert_eq!(
        st.recovered, 4,
        "the blocks on disk; the host ones died with the process"
    );
    assert_eq!((s.lookup(&first), s.lookup(&second)), (4, 0));
    // Saving a block the disk holds is not a second copy.
    let r = s
        .save_layer(
            &first[..1],
            SourceBlocks {
                memory: &src,
                layout: &layout(16),
                blocks: &[0],
            },
            0,
            5,
            Duration::ZERO,
        )
        .unwrap();
    assert_eq!(r.already_stored, 1);
    let slots = s.pin(&first, 2, Duration::ZERO);
    assert_holds(&s, &slots, 0, &src);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn admission_two_keeps_blocks_one_request_used_off_the_disk() {
    for (min_sharers, on_disk) in [(1, 4), (2, 0)] {
        let d = dir("admission");
        let mut s = store(4, &d, 16, min_sharers);
        let src = caches();
        save(&mut s, &keys(0..4), 0, &src, 1);
        save(&mut s, &keys(4..8), 4, &src, 2);
        assert_eq!(s.on_disk(), on_disk, "admission {min_sharers}");
        assert_eq!(s.lookup(&keys(0..4)), on_disk);
        drop(s);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
fn a_block_damaged_on_disk_is_never_served_and_its_chain_is_dropped() {
    use std::os::unix::fs::FileExt;
    let d = dir("damaged");
    let mut s = store(4, &d, 16, 1);
    let src = caches();
    let chain = keys(0..4);
    save(&mut s, &chain, 0, &src, 1);
    save(&mut s, &keys(4..8), 4, &src, 2);
    assert_eq!(s.on_disk(), 4);
    let disk = s.disk.as_ref().unwrap();
    disk.flush();
    // A payload byte of every record flipped: the chain's root is read first and fails.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(disk.file_path())
        .unwrap();
    let record = disk.format().record_bytes();
    for slot in 0..4 {
        file.write_all_at(&[0xFF, 0x00, 0xFF], slot * record + 4096 + 100)
            .unwrap();
    }
    assert_eq!(
        s.lookup(&chain),
        4,
        "damage is found on read, not on lookup"
    );
    let slots = s.pin(&chain, 3, Duration::ZERO);
    assert!(slots.is_empty(), "{slots:?}");
    let st = s.disk_stats().unwrap();
    assert_eq!(
        (st.disk.corrupt, st.promote_failed),
        (4, 4),
        "read together: {st:?}"
    );
    assert_eq!(
        s.lookup(&chain),
        0,
        "the chain below the damaged block is dropped"
    );
    assert_eq!(s.lookup(&keys(4..8)), 4, "the rest keeps serving");
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_dropped_namespace_leaves_the_disk_and_does_not_come_back() {
    let d = dir("namespace");
    let src = caches();
    let k = keys(0..8);
    {
        let mut s = store(4, &d, 16, 1);
        save(&mut s, &k[..4], 0, &src, 1);
        save(&mut s, &k[4..], 4, &src, 2);
        assert_eq!(s.on_disk(), 4);
        assert_eq!(s.drop_namespace(k[0].ns), 8);
        assert_eq!((s.lookup_streaming(&k), s.on_disk()), (0, 0));
    }
    let s = store(4, &d, 16, 1);
    assert_eq!(s.disk_stats().unwrap().recovered, 0);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_disk_of_another_format_is_refused() {
    let d = dir("format");
    let other = KvLayout::new(LAYERS, 4, BYTES / 2, 16, Dtype::Bf16).unwrap();
    let err = TierStore::new(other)
        .unwrap()
        .with_disk(disk(&d, 4), 1)
        .unwrap_err();
    assert!(err.to_string().contains("disk tier holds blocks"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn held_blocks_move_to_disk_rather_than_turn_newcomers_away() {
    let d = dir("held");
    // Two sharers to go down: a block only one request used is dropped from host memory, unless held.
    let mut s = store(4, &d, 16, 2);
    let src = caches();
    let (first, second) = (keys(0..4), keys(4..8));
    save(&mut s, &first, 0, &src, 1);
    assert_eq!(s.hold(&first, Duration::from_secs(60)), 4);
    save(&mut s, &second, 4, &src, 2);
    // The newcomers took host memory; the held blocks went to disk, where lookups still find them.
    assert_eq!((s.lookup(&first), s.lookup(&second)), (4, 4));
    assert_eq!((s.resident(), s.on_disk(), s.held()), (4, 4, 4));
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_prompt_on_disk_comes_back_whole_past_hotter_blocks() {
    // Four host slots: of three prompts of three blocks, the first ends on disk, the last is used
    // again (hotter than the first). A load of the first still gets all three of its blocks back.
    let d = dir("past-hotter");
    let mut s = store(4, &d, 16, 1);
    let src = caches();
    let (a, b, c) = (keys(0..3), keys(3..6), keys(6..9));
    save(&mut s, &a, 0, &src, 1);
    save(&mut s, &b, 3, &src, 2);
    save(&mut s, &c, 6, &src, 3);
    let again = s.pin(&c, 4, Duration::from_secs(1));
    assert_eq!(again.len(), 3);
    s.unpin(&again);
    assert_eq!(s.lookup(&a), 3, "lookups cover the disk");
    s.disk.as_ref().unwrap().flush();
    let slots = s.pin(&a, 5, Duration::from_secs(2));
    assert_eq!(slots.len(), 3, "{:?}", s.disk_stats());
    assert_holds(&s, &slots, 0, &src);
    s.unpin(&slots);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Where each block is held according to `events` (host, disk), applied to `view`.
fn replay(view: &mut HashMap<ScopedKey, (bool, bool)>, events: &[KvEvent]) {
    for e in events {
        let (key, medium, now) = match e {
            KvEvent::Stored { key, medium, .. } => (key, medium, true),
            KvEvent::Removed { key, medium, .. } => (key, medium, false),
        };
        let held = view.entry(*key).or_default();
        let was = match medium {
            Medium::Host => std::mem::replace(&mut held.0, now),
            Medium::Disk => std::mem::replace(&mut held.1, now),
        };
        assert_ne!(was, now, "{e:?} repeats what was reported");
        if *held == (false, false) {
            view.remove(key);
        }
    }
}

/// Where the store holds each block.
fn held(s: &TierStore) -> HashMap<ScopedKey, (bool, bool)> {
    s.by_tier
        .values()
        .map(|k| {
            let host = s.index.get(k).is_some_and(|e| e.layers == LAYERS);
            (*k, (host, s.disk_holds(k)))
        })
        .filter(|(_, h)| *h != (false, false))
        .collect()
}

#[test]
fn kv_events_follow_every_block_into_host_memory_down_to_disk_and_out() {
    let d = dir("events");
    let mut s = store(4, &d, 4, 1);
    s.keep_kv_events();
    let src = caches();
    let tokens: Vec<u32> = (1000..1064).collect();
    let mut view = HashMap::new();
    let first = keys(0..4);
    // The engine knows the blocks by hashes of its own (the first block's only, say).
    let theirs = [BlockHash([200; 32])];
    s.describe_saves(&first[1..], &theirs, Some(first[0].hash), &tokens[16..], 16);
    save(&mut s, &first[1..], 1, &src, 1);
    s.end_described_saves();
    let events = s.take_kv_events();
    replay(&mut view, &events);
    assert_eq!(view, held(&s));
    // Each block once, into host memory, with its tokens and its parent (the first's is the one given).
    assert_eq!(events.len(), 3, "{events:?}");
    for (i, e) in events.iter().enumerate() {
        let KvEvent::Stored {
            key,
            hash,
            medium: Medium::Host,
            origin,
        } = e
        else {
            panic!("{e:?}")
        };
        assert_eq!(*key, first[i + 1]);
        let (want, parent) = match i {
            0 => (theirs[0], first[0].hash),
            1 => (first[2].hash, theirs[0]),
            _ => (first[i + 1].hash, first[i].hash),
        };
        assert_eq!((*hash, origin.parent), (want, Some(parent)));
        assert_eq!(&origin.tokens[..], &tokens[16 * (i + 1)..16 * (i + 2)]);
    }
    // Later saves (undescribed) push the first ones to disk, then off it: every change is reported, a
    // block moving down is stored below before it leaves above, and its origin goes with it.
    let mut off_disk = 0;
    for (n, ids) in [(2u64, 4..8), (3, 8..12), (4, 12..16)] {
        let k = keys(ids.clone());
        save(&mut s, &k, u32::from(ids.start), &src, n);
        let events = s.take_kv_events();
        off_disk += events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    KvEvent::Removed {
                        medium: Medium::Disk,
                        ..
                    }
                )
            })
            .count();
        for (i, e) in events.iter().enumerate() {
            if let KvEvent::Removed {
                key,
                medium: Medium::Host,
                ..
            } = e
                && held(&s).get(key).is_some_and(|h| h.1)
            {
                assert!(
                    events[..i].iter().any(|x| matches!(x,
                        KvEvent::Stored { key: k, medium: Medium::Disk, .. } if k == key)),
                    "{key:?} left host memory before it was reported on disk: {events:?}"
                );
            }
            if let KvEvent::Stored {
                key,
                hash,
                medium: Medium::Disk,
                origin,
            } = e
                && first[1..].contains(key)
            {
                assert_eq!(
                    origin.tokens.len(),
                    16,
                    "{key:?} lost its tokens on the way down"
                );
                assert_eq!(*key == first[1], *hash == theirs[0], "{key:?} as {hash:?}");
            }
        }
        replay(&mut view, &events);
        assert_eq!(view, held(&s), "after saving request {n}");
    }
    assert!(
        view.values().any(|h| h.1) && off_disk > 0,
        "blocks went to disk and left it: {view:?}"
    );
    assert_eq!(s.kv_events_dropped(), 0);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn kv_events_are_kept_only_when_asked_and_recovered_blocks_are_reported_at_once() {
    let d = dir("events-recovered");
    let src = caches();
    {
        let mut s = store(4, &d, 16, 1);
        save(&mut s, &keys(0..4), 0, &src, 1);
        save(&mut s, &keys(4..8), 4, &src, 2);
        assert!(s.take_kv_events().is_empty(), "no events unless asked");
    }
    let mut s = store(8, &d, 16, 1);
    s.keep_kv_events();
    let events = s.take_kv_events();
    assert_eq!(events.len(), 4, "{events:?}");
    assert!(events.iter().all(|e| matches!(e,
        KvEvent::Stored { medium: Medium::Disk, origin, .. } if origin.tokens.is_empty())));
    let mut view = HashMap::new();
    replay(&mut view, &events);
    assert_eq!(view, held(&s));
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}
