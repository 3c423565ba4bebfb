//! The local tier store: blocks a producer saved, kept in host memory under the policy crate's
//! [`TierManager`] and served to consumers by key.
//!
//! The store is one KV region of `capacity` slots (`layers x capacity x block_bytes`, registered with the
//! transport so loads read straight from it). A block takes a slot when its layer 0 is saved; its layers
//! arrive in order. A block stored whole can be served at once; a block being saved can be served to a
//! load that streams its layers as they are saved ([`TierStore::pin_streaming`]), and one whose save ended
//! early is abandoned ([`TierStore::abandon_partial`]). The tier manager ranks blocks by heat (decayed
//! frequency, sharing degree, recency) and evicts chain tails before their parents; a block it evicts
//! while a load reads it keeps its slot until that load ends, but is never served again. A lookup walks a
//! request's keys and stops at the first block that is missing (or, for [`TierStore::lookup`], not whole).
//! A held block ([`TierStore::hold`]: saved for a decode that has not loaded it yet) may move to disk but
//! is dropped only when nothing else can be, until a load releases it or its deadline passes.

use std::collections::HashMap;
use std::time::Duration;

use policy::{NamespaceId, TierCapacities, TierConfig, TierManager};
use transfer_engine::policy::{BlockKey, Tier, TierPolicy};
use transfer_engine::{BlockId, KvLayout, MemoryRegion};

use crate::copier::BlockCopier;
use crate::disk::DiskTier;
use crate::error::ConnectorError;
use crate::keys::ScopedKey;

#[derive(Debug, Clone, Copy)]
struct Entry {
    slot: u32,
    /// Layers saved so far (layers arrive in order).
    layers: u32,
    /// Loads reading the slot now.
    pins: u32,
}

/// What one layer's save did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SaveReport {
    /// Blocks whose layer was copied in.
    pub copied: usize,
    /// Blocks that became loadable (their last layer arrived).
    pub completed: usize,
    /// Blocks already stored whole (a shared prefix): nothing to copy.
    pub already_stored: usize,
    /// Blocks that could not be stored (no free slot, or an earlier layer was missed).
    pub dropped: usize,
}

/// Where a save reads from: blocks of the caller's KV caches.
#[derive(Debug, Clone, Copy)]
pub struct SourceBlocks<'a> {
    /// The KV caches' memory.
    pub memory: &'a MemoryRegion,
    /// Their layout.
    pub layout: &'a KvLayout,
    /// The blocks to save, paired with the keys.
    pub blocks: &'a [u32],
}

/// Host-memory blocks under a tier manager. See the module docs.
#[derive(Debug)]
pub struct TierStore {
    layout: KvLayout,
    memory: MemoryRegion,
    index: HashMap<ScopedKey, Entry>,
    /// The full key behind each tier-manager key.
    by_tier: HashMap<BlockKey, ScopedKey>,
    /// Slots of evicted blocks still being read, with their pins.
    zombies: HashMap<u32, u32>,
    free: Vec<u32>,
    /// The stored block each slot holds (`None` when free or held by an evicted block).
    owners: Vec<Option<ScopedKey>>,
    tiers: TierManager,
    peak_used: usize,
    copier: BlockCopier,
    /// The tier below host memory, if any ([`TierStore::with_disk`]).
    disk: Option<DiskTier>,
    disk_stats: DiskTierStats,
    holds: hold::Holds,
    announcer: announce::Announcer,
    events: events::KvEventLog,
}

impl TierStore {
    /// A store of `layout.blocks_per_layer` slots over zeroed host memory (allocated zeroed, so the
    /// operating system maps its pages on first touch: a large store does not stall start-up), ranked by
    /// plain heat order (see [`TierStore::with_memory`]).
    pub fn new(layout: KvLayout) -> Result<TierStore, ConnectorError> {
        let bytes = usize::try_from(layout.total_bytes())
            .map_err(|_| ConnectorError::Config("the store does not fit in memory".into()))?;
        Self::with_memory(layout, MemoryRegion::zeroed(bytes), false)
    }

    /// A store over the caller's `memory` (at least `layout.total_bytes()` long). With `segments`, the
    /// tier manager splits the store ARC-style into blocks one request used and blocks several used, and
    /// evicts from the first while it is over its learned share: better reuse of shared prefixes, but a
    /// block just saved can be evicted before any consumer loaded it (measured in `te-bench pd`: 6.5% of
    /// saved blocks dropped at once). Without, plain heat order keeps the newest blocks until colder ones
    /// are gone, which is what prefill-to-decode hand-off needs.
    pub fn with_memory(
        layout: KvLayout,
        memory: MemoryRegion,
        segments: bool,
    ) -> Result<TierStore, ConnectorError> {
        if (memory.len() as u64) < layout.total_bytes() {
            return Err(ConnectorError::Config(format!(
                "store memory of {} bytes is smaller than its layout ({} bytes)",
                memory.len(),
                layout.total_bytes()
            )));
        }
        let capacity = layout.blocks_per_layer as usize;
        let mut cfg = TierConfig::new(TierCapacities {
            gpu: 0,
            host: capacity,
            remote: 0,
        });
        cfg.adaptive_segments = segments;
        let tiers = TierManager::new(cfg)?;
        Ok(TierStore {
            layout,
            memory,
            index: HashMap::new(),
            by_tier: HashMap::new(),
            zombies: HashMap::new(),
            free: (0..layout.blocks_per_layer).rev().collect(),
            owners: vec![None; capacity],
            tiers,
            peak_used: 0,
            copier: BlockCopier::default(),
            disk: None,
            disk_stats: DiskTierStats::default(),
            holds: hold::Holds::default(),
            announcer: announce::Announcer::default(),
            events: events::KvEventLog::default(),
        })
    }

    /// The store's layout (its slots are the blocks).
    #[must_use]
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// The memory behind the slots.
    #[must_use]
    pub fn memory(&self) -> &MemoryRegion {
        &self.memory
    }

    /// Copies `len` bytes at `from` of the store's memory to `to` of `dst` (the KV caches, host or GPU).
    pub fn copy_out(
        &self,
        from: usize,
        dst: &MemoryRegion,
        to: usize,
        len: usize,
    ) -> Result<(), ConnectorError> {
        self.copier.copy(&self.memory, from, dst, to, len)
    }

    /// Slots in use now (stored blocks, whole or partial, and evicted ones still being read).
    #[must_use]
    pub fn used(&self) -> usize {
        self.layout.blocks_per_layer as usize - self.free.len()
    }

    /// The most slots ever in use at once.
    #[must_use]
    pub fn peak_used(&self) -> usize {
        self.peak_used
    }

    /// Blocks the tier manager holds in host memory.
    #[must_use]
    pub fn resident(&self) -> usize {
        self.tiers.len(Tier::Host)
    }

    /// Whether `key` is stored whole, in host memory or on disk.
    #[must_use]
    pub fn contains(&self, key: &ScopedKey) -> bool {
        match self.index.get(key) {
            Some(e) => e.layers == self.layout.layers,
            None => self.disk_holds(key),
        }
    }

    /// How many leading keys are stored whole: the walk stops at the first missing or partial block.
    #[must_use]
    pub fn lookup(&self, keys: &[ScopedKey]) -> usize {
        keys.iter().take_while(|k| self.contains(k)).count()
    }

    /// How many leading keys are stored whole or being saved now: what a streaming load can carry.
    #[must_use]
    pub fn lookup_streaming(&self, keys: &[ScopedKey]) -> usize {
        keys.iter()
            .take_while(|k| self.index.contains_key(k) || self.disk_holds(k))
            .count()
    }

    /// How many of `keys` only the disk tier holds (their bytes are not in host memory): of a lookup's
    /// prefix, the blocks a load reads back from disk.
    #[must_use]
    pub fn disk_only(&self, keys: &[ScopedKey]) -> usize {
        keys.iter()
            .filter(|k| !self.index.contains_key(k) && self.disk_holds(k))
            .count()
    }

    /// The layers saved of every block of `keys`, each in the slot paired with it in `slots` (the fewest of
    /// them), or `None` when one of them is no longer stored in that slot (abandoned, evicted, or stored
    /// anew elsewhere): a load of those slots can never complete.
    #[must_use]
    pub fn layers_saved(&self, keys: &[ScopedKey], slots: &[u32]) -> Option<u32> {
        if keys.len() != slots.len() {
            return None;
        }
        keys.iter()
            .zip(slots)
            .map(|(k, &slot)| {
                self.index
                    .get(k)
                    .filter(|e| e.slot == slot)
                    .map(|e| e.layers)
            })
            .try_fold(self.layout.layers, |least, l| Some(least.min(l?)))
    }

    /// Gives up the blocks of `keys` that are not stored whole (their save ended before the last layer):
    /// they are never served again, and their slots free once no load reads them. Returns how many.
    pub fn abandon_partial(&mut self, keys: &[ScopedKey]) -> usize {
        let partial: Vec<ScopedKey> = keys
            .iter()
            .filter(|k| {
                self.index
                    .get(k)
                    .is_some_and(|e| e.layers < self.layout.layers)
            })
            .copied()
            .collect();
        for key in &partial {
            self.release(key);
        }
        partial.len()
    }

    /// Takes `key` out of the index; its slot is free at once, or when its last load ends.
    fn release(&mut self, key: &ScopedKey) {
        if let Some(e) = self.index.remove(key) {
            self.owners[e.slot as usize] = None;
            if e.pins == 0 {
                self.free.push(e.slot);
            } else {
                self.zombies.insert(e.slot, e.pins);
            }
            if e.layers == self.layout.layers {
                self.announce(key);
            }
        }
    }

    /// Saves layer `layer` of blocks `keys`, read from `src` (the caller's KV caches), for request
    /// `request` at time `now`. Layer 0 claims slots (the tier manager
    /// may evict cold chain tails to make room); later layers fill the slots their block already holds.
    pub fn save_layer(
        &mut self,
        keys: &[ScopedKey],
        src: SourceBlocks<'_>,
        layer: u32,
        request: u64,
        now: Duration,
    ) -> Result<SaveReport, ConnectorError> {
        let SourceBlocks {
            memory: src,
            layout: src_layout,
            blocks: src_blocks,
        } = src;
        if keys.len() != src_blocks.len() {
            return Err(ConnectorError::Blocks(format!(
                "{} keys but {} blocks",
                keys.len(),
                src_blocks.len()
            )));
        }
        if layer >= self.layout.layers || src_layout.block_bytes != self.layout.block_bytes {
            return Err(ConnectorError::Blocks(format!(
                "layer {layer} of {}-byte blocks does not fit the store ({} layers of {}-byte blocks)",
                src_layout.block_bytes, self.layout.layers, self.layout.block_bytes
            )));
        }
        let mut report = SaveReport::default();
        let mut parent: Option<ScopedKey> = None;
        for (key, &block) in keys.iter().zip(src_blocks) {
            let src_id = BlockId::new(layer, block);
            if !src_layout.contains(src_id) {
                return Err(ConnectorError::Blocks(format!(
                    "block {block} of layer {layer} is outside the KV caches"
                )));
            }
            let entry = self.index.get(key).copied();
            let entry = match entry {
                None if self.disk_holds(key) => {
                    report.already_stored += 1; // on disk
                    parent = Some(*key);
                    continue;
                }
                Some(e) if e.layers == self.layout.layers => {
                    report.already_stored += 1;
                    parent = Some(*key);
                    continue;
                }
                Some(e) if e.layers == layer => e,
                Some(_) => {
                    report.dropped += 1;
                    parent = Some(*key);
                    continue;
                }
                None if layer == 0 => match self.claim(*key, parent, request, now) {
                    Some(e) => e,
                    None => {
                        report.dropped += 1;
                        parent = Some(*key);
                        continue;
                    }
                },
                None => {
                    report.dropped += 1;
                    parent = Some(*key);
                    continue;
                }
            };
            let to = BlockId::new(layer, entry.slot);
            for (at, into, len) in src_layout.copies_to(src_id, &self.layout, to) {
                self.copier
                    .copy(src, at as usize, &self.memory, into as usize, len as usize)?;
            }
            let e = self.index.get_mut(key).expect("claimed above");
            e.layers += 1;
            report.copied += 1;
            if e.layers == self.layout.layers {
                report.completed += 1;
                self.announce(key);
            }
            parent = Some(*key);
        }
        Ok(report)
    }

    /// Gives `key` a slot and a place in the tier manager, evicting if needed.
    fn claim(
        &mut self,
        key: ScopedKey,
        parent: Option<ScopedKey>,
        request: u64,
        now: Duration,
    ) -> Option<Entry> {
        self.expire_holds(now);
        let tier_key = key.tier_key();
        if self.by_tier.get(&tier_key).is_some_and(|k| *k != key) {
            return None; // a 64-bit collision with another stored block: not stored
        }
        let moves = self
            .tiers
            .insert(key.ns, tier_key, parent.map(|p| p.tier_key()), request, now);
        self.by_tier.insert(tier_key, key);
        self.apply_moves(moves);
        if !self.by_tier.contains_key(&tier_key) {
            return None; // the manager evicted the newcomer itself
        }
        // Placed below host memory at once (a chain longer than the store), or no slot is free (evicted
        // blocks still being read hold them): its bytes have nowhere to go yet, so it is not stored.
        let on_host = matches!(self.tiers.tier_of(tier_key), Some(Tier::Host | Tier::Gpu));
        let Some(slot) = self.free.pop().filter(|_| on_host) else {
            let forget = self.tiers.remove(tier_key);
            self.apply_moves(forget);
            return None;
        };
        let e = Entry {
            slot,
            layers: 0,
            pins: 0,
        };
        self.index.insert(key, e);
        self.owners[slot as usize] = Some(key);
        self.peak_used = self.peak_used.max(self.used());
        Some(e)
    }

    /// Pins the leading stored blocks of `keys` for a load and returns their slots (as many as are stored
    /// whole, in order), recording the use with the tier manager.
    pub fn pin(&mut self, keys: &[ScopedKey], request: u64, now: Duration) -> Vec<u32> {
        let n = self.lookup(keys);
        self.pin_leading(&keys[..n], request, now)
    }

    /// [`TierStore::pin`] for a load that streams layers as they are saved: blocks being saved are pinned
    /// too (see [`TierStore::layers_saved`] for how far each is).
    pub fn pin_streaming(&mut self, keys: &[ScopedKey], request: u64, now: Duration) -> Vec<u32> {
        let n = self.lookup_streaming(keys);
        self.pin_leading(&keys[..n], request, now)
    }

    fn pin_leading(&mut self, keys: &[ScopedKey], request: u64, now: Duration) -> Vec<u32> {
        // Every use at once, none of them making room for another (a prompt coming back from disk
        // does not push its own head out), then their moves at once: blocks on disk are read back into
        // host slots together, several reads in flight.
        let tier_keys: Vec<BlockKey> = keys.iter().map(ScopedKey::tier_key).collect();
        let moves = self.tiers.access_together(&tier_keys, request, now);
        self.apply_moves(moves);
        let mut slots = Vec::with_capacity(keys.len());
        for key in keys {
            let Some(e) = self.index.get_mut(key) else {
                break;
            };
            e.pins += 1;
            slots.push(e.slot);
        }
        slots
    }

    /// Ends a load's hold on `slots`.
    pub fn unpin(&mut self, slots: &[u32]) {
        for &slot in slots {
            if let Some(p) = self.zombies.get_mut(&slot) {
                *p -= 1;
                if *p == 0 {
                    self.zombies.remove(&slot);
                    self.free.push(slot);
                }
                continue;
            }
            if let Some(key) = self.owners.get(slot as usize).copied().flatten()
                && let Some(e) = self.index.get_mut(&key)
            {
                e.pins = e.pins.saturating_sub(1);
            }
        }
    }

    /// Drops every block of namespace `ns` (after a weight update): none is served again.
    pub fn drop_namespace(&mut self, ns: NamespaceId) -> usize {
        let moves = self.tiers.drop_namespace(ns);
        let n = moves.len();
        self.apply_moves(moves);
        // Partial blocks the manager may not list are dropped too.
        let stale: Vec<ScopedKey> = self.index.keys().filter(|k| k.ns == ns).copied().collect();
        for key in stale {
            self.by_tier.remove(&key.tier_key());
            self.release(&key);
        }
        if let Some(d) = &self.disk
            && d.drop_namespace(ns).is_err()
        {
            // Its blocks are gone from the index; a reopened disk could bring them back (of weights no
            // longer served, so no lookup finds them).
            self.disk_stats.manifest_errors += 1;
        }
        n
    }
}

mod announce;
mod disk;
#[cfg(test)]
mod disk_tests;
mod events;
mod hold;
#[cfg(test)]
mod tests;

pub use disk::DiskTierStats;
pub use events::{BlockOrigin, KvEvent, Medium, PENDING_EVENTS};
