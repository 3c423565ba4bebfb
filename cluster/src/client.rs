//! One instance's calls to the index: lookups, publishes, leases. Every call is one pipeline, bounded by
//! the configured timeout; none retries (the caller falls back, the publisher re-syncs).

use std::future::Future;
use std::sync::Arc;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, Pipeline, Value};
use tokio::sync::Mutex;
use transfer_engine::NamespaceId;
use transfer_engine::policy::BlockKey;

use crate::holders::{Holders, StaleEntry, holders, live_leases};
use crate::schema::{IndexTier, block_key, entry_value, lease_value, leases_key};
use crate::{IndexConfig, IndexError, IndexStats};

/// A change to what an instance holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexEvent {
    /// The block is now in `tier` of this instance (saved, promoted or demoted).
    Stored {
        /// The block's namespace.
        ns: NamespaceId,
        /// The block.
        key: BlockKey,
        /// Where it is.
        tier: IndexTier,
    },
    /// The block left this instance.
    Removed {
        /// The block's namespace.
        ns: NamespaceId,
        /// The block.
        key: BlockKey,
    },
}

/// An instance's connection to the index. Connects on first use and again after Redis comes back.
pub struct IndexClient {
    cfg: IndexConfig,
    client: redis::Client,
    con: Mutex<Option<ConnectionManager>>,
    stats: Arc<IndexStats>,
}

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Removes a block's entry of one instance only while it holds the value a lookup read: an instance
/// re-publishing the block meanwhile (a newer epoch) keeps its entry. One key: safe on a Redis Cluster.
const REMOVE_IF_UNCHANGED: &str = "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0";

impl IndexClient {
    /// A client for `cfg` (checked). Opens no connection yet.
    pub fn new(cfg: IndexConfig) -> Result<IndexClient, IndexError> {
        cfg.validate()?;
        let client = redis::Client::open(cfg.url.as_str()).map_err(|e| {
            IndexError::Config(format!(
                "{:?} is not a Redis URL (redis://host:port, rediss:// for TLS): {e}",
                cfg.url
            ))
        })?;
        Ok(IndexClient {
            cfg,
            client,
            con: Mutex::new(None),
            stats: Arc::default(),
        })
    }

    /// Its counters (shared with its publisher).
    #[must_use]
    pub fn stats(&self) -> &Arc<IndexStats> {
        &self.stats
    }

    /// The settings it was made with.
    #[must_use]
    pub fn config(&self) -> &IndexConfig {
        &self.cfg
    }

    /// Who holds the leading blocks of `keys` (a prompt's block keys in order), in one round trip
    /// whatever the number of instances. Entries of lapsed leases or old epochs are skipped (and removed
    /// in the background).
    pub async fn lookup(&self, ns: NamespaceId, keys: &[BlockKey]) -> Result<Holders, IndexError> {
        let answer = self.lookup_once(ns, keys).await;
        match &answer {
            Ok(found) => {
                IndexStats::add(&self.stats.lookups, 1);
                IndexStats::add(&self.stats.stale_entries, found.stale.len() as u64);
            }
            Err(_) => IndexStats::add(&self.stats.lookup_failures, 1),
        }
        answer
    }

    async fn lookup_once(&self, ns: NamespaceId, keys: &[BlockKey]) -> Result<Holders, IndexError> {
        let prefix = &self.cfg.prefix;
        let mut pipe = redis::pipe();
        pipe.cmd("TIME").cmd("HGETALL").arg(leases_key(prefix, ns));
        for &key in keys {
            pipe.cmd("HGETALL").arg(block_key(prefix, ns, key));
        }
        let mut answers: Vec<Value> = self.query(&pipe).await?.into_iter().collect();
        if answers.len() != keys.len() + 2 {
            return Err(answer_error("a lookup's pipeline answered the wrong count"));
        }
        let blocks = answers
            .split_off(2)
            .into_iter()
            .map(parse::<Pairs>)
            .collect::<Result<Vec<_>, _>>()?;
        let leases: Pairs = parse(answers.pop().unwrap_or(Value::Nil))?;
        let now = server_ms(parse(answers.pop().unwrap_or(Value::Nil))?);
        let found = holders(&live_leases(&leases, now), &blocks);
        if !found.stale.is_empty() {
            self.remove_stale(ns, keys, &found.stale);
        }
        Ok(found)
    }

    /// The instances holding a live lease in `ns` now (by the server's clock), in address order: those a
    /// lookup would name.
    pub async fn live(&self, ns: NamespaceId) -> Result<Vec<String>, IndexError> {
        let mut pipe = redis::pipe();
        pipe.cmd("TIME")
            .cmd("HGETALL")
            .arg(leases_key(&self.cfg.prefix, ns));
        let mut answers = self.query(&pipe).await?;
        let leases: Pairs = parse(answers.pop().unwrap_or(Value::Nil))?;
        let now = server_ms(parse(answers.pop().unwrap_or(Value::Nil))?);
        let mut live: Vec<String> = live_leases(&leases, now).into_keys().collect();
        live.sort();
        Ok(live)
    }

    /// Publishes `events` under `epoch` in one pipeline (each stored block's entries then expire
    /// `entry_ttl` after this).
    pub async fn publish(&self, epoch: u64, events: &[IndexEvent]) -> Result<(), IndexError> {
        if events.is_empty() {
            return Ok(());
        }
        let prefix = &self.cfg.prefix;
        let me = self.cfg.instance.as_str();
        let ttl = millis(self.cfg.entry_ttl);
        let mut pipe = redis::pipe();
        for event in events {
            match *event {
                IndexEvent::Stored { ns, key, tier } => {
                    let name = block_key(prefix, ns, key);
                    pipe.cmd("HSET")
                        .arg(&name)
                        .arg(me)
                        .arg(entry_value(tier, epoch))
                        .ignore();
                    pipe.cmd("PEXPIRE").arg(&name).arg(ttl).ignore();
                }
                IndexEvent::Removed { ns, key } => {
                    pipe.cmd("HDEL")
                        .arg(block_key(prefix, ns, key))
                        .arg(me)
                        .ignore();
                }
            }
        }
        self.query(&pipe).await.map(drop)
    }

    /// Renews this instance's lease in each of `namespaces` under `epoch` (deadline: the server's clock
    /// plus `lease`) and drops leases that lapsed more than an `entry_ttl` ago. Two round trips.
    pub async fn renew(&self, namespaces: &[NamespaceId], epoch: u64) -> Result<(), IndexError> {
        let now = self.server_time_ms().await?;
        let deadline = now + millis(self.cfg.lease);
        let mut pipe = redis::pipe();
        for &ns in namespaces {
            pipe.cmd("HSET")
                .arg(leases_key(&self.cfg.prefix, ns))
                .arg(&self.cfg.instance)
                .arg(lease_value(deadline, epoch))
                .ignore();
            pipe.cmd("HGETALL").arg(leases_key(&self.cfg.prefix, ns));
        }
        let answers = self.query(&pipe).await?;
        let forgotten = now.saturating_sub(millis(self.cfg.entry_ttl));
        let mut prune = redis::pipe();
        let mut pruned = 0;
        for (&ns, leases) in namespaces.iter().zip(answers) {
            let leases: Pairs = parse(leases)?;
            let live = live_leases(&leases, forgotten);
            for (field, _) in &leases {
                if !live.contains_key(String::from_utf8_lossy(field).as_ref()) {
                    prune
                        .cmd("HDEL")
                        .arg(leases_key(&self.cfg.prefix, ns))
                        .arg(field)
                        .ignore();
                    pruned += 1;
                }
            }
        }
        if pruned == 0 {
            return Ok(());
        }
        self.query(&prune).await.map(drop)
    }

    /// Ends this instance's lease in `namespaces` at once: lookups stop returning its entries.
    pub async fn leave(&self, namespaces: &[NamespaceId]) -> Result<(), IndexError> {
        let mut pipe = redis::pipe();
        for &ns in namespaces {
            pipe.cmd("HDEL")
                .arg(leases_key(&self.cfg.prefix, ns))
                .arg(&self.cfg.instance)
                .ignore();
        }
        self.query(&pipe).await.map(drop)
    }

    /// The Redis server's clock, in milliseconds since the Unix epoch (leases and epochs use it, so
    /// instances' clocks need not agree).
    pub async fn server_time_ms(&self) -> Result<u64, IndexError> {
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        let answer = self.query(&pipe).await?.into_iter().next();
        Ok(server_ms(parse(answer.unwrap_or(Value::Nil))?))
    }

    /// A number the Redis server reports in `INFO <section>`, e.g. `("memory", "used_memory")` (bytes
    /// it uses) or `("stats", "total_commands_processed")`.
    pub async fn server_figure(&self, section: &str, field: &str) -> Result<u64, IndexError> {
        let mut pipe = redis::pipe();
        pipe.cmd("INFO").arg(section);
        let answer = self.query(&pipe).await?.into_iter().next();
        let text: String = parse(answer.unwrap_or(Value::Nil))?;
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| answer_error("INFO has no such figure"))
    }

    /// Removes every entry and lease of namespace `ns` (after a weight update, or between runs), by
    /// `SCAN` and `UNLINK` in batches; returns the keys removed. On a Redis Cluster, run it against each
    /// primary. Not atomic: instances still publishing there re-add their entries.
    pub async fn drop_namespace(&self, ns: NamespaceId) -> Result<u64, IndexError> {
        let pattern = format!("{}:b:{:016x}*", self.cfg.prefix, ns.0);
        let mut cursor = 0u64;
        let mut removed = 0u64;
        loop {
            let mut pipe = redis::pipe();
            pipe.cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let answer = self.query(&pipe).await?.into_iter().next();
            let (next, keys): (u64, Vec<Vec<u8>>) = parse(answer.unwrap_or(Value::Nil))?;
            if !keys.is_empty() {
                let mut unlink = redis::pipe();
                unlink.cmd("UNLINK").arg(&keys).ignore();
                self.query(&unlink).await?;
                removed += keys.len() as u64;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut pipe = redis::pipe();
        pipe.cmd("UNLINK").arg(leases_key(&self.cfg.prefix, ns));
        let answer = self.query(&pipe).await?.into_iter().next();
        Ok(removed + parse::<u64>(answer.unwrap_or(Value::Nil))?)
    }

    /// Removes entries a lookup found stale, in the background (best effort: a failure leaves them to
    /// expire).
    fn remove_stale(&self, ns: NamespaceId, keys: &[BlockKey], stale: &[StaleEntry]) {
        let mut pipe = redis::pipe();
        for entry in stale {
            pipe.cmd("EVAL")
                .arg(REMOVE_IF_UNCHANGED)
                .arg(1)
                .arg(block_key(&self.cfg.prefix, ns, keys[entry.block]))
                .arg(&entry.instance)
                .arg(&entry.value)
                .ignore();
        }
        let Ok(guard) = self.con.try_lock() else {
            return;
        };
        let Some(mut con) = guard.clone() else {
            return;
        };
        let limit = self.cfg.timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(limit, pipe.query_async::<()>(&mut con)).await;
        });
    }

    /// Runs `pipe` on the connection (opened if there is none), within the timeout.
    /// Runs `pipe`, within `timeout` in all. A connection found dropped (Redis restarted since the last
    /// call) is replaced and the pipeline sent once more: every pipeline here may run twice (writes set
    /// values, they add nothing), and the first call after a restart should not be lost.
    async fn query(&self, pipe: &Pipeline) -> Result<Vec<Value>, IndexError> {
        let mut con = self.connection().await?;
        let call = async {
            match pipe.query_async::<Vec<Value>>(&mut con).await {
                Err(e) if e.is_connection_dropped() => pipe.query_async(&mut con).await,
                answer => answer,
            }
        };
        within(self.cfg.timeout, call).await
    }

    async fn connection(&self) -> Result<ConnectionManager, IndexError> {
        let mut guard = self.con.lock().await;
        if let Some(con) = guard.as_ref() {
            return Ok(con.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.cfg.connect_timeout))
            .set_response_timeout(Some(self.cfg.timeout))
            .set_number_of_retries(1)
            .set_max_delay(self.cfg.connect_timeout);
        let con = within(
            self.cfg.connect_timeout,
            self.client.get_connection_manager_with_config(config),
        )
        .await?;
        *guard = Some(con.clone());
        Ok(con)
    }
}

async fn within<T>(
    limit: std::time::Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, IndexError> {
    match tokio::time::timeout(limit, call).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(IndexError::Timeout(limit)),
    }
}

fn parse<T: FromRedisValue>(value: Value) -> Result<T, IndexError> {
    redis::from_redis_value(value).map_err(|e| IndexError::Redis(e.into()))
}

fn answer_error(what: &'static str) -> IndexError {
    IndexError::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        what,
    )))
}

fn server_ms((secs, micros): (u64, u64)) -> u64 {
    secs * 1_000 + micros / 1_000
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
