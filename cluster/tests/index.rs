//! The index against a real Redis this test starts (`redis-server`, which scripts/install-deps.sh
//! installs): publishing, lookups, leases, drift repair, and Redis going away and coming back. Every wait
//! is bounded; none depends on the machine being quiet (deadlines are seconds for what takes
//! milliseconds).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster::local_redis::LocalRedis;
use cluster::{Holdings, IndexClient, IndexConfig, IndexEvent, IndexTier, Publisher};
use transfer_engine::NamespaceId;
use transfer_engine::policy::BlockKey;

const NS: NamespaceId = NamespaceId(0xfeed);

/// What a test instance holds; its events are sent by hand, as a tier store would.
#[derive(Default)]
struct Held(Mutex<Vec<(NamespaceId, BlockKey, IndexTier)>>);

impl Holdings for Held {
    fn snapshot(&self) -> Vec<(NamespaceId, BlockKey, IndexTier)> {
        self.0.lock().unwrap().clone()
    }
}

struct Instance {
    held: Arc<Held>,
    publisher: Publisher,
    client: Arc<IndexClient>,
}

impl Instance {
    async fn start(url: &str, name: &str) -> Instance {
        let mut cfg = IndexConfig::new(url, name);
        cfg.lease = Duration::from_millis(900);
        cfg.entry_ttl = Duration::from_secs(30);
        cfg.resync_interval = Duration::from_secs(60);
        cfg.timeout = Duration::from_millis(500);
        let client = Arc::new(IndexClient::new(cfg).unwrap());
        let held = Arc::new(Held::default());
        let publisher = Publisher::start(Arc::clone(&client), &[NS], held.clone());
        let i = Instance {
            held,
            publisher,
            client,
        };
        i.wait_in_sync().await;
        i
    }

    async fn wait_in_sync(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.publisher.in_sync() {
            assert!(
                Instant::now() < deadline,
                "publisher not in sync after 20 s: {:?}",
                self.client.stats().counts()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stores `keys` in `tier` and publishes them.
    async fn store(&self, keys: &[u64], tier: IndexTier) {
        for &k in keys {
            self.held.0.lock().unwrap().push((NS, BlockKey(k), tier));
            self.publisher.send(IndexEvent::Stored {
                ns: NS,
                key: BlockKey(k),
                tier,
            });
        }
        assert!(self.publisher.flush(Duration::from_secs(10)).await);
    }

    async fn remove(&self, keys: &[u64]) {
        for &k in keys {
            self.held.0.lock().unwrap().retain(|(_, key, _)| key.0 != k);
            self.publisher.send(IndexEvent::Removed {
                ns: NS,
                key: BlockKey(k),
            });
        }
        assert!(self.publisher.flush(Duration::from_secs(10)).await);
    }
}

fn prompt(keys: &[u64]) -> Vec<BlockKey> {
    keys.iter().copied().map(BlockKey).collect()
}

fn reader(url: &str) -> IndexClient {
    let mut cfg = IndexConfig::new(url, "router");
    cfg.timeout = Duration::from_millis(500);
    IndexClient::new(cfg).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_find_the_longest_prefix_each_live_instance_holds_and_removals_and_departures_count()
 {
    let redis = LocalRedis::start().unwrap();
    let a = Instance::start(&redis.url(), "10.0.0.1:7000").await;
    let b = Instance::start(&redis.url(), "10.0.0.2:7000").await;
    a.store(&[1, 2, 3], IndexTier::Host).await;
    a.store(&[4], IndexTier::Disk).await;
    b.store(&[1, 2], IndexTier::Host).await;
    b.store(&[9], IndexTier::Host).await; // not a prefix of the prompt: never counted
    let router = reader(&redis.url());
    let found = router.lookup(NS, &prompt(&[1, 2, 3, 4, 5])).await.unwrap();
    assert_eq!(found.held_by("10.0.0.1:7000"), 4);
    assert_eq!(found.holders[0].disk_blocks, 1);
    assert_eq!(found.held_by("10.0.0.2:7000"), 2);
    assert_eq!(found.longest(), 4);
    // Another namespace sees none of it.
    let other = router
        .lookup(NamespaceId(1), &prompt(&[1, 2]))
        .await
        .unwrap();
    assert!(other.holders.is_empty());

    // A removal ends a prefix where it is.
    a.remove(&[2]).await;
    let found = router.lookup(NS, &prompt(&[1, 2, 3, 4])).await.unwrap();
    assert_eq!(found.held_by("10.0.0.1:7000"), 1);

    // Leaving ends an instance's entries at once.
    b.publisher.close().await.unwrap();
    let found = router.lookup(NS, &prompt(&[1, 2])).await.unwrap();
    assert_eq!(found.held_by("10.0.0.2:7000"), 0);
    assert_eq!(found.stale_entries(), 2, "{found:?}");

    // A crashed instance (no leave) stops counting once its lease lapses; its entries are removed.
    drop(a.publisher);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = router.lookup(NS, &prompt(&[1])).await.unwrap();
        if found.holders.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a lapsed lease still counts: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while router
        .lookup(NS, &prompt(&[1]))
        .await
        .unwrap()
        .stale_entries()
        > 0
    {
        assert!(
            Instant::now() < deadline,
            "stale entries were never removed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(router.stats().counts().stale_entries >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_repairs_a_lost_removal_and_an_instance_restarted_with_its_disk() {
    let redis = LocalRedis::start().unwrap();
    let a = Instance::start(&redis.url(), "a:1").await;
    a.store(&[1, 2, 3], IndexTier::Host).await;
    // Block 2 leaves without its removal reaching the index (a lost publish).
    a.held.0.lock().unwrap().retain(|(_, k, _)| k.0 != 2);
    let router = reader(&redis.url());
    assert_eq!(
        router
            .lookup(NS, &prompt(&[1, 2, 3]))
            .await
            .unwrap()
            .longest(),
        3
    );
    let before = a.client.stats().counts().resyncs;
    a.publisher.resync();
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.client.stats().counts().resyncs == before {
        assert!(Instant::now() < deadline, "no re-sync in 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        router
            .lookup(NS, &prompt(&[1, 2, 3]))
            .await
            .unwrap()
            .longest(),
        1
    );

    // The instance restarts with its disk tier: the new one publishes what it found there.
    a.publisher.close().await.unwrap();
    let restarted = Instance::start(&redis.url(), "a:1").await;
    assert_eq!(router.lookup(NS, &prompt(&[1])).await.unwrap().longest(), 0);
    restarted.held.0.lock().unwrap().extend([
        (NS, BlockKey(1), IndexTier::Disk),
        (NS, BlockKey(3), IndexTier::Disk),
    ]);
    restarted.publisher.resync();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = router.lookup(NS, &prompt(&[1, 2])).await.unwrap();
        if found.longest() == 1 && restarted.client.stats().counts().resyncs >= 2 {
            assert_eq!(found.holders[0].disk_blocks, 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted instance's disk was never published"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let counts = restarted.client.stats().counts();
    assert!(
        counts.resyncs >= 2 && counts.resync_blocks >= 2,
        "{counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_lookups_fail_fast_publishes_are_dropped_and_a_returning_redis_is_rebuilt() {
    let redis = LocalRedis::start().unwrap();
    let port = redis.port();
    let url = redis.url();
    let a = Instance::start(&url, "a:1").await;
    a.store(&[1, 2], IndexTier::Host).await;
    let router = reader(&url);
    assert_eq!(
        router.lookup(NS, &prompt(&[1, 2])).await.unwrap().longest(),
        2
    );
    redis.kill();

    let started = Instant::now();
    let e = router.lookup(NS, &prompt(&[1, 2])).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}: {e}",
        started.elapsed()
    );
    assert_eq!(router.stats().counts().lookup_failures, 1);
    // Serving goes on: the instance stores more while the index is gone; the events are dropped.
    a.store(&[3], IndexTier::Host).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.publisher.in_sync() || a.client.stats().counts().dropped == 0 {
        assert!(Instant::now() < deadline, "{:?}", a.client.stats().counts());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.store(&[4], IndexTier::Host).await;

    // Redis comes back empty: the publisher rebuilds what the instance holds.
    let _back = LocalRedis::start_on(port).unwrap();
    a.wait_in_sync().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = router.lookup(NS, &prompt(&[1, 2, 3, 4])).await;
        if found.as_ref().is_ok_and(|f| f.longest() == 4) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the index was not rebuilt: {found:?}, {:?}",
            a.client.stats().counts()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_lookup_after_redis_restarted_is_answered_on_a_new_connection() {
    let redis = LocalRedis::start().unwrap();
    let port = redis.port();
    let url = redis.url();
    let a = Instance::start(&url, "a:1").await;
    a.store(&[1, 2], IndexTier::Host).await;
    let router = reader(&url);
    assert_eq!(
        router.lookup(NS, &prompt(&[1, 2])).await.unwrap().longest(),
        2
    );
    // Restarted between two lookups: the router's connection is gone, though it has not seen it yet.
    redis.kill();
    let _back = LocalRedis::start_on(port).unwrap();
    let found = router.lookup(NS, &prompt(&[1, 2])).await;
    assert!(found.is_ok(), "{found:?}");
    assert_eq!(router.stats().counts().lookup_failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lookup_answers_for_sixty_four_instances() {
    let redis = LocalRedis::start().unwrap();
    let mut instances = Vec::new();
    for i in 0..64u64 {
        let inst = Instance::start(&redis.url(), &format!("10.0.1.{i}:7000")).await;
        // Instance i holds the first i % 9 blocks of the prompt.
        let keys: Vec<u64> = (1..=i % 9).collect();
        inst.store(&keys, IndexTier::Host).await;
        instances.push(inst);
    }
    let router = reader(&redis.url());
    let found = router
        .lookup(NS, &prompt(&(1..=10).collect::<Vec<_>>()))
        .await
        .unwrap();
    for i in 0..64u64 {
        assert_eq!(
            found.held_by(&format!("10.0.1.{i}:7000")),
            (i % 9) as usize,
            "instance {i}"
        );
    }
    assert_eq!(found.longest(), 8);
    assert!(found.holders.windows(2).all(|w| w[0].blocks >= w[1].blocks));
}
