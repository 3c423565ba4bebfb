//! Trace replay: hit ratio of a policy on a Mooncake trace, as `data/traces/README.md` defines it.
//!
//! For each request in file order, its hit blocks are the longest run of leading `hash_ids` present in
//! the cache at lookup time; then every block of the request is inserted or touched, and the policy evicts
//! down to capacity. `hit ratio = Σ hit blocks / Σ len(hash_ids)`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use transfer_engine::policy::{BlockKey, RequestInfo, TierPolicy};

use crate::arc::Arc;
use crate::belady::{Belady, NextUse};
use crate::cache::replay_cache;
use crate::lirs::Lirs;
use crate::lru::Lru;
use crate::s3fifo::S3Fifo;
use crate::tinylfu::WTinyLfu;
use policy::continuation::{BLOCK_TOKENS, Continuation, ContinuationConfig};
use policy::error::PolicyError;
use policy::namespace::NamespaceId;
use policy::tier::{NearestOrder, TierCapacities, TierConfig, TierManager};
use policy::trace::Trace;

/// The policies a trace can be replayed against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyKind {
    /// Least recently used (the incumbent).
    Lru,
    /// S3-FIFO ([`crate::s3fifo`]).
    S3Fifo,
    /// LIRS ([`crate::lirs`]).
    Lirs,
    /// ARC ([`crate::arc`]).
    Arc,
    /// W-TinyLFU ([`crate::tinylfu`]).
    WTinyLfu,
    /// This crate's heat scoring and tier manager (default configuration).
    Heat,
    /// Conversation-continuation eviction index ([`policy::continuation`], default configuration).
    Continuation,
    /// The same index as the [`TierManager`]'s nearest-tier order ([`policy::tier::NearestOrder`]),
    /// driven through [`TierPolicy::on_request`].
    TierContinuation,
    /// Belady's offline optimum (knows the future; the limit).
    Belady,
}

impl PolicyKind {
    /// Every policy, baselines first, the offline optimum last.
    pub const ALL: [PolicyKind; 9] = [
        PolicyKind::Lru,
        PolicyKind::S3Fifo,
        PolicyKind::Lirs,
        PolicyKind::Arc,
        PolicyKind::WTinyLfu,
        PolicyKind::Heat,
        PolicyKind::Continuation,
        PolicyKind::TierContinuation,
        PolicyKind::Belady,
    ];

    /// The name used on command lines and in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::S3Fifo => "s3fifo",
            PolicyKind::Lirs => "lirs",
            PolicyKind::Arc => "arc",
            PolicyKind::WTinyLfu => "wtinylfu",
            PolicyKind::Heat => "heat",
            PolicyKind::Continuation => "continuation",
            PolicyKind::TierContinuation => "tier-continuation",
            PolicyKind::Belady => "belady",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| PolicyError::UnknownPolicy(s.to_owned()))
    }
}

/// The result of one replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    /// The trace's name.
    pub trace: String,
    /// The policy's name.
    pub policy: String,
    /// Cache capacity in blocks.
    pub capacity_blocks: usize,
    /// Requests replayed.
    pub requests: usize,
    /// Sum of `len(hash_ids)` over all requests.
    pub blocks: u64,
    /// Distinct blocks in the trace.
    pub distinct_blocks: usize,
    /// Prefix hit blocks.
    pub hit_blocks: u64,
    /// `hit_blocks / blocks` (0 for an empty trace).
    pub hit_ratio: f64,
    /// Wall time of the replay, if the caller measured it (this crate never reads the clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
}

impl ReplayReport {
    /// The report with the replay's measured wall time.
    #[must_use]
    pub fn with_seconds(mut self, seconds: f64) -> ReplayReport {
        self.seconds = Some(seconds);
        self
    }
}

/// Replays `trace` against `policy` with a cache of `capacity_blocks` blocks.
#[must_use]
pub fn replay(trace: &Trace, capacity_blocks: usize, policy: PolicyKind) -> ReplayReport {
    let hit_blocks = match policy {
        PolicyKind::Lru => replay_cache(trace, &mut Lru::new(capacity_blocks)),
        PolicyKind::S3Fifo => replay_cache(trace, &mut S3Fifo::new(capacity_blocks)),
        PolicyKind::Lirs => replay_cache(trace, &mut Lirs::new(capacity_blocks)),
        PolicyKind::Arc => replay_cache(trace, &mut Arc::new(capacity_blocks)),
        PolicyKind::WTinyLfu => replay_cache(trace, &mut WTinyLfu::new(capacity_blocks)),
        PolicyKind::Belady => replay_belady(trace, capacity_blocks),
        PolicyKind::Heat => {
            let cfg = heat_config(capacity_blocks);
            replay_tiered(trace, &cfg).expect("the default heat configuration is valid")
        }
        PolicyKind::Continuation => {
            replay_continuation(trace, capacity_blocks, ContinuationConfig::default())
        }
        PolicyKind::TierContinuation => {
            let cfg = TierConfig::continuation(heat_config(capacity_blocks).capacities);
            replay_tiered(trace, &cfg).expect("the default continuation configuration is valid")
        }
    };
    report(trace, capacity_blocks, policy.name(), hit_blocks)
}

/// Replays `trace` against a [`Continuation`] cache with configuration `cfg` (to evaluate ablations);
/// returns the prefix hit blocks.
#[must_use]
pub fn replay_continuation(trace: &Trace, capacity_blocks: usize, cfg: ContinuationConfig) -> u64 {
    let mut cache = Continuation::new(capacity_blocks, cfg);
    let mut hits = 0;
    for req in trace.requests() {
        hits += prefix_hits(&req.hash_ids, |id| cache.contains(BlockKey(id)));
        cache.on_request(req);
        cache.evict_to_capacity();
    }
    hits
}

/// The tier configuration `replay(.., PolicyKind::Heat)` uses: one GPU tier of `capacity_blocks`.
#[must_use]
pub fn heat_config(capacity_blocks: usize) -> TierConfig {
    TierConfig::new(TierCapacities {
        gpu: capacity_blocks,
        host: 0,
        remote: 0,
    })
}

/// Replays `trace` against a [`TierManager`] with configuration `cfg` (capacity: all tiers together:
/// a block hits wherever it lives). Use it to evaluate other heat weights or nearest-tier orders.
pub fn replay_with(trace: &Trace, cfg: &TierConfig) -> Result<ReplayReport, PolicyError> {
    let hit_blocks = replay_tiered(trace, cfg)?;
    let kind = match cfg.nearest {
        NearestOrder::Heat => PolicyKind::Heat,
        NearestOrder::Continuation(_) => PolicyKind::TierContinuation,
    };
    Ok(report(
        trace,
        cfg.capacities.total(),
        kind.name(),
        hit_blocks,
    ))
}

fn report(trace: &Trace, capacity_blocks: usize, policy: &str, hit_blocks: u64) -> ReplayReport {
    let blocks = trace.total_blocks();
    ReplayReport {
        trace: trace.name().to_owned(),
        policy: policy.to_owned(),
        capacity_blocks,
        requests: trace.requests().len(),
        blocks,
        distinct_blocks: trace.distinct_blocks(),
        hit_blocks,
        hit_ratio: if blocks == 0 {
            0.0
        } else {
            hit_blocks as f64 / blocks as f64
        },
        seconds: None,
    }
}

fn prefix_hits(ids: &[u64], cached: impl Fn(u64) -> bool) -> u64 {
    ids.iter().take_while(|id| cached(**id)).count() as u64
}

fn replay_belady(trace: &Trace, capacity: usize) -> u64 {
    let next = NextUse::new(trace);
    let mut cache = Belady::new(capacity);
    let mut hits = 0;
    for (i, req) in trace.requests().iter().enumerate() {
        hits += prefix_hits(&req.hash_ids, |id| cache.contains(id));
        for (depth, (id, next)) in req.hash_ids.iter().zip(next.of(i)).enumerate() {
            cache.touch(*id, u32::try_from(depth).unwrap_or(u32::MAX), *next);
        }
        cache.evict_to_capacity();
    }
    hits
}

/// Replays through [`TierPolicy::on_request`]: one call per request (its keys, partial last block and
/// output length), which stores every block and then settles once.
fn replay_tiered(trace: &Trace, cfg: &TierConfig) -> Result<u64, PolicyError> {
    let mut manager = TierManager::new(*cfg)?;
    let mut keys = Vec::new();
    let mut hits = 0;
    for (i, req) in trace.requests().iter().enumerate() {
        hits += prefix_hits(&req.hash_ids, |id| manager.tier_of(BlockKey(id)).is_some());
        keys.clear();
        keys.extend(req.hash_ids.iter().map(|id| BlockKey(*id)));
        let info = RequestInfo {
            id: i as u64,
            ns: NamespaceId::DEFAULT,
            keys: &keys,
            partial_last: req.input_length < BLOCK_TOKENS * keys.len() as u64,
            output_tokens: Some(req.output_length),
        };
        manager.on_request(&info, Duration::from_millis(req.timestamp));
    }
    Ok(hits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Trace {
        Trace::parse(
            "tiny",
            "{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1,2,3]}\n\
             {\"timestamp\":1,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1,2,4]}\n\
             {\"timestamp\":2,\"input_length\":1,\"output_length\":1,\"hash_ids\":[5,6]}\n\
             {\"timestamp\":3,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1,2,3]}\n",
        )
        .unwrap()
    }

    #[test]
    fn policy_names_round_trip() {
        for k in PolicyKind::ALL {
            assert_eq!(k.name().parse::<PolicyKind>().unwrap(), k);
        }
        assert_eq!("LRU".parse::<PolicyKind>().unwrap(), PolicyKind::Lru);
        let msg = "fifo".parse::<PolicyKind>().unwrap_err().to_string();
        for k in PolicyKind::ALL {
            assert!(msg.contains(k.name()), "{msg}");
        }
    }

    #[test]
    fn hits_are_prefixes_counted_before_insertion() {
        let t = tiny();
        // Infinite cache: request 2 hits [1,2]; request 4 hits [1,2,3].
        for k in PolicyKind::ALL {
            let r = replay(&t, 100, k);
            assert_eq!((r.hit_blocks, r.blocks, r.requests), (5, 11, 4), "{k}");
        }
        // Nothing cached: nothing hits.
        for k in PolicyKind::ALL {
            assert_eq!(replay(&t, 0, k).hit_blocks, 0, "{k}");
        }
    }

    #[test]
    fn heat_keeps_chain_roots_where_lru_keeps_tails() {
        // One block of room: LRU keeps each request's last block (useless: hits are prefixes); the
        // heat policy evicts chain tails first and keeps the shared root, which hits.
        let t = tiny();
        assert_eq!(replay(&t, 1, PolicyKind::Lru).hit_blocks, 0);
        assert!(replay(&t, 1, PolicyKind::Heat).hit_blocks >= 1);
        for cap in 0..8 {
            let lru = replay(&t, cap, PolicyKind::Lru).hit_blocks;
            assert!(
                replay(&t, cap, PolicyKind::Heat).hit_blocks >= lru,
                "cap {cap}"
            );
        }
    }

    #[test]
    fn report_serialises_the_documented_fields() {
        let json = serde_json::to_value(replay(&tiny(), 3, PolicyKind::Lru)).unwrap();
        for field in [
            "policy",
            "requests",
            "blocks",
            "hit_blocks",
            "hit_ratio",
            "capacity_blocks",
            "trace",
        ] {
            assert!(json.get(field).is_some(), "{field} missing");
        }
        assert!(json.get("seconds").is_none());
    }
}
