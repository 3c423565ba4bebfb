//! What the store tells a serving engine's KV-event stream (vLLM's `BlockStored` / `BlockRemoved`, which
//! its publisher carries to KV-aware routers such as llm-d's and Dynamo's): each block entering or
//! leaving host memory or disk, per medium, with the block's tokens and parent as the save that made it
//! described them ([`TierStore::describe_saves`]). Off until [`TierStore::keep_kv_events`]; while on,
//! the engine drains it every step ([`TierStore::take_kv_events`]), and at most [`PENDING_EVENTS`] wait:
//! beyond that the oldest are dropped and counted.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::TierStore;
use crate::keys::{BlockHash, ScopedKey};

/// Events kept for the engine between two drains, at most.
pub const PENDING_EVENTS: usize = 1 << 16;

/// Where a block is held: vLLM's event "medium".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    /// The store's host memory (vLLM's `"CPU"`).
    Host,
    /// The disk tier (vLLM's `"STORAGE"`).
    Disk,
}

impl Medium {
    /// The name vLLM's events give the medium.
    #[must_use]
    pub fn vllm_name(self) -> &'static str {
        match self {
            Medium::Host => "CPU",
            Medium::Disk => "STORAGE",
        }
    }
}

/// A block as the serving engine knows it: its own hash of the block (when it is not the store's key),
/// the block before it and its tokens (empty when unknown, as for a block recovered from disk after a
/// restart).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockOrigin {
    /// The engine's hash of the block (`None`: the key's hash is the engine's).
    pub hash: Option<BlockHash>,
    /// The previous block's hash, as the engine knows it (`None` for a prompt's first block, or unknown).
    pub parent: Option<BlockHash>,
    /// The block's tokens.
    pub tokens: Arc<[u32]>,
}

/// One change of what the store holds, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// `key` is now loadable from `medium`.
    Stored {
        /// The block.
        key: ScopedKey,
        /// Its hash as the engine knows it.
        hash: BlockHash,
        /// Where.
        medium: Medium,
        /// Its parent and tokens.
        origin: BlockOrigin,
    },
    /// `key` left `medium`.
    Removed {
        /// The block.
        key: ScopedKey,
        /// Its hash as the engine knows it.
        hash: BlockHash,
        /// Where from.
        medium: Medium,
    },
}

#[derive(Debug, Clone, Default)]
struct Held {
    host: bool,
    disk: bool,
    origin: BlockOrigin,
}

/// The pending events and what each held block was last reported as (bounded by the store's blocks).
#[derive(Debug, Default)]
pub(super) struct KvEventLog {
    on: bool,
    pending: VecDeque<KvEvent>,
    dropped: u64,
    held: HashMap<ScopedKey, Held>,
    /// Origins of blocks being saved this step, until they are stored (or the step ends).
    described: HashMap<ScopedKey, BlockOrigin>,
}

impl KvEventLog {
    fn push(&mut self, event: KvEvent) {
        if self.pending.len() == PENDING_EVENTS {
            self.pending.pop_front();
            self.dropped += 1;
        }
        self.pending.push_back(event);
    }

    /// `key` is now held in host memory (`host`) and on disk (`disk`): events for what changed, stores
    /// before removals (a block moving down is never reported nowhere).
    fn observe(&mut self, key: &ScopedKey, host: bool, disk: bool) {
        if !self.on {
            return;
        }
        let was = self.held.get(key).cloned().unwrap_or_default();
        if (was.host, was.disk) == (host, disk) {
            return;
        }
        let origin = if was.host || was.disk {
            was.origin
        } else {
            self.described.remove(key).unwrap_or_default()
        };
        let hash = origin.hash.unwrap_or(key.hash);
        let media = [
            (Medium::Host, host, was.host),
            (Medium::Disk, disk, was.disk),
        ];
        for (medium, now, before) in media {
            if now && !before {
                self.push(KvEvent::Stored {
                    key: *key,
                    hash,
                    medium,
                    origin: origin.clone(),
                });
            }
        }
        for (medium, now, before) in media {
            if before && !now {
                self.push(KvEvent::Removed {
                    key: *key,
                    hash,
                    medium,
                });
            }
        }
        if host || disk {
            self.held.insert(*key, Held { host, disk, origin });
        } else {
            self.held.remove(key);
        }
    }
}

impl TierStore {
    /// Keeps KV events from now on. Blocks already held (recovered from disk) are reported at once,
    /// without tokens or parent.
    pub fn keep_kv_events(&mut self) {
        if self.events.on {
            return;
        }
        self.events.on = true;
        let held: Vec<ScopedKey> = self.by_tier.values().copied().collect();
        for key in held {
            self.announce_event(&key);
        }
    }

    /// Tells the KV-event log where `key` is held now.
    pub(super) fn announce_event(&mut self, key: &ScopedKey) {
        if !self.events.on {
            return;
        }
        let (host, disk) = (self.whole_in_host(key), self.disk_holds(key));
        self.events.observe(key, host, disk);
    }

    /// Whether KV events are kept.
    #[must_use]
    pub fn keeps_kv_events(&self) -> bool {
        self.events.on
    }

    /// The origins of blocks about to be saved (a [`crate::BlockSpec`]'s): `keys[i]` holds
    /// `tokens[i * block..][..block]`, the engine knows it as `engine_hashes[i]` (empty: as its key),
    /// its parent is the block before (`parent` for the first). Their events carry them. `tokens`
    /// shorter than the keys need: the blocks it does not cover are reported without tokens.
    pub fn describe_saves(
        &mut self,
        keys: &[ScopedKey],
        engine_hashes: &[BlockHash],
        parent: Option<BlockHash>,
        tokens: &[u32],
        block: usize,
    ) {
        if !self.events.on {
            return;
        }
        let mut parent = parent;
        for (i, key) in keys.iter().enumerate() {
            let hash = engine_hashes.get(i).copied();
            let toks = tokens
                .get(i * block..(i + 1) * block)
                .map_or_else(|| Arc::from(Vec::new()), Arc::from);
            if !self.events.held.contains_key(key) {
                self.events.described.insert(
                    *key,
                    BlockOrigin {
                        hash,
                        parent,
                        tokens: toks,
                    },
                );
            }
            parent = Some(hash.unwrap_or(key.hash));
        }
    }

    /// Forgets the origins of saves that did not complete (called at the end of each step).
    pub fn end_described_saves(&mut self) {
        self.events.described.clear();
    }

    /// The events since the last call, oldest first.
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.events.pending.drain(..).collect()
    }

    /// Events dropped because the engine did not drain them in time (more than [`PENDING_EVENTS`]).
    #[must_use]
    pub fn kv_events_dropped(&self) -> u64 {
        self.events.dropped
    }
}
