//! The tier store's disk tier: host victims the tier manager admits below are written to a
//! [`DiskTier`]; a use of a block on disk reads it back into a host slot (where loads read it), and it
//! leaves the disk. The tier manager ranks both tiers (chain tails before their parents) and decides
//! every move; this module carries them out.

use std::collections::{HashMap, HashSet};

use policy::{TierCapacities, TierManager};
use transfer_engine::BlockId;
use transfer_engine::policy::{BlockKey, Tier, TierMove};

use super::{Entry, TierStore};
use crate::disk::{BlockFormat, DiskStats, DiskTier, Got, Put};
use crate::error::ConnectorError;
use crate::keys::ScopedKey;

/// Byte ranges of a host slot, in a block's byte order.
type Pieces = Vec<(usize, usize)>;

/// What the store's disk tier did since the store opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskTierStats {
    /// Blocks demoted from host memory to disk.
    pub demoted: u64,
    /// Host victims admitted below that the disk could not take (queue full, no slot): dropped.
    pub demote_dropped: u64,
    /// Blocks read back from disk into host memory for a use.
    pub promoted: u64,
    /// Blocks on disk that could not be read back (damaged, an I/O error, no free host slot): dropped,
    /// with their chain below; the caller recomputes them.
    pub promote_failed: u64,
    /// Blocks recovered from disk when the store opened.
    pub recovered: u64,
    /// Dropped namespaces the disk could not record (its manifest write failed).
    pub manifest_errors: u64,
    /// Blocks the disk tier can hold.
    pub capacity_blocks: u32,
    /// The disk tier's own counters.
    pub disk: DiskStats,
}

impl TierStore {
    /// Puts `disk` below the store's host memory. The tier manager then holds the disk's capacity as its
    /// farther tier, admits host victims to it by `demote_min_sharers` (see
    /// [`policy::TierConfig::demote_min_sharers`]), and starts with every block the disk recovered.
    /// Only on an empty store, and the disk's block format must be the store's.
    pub fn with_disk(
        mut self,
        mut disk: DiskTier,
        demote_min_sharers: u32,
    ) -> Result<TierStore, ConnectorError> {
        let want = BlockFormat::of(&self.layout);
        if disk.format() != want {
            return Err(ConnectorError::Config(format!(
                "the disk tier holds blocks of {:?}, the store {want:?}",
                disk.format()
            )));
        }
        if !self.index.is_empty() {
            return Err(ConnectorError::Config(
                "a disk tier is added to an empty store".into(),
            ));
        }
        let mut cfg = *self.tiers.config();
        cfg.capacities = TierCapacities {
            gpu: 0,
            host: self.layout.blocks_per_layer as usize,
            remote: disk.capacity_blocks() as usize,
        };
        cfg.demote_min_sharers = demote_min_sharers;
        self.tiers = TierManager::new(cfg)?;
        // Parents before children, so the chains link; a block whose parent was not recovered starts a
        // chain of its own.
        let recovered = disk.take_recovered();
        let present: HashSet<ScopedKey> = recovered.iter().map(|(k, _)| *k).collect();
        let mut children: HashMap<ScopedKey, Vec<ScopedKey>> = HashMap::new();
        let mut next: Vec<(ScopedKey, Option<ScopedKey>)> = Vec::new();
        for (key, parent) in &recovered {
            match parent.filter(|p| present.contains(p) && p != key) {
                Some(p) => children.entry(p).or_default().push(*key),
                None => next.push((*key, None)),
            }
        }
        while let Some((key, parent)) = next.pop() {
            self.place_recovered(&disk, key, parent);
            let below = children.remove(&key).unwrap_or_default();
            next.extend(below.into_iter().map(|c| (c, Some(key))));
        }
        for key in children.into_values().flatten() {
            self.place_recovered(&disk, key, None); // a cycle of damaged links: no parent
        }
        self.disk_stats.recovered = self.by_tier.len() as u64;
        self.disk = Some(disk);
        Ok(self)
    }

    fn place_recovered(&mut self, disk: &DiskTier, key: ScopedKey, parent: Option<ScopedKey>) {
        let tier_key = key.tier_key();
        if self.by_tier.contains_key(&tier_key) {
            disk.remove(&key); // a 64-bit collision with another recovered block
            return;
        }
        let parent = parent.map(|p| p.tier_key());
        let moves = self.tiers.insert_at(
            Tier::Remote,
            key.ns,
            tier_key,
            parent,
            0,
            std::time::Duration::ZERO,
        );
        self.by_tier.insert(tier_key, key);
        self.apply_moves(moves);
        self.announce(&key);
    }

    /// The disk tier's counters (`None` without one).
    #[must_use]
    pub fn disk_stats(&self) -> Option<DiskTierStats> {
        let disk = self.disk.as_ref()?;
        Some(DiskTierStats {
            disk: disk.stats(),
            capacity_blocks: disk.capacity_blocks(),
            ..self.disk_stats
        })
    }

    /// Blocks the tier manager holds on disk.
    #[must_use]
    pub fn on_disk(&self) -> usize {
        self.tiers.len(Tier::Remote)
    }

    /// Whether the disk tier holds `key`.
    pub(super) fn disk_holds(&self, key: &ScopedKey) -> bool {
        self.disk.as_ref().is_some_and(|d| d.contains(key))
    }

    /// Carries out the tier manager's moves: a block whose last move takes it nowhere is released (from
    /// host memory or disk); one that ends on disk while its bytes are in host memory is demoted; one
    /// that ends in host memory while on disk is promoted. Leaving blocks go first, so their slots are
    /// free for arriving ones.
    pub(super) fn apply_moves(&mut self, moves: Vec<TierMove>) {
        let mut order: Vec<BlockKey> = Vec::new();
        let mut last: HashMap<BlockKey, Option<Tier>> = HashMap::new();
        for mv in moves {
            if last.insert(mv.key, mv.to).is_none() {
                order.push(mv.key);
            }
        }
        let mut lost: Vec<BlockKey> = Vec::new();
        for tk in &order {
            let Some(key) = self.by_tier.get(tk).copied() else {
                continue;
            };
            match last[tk] {
                None => {
                    self.by_tier.remove(tk);
                    self.release(&key);
                    if let Some(d) = &self.disk {
                        d.remove(&key);
                        self.announce(&key);
                    }
                }
                Some(Tier::Remote) if self.index.contains_key(&key) && !self.demote(key) => {
                    lost.push(*tk);
                }
                _ => {}
            }
        }
        let arriving: Vec<ScopedKey> = order
            .iter()
            .filter(|tk| matches!(last[*tk], Some(Tier::Host | Tier::Gpu)))
            .filter_map(|tk| self.by_tier.get(tk).copied())
            .filter(|key| !self.index.contains_key(key) && self.disk_holds(key))
            .collect();
        lost.extend(self.promote(&arriving).into_iter().map(|k| k.tier_key()));
        for tk in lost {
            // The manager thinks they are somewhere; they are not. Its moves only release.
            let forget = self.tiers.remove(tk);
            self.apply_moves(forget);
        }
    }

    /// Writes host block `key` to disk and frees its slot; false when the disk could not take it.
    fn demote(&mut self, key: ScopedKey) -> bool {
        let Some(e) = self.index.get(&key).copied() else {
            return false;
        };
        let whole = e.layers == self.layout.layers;
        let put = match (&self.disk, whole) {
            (Some(disk), true) => {
                let parent = self
                    .tiers
                    .parent_of(key.tier_key())
                    .and_then(|p| self.by_tier.get(&p))
                    .map(|p| p.hash);
                let pieces = self.pieces(e.slot);
                disk.put(key, parent, &self.memory, &pieces)
                    .unwrap_or(Put::NoSlot)
            }
            _ => Put::NoSlot, // a block still being saved (or no disk) cannot move down
        };
        self.release(&key);
        self.announce(&key);
        if put == Put::Queued {
            self.disk_stats.demoted += 1;
            true
        } else {
            self.disk_stats.demote_dropped += 1;
            false
        }
    }

    /// Reads disk blocks `keys` into free host slots, all at once; returns those it could not read
    /// (damaged, an I/O error, no free slot). Every one leaves the disk: a block lives in one tier.
    fn promote(&mut self, keys: &[ScopedKey]) -> Vec<ScopedKey> {
        let Some(disk) = &self.disk else {
            return keys.to_vec();
        };
        // Each block with the slot it is read into and that slot's byte ranges.
        let mut placed: Vec<(ScopedKey, u32, Pieces)> = Vec::new();
        let mut failed = Vec::new();
        for key in keys {
            match self.free.pop() {
                Some(slot) => placed.push((*key, slot, self.pieces(slot))),
                None => failed.push(*key),
            }
        }
        let wanted: Vec<(ScopedKey, &[(usize, usize)])> =
            placed.iter().map(|(k, _, p)| (*k, p.as_slice())).collect();
        let got = disk.get_many(&wanted, &self.memory);
        for ((key, slot, _), got) in placed.iter().zip(got) {
            if !matches!(got, Ok(Got::Served)) {
                self.free.push(*slot);
                failed.push(*key);
                continue;
            }
            disk.remove(key);
            let e = Entry {
                slot: *slot,
                layers: self.layout.layers,
                pins: 0,
            };
            self.index.insert(*key, e);
            self.owners[*slot as usize] = Some(*key);
            self.disk_stats.promoted += 1;
        }
        for key in &failed {
            disk.remove(key);
        }
        for (key, _, _) in &placed {
            self.announce(key);
        }
        for key in &failed {
            self.announce(key);
        }
        self.peak_used = self.peak_used.max(self.used());
        self.disk_stats.promote_failed += failed.len() as u64;
        failed
    }

    /// The byte ranges of slot `slot` in the store's memory, layer by layer, chunk by chunk.
    fn pieces(&self, slot: u32) -> Pieces {
        (0..self.layout.layers)
            .flat_map(|l| self.layout.chunks(BlockId::new(l, slot)))
            .map(|(at, len)| (at as usize, len as usize))
            .collect()
    }
}
