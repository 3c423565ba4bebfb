//! A producer whose store spills to a disk tier: a consumer's load of blocks that left host memory is
//! read back from disk and arrives byte for byte, and a restarted producer serves what its disk kept.

mod common;

use common::{Instance, Kv, begin_save, plan_load, wait_each_layer_and_check};
use connector::disk::DiskConfig;
use connector::{ConnectorConfig, KvRole, namespace};
use transfer_engine::MemoryRegion;

const KV: Kv = Kv {
    layers: 3,
    block: 4096,
    pool: 16,
};

fn pair(dir: &std::path::Path) -> (Instance, Instance) {
    let mut p = ConnectorConfig::new(KvRole::Producer, namespace("m", 7, 16));
    (p.layers, p.block_bytes, p.store_blocks) = (KV.layers, KV.block, 4);
    p.disk = Some(DiskConfig::new(dir, 1 << 20));
    let mut c = p.clone();
    c.role = KvRole::Consumer;
    c.store_blocks = 0;
    c.disk = None;
    Instance::loopback_pair(p, c).unwrap()
}

/// Saves `tokens` (4 full blocks) from producer blocks `blocks` as request `id`.
fn save(p: &Instance, id: &str, tokens: &[u32], blocks: &[u32]) {
    begin_save(p, id, tokens, blocks);
    for layer in 0..KV.layers {
        p.save_kv_layer(layer).unwrap();
    }
    p.wait_for_save().unwrap();
    p.clear_connector_metadata();
    let _ = p.request_finished(id);
}

/// Loads `tokens` into consumer blocks 8..12 and checks them against producer blocks `src_first..`.
fn load_and_check(c: &Instance, id: &str, tokens: &[u32], src: &MemoryRegion, src_first: u32) {
    let dst = MemoryRegion::zeroed(KV.pool_bytes());
    c.register_kv_caches(dst.clone(), KV.pool).unwrap();
    assert_eq!(plan_load(c, id, tokens, &[8, 9, 10, 11, 12]), 64);
    c.start_load_kv().unwrap();
    wait_each_layer_and_check(&KV, c, src, &dst, src_first, &[8, 9, 10, 11]);
    assert!(c.failed_blocks().is_empty());
    c.clear_connector_metadata();
}

#[test]
fn blocks_that_left_host_memory_load_from_disk_and_survive_a_restart() {
    let dir = std::env::temp_dir().join(format!("kv-connector-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = MemoryRegion::from_vec((0..KV.pool_bytes()).map(|i| (i * 29 % 253) as u8).collect());
    let first: Vec<u32> = (100..165).collect();
    let second: Vec<u32> = (900..965).collect();
    {
        let (p, c) = pair(&dir);
        p.register_kv_caches(src.clone(), KV.pool).unwrap();
        save(&p, "a", &first, &[0, 1, 2, 3, 4]);
        save(&p, "b", &second, &[5, 6, 7, 8, 9]); // a's blocks go to disk
        let st = p.disk_stats().unwrap();
        assert_eq!(st.demoted, 4, "{st:?}");
        load_and_check(&c, "a", &first, &src, 0);
        let st = p.disk_stats().unwrap();
        assert_eq!((st.promoted, st.promote_failed), (4, 0), "{st:?}");
        let text = p.prometheus();
        for line in [
            format!("kv_disk_demoted_blocks_total {}", st.demoted),
            "kv_disk_promoted_blocks_total 4".to_owned(),
            format!("kv_tier_blocks{{tier=\"disk\"}} {}", st.disk.blocks),
            format!(
                "kv_tier_capacity_blocks{{tier=\"disk\"}} {}",
                st.capacity_blocks
            ),
        ] {
            assert!(text.contains(&line), "{line} not in\n{text}");
        }
    }
    // A new producer on the same directory: what reached the disk is served again.
    let (p, c) = pair(&dir);
    p.register_kv_caches(src.clone(), KV.pool).unwrap();
    let st = p.disk_stats().unwrap();
    // b's blocks (pushed down when a's came back up), and any record not yet overwritten.
    assert!(st.recovered >= 4, "{st:?}");
    load_and_check(&c, "b2", &second, &src, 5);
    drop((p, c));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_consumer_with_a_disk_tier_is_refused() {
    let mut c = ConnectorConfig::new(KvRole::Consumer, namespace("m", 7, 16));
    c.disk = Some(DiskConfig::new(std::env::temp_dir(), 1 << 20));
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("disk tier belongs to a producer"), "{err}");
}
