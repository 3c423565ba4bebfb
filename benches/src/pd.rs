//! `te-bench pd`: prefill/decode disaggregation through the connector, two OS processes over TCP or RDMA
//! (`--backend rdma --provider shm|tcp`: the same connector code over libfabric).
//!
//! This process is the decode instance; it spawns itself as the prefill instance (`pd --prefill-child`)
//! and drives it over the child's stdin and stdout, one JSON line per command. For each request of a
//! Mooncake trace (its `hash_ids` decide the prompt tokens, so requests that share ids share prefixes):
//! 1. prefill computes the blocks its tier store does not hold already (simulated compute per block and
//!    layer) and saves KV layer by layer through the connector, each block stamped with its weight version
//!    and key;
//! 2. decode asks its connector how many tokens it can load, loads them layer by layer, waiting for each
//!    layer and then spending the simulated compute of the blocks it did not load.
//!
//! By default the decode asks as soon as the prefill has saved layer 0 (a proxy that hands the request to
//! both instances at once): the producer streams each later layer as it is saved, so the transfer overlaps
//! the prefill's compute. With `--sequential` the decode asks only once the prefill has finished.
//!
//! Time to first token (prefill + load + the decode's own compute) is compared with recompute (the same
//! stream, no engine: the decode computes every block itself). Midway the weight version changes on both
//! sides; every loaded block's stamp is checked, and `stale_blocks_served` counts blocks of an old
//! version that arrived after the change (it must be 0), `wrong_blocks` blocks whose key differs.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use connector::{ConnectorConfig, KvRequest, KvRole, RequestExtras, ScopedKey, namespace};
use serde::Serialize;
use transfer_engine::MemoryRegion;

use crate::args::{fmt_size, parse_size};
use crate::report::quantile;
use backend::PdBackend;
use child::{ChildCommand, PrefillChild, prefill_child};

mod backend;
mod child;

/// Tokens behind one trace hash id (the Mooncake traces hash 512-token blocks).
const TRACE_BLOCK_TOKENS: usize = 512;
/// Bytes stamped at the start of each block and layer: weight version (8) and key (32).
const STAMP: usize = 40;

/// Arguments of `te-bench pd`.
#[derive(Debug, Clone, Args)]
pub(crate) struct PdArgs {
    /// Requests replayed from the trace, in file order.
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// Mooncake trace (default: the repository's conversation trace in data/traces).
    #[arg(long)]
    trace: Option<std::path::PathBuf>,
    /// Trace blocks (512 tokens each) kept per prompt, at most.
    #[arg(long, default_value_t = 8)]
    max_trace_blocks: usize,
    /// Transformer layers.
    #[arg(long, default_value_t = 8)]
    layers: u32,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 128)]
    block_tokens: u32,
    /// Bytes of one block of one layer, with a unit.
    #[arg(long, value_parser = parse_size, default_value = "32KiB")]
    block_bytes: u64,
    /// Simulated prefill compute per block and layer, in microseconds. The default is about 4.3 times
    /// what this machine's TCP path takes to move a 32 KiB block (14 µs at the 2.3 GB/s measured here):
    /// the ratio of a 7B model's prefill compute per token and layer on an A100 (14 GFLOP a token at half
    /// its 312 TFLOP/s, 2.8 µs a layer) to moving its 16 KiB of KV per token and layer at 200 Gb/s.
    #[arg(long, default_value_t = 60)]
    compute_us: u64,
    /// Blocks the prefill's tier store holds in host memory.
    #[arg(long, default_value_t = 2048)]
    store_blocks: u32,
    /// Rank the prefill's tier store with the tier manager's ARC-style segments instead of plain heat.
    #[arg(long)]
    store_segments: bool,
    /// Request index at which the weight version changes (default: half way).
    #[arg(long)]
    weight_change_at: Option<usize>,
    /// Serve the decode connector's metrics as Prometheus text over HTTP on this address while the run
    /// lasts (e.g. 127.0.0.1:9464; any path answers).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Ask the decode only once the prefill has finished, instead of as soon as it saved layer 0 (no
    /// overlap of the transfer with the prefill's compute).
    #[arg(long)]
    sequential: bool,
    /// What carries the KV between the two processes.
    #[arg(long, value_enum, default_value_t = PdBackend::Tcp)]
    backend: PdBackend,
    /// libfabric provider of `--backend rdma`: shm (same host), tcp, or another that `fi_info` lists.
    #[arg(long, default_value = "shm")]
    provider: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Run as the prefill child (internal).
    #[arg(long, hide = true)]
    prefill_child: bool,
}

/// The report's JSON object.
#[derive(Debug, Serialize)]
struct PdReport {
    /// The transport (`tcp` or `rdma`).
    backend: &'static str,
    /// The libfabric provider of `--backend rdma` (none over TCP).
    provider: Option<String>,
    requests: usize,
    /// Whether the decode asked only after the prefill finished (`--sequential`).
    sequential: bool,
    ttft_ms_engine: f64,
    ttft_ms_recompute: f64,
    ttft_ms_engine_p90: f64,
    ttft_ms_recompute_p90: f64,
    /// p50 of the prefill instance computing and saving (as timed in its process).
    prefill_ms: f64,
    /// p50 of the decode's part: from asking (after the prefill, or after its layer 0) to its last layer
    /// loaded and its own compute done.
    decode_ms: f64,
    /// Loads the prefill served while some of their layers were still being saved.
    streamed_loads: u64,
    /// Blocks the prefill found in its tier store (shared prefixes) over all prompt blocks.
    prefill_reuse: f64,
    hit_rate: f64,
    bytes_loaded: u64,
    load_gbps: f64,
    requests_per_s_engine: f64,
    requests_per_s_recompute: f64,
    peak_buffer_bytes: u64,
    stale_blocks_served: u64,
    wrong_blocks: u64,
    recompute_blocks: u64,
    prefill_computed_blocks: u64,
    /// Blocks the prefill's store could not keep while saving (no free slot).
    prefill_save_dropped: u64,
    weight_change_at: usize,
    loaded_blocks_after_change: u64,
}

fn config(args: &PdArgs, role: KvRole) -> ConnectorConfig {
    let mut c = ConnectorConfig::new(role, namespace("te-bench-pd", 1, args.block_tokens));
    (c.layers, c.block_bytes, c.prefetch_depth) = (args.layers, args.block_bytes, 2);
    c.store_blocks = if role.saves() { args.store_blocks } else { 0 };
    c.store_segments = args.store_segments;
    c
}

fn pool_blocks(args: &PdArgs) -> u32 {
    (args.max_trace_blocks * TRACE_BLOCK_TOKENS).div_ceil(args.block_tokens as usize) as u32
}

fn pool_bytes(args: &PdArgs) -> u64 {
    u64::from(args.layers) * u64::from(pool_blocks(args)) * args.block_bytes
}

/// The prompt of a trace request: 512 tokens per hash id, a function of the id and the position only.
fn tokens_of(hash_ids: &[u64], input_length: u64, max_blocks: usize) -> Vec<u32> {
    let n = (input_length as usize).min(hash_ids.len().min(max_blocks) * TRACE_BLOCK_TOKENS);
    (0..n)
        .map(|i| {
            let h = hash_ids[i / TRACE_BLOCK_TOKENS];
            ((h.wrapping_mul(2_654_435_761) + (i % TRACE_BLOCK_TOKENS) as u64 * 40_503) % 150_000)
                as u32
        })
        .collect()
}

fn stamp(version: u64, key: &ScopedKey) -> [u8; STAMP] {
    let mut s = [0u8; STAMP];
    s[..8].copy_from_slice(&version.to_le_bytes());
    s[8..].copy_from_slice(&key.hash.0);
    s
}

fn sleep_us(us: u64) {
    if us > 0 {
        std::thread::sleep(Duration::from_micros(us));
    }
}

pub(crate) fn main(args: &PdArgs) -> anyhow::Result<()> {
    if args.prefill_child {
        return prefill_child(args);
    }
    if args.block_tokens == 0 || args.layers == 0 || args.block_bytes < STAMP as u64 {
        bail!("--block-tokens and --layers must be at least 1, --block-bytes at least {STAMP}");
    }
    let trace_path = match &args.trace {
        Some(p) => p.clone(),
        None => crate::demo_trace().context("no trace at data/traces: pass --trace")?,
    };
    let trace = policy::Trace::load(&trace_path)?;
    let requests: Vec<_> = trace.requests().iter().take(args.requests).collect();
    if requests.is_empty() {
        bail!("the trace has no requests");
    }
    let change_at = args.weight_change_at.unwrap_or(requests.len() / 2);
    let mut child = PrefillChild::spawn(args)?;
    let decode = std::sync::Arc::new(backend::connector(
        args,
        KvRole::Consumer,
        2,
        Some(child.control),
    )?);
    if let Some(addr) = args.metrics_listen {
        let listener = std::net::TcpListener::bind(addr)
            .with_context(|| format!("binding the metrics endpoint on {addr}"))?;
        let source = std::sync::Arc::downgrade(&decode);
        eprintln!("pd: metrics on http://{}/metrics", listener.local_addr()?);
        std::thread::spawn(move || {
            serve_metrics(&listener, || {
                source.upgrade().map(|c| c.worker.prometheus())
            })
        });
    }
    let pool = MemoryRegion::zeroed(pool_bytes(args) as usize);
    decode
        .worker
        .register_kv_caches(pool.clone(), pool_blocks(args))?;
    let bs = args.block_tokens as usize;
    let (mut ttft_engine, mut ttft_recompute) = (Vec::new(), Vec::new());
    let (mut prefill_ms, mut decode_ms, mut all_blocks) = (Vec::new(), Vec::new(), 0u64);
    let (mut stale, mut wrong, mut after_change, mut prefill_computed) = (0u64, 0u64, 0u64, 0u64);
    let mut version = 1;
    let (mut engine_time, mut load_time) = (Duration::ZERO, Duration::ZERO);
    for (i, req) in requests.iter().enumerate() {
        if i == change_at {
            version += 1;
            child.call(&ChildCommand::Weights { version })?;
            decode.set_weight_version(version);
        }
        let tokens = tokens_of(&req.hash_ids, req.input_length, args.max_trace_blocks);
        let total_blocks = tokens.len().div_ceil(bs) as u64;
        let id = format!("r{i}");
        let started = Instant::now();
        child.send(&ChildCommand::Prefill {
            id: id.clone(),
            tokens: tokens.clone(),
            announce: !args.sequential,
        })?;
        let mut reply = child.reply()?;
        if !args.sequential && !reply.started {
            bail!("the prefill did not announce its layer 0");
        }
        all_blocks += total_blocks;
        let decode_started = Instant::now();
        let extras = RequestExtras::default();
        let kreq = KvRequest {
            id: &id,
            tokens: &tokens,
            extras: &extras,
            external_keys: None,
            transfer_params: None,
        };
        let keys = decode.scheduler.request_keys(&kreq);
        let (n, _) = decode.scheduler.wait_matched_tokens(&kreq, 0)?;
        let blocks: Vec<u32> = (0..total_blocks as u32).collect();
        decode.scheduler.update_state_after_alloc(&id, &blocks, n)?;
        decode.plan_step()?;
        let load_started = Instant::now();
        decode.worker.start_load_kv()?;
        let loaded = (n / bs) as u64;
        for layer in 0..args.layers {
            decode.worker.wait_for_layer_load(layer)?;
            sleep_us(args.compute_us * (total_blocks - loaded));
        }
        load_time += load_started.elapsed();
        let failed = decode.worker.failed_blocks();
        sleep_us(args.compute_us * u64::from(args.layers) * failed.len() as u64); // recompute them
        ttft_engine.push(started.elapsed().as_secs_f64() * 1e3);
        decode_ms.push(decode_started.elapsed().as_secs_f64() * 1e3);
        engine_time += started.elapsed();
        decode.worker.clear_connector_metadata();
        decode.scheduler.request_finished(&id);
        let _ = decode.worker.get_finished();
        if !args.sequential {
            reply = child.reply()?;
        }
        prefill_computed += reply.computed_blocks as u64;
        prefill_ms.push(reply.elapsed_us as f64 / 1e3);
        // Check every block that was loaded: its stamp names this weight version and this key.
        for (b, key) in keys.iter().enumerate().take(loaded as usize) {
            if failed.contains(&(b as u32)) {
                continue;
            }
            for layer in 0..args.layers {
                let at = ((u64::from(layer) * u64::from(pool_blocks(args)) + b as u64)
                    * args.block_bytes) as usize;
                let got = pool.read(at..at + STAMP)?;
                if got[..8] != version.to_le_bytes() {
                    stale += 1;
                } else if got[..] != stamp(version, key)[..] {
                    wrong += 1;
                }
            }
            if i >= change_at {
                after_change += 1;
            }
        }
        // Recompute baseline: the same request computed whole on the decode instance.
        let t = Instant::now();
        for _ in 0..args.layers {
            sleep_us(args.compute_us * total_blocks);
        }
        ttft_recompute.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let stats = child.call(&ChildCommand::Stats)?;
    let snap = decode.worker.metrics().snapshot();
    let block_all_layers = args.block_bytes * u64::from(args.layers);
    let recompute_total: f64 = ttft_recompute.iter().sum::<f64>() / 1e3;
    let report = PdReport {
        backend: args.backend.name(),
        provider: (args.backend == PdBackend::Rdma).then(|| args.provider.clone()),
        requests: requests.len(),
        sequential: args.sequential,
        ttft_ms_engine: quantile(&mut ttft_engine.clone(), 0.5),
        ttft_ms_recompute: quantile(&mut ttft_recompute.clone(), 0.5),
        ttft_ms_engine_p90: quantile(&mut ttft_engine, 0.9),
        ttft_ms_recompute_p90: quantile(&mut ttft_recompute, 0.9),
        prefill_ms: quantile(&mut prefill_ms, 0.5),
        decode_ms: quantile(&mut decode_ms, 0.5),
        prefill_reuse: 1.0 - prefill_computed as f64 / all_blocks.max(1) as f64,
        hit_rate: snap.hit_rate(),
        bytes_loaded: snap.bytes_in,
        load_gbps: snap.bytes_in as f64 / load_time.as_secs_f64().max(1e-9) / 1e9,
        requests_per_s_engine: requests.len() as f64 / engine_time.as_secs_f64().max(1e-9),
        requests_per_s_recompute: requests.len() as f64 / recompute_total.max(1e-9),
        // Both processes' KV pools plus the most the prefill's tier store ever held.
        peak_buffer_bytes: 2 * pool_bytes(args) + stats.store_peak_blocks as u64 * block_all_layers,
        stale_blocks_served: stale,
        wrong_blocks: wrong,
        recompute_blocks: snap.recompute_blocks,
        prefill_computed_blocks: prefill_computed,
        prefill_save_dropped: stats.save_dropped,
        streamed_loads: stats.streamed_loads,
        weight_change_at: change_at,
        loaded_blocks_after_change: after_change,
    };
    drop(decode);
    child.finish();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_human(args, &report, &trace_path);
    }
    if report.stale_blocks_served > 0 || report.wrong_blocks > 0 {
        bail!(
            "{} stale and {} wrong blocks were served",
            report.stale_blocks_served,
            report.wrong_blocks
        );
    }
    Ok(())
}

fn print_human(args: &PdArgs, r: &PdReport, trace: &std::path::Path) {
    println!(
        "pd: {} requests of {} ({} layers x {} blocks of {} tokens, {} per block and layer), prefill and decode \
         in two processes over TCP",
        r.requests,
        trace.display(),
        args.layers,
        pool_blocks(args),
        args.block_tokens,
        fmt_size(args.block_bytes)
    );
    println!(
        "  TTFT p50  engine {:.2} ms  recompute {:.2} ms  (ratio {:.2})",
        r.ttft_ms_engine,
        r.ttft_ms_recompute,
        r.ttft_ms_recompute / r.ttft_ms_engine
    );
    println!(
        "  engine TTFT parts (p50): prefill {:.2} ms (it found {:.1}% of blocks in its tier store), decode load and compute {:.2} ms ({})",
        r.prefill_ms,
        100.0 * r.prefill_reuse,
        r.decode_ms,
        if r.sequential {
            "asked after the prefill finished"
        } else {
            "asked once the prefill saved layer 0, overlapping it"
        }
    );
    println!(
        "  TTFT p90  engine {:.2} ms  recompute {:.2} ms",
        r.ttft_ms_engine_p90, r.ttft_ms_recompute_p90
    );
    println!(
        "  hit rate {:.3}, {} loaded at {:.2} GB/s during loads, {} blocks recomputed",
        r.hit_rate,
        fmt_size(r.bytes_loaded),
        r.load_gbps,
        r.recompute_blocks
    );
    println!(
        "  requests/s  engine {:.1}  recompute {:.1}",
        r.requests_per_s_engine, r.requests_per_s_recompute
    );
    println!(
        "  peak buffer memory {:.1} MiB (both KV pools and the prefill's tier store at its peak)",
        r.peak_buffer_bytes as f64 / (1 << 20) as f64
    );
    println!(
        "  weight version changed before request {}: {} blocks loaded after it, {} of an old version (must be 0), {} with a wrong key",
        r.weight_change_at, r.loaded_blocks_after_change, r.stale_blocks_served, r.wrong_blocks
    );
}

/// Answers every HTTP request on `listener` with `text()` as Prometheus text, until `text` gives `None`.
fn serve_metrics(listener: &std::net::TcpListener, text: impl Fn() -> Option<String>) {
    use std::io::Read;
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut request = [0u8; 8192];
        let _ = stream.read(&mut request); // one read: the request line and headers, ignored
        let Some(body) = text() else { return };
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n             Connection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_metrics_endpoint_answers_http_with_prometheus_text() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            serve_metrics(&listener, || {
                Some("# TYPE kv_cache_hit_rate gauge\nkv_cache_hit_rate 0.5\n".into())
            })
        });
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.ends_with("kv_cache_hit_rate 0.5\n"), "{answer}");
    }

    #[test]
    fn prompts_share_tokens_exactly_where_trace_ids_agree() {
        let a = tokens_of(&[1, 2], 1024, 8);
        let b = tokens_of(&[1, 3], 1000, 8);
        assert_eq!(a[..512], b[..512]);
        assert_ne!(a[512..1000], b[512..]);
        assert_eq!(
            tokens_of(&[1, 2, 3], 5000, 2).len(),
            1024,
            "capped at max blocks"
        );
    }
}
