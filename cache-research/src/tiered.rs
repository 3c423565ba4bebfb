//! Trace replay over host memory with a disk tier below it, as the connector's store runs them: where
//! the hits come from, and what the disk's admission rule costs and wins.
//!
//! The tier manager holds `host` blocks in its host tier and `disk` below it (its nearest, GPU tier
//! empty, so every block settles in host memory first, as a producer's save does); host victims move to
//! disk when [`TierConfig::demote_min_sharers`] admits them, and a hit on disk promotes the block (and
//! its farther ancestors) back to host memory. Hits are counted as in [`mod@crate::replay`]: the longest run
//! of leading blocks present anywhere, at lookup time, split by the tier each hit block was in.

use std::time::Duration;

use serde::Serialize;
use transfer_engine::policy::{BlockKey, RequestInfo, Tier, TierPolicy};

use policy::continuation::BLOCK_TOKENS;
use policy::error::PolicyError;
use policy::namespace::NamespaceId;
use policy::tier::{TierCapacities, TierConfig, TierManager};
use policy::trace::Trace;

/// The result of one replay over host and disk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TieredReport {
    /// The trace's name.
    pub trace: String,
    /// Blocks in host memory.
    pub host_blocks: usize,
    /// Blocks on disk (0: host memory only).
    pub disk_blocks: usize,
    /// Requests that must have used a host victim for it to go to disk.
    pub demote_min_sharers: u32,
    /// Requests replayed.
    pub requests: usize,
    /// Sum of `len(hash_ids)` over all requests.
    pub blocks: u64,
    /// Prefix hit blocks, wherever they were.
    pub hit_blocks: u64,
    /// Hit blocks that were in host memory.
    pub host_hits: u64,
    /// Hit blocks that were on disk (each read back into host memory).
    pub disk_hits: u64,
    /// `hit_blocks / blocks`.
    pub hit_ratio: f64,
    /// `host_hits / blocks`.
    pub host_hit_ratio: f64,
    /// `disk_hits / blocks`.
    pub disk_hit_ratio: f64,
    /// Blocks written to disk (host victims admitted below): the disk's write load.
    pub disk_writes: u64,
    /// Disk hits per block written to disk (how much each write earned).
    pub hits_per_write: f64,
}

/// Replays `trace` over `host` blocks of host memory and `disk` blocks of disk, admitting host victims
/// to disk by `demote_min_sharers`.
pub fn replay_host_disk(
    trace: &Trace,
    host: usize,
    disk: usize,
    demote_min_sharers: u32,
) -> Result<TieredReport, PolicyError> {
    let mut cfg = TierConfig::new(TierCapacities {
        gpu: 0,
        host,
        remote: disk,
    });
    cfg.demote_min_sharers = demote_min_sharers;
    let mut manager = TierManager::new(cfg)?;
    let (mut host_hits, mut disk_hits, mut disk_writes) = (0u64, 0u64, 0u64);
    let mut keys = Vec::new();
    for (i, req) in trace.requests().iter().enumerate() {
        for id in &req.hash_ids {
            match manager.tier_of(BlockKey(*id)) {
                Some(Tier::Remote) => disk_hits += 1,
                Some(_) => host_hits += 1,
                None => break,
            }
        }
        keys.clear();
        keys.extend(req.hash_ids.iter().map(|id| BlockKey(*id)));
        let info = RequestInfo {
            id: i as u64,
            ns: NamespaceId::DEFAULT,
            keys: &keys,
            partial_last: req.input_length < BLOCK_TOKENS * keys.len() as u64,
            output_tokens: Some(req.output_length),
        };
        let moves = manager.on_request(&info, Duration::from_millis(req.timestamp));
        disk_writes += moves
            .iter()
            .filter(|mv| mv.to == Some(Tier::Remote) && mv.from != Tier::Remote)
            .count() as u64;
    }
    let blocks = trace.total_blocks();
    let ratio = |n: u64| {
        if blocks == 0 {
            0.0
        } else {
            n as f64 / blocks as f64
        }
    };
    let hit_blocks = host_hits + disk_hits;
    Ok(TieredReport {
        trace: trace.name().to_owned(),
        host_blocks: host,
        disk_blocks: disk,
        demote_min_sharers,
        requests: trace.requests().len(),
        blocks,
        hit_blocks,
        host_hits,
        disk_hits,
        hit_ratio: ratio(hit_blocks),
        host_hit_ratio: ratio(host_hits),
        disk_hit_ratio: ratio(disk_hits),
        disk_writes,
        hits_per_write: if disk_writes == 0 {
            0.0
        } else {
            disk_hits as f64 / disk_writes as f64
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace() -> Trace {
        // Four conversations of three turns, each turn a longer prefix of its conversation, interleaved
        // so that a one-block host tier cannot keep any of them between turns.
        let mut lines = String::new();
        for turn in 1..=3u64 {
            for conv in 0..4u64 {
                let ids: Vec<String> = (0..turn * 2)
                    .map(|b| (conv * 100 + b).to_string())
                    .collect();
                lines.push_str(&format!(
                    "{{\"timestamp\":{},\"input_length\":{},\"output_length\":8,\"hash_ids\":[{}]}}\n",
                    turn * 10 + conv,
                    turn * 2 * BLOCK_TOKENS,
                    ids.join(",")
                ));
            }
        }
        Trace::parse("turns", &lines).unwrap()
    }

    #[test]
    fn a_disk_below_host_memory_turns_misses_into_disk_hits() {
        let t = trace();
        let host_only = replay_host_disk(&t, 2, 0, 1).unwrap();
        let with_disk = replay_host_disk(&t, 2, 64, 1).unwrap();
        assert_eq!(host_only.disk_hits, 0);
        assert!(with_disk.disk_hits > 0, "{with_disk:?}");
        assert!(
            with_disk.hit_blocks > host_only.hit_blocks,
            "{host_only:?} {with_disk:?}"
        );
        assert_eq!(
            with_disk.hit_blocks,
            with_disk.host_hits + with_disk.disk_hits
        );
        assert!(with_disk.disk_writes > 0);
        // Unbounded host memory: every earlier prefix hits, from host.
        let all = replay_host_disk(&t, 1000, 0, 1).unwrap();
        assert_eq!(all.hit_blocks, 4 * (2 + 4), "{all:?}");
    }

    #[test]
    fn a_stricter_admission_writes_less_to_disk() {
        let t = trace();
        let every = replay_host_disk(&t, 2, 64, 1).unwrap();
        let twice = replay_host_disk(&t, 2, 64, 2).unwrap();
        assert!(twice.disk_writes < every.disk_writes, "{every:?} {twice:?}");
    }
}
