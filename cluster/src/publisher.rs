//! The background task that keeps the index true to what an instance holds: it batches events into
//! pipelines, renews the lease, and re-syncs (everything held, under a new epoch) at start, after Redis
//! failed or events were dropped, and every `resync_interval`. It never blocks the caller: a full queue
//! or a failing Redis drops events, counted, and the next re-sync repairs what they would have said.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use transfer_engine::NamespaceId;
use transfer_engine::policy::BlockKey;

use crate::{IndexClient, IndexError, IndexEvent, IndexStats, IndexTier};

/// What an instance holds, read whole for a re-sync.
pub trait Holdings: Send + Sync + 'static {
    /// Every block held now, with its namespace and tier.
    fn snapshot(&self) -> Vec<(NamespaceId, BlockKey, IndexTier)>;
}

/// Feeds one instance's events to the index. Dropping it stops the task (without leaving: the lease
/// lapses); [`Publisher::close`] leaves at once.
pub struct Publisher {
    tx: mpsc::Sender<IndexEvent>,
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

struct Shared {
    client: Arc<IndexClient>,
    /// Events sent and events handled (published or dropped), for [`Publisher::flush`].
    sent: AtomicU64,
    handled: AtomicU64,
    progress: Notify,
    resync: Notify,
    /// Whether the index is known to match (the last re-sync held and nothing failed since).
    in_sync: AtomicBool,
    stop: Notify,
}

impl Publisher {
    /// Starts the task on the current tokio runtime, leasing `namespaces` (and any an event names).
    #[must_use]
    pub fn start(
        client: Arc<IndexClient>,
        namespaces: &[NamespaceId],
        holdings: Arc<dyn Holdings>,
    ) -> Publisher {
        let (tx, rx) = mpsc::channel(client.config().queue);
        let shared = Arc::new(Shared {
            client,
            sent: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            progress: Notify::new(),
            resync: Notify::new(),
            in_sync: AtomicBool::new(false),
            stop: Notify::new(),
        });
        let task = Task {
            shared: Arc::clone(&shared),
            rx,
            holdings,
            namespaces: namespaces.iter().copied().collect(),
            epoch: 0,
        };
        Publisher {
            tx,
            shared,
            task: Some(tokio::spawn(task.run())),
        }
    }

    /// Queues `event`; never waits. A full queue drops it (counted) and asks for a re-sync.
    pub fn send(&self, event: IndexEvent) {
        self.shared.sent.fetch_add(1, Ordering::Relaxed);
        if self.tx.try_send(event).is_err() {
            self.handled(1);
            IndexStats::add(&self.shared.client.stats().dropped, 1);
            self.shared.in_sync.store(false, Ordering::Relaxed);
            self.shared.resync.notify_one();
        }
    }

    /// Whether the index is known to match what this instance holds.
    #[must_use]
    pub fn in_sync(&self) -> bool {
        self.shared.in_sync.load(Ordering::Relaxed)
    }

    /// Asks for a re-sync now.
    pub fn resync(&self) {
        self.shared.resync.notify_one();
    }

    /// Waits until every event sent before this call is published or dropped, or `limit` passes;
    /// returns whether they were.
    pub async fn flush(&self, limit: Duration) -> bool {
        let target = self.shared.sent.load(Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.shared.progress.notified();
            if self.shared.handled.load(Ordering::Relaxed) >= target {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Stops the task and ends this instance's leases at once.
    pub async fn close(mut self) -> Result<(), IndexError> {
        self.shared.stop.notify_one();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        Ok(())
    }

    fn handled(&self, n: u64) {
        self.shared.handled.fetch_add(n, Ordering::Relaxed);
        self.shared.progress.notify_waiters();
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

struct Task {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<IndexEvent>,
    holdings: Arc<dyn Holdings>,
    namespaces: BTreeSet<NamespaceId>,
    /// The epoch of the last re-sync (0 before the first).
    epoch: u64,
}

impl Task {
    async fn run(mut self) {
        let cfg = self.shared.client.config().clone();
        let mut renew = tokio::time::interval(cfg.lease / 3);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut resync = tokio::time::interval(cfg.resync_interval);
        resync.tick().await;
        let mut events = Vec::with_capacity(cfg.batch);
        loop {
            tokio::select! {
                biased;
                () = self.shared.stop.notified() => {
                    let namespaces: Vec<_> = self.namespaces.iter().copied().collect();
                    let _ = self.shared.client.leave(&namespaces).await;
                    return;
                }
                _ = renew.tick() => self.renew().await,
                () = self.shared.resync.notified() => self.resync().await,
                _ = resync.tick() => self.resync().await,
                n = self.rx.recv_many(&mut events, cfg.batch) => {
                    if n == 0 {
                        return;
                    }
                    self.publish(&events).await;
                    events.clear();
                }
            }
        }
    }

    fn stats(&self) -> &IndexStats {
        self.shared.client.stats()
    }

    async fn publish(&mut self, events: &[IndexEvent]) {
        let n = events.len() as u64;
        let mut fresh = false;
        for event in events {
            let (IndexEvent::Stored { ns, .. } | IndexEvent::Removed { ns, .. }) = *event;
            fresh |= self.namespaces.insert(ns);
        }
        if self.shared.in_sync.load(Ordering::Relaxed) {
            match self.shared.client.publish(self.epoch, events).await {
                Ok(()) => IndexStats::add(&self.stats().published, n),
                Err(_) => {
                    IndexStats::add(&self.stats().publish_failures, 1);
                    IndexStats::add(&self.stats().dropped, n);
                    self.shared.in_sync.store(false, Ordering::Relaxed);
                }
            }
        } else {
            IndexStats::add(&self.stats().dropped, n);
        }
        self.shared.handled.fetch_add(n, Ordering::Relaxed);
        self.shared.progress.notify_waiters();
        if fresh {
            self.renew().await;
        }
    }

    /// Renews the leases; the first success after a failure (or before the first re-sync) re-syncs.
    async fn renew(&mut self) {
        if !self.shared.in_sync.load(Ordering::Relaxed) {
            self.resync().await;
            return;
        }
        let namespaces: Vec<_> = self.namespaces.iter().copied().collect();
        match self.shared.client.renew(&namespaces, self.epoch).await {
            Ok(()) => IndexStats::add(&self.stats().renewals, 1),
            Err(_) => {
                IndexStats::add(&self.stats().renew_failures, 1);
                self.shared.in_sync.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Publishes everything held under a new epoch, then moves the leases to it.
    async fn resync(&mut self) {
        let started = Instant::now();
        match self.resync_once().await {
            Ok(blocks) => {
                IndexStats::add(&self.stats().resyncs, 1);
                IndexStats::add(&self.stats().resync_blocks, blocks);
                IndexStats::add(&self.stats().renewals, 1);
                let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                self.stats()
                    .last_resync_micros
                    .store(micros, Ordering::Relaxed);
                self.shared.in_sync.store(true, Ordering::Relaxed);
            }
            Err(_) => {
                IndexStats::add(&self.stats().renew_failures, 1);
                self.shared.in_sync.store(false, Ordering::Relaxed);
            }
        }
    }

    async fn resync_once(&mut self) -> Result<u64, IndexError> {
        let client = Arc::clone(&self.shared.client);
        let epoch = client.server_time_ms().await?.max(self.epoch + 1);
        let held = self.holdings.snapshot();
        let batch = client.config().batch;
        let mut events = Vec::with_capacity(batch);
        for chunk in held.chunks(batch) {
            events.clear();
            for &(ns, key, tier) in chunk {
                self.namespaces.insert(ns);
                events.push(IndexEvent::Stored { ns, key, tier });
            }
            client.publish(epoch, &events).await?;
        }
        let namespaces: Vec<_> = self.namespaces.iter().copied().collect();
        client.renew(&namespaces, epoch).await?;
        self.epoch = epoch;
        Ok(held.len() as u64)
    }
}
