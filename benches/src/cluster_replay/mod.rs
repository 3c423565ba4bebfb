//! `te-bench cluster`: a trace replayed over N simulated instances, each a real cache publishing to a
//! real Redis through the real index client, each request routed by a chosen policy; compute and
//! transfer time simulated (virtual seconds), every index call real.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use cluster::local_redis::LocalRedis;
use cluster::route::RoutePolicy;
use policy::Trace;

mod instance;
mod publish;
mod replay;

use instance::CacheKind;
pub(crate) use replay::Placement;

use crate::report::print_rows;

/// Arguments of `te-bench cluster`.
#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    /// Trace file (Mooncake format: `timestamp`, `input_length`, `output_length`, `hash_ids`).
    #[arg(long)]
    trace: PathBuf,
    /// Replay only the first this many requests.
    #[arg(long)]
    rows: Option<usize>,
    /// Instance counts to run.
    #[arg(long, value_delimiter = ',', default_value = "8,16,64")]
    instances: Vec<usize>,
    /// Each instance's cache, in percent of the trace's distinct blocks.
    #[arg(long, default_value_t = 2.0)]
    capacity_pct: f64,
    /// Routing policies: round-robin, least-loaded, cache, cache-load (all when omitted).
    #[arg(long, value_delimiter = ',')]
    route: Vec<RoutePolicy>,
    /// Each instance's cache: lru, tier (the policy crate's tier manager, continuation order) or heat (the
    /// tier manager, heat order).
    #[arg(long, value_enum, default_value = "lru")]
    cache: CacheKind,
    /// Where a pulled block is kept, for the pooled runs: copy (at the puller too), single (only at its
    /// holder), `hot<N>` (at the puller once N requests pulled it). Each runs.
    #[arg(long, value_delimiter = ',', default_value = "copy,single,hot4")]
    placement: Vec<Placement>,
    /// The load: busy fraction of every instance if nothing were reused (sets the compute speed).
    #[arg(long, default_value_t = 0.7)]
    utilization: f64,
    /// Bytes of one 512-token block's KV (64 MiB: a Llama-3-8B-like model in 16 bits).
    #[arg(long, default_value = "64MiB", value_parser = crate::args::parse_size)]
    block_bytes: u64,
    /// Bandwidth between instances, GB/s, for the simulated transfer of pulled blocks.
    #[arg(long, default_value_t = 25.0)]
    link_gbps: f64,
    /// A Redis (or Valkey) to use; omitted, one is started on a loopback port.
    #[arg(long)]
    redis: Option<String>,
    /// Events one instance publishes in the publish-rate run (0: skip it).
    #[arg(long, default_value_t = 200_000)]
    publish_events: usize,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) fn main(args: &ClusterArgs) -> anyhow::Result<()> {
    let mut trace =
        Trace::load(&args.trace).with_context(|| format!("loading {}", args.trace.display()))?;
    if let Some(rows) = args.rows {
        let requests = trace.requests().iter().take(rows).cloned().collect();
        trace = Trace::from_requests(trace.name(), requests);
    }
    let local;
    let url = match &args.redis {
        Some(url) => url.clone(),
        None => {
            local = LocalRedis::start().map_err(anyhow::Error::msg)?;
            local.url()
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let routes = if args.route.is_empty() {
        vec![
            RoutePolicy::RoundRobin,
            RoutePolicy::LeastLoaded,
            RoutePolicy::CacheAware,
            RoutePolicy::CacheLoad,
        ]
    } else {
        args.route.clone()
    };
    let capacity = (trace.distinct_blocks() as f64 * args.capacity_pct / 100.0).round() as usize;
    if !args.json {
        println!(
            "{}: {} requests, {} blocks ({} distinct); {} blocks a cache ({}%), {} cache; Redis at {url}",
            trace.name(),
            trace.requests().len(),
            trace.total_blocks(),
            trace.distinct_blocks(),
            capacity,
            args.capacity_pct,
            match args.cache {
                CacheKind::Lru => "LRU",
                CacheKind::Tier => "tier-manager (continuation)",
                CacheKind::Heat => "tier-manager (heat)",
            }
        );
    }
    let mut rows = Vec::new();
    let mut run = 0;
    for &n in &args.instances {
        for &route in &routes {
            let mut setups = vec![None];
            setups.extend(args.placement.iter().copied().map(Some));
            for placement in setups {
                run += 1;
                let setup = replay::Setup {
                    instances: n,
                    capacity,
                    cache: args.cache,
                    route,
                    placement,
                    utilization: args.utilization,
                    block_bytes: args.block_bytes,
                    link_gbps: args.link_gbps,
                    prefix: format!("tb{run}"),
                };
                let started = Instant::now();
                let row = runtime.block_on(replay::replay(&trace, &url, &setup))?;
                if !args.json {
                    eprintln!(
                        "  {n} instances, {route:?}, {placement:?}: {:.1} s",
                        started.elapsed().as_secs_f64()
                    );
                }
                rows.push(row);
            }
        }
    }
    print_rows(
        &rows,
        args.json,
        &[
            "instances",
            "route",
            "pool",
            "hit_ratio",
            "own_hit_ratio",
            "pulled_hit_ratio",
            "balance",
            "moved_gib",
            "ttft_p50_s",
            "ttft_p99_s",
            "lookup_p50_us",
            "lookup_p99_us",
            "index_ops_per_s",
            "index_mib",
            "stale_lookups",
        ],
    )?;
    if args.publish_events > 0 {
        let rates = runtime.block_on(publish::rates(&url, args.publish_events))?;
        print_rows(
            &rates,
            args.json,
            &[
                "publishers",
                "events_each",
                "events_per_s_each",
                "seconds",
                "dropped",
            ],
        )?;
        let resyncs = runtime.block_on(publish::resyncs(&url, &[capacity, 100_000]))?;
        print_rows(
            &resyncs,
            args.json,
            &["blocks", "milliseconds", "blocks_per_s"],
        )?;
    }
    Ok(())
}
