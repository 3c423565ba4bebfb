use std::path::PathBuf;

use transfer_engine::{Dtype, MemoryRegion, NamespaceId};

use super::*;

const FORMAT: BlockFormat = BlockFormat {
    layers: 3,
    layer_bytes: 5000, // not a whole page: the record pads
    tokens_per_block: 16,
    dtype: Dtype::Bf16,
};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kv-disk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn key(ns: u64, i: u8) -> ScopedKey {
    ScopedKey {
        ns: NamespaceId(ns),
        hash: BlockHash([i; 32]),
    }
}

/// A block's bytes, one piece per layer at a stride, as a tier store's slot lays them out.
fn block(i: u8) -> (MemoryRegion, Vec<(usize, usize)>) {
    let stride = 6000;
    let mem = MemoryRegion::from_vec(
        (0..stride * 3)
            .map(|b| (b as u8).wrapping_mul(31) ^ i)
            .collect(),
    );
    let pieces = (0..3).map(|l| (l * stride, 5000)).collect();
    (mem, pieces)
}

/// What [`read_back`] returns for block `i`: its pieces in place, zero between them.
fn expected(i: u8) -> Vec<u8> {
    let (mem, pieces) = block(i);
    let mut want = vec![0; 18000];
    for (o, l) in pieces {
        want[o..o + l].copy_from_slice(&mem.read(o..o + l).unwrap());
    }
    want
}

fn read_back(tier: &DiskTier, k: &ScopedKey) -> (Got, Vec<u8>) {
    let dst = MemoryRegion::zeroed(18000);
    let pieces: Vec<(usize, usize)> = (0..3).map(|l| (l * 6000, 5000)).collect();
    let got = tier.get(k, &dst, &pieces).unwrap();
    (got, dst.to_vec().unwrap())
}

fn open(d: &PathBuf, io: DiskIo, blocks: u64) -> Result<DiskTier, DiskError> {
    let cfg = DiskConfig {
        io,
        ..DiskConfig::new(d, blocks * FORMAT.record_bytes())
    };
    DiskTier::open(cfg, FORMAT)
}

#[test]
fn blocks_round_trip_byte_for_byte_with_buffered_and_direct_io() {
    for io in [DiskIo::Buffered, DiskIo::Direct] {
        let d = dir(io.name());
        let tier = match open(&d, io, 8) {
            Err(DiskError::DirectUnsupported(p)) => {
                println!(
                    "not run: direct I/O: {} does not support O_DIRECT",
                    p.display()
                );
                continue;
            }
            t => t.unwrap(),
        };
        assert_eq!(tier.capacity_blocks(), 8);
        for i in 0..8 {
            let (mem, pieces) = block(i);
            assert_eq!(
                tier.put(key(1, i), None, &mem, &pieces).unwrap(),
                Put::Queued
            );
        }
        tier.flush();
        let s = tier.stats();
        assert_eq!((s.written, s.queued, s.blocks), (8, 0, 8));
        for i in 0..8 {
            let (got, bytes) = read_back(&tier, &key(1, i));
            assert_eq!(got, Got::Served);
            assert_eq!(bytes, expected(i), "{io:?} block {i}");
        }
        assert_eq!(tier.stats().disk_hits, 8);
        assert_eq!(read_back(&tier, &key(1, 99)).0, Got::Missing);
        drop(tier);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
fn a_queued_block_is_served_from_staging_and_a_full_queue_drops_puts() {
    let d = dir("queue");
    let tier = DiskTier::open(
        DiskConfig {
            queue_blocks: 2,
            ..DiskConfig::new(&d, 8 * FORMAT.record_bytes())
        },
        FORMAT,
    )
    .unwrap();
    tier.pause_writer(true);
    let (mem, pieces) = block(1);
    assert_eq!(
        tier.put(key(1, 1), None, &mem, &pieces).unwrap(),
        Put::Queued
    );
    assert_eq!(
        tier.put(key(1, 2), None, &mem, &pieces).unwrap(),
        Put::Queued
    );
    assert_eq!(
        tier.put(key(1, 3), None, &mem, &pieces).unwrap(),
        Put::QueueFull
    );
    assert_eq!(
        tier.put(key(1, 1), None, &mem, &pieces).unwrap(),
        Put::AlreadyStored
    );
    let (got, bytes) = read_back(&tier, &key(1, 1));
    assert_eq!((got, bytes), (Got::Served, expected(1)));
    // Removed while queued: never written.
    assert!(tier.remove(&key(1, 2)));
    let s = tier.stats();
    assert_eq!((s.queue_hits, s.dropped_queue_full, s.queued), (1, 1, 2));
    tier.pause_writer(false);
    tier.flush();
    assert_eq!(tier.stats().written, 1);
    assert_eq!(read_back(&tier, &key(1, 1)).0, Got::Served);
    assert_eq!(tier.stats().disk_hits, 1);
    drop(tier);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_full_tier_refuses_puts_and_a_removed_block_frees_its_slot() {
    let d = dir("slots");
    let tier = open(&d, DiskIo::Buffered, 2).unwrap();
    let (mem, pieces) = block(0);
    for i in 0..2 {
        assert_eq!(
            tier.put(key(1, i), None, &mem, &pieces).unwrap(),
            Put::Queued
        );
    }
    assert_eq!(
        tier.put(key(1, 2), None, &mem, &pieces).unwrap(),
        Put::NoSlot
    );
    assert!(tier.remove(&key(1, 0)));
    assert_eq!(
        tier.put(key(1, 2), None, &mem, &pieces).unwrap(),
        Put::Queued
    );
    assert_eq!(tier.stats().dropped_no_slot, 1);
    let short = [(0, 100)];
    assert!(matches!(
        tier.put(key(1, 5), None, &mem, &short),
        Err(DiskError::Config(_))
    ));
    drop(tier);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn reopening_recovers_blocks_and_their_chains_and_not_a_dropped_namespace() {
    let d = dir("reopen");
    let tier = open(&d, DiskIo::Buffered, 8).unwrap();
    for i in 0..3 {
        let (mem, pieces) = block(i);
        let parent = i.checked_sub(1).map(|p| BlockHash([p; 32]));
        tier.put(key(1, i), parent, &mem, &pieces).unwrap();
    }
    // Namespace 2 is dropped with one record on disk and one still queued: recovery drops the written
    // one, and the writer skips the queued one (each case pinned down, not left to the writer's timing).
    let (mem, pieces) = block(9);
    tier.put(key(2, 9), None, &mem, &pieces).unwrap();
    tier.flush();
    tier.pause_writer(true);
    let (mem, pieces) = block(10);
    tier.put(key(2, 10), None, &mem, &pieces).unwrap();
    assert_eq!(tier.drop_namespace(NamespaceId(2)).unwrap(), 2);
    tier.pause_writer(false);
    drop(tier); // writes what is queued

    let mut tier = open(&d, DiskIo::Buffered, 8).unwrap();
    let r = tier.recovery();
    assert_eq!((r.blocks, r.dropped, r.corrupt_headers), (3, 1, 0));
    assert!(!r.manifest_damaged);
    let mut chains = tier.take_recovered();
    chains.sort_by_key(|(k, _)| k.hash.0[0]);
    assert_eq!(
        chains,
        vec![
            (key(1, 0), None),
            (key(1, 1), Some(key(1, 0))),
            (key(1, 2), Some(key(1, 1)))
        ]
    );
    for i in 0..3 {
        let (got, bytes) = read_back(&tier, &key(1, i));
        assert_eq!((got, bytes), (Got::Served, expected(i)));
    }
    assert!(!tier.contains(&key(2, 9)) && !tier.contains(&key(2, 10)));
    // The same key written again into another slot (its old record stays): the newer record wins after a
    // reopen.
    assert!(tier.remove(&key(1, 0)));
    assert!(tier.remove(&key(1, 1))); // its slot is handed out next
    let (mem, pieces) = block(7);
    tier.put(key(1, 0), None, &mem, &pieces).unwrap();
    drop(tier);
    let tier = open(&d, DiskIo::Buffered, 8).unwrap();
    assert_eq!(tier.recovery().superseded, 1);
    assert_eq!(read_back(&tier, &key(1, 0)).1, expected(7));
    drop(tier);

    // A damaged manifest of dropped namespaces is ignored, and said so.
    std::fs::write(d.join("dropped-namespaces"), "ns zz\ncrc32c 0\n").unwrap();
    let tier = open(&d, DiskIo::Buffered, 8).unwrap();
    assert!(tier.recovery().manifest_damaged);
    drop(tier);

    // Reopened for another block format: nothing of the old one is served (four records: namespace 1's
    // three and namespace 2's written one, whose slot no put has taken since).
    let other = BlockFormat {
        tokens_per_block: 32,
        ..FORMAT
    };
    let tier = DiskTier::open(DiskConfig::new(&d, 8 * FORMAT.record_bytes()), other).unwrap();
    assert_eq!(
        (tier.recovery().blocks, tier.recovery().other_format),
        (0, 4)
    );
    drop(tier);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bytes_flipped_on_disk_are_never_served() {
    use std::os::unix::fs::FileExt;
    let d = dir("corrupt");
    let tier = open(&d, DiskIo::Buffered, 4).unwrap();
    for i in 0..3 {
        let (mem, pieces) = block(i);
        tier.put(key(1, i), None, &mem, &pieces).unwrap();
    }
    tier.flush();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.join(slots::SLOT_FILE))
        .unwrap();
    let flip = |at: u64| {
        let mut b = [0u8];
        file.read_exact_at(&mut b, at).unwrap();
        file.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    };
    // Slot 0's payload (a byte of layer 2) and slot 1's header.
    flip(PAGE as u64 + 12_345);
    flip(FORMAT.record_bytes() + 40);
    assert_eq!(read_back(&tier, &key(1, 0)), (Got::Corrupt, vec![0; 18000]));
    assert_eq!(read_back(&tier, &key(1, 1)).0, Got::Corrupt);
    assert_eq!(
        read_back(&tier, &key(1, 0)).0,
        Got::Missing,
        "removed once found"
    );
    assert_eq!(read_back(&tier, &key(1, 2)).0, Got::Served);
    assert_eq!(tier.stats().corrupt, 2);
    drop(tier);

    // Blocks found damaged are not recovered by a reopen (their headers were zeroed); a damaged header is
    // counted and its slot freed.
    flip(2 * FORMAT.record_bytes() + 40);
    let tier = open(&d, DiskIo::Buffered, 4).unwrap();
    let r = tier.recovery();
    assert_eq!((r.blocks, r.corrupt_headers), (0, 1));
    assert_eq!(read_back(&tier, &key(1, 2)).0, Got::Missing);
    drop(tier);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn many_blocks_are_read_at_once_in_order() {
    let d = dir("many");
    let tier = open(&d, DiskIo::Buffered, 16).unwrap();
    for i in 0..16 {
        let (mem, pieces) = block(i);
        tier.put(key(1, i), None, &mem, &pieces).unwrap();
    }
    tier.flush();
    let dst = MemoryRegion::zeroed(16 * 15000);
    let pieces: Vec<Vec<(usize, usize)>> = (0..16)
        .map(|b| (0..3).map(|l| (b * 15000 + l * 5000, 5000)).collect())
        .collect();
    let wanted: Vec<(ScopedKey, &[(usize, usize)])> = (0..16)
        .map(|i| (key(1, i as u8), pieces[i].as_slice()))
        .chain([(key(1, 200), pieces[0].as_slice())])
        .collect();
    let got = tier.get_many(&wanted[..16], &dst);
    assert!(got.iter().all(|g| matches!(g, Ok(Got::Served))));
    for i in 0..16u8 {
        let (mem, pieces) = block(i);
        let want: Vec<u8> = pieces
            .iter()
            .flat_map(|&(o, l)| mem.read(o..o + l).unwrap().to_vec())
            .collect();
        let at = usize::from(i) * 15000;
        assert_eq!(dst.read(at..at + 15000).unwrap()[..], want[..], "block {i}");
    }
    assert!(matches!(
        tier.get_many(&wanted[16..], &dst)[0],
        Ok(Got::Missing)
    ));
    drop(tier);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn configurations_that_hold_nothing_are_refused() {
    let d = dir("config");
    assert!(matches!(
        DiskTier::open(DiskConfig::new(&d, FORMAT.record_bytes() - 1), FORMAT),
        Err(DiskError::Config(_))
    ));
    let zero = DiskConfig {
        queue_blocks: 0,
        ..DiskConfig::new(&d, 1 << 30)
    };
    assert!(matches!(
        DiskTier::open(zero, FORMAT),
        Err(DiskError::Config(_))
    ));
    let _ = std::fs::remove_dir_all(&d);
}
