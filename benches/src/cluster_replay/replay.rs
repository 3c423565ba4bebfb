//! One replay of `te-bench cluster`: every request looked up in the index, routed, served (hits from the
//! instance's own cache, then from the pool), stored, and its changes published before the next.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use cluster::route::{Candidate, RequestCost, RoutePolicy, Router};
use policy::Trace;
use policy::continuation::BLOCK_TOKENS;
use serde::Serialize;
use transfer_engine::policy::BlockKey;

use super::instance::{CacheKind, Instance, NS};

/// Where a block pulled from another instance is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// At the puller too (a copy per instance that used it).
    Copy,
    /// Only at its holder: one copy in the cluster.
    Single,
    /// At the puller once this many requests pulled it (replicas of hot prefixes only).
    Hot(u32),
}

impl FromStr for Placement {
    type Err = String;

    fn from_str(s: &str) -> Result<Placement, String> {
        match s {
            "copy" => Ok(Placement::Copy),
            "single" => Ok(Placement::Single),
            _ => s
                .strip_prefix("hot")
                .and_then(|n| n.parse().ok())
                .filter(|&n| n > 0)
                .map(Placement::Hot)
                .ok_or_else(|| format!("unknown placement {s:?} (copy, single, hot<N>)")),
        }
    }
}

impl Placement {
    fn name(self) -> String {
        match self {
            Placement::Copy => "copy".into(),
            Placement::Single => "single".into(),
            Placement::Hot(n) => format!("hot{n}"),
        }
    }
}

/// One run's setting.
pub(crate) struct Setup {
    pub(crate) instances: usize,
    pub(crate) capacity: usize,
    pub(crate) cache: CacheKind,
    pub(crate) route: RoutePolicy,
    /// `None`: each instance loads only from its own cache.
    pub(crate) placement: Option<Placement>,
    pub(crate) utilization: f64,
    pub(crate) block_bytes: u64,
    pub(crate) link_gbps: f64,
    /// Key prefix of this run in Redis.
    pub(crate) prefix: String,
}

/// One run's figures.
#[derive(Debug, Serialize)]
pub(crate) struct Row {
    instances: usize,
    route: String,
    /// `own` (no pool) or the placement of pulled blocks.
    pool: String,
    hit_ratio: f64,
    own_hit_ratio: f64,
    pulled_hit_ratio: f64,
    /// Busiest instance's computed prompt tokens over the mean.
    balance: f64,
    moved_gib: f64,
    ttft_p50_s: f64,
    ttft_p99_s: f64,
    lookup_p50_us: f64,
    lookup_p99_us: f64,
    /// Redis commands a second of wall time over the run.
    index_ops_per_s: f64,
    /// Redis memory at the end over its memory at the start.
    index_mib: f64,
    /// Lookups where the index claimed more than the holder still had.
    stale_lookups: u64,
    published: u64,
    dropped: u64,
}

pub(crate) async fn replay(trace: &Trace, url: &str, setup: &Setup) -> anyhow::Result<Row> {
    let n = setup.instances;
    let mut instances = (0..n)
        .map(|i| {
            Instance::start(
                url,
                &setup.prefix,
                format!("10.0.{}.{}:7000", i / 250, i % 250 + 1),
                setup.cache,
                setup.capacity,
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for inst in &instances {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !inst.publisher.in_sync() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} never reached the index",
                inst.name
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let router_client = &instances[0].client;
    let memory_before = router_client.server_figure("memory", "used_memory").await?;
    let commands_before = router_client
        .server_figure("stats", "total_commands_processed")
        .await?;

    let span = trace
        .requests()
        .last()
        .map_or(1.0, |r| r.timestamp.max(1) as f64 / 1e3);
    let compute_per_block =
        n as f64 * span * setup.utilization / trace.total_blocks().max(1) as f64;
    let transfer_per_block = setup.block_bytes as f64 / (setup.link_gbps * 1e9);
    let mut router = Router::new(setup.route);
    let mut pulls: HashMap<BlockKey, u32> = HashMap::new();
    let (mut own_hits, mut pulled_hits, mut stale_lookups) = (0u64, 0u64, 0u64);
    let mut lookup_us = Vec::with_capacity(trace.requests().len());
    let mut ttft = Vec::with_capacity(trace.requests().len());
    let mut keys = Vec::new();
    let wall = Instant::now();
    for (id, req) in trace.requests().iter().enumerate() {
        keys.clear();
        keys.extend(req.hash_ids.iter().map(|&h| BlockKey(h)));
        let now_s = req.timestamp as f64 / 1e3;
        let now = Duration::from_millis(req.timestamp);

        let asked = Instant::now();
        let found = instances[0].client.lookup(NS, &keys).await?;
        lookup_us.push(asked.elapsed().as_secs_f64() * 1e6);

        let candidates: Vec<Candidate> = instances
            .iter()
            .map(|inst| Candidate {
                held: found.held_by(&inst.name),
                queued: (inst.busy_until - now_s).max(0.0),
            })
            .collect();
        let pooled = if setup.placement.is_some() {
            found.pooled()
        } else {
            0
        };
        let cost = RequestCost {
            blocks: keys.len(),
            pooled,
            compute_per_block,
            transfer_per_block,
        };
        let chosen = router.choose(&cost, &candidates);

        // Served: the chosen instance's own cache first, then the pool's holders, segment by segment.
        let own = instances[chosen].prefix(&keys);
        let mut served_by = Vec::new();
        let (mut pos, mut pulled) = (own, 0);
        if setup.placement.is_some() {
            for seg in found.segments(own) {
                let j = instances.iter().position(|i| i.name == seg.instance);
                let Some(j) = j.filter(|_| seg.start == pos) else {
                    stale_lookups += 1;
                    break;
                };
                let really = instances[j].prefix(&keys[seg.start..seg.end]);
                if j != chosen && really > 0 {
                    served_by.push((j, seg.start..seg.start + really));
                    pulled += really;
                }
                pos += really;
                if really < seg.end - seg.start {
                    stale_lookups += 1;
                    break;
                }
            }
        }
        // Blocks further along the prompt the chosen instance holds itself (a chain split over the
        // pool by single placement) are its own hits.
        let own_later = pos - own - pulled;
        own_hits += (own + own_later) as u64;
        pulled_hits += pulled as u64;
        let hit = pos;
        let computed_tokens = req.input_length.saturating_sub(hit as u64 * BLOCK_TOKENS);

        // Simulated time: queue, then the pull and the computation.
        let inst = &mut instances[chosen];
        let start = inst.busy_until.max(now_s);
        let work =
            (keys.len() - hit) as f64 * compute_per_block + pulled as f64 * transfer_per_block;
        inst.busy_until = start + work;
        inst.computed_tokens += computed_tokens;
        ttft.push(inst.busy_until - now_s);

        // Stored: what the chosen instance computed, and what it pulled as the placement says.
        let mut stored = Vec::with_capacity(keys.len());
        for (at, &k) in keys.iter().enumerate() {
            let pulled_here = at >= own && at < hit && !inst.holds(k);
            let keep = !pulled_here
                || match setup.placement {
                    Some(Placement::Single) => false,
                    Some(Placement::Hot(min)) => {
                        let count = pulls.entry(k).or_default();
                        *count += 1;
                        *count >= min
                    }
                    _ => true,
                };
            if keep {
                stored.push(k);
            }
        }
        inst.store(&stored, id as u64, req.input_length, now);
        for (j, range) in served_by {
            instances[j].serve(&keys[range], id as u64, now);
            let _ = instances[j].publisher.flush(Duration::from_secs(10)).await;
        }
        anyhow::ensure!(
            instances[chosen]
                .publisher
                .flush(Duration::from_secs(10))
                .await,
            "a publish did not finish in 10 s"
        );
    }
    let seconds = wall.elapsed().as_secs_f64();
    let router_client = &instances[0].client;
    let memory_after = router_client.server_figure("memory", "used_memory").await?;
    let commands_after = router_client
        .server_figure("stats", "total_commands_processed")
        .await?;
    let (mut published, mut dropped) = (0, 0);
    for inst in &instances {
        let counts = inst.client.stats().counts();
        published += counts.published;
        dropped += counts.dropped;
    }
    let blocks = trace.total_blocks().max(1) as f64;
    let computed: Vec<u64> = instances.iter().map(|i| i.computed_tokens).collect();
    let mean = computed.iter().sum::<u64>() as f64 / n as f64;
    let busiest = computed.iter().copied().max().unwrap_or(0) as f64;
    let row = Row {
        instances: n,
        route: format!("{:?}", setup.route),
        pool: setup.placement.map_or("own".into(), Placement::name),
        hit_ratio: round((own_hits + pulled_hits) as f64 / blocks),
        own_hit_ratio: round(own_hits as f64 / blocks),
        pulled_hit_ratio: round(pulled_hits as f64 / blocks),
        balance: round(if mean > 0.0 { busiest / mean } else { 1.0 }),
        moved_gib: round(pulled_hits as f64 * setup.block_bytes as f64 / f64::from(1u32 << 30)),
        ttft_p50_s: round(quantile(&mut ttft, 0.5)),
        ttft_p99_s: round(quantile(&mut ttft, 0.99)),
        lookup_p50_us: quantile(&mut lookup_us, 0.5).round(),
        lookup_p99_us: quantile(&mut lookup_us, 0.99).round(),
        index_ops_per_s: ((commands_after.saturating_sub(commands_before)) as f64 / seconds)
            .round(),
        index_mib: round(memory_after.saturating_sub(memory_before) as f64 / f64::from(1u32 << 20)),
        stale_lookups,
        published,
        dropped,
    };
    for inst in instances {
        inst.publisher.close().await?;
    }
    router_client_drop(url, &setup.prefix).await?;
    Ok(row)
}

/// Frees the run's entries so the next run's memory figure starts clean.
async fn router_client_drop(url: &str, prefix: &str) -> anyhow::Result<()> {
    let mut cfg = cluster::IndexConfig::new(url, "te-bench");
    cfg.prefix = prefix.into();
    cfg.timeout = Duration::from_secs(5);
    cluster::IndexClient::new(cfg)?.drop_namespace(NS).await?;
    Ok(())
}

fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}

fn round(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster::local_redis::LocalRedis;

    fn setup(route: RoutePolicy, placement: Option<Placement>, prefix: &str) -> Setup {
        Setup {
            instances: 2,
            capacity: 100,
            cache: CacheKind::Lru,
            route,
            placement,
            utilization: 0.5,
            block_bytes: 1 << 20,
            link_gbps: 10.0,
            prefix: prefix.into(),
        }
    }

    #[test]
    fn placements_parse_and_unknown_ones_are_refused() {
        assert_eq!("copy".parse(), Ok(Placement::Copy));
        assert_eq!("hot3".parse(), Ok(Placement::Hot(3)));
        assert!("hot0".parse::<Placement>().is_err());
        assert!(
            "spread"
                .parse::<Placement>()
                .unwrap_err()
                .contains("single")
        );
    }

    #[test]
    fn round_robin_finds_the_other_instances_prefix_only_through_the_pool() {
        // Two turns of one conversation, then an unrelated prompt, then the first again: round robin
        // sends turns 1 and 3 to instance 0 and turn 2 to instance 1.
        let trace = Trace::parse(
            "t",
            "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,\"hash_ids\":[1,2]}\n\
             {\"timestamp\":10,\"input_length\":1536,\"output_length\":1,\"hash_ids\":[1,2,3]}\n\
             {\"timestamp\":20,\"input_length\":1024,\"output_length\":1,\"hash_ids\":[1,2,3,4]}\n",
        )
        .unwrap();
        let redis = LocalRedis::start().unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let own = runtime
            .block_on(replay(
                &trace,
                &redis.url(),
                &setup(RoutePolicy::RoundRobin, None, "a"),
            ))
            .unwrap();
        // Own caches only: turn 2 (instance 1) misses; turn 3 (instance 0) hits blocks 1, 2.
        assert_eq!(
            (own.hit_ratio, own.pulled_hit_ratio),
            (round(2.0 / 9.0), 0.0)
        );
        let pooled = runtime
            .block_on(replay(
                &trace,
                &redis.url(),
                &setup(RoutePolicy::RoundRobin, Some(Placement::Single), "b"),
            ))
            .unwrap();
        // Pooled: turn 2 pulls 1, 2 from instance 0; turn 3 holds 1, 2 itself and pulls 3.
        assert_eq!(pooled.hit_ratio, round(5.0 / 9.0));
        assert_eq!(pooled.pulled_hit_ratio, round(3.0 / 9.0));
        assert_eq!(pooled.stale_lookups, 0);
        assert!(pooled.published > 0 && pooled.dropped == 0, "{pooled:?}");
    }
}
