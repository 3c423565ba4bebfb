//! How many block events a second one instance's publisher gets into the index, alone and beside
//! others publishing at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{Holdings, IndexClient, IndexConfig, IndexEvent, IndexTier, Publisher};
use serde::Serialize;
use transfer_engine::NamespaceId;
use transfer_engine::policy::BlockKey;

/// One publish-rate run.
#[derive(Debug, Serialize)]
pub(crate) struct Rate {
    publishers: usize,
    events_each: usize,
    /// The slowest publisher's events over its wall time.
    events_per_s_each: f64,
    seconds: f64,
    dropped: u64,
}

/// What a publisher holds: `0` blocks, or as many as a re-sync is timed with.
struct Blocks(usize);

impl Holdings for Blocks {
    fn snapshot(&self) -> Vec<(NamespaceId, BlockKey, IndexTier)> {
        (0..self.0 as u64)
            .map(|k| (NS, BlockKey(k), IndexTier::Host))
            .collect()
    }
}

/// One timed re-sync.
#[derive(Debug, Serialize)]
pub(crate) struct Resync {
    blocks: u64,
    milliseconds: f64,
    blocks_per_s: f64,
}

/// Times a re-sync of an instance holding each of `sizes` blocks (the drift repair every
/// `resync_interval`, and the rebuild after Redis comes back).
pub(crate) async fn resyncs(url: &str, sizes: &[usize]) -> anyhow::Result<Vec<Resync>> {
    let mut rows = Vec::new();
    for &blocks in sizes {
        let mut cfg = IndexConfig::new(url, "resync:1");
        cfg.prefix = "tbresync".into();
        cfg.timeout = Duration::from_secs(5);
        let client = Arc::new(IndexClient::new(cfg)?);
        let publisher = Publisher::start(Arc::clone(&client), &[NS], Arc::new(Blocks(blocks)));
        // The first re-sync (at start) is the one timed.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !publisher.in_sync() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "a re-sync of {blocks} blocks took over 60 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let counts = client.stats().counts();
        anyhow::ensure!(counts.resync_blocks == blocks as u64, "{counts:?}");
        let seconds = counts.last_resync_micros as f64 / 1e6;
        rows.push(Resync {
            blocks: blocks as u64,
            milliseconds: (seconds * 1e4).round() / 10.0,
            blocks_per_s: (blocks as f64 / seconds).round(),
        });
        publisher.close().await?;
        client.drop_namespace(NS).await?;
    }
    Ok(rows)
}

const NS: NamespaceId = NamespaceId(0x70_75_62);

/// Runs 1 and then 8 publishers at once, each publishing `events` stored blocks as fast as its queue
/// takes them (sent in slices of half the queue, each flushed).
pub(crate) async fn rates(url: &str, events: usize) -> anyhow::Result<Vec<Rate>> {
    let mut rows = Vec::new();
    for publishers in [1, 8] {
        let mut tasks = Vec::new();
        for p in 0..publishers {
            let mut cfg = IndexConfig::new(url, format!("pub{p}:1"));
            cfg.prefix = "tbpub".into();
            cfg.timeout = Duration::from_secs(5);
            let client = Arc::new(IndexClient::new(cfg)?);
            tasks.push(tokio::spawn(publish_all(client, events, p as u64)));
        }
        let mut slowest: f64 = 0.0;
        let mut dropped = 0;
        for task in tasks {
            let (seconds, lost) = task.await??;
            slowest = slowest.max(seconds);
            dropped += lost;
        }
        rows.push(Rate {
            publishers,
            events_each: events,
            events_per_s_each: (events as f64 / slowest).round(),
            seconds: (slowest * 1e3).round() / 1e3,
            dropped,
        });
        let mut cfg = IndexConfig::new(url, "te-bench");
        cfg.prefix = "tbpub".into();
        cfg.timeout = Duration::from_secs(5);
        IndexClient::new(cfg)?.drop_namespace(NS).await?;
    }
    Ok(rows)
}

async fn publish_all(
    client: Arc<IndexClient>,
    events: usize,
    p: u64,
) -> anyhow::Result<(f64, u64)> {
    let publisher = Publisher::start(Arc::clone(&client), &[NS], Arc::new(Blocks(0)));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !publisher.in_sync() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "a publisher never reached the index"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let slice = client.config().queue / 2;
    let started = Instant::now();
    let mut sent = 0;
    while sent < events {
        let upto = (sent + slice).min(events);
        for k in sent..upto {
            publisher.send(IndexEvent::Stored {
                ns: NS,
                key: BlockKey(p << 40 | k as u64),
                tier: IndexTier::Host,
            });
        }
        anyhow::ensure!(
            publisher.flush(Duration::from_secs(60)).await,
            "a publish slice took over 60 s"
        );
        sent = upto;
    }
    let seconds = started.elapsed().as_secs_f64();
    let dropped = client.stats().counts().dropped;
    publisher.close().await?;
    Ok((seconds, dropped))
}
