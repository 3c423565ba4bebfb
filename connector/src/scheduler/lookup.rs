//! The scheduler half's lookups: a prompt's keys, hashed once, asked of every candidate producer at once
//! in the background, each given `lookup_timeout` to answer. The serving engine's call returns at once
//! (`None` while the lookup runs), so its scheduler thread never waits on the network.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::error::ConnectorError;
use crate::keys::ScopedKey;
use crate::producer::lock;
use crate::producers::Producers;
use crate::request::KvTransferParams;
use crate::tp::RankKv;

/// A producer a lookup asks.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// Its control address.
    pub(crate) addr: SocketAddr,
    /// What a load from it names (`None` for this instance's own store).
    pub(crate) producer: Option<KvTransferParams>,
    /// This instance's own workers: their store is a lower tier, asked for whole blocks only, and
    /// preferred when it holds at least as much as any other.
    pub(crate) own: bool,
}

/// What a lookup found for one request.
#[derive(Debug)]
pub(crate) struct Found {
    /// The request's keys, every full block.
    pub(crate) keys: Arc<Vec<ScopedKey>>,
    /// Leading blocks the chosen producer holds.
    pub(crate) matched: usize,
    /// Of those, how many only the chosen producer's disk tier holds.
    pub(crate) disk: usize,
    /// The chosen producer is this instance's own store.
    pub(crate) local: bool,
    /// The chosen producer (`None`: none, or this instance's own store).
    pub(crate) producer: Option<KvTransferParams>,
    /// Why candidates did not answer.
    pub(crate) errors: Vec<ConnectorError>,
}

impl Found {
    /// Nothing found, nobody asked.
    pub(crate) fn nothing(keys: Arc<Vec<ScopedKey>>) -> Found {
        Found {
            keys,
            matched: 0,
            disk: 0,
            local: false,
            producer: None,
            errors: Vec::new(),
        }
    }
}

enum Entry {
    Running(u64),
    Done(Found),
}

/// What a request's lookup is now, as [`Lookups::take`] says.
pub(crate) enum Taken {
    /// None was started (or it was forgotten).
    Unknown,
    /// It runs.
    Running,
    /// It is over: here is what it found (taken from the table).
    Done(Found),
}

/// The lookups of one scheduler, by request id.
#[derive(Default)]
pub(crate) struct Lookups {
    entries: Mutex<(HashMap<String, Entry>, u64)>,
    finished: Condvar,
}

impl std::fmt::Debug for Lookups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookups")
            .field("requests", &lock(&self.entries).0.len())
            .finish()
    }
}

impl Lookups {
    /// Takes `request`'s finished lookup, or says it runs or is unknown.
    pub(crate) fn take(&self, request: &str) -> Taken {
        let mut guard = lock(&self.entries);
        match guard.0.remove(request) {
            None => Taken::Unknown,
            Some(Entry::Done(found)) => Taken::Done(found),
            Some(running) => {
                guard.0.insert(request.to_owned(), running);
                Taken::Running
            }
        }
    }

    /// Marks `request`'s lookup as running; returns its generation, for [`Lookups::finish`].
    pub(crate) fn start(&self, request: &str) -> u64 {
        let mut guard = lock(&self.entries);
        guard.1 += 1;
        let generation = guard.1;
        guard
            .0
            .insert(request.to_owned(), Entry::Running(generation));
        generation
    }

    /// Records what lookup `generation` of `request` found, unless the request was forgotten (or looked
    /// up afresh) meanwhile.
    pub(crate) fn finish(&self, request: &str, generation: u64, found: Found) {
        let mut guard = lock(&self.entries);
        if let Some(entry) = guard.0.get_mut(request)
            && matches!(entry, Entry::Running(g) if *g == generation)
        {
            *entry = Entry::Done(found);
            self.finished.notify_all();
        }
    }

    /// Whether `request`'s lookup runs (a cheap question for a caller asking every step).
    pub(crate) fn running(&self, request: &str) -> bool {
        matches!(lock(&self.entries).0.get(request), Some(Entry::Running(_)))
    }

    /// Forgets `request`'s lookup (the request finished); a lookup still running is discarded when it
    /// ends.
    pub(crate) fn forget(&self, request: &str) {
        lock(&self.entries).0.remove(request);
    }

    /// Waits, at most `limit`, until one of the lookups running now ends (at once when none runs).
    pub(crate) fn wait_any(&self, limit: Duration) {
        let running = |entries: &HashMap<String, Entry>| {
            entries
                .values()
                .filter(|e| matches!(e, Entry::Running(_)))
                .count()
        };
        // Counted under the same lock the wait then holds, so no lookup ends unseen in between.
        let mut before = None;
        self.wait_while(limit, |entries| {
            let now = running(entries);
            let before = *before.get_or_insert(now);
            before > 0 && now >= before
        });
    }

    /// Waits, at most `limit`, until `request`'s lookup is no longer running.
    pub(crate) fn wait(&self, request: &str, limit: Duration) {
        self.wait_while(limit, |entries| {
            matches!(entries.get(request), Some(Entry::Running(_)))
        });
    }

    /// Waits, at most `limit`, while `waiting` holds of the table (checked again as each lookup ends).
    fn wait_while(
        &self,
        limit: Duration,
        mut waiting: impl FnMut(&HashMap<String, Entry>) -> bool,
    ) {
        let until = Instant::now() + limit;
        let mut guard = lock(&self.entries);
        while waiting(&guard.0) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            guard = self
                .finished
                .wait_timeout(guard, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

/// Asks every candidate at once how many leading blocks of `keys[..usable]` it holds, each for at most
/// `deadline`, and chooses the one holding the most (this instance's own store on a tie, then the earlier
/// candidate); the first to hold all of them ends the lookup.
pub(crate) async fn ask(
    producers: Arc<Producers>,
    candidates: Vec<Candidate>,
    keys: Arc<Vec<ScopedKey>>,
    usable: usize,
    tp: RankKv,
    deadline: Duration,
) -> Found {
    let mut asks = JoinSet::new();
    for (i, c) in candidates.iter().enumerate() {
        let (client, keys, own) = (producers.client(c.addr), keys.clone(), c.own);
        asks.spawn(async move {
            let answer =
                tokio::time::timeout(deadline, client.lookup(&keys[..usable], tp, own)).await;
            (i, answer)
        });
    }
    let mut held = vec![(0, 0); candidates.len()];
    let mut errors = Vec::new();
    // Asked, this instance's own store is preferred on a tie: until it has answered, only it can end
    // the lookup early.
    let mut own_pending = candidates.iter().any(|c| c.own);
    while let Some(joined) = asks.join_next().await {
        let Ok((i, answer)) = joined else { continue };
        if candidates[i].own {
            own_pending = false;
        }
        match answer {
            Ok(Ok(blocks)) => {
                held[i] = blocks;
                // Nobody can hold more than every usable block: the others' answers are not waited
                // for (they finish in the background, their connections kept), so a slow peer costs
                // nothing when a quick one holds the whole prompt.
                if blocks.0 >= usable && (candidates[i].own || !own_pending) {
                    asks.detach_all();
                    break;
                }
            }
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push(ConnectorError::Control {
                peer: candidates[i].addr.to_string(),
                message: format!("no answer to a lookup within {deadline:?}"),
            }),
        }
    }
    let best = (0..candidates.len())
        .filter(|&i| held[i].0 > 0)
        .max_by_key(|&i| (held[i].0, candidates[i].own, std::cmp::Reverse(i)));
    match best {
        Some(i) => Found {
            keys,
            matched: held[i].0,
            disk: held[i].1,
            local: candidates[i].own,
            producer: candidates[i].producer.clone(),
            errors,
        },
        None => Found {
            errors,
            ..Found::nothing(keys)
        },
    }
}
