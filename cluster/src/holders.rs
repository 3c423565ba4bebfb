//! From what one lookup read (the leases and each block's entries) to who holds how long a prefix.

use std::collections::HashMap;

use crate::schema::{IndexTier, parse_entry, parse_lease};

/// An instance holding a prompt's leading blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The instance's address (what it serves loads on).
    pub instance: String,
    /// How many leading blocks of the prompt it holds.
    pub blocks: usize,
    /// How many of those are on its disk tier rather than in host memory.
    pub disk_blocks: usize,
}

/// What a lookup found: the holders, longest prefix first (ties by address), and the entries it skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    /// Instances holding at least the first block, longest prefix first.
    pub holders: Vec<Holder>,
    /// Entries of instances whose lease lapsed or of an epoch before their lease's. Not counted; the
    /// lookup removes them (each only while it still holds the value read, so never a newer one).
    pub(crate) stale: Vec<StaleEntry>,
    /// Entries holding bytes this crate does not write (skipped).
    pub malformed: usize,
    /// For each block of the prompt, the live instances holding it (in address order).
    pub(crate) per_block: Vec<Vec<String>>,
}

/// Blocks `start..end` of a prompt, to load from `instance`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The instance holding them.
    pub instance: String,
    /// The first block.
    pub start: usize,
    /// One past the last block.
    pub end: usize,
}

/// An entry a lookup skipped: the block's index in the prompt, the instance, and the value read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StaleEntry {
    pub(crate) block: usize,
    pub(crate) instance: Vec<u8>,
    pub(crate) value: Vec<u8>,
}

impl Holders {
    /// How many entries the lookup skipped as stale (lapsed lease or old epoch).
    #[must_use]
    pub fn stale_entries(&self) -> usize {
        self.stale.len()
    }

    /// The longest prefix any live instance holds.
    #[must_use]
    pub fn longest(&self) -> usize {
        self.holders.first().map_or(0, |h| h.blocks)
    }

    /// Leading blocks of the prompt the pool holds: each held by some live instance, not necessarily
    /// one instance.
    #[must_use]
    pub fn pooled(&self) -> usize {
        self.per_block.iter().take_while(|h| !h.is_empty()).count()
    }

    /// Where to load blocks `from..`[`pooled`](Self::pooled) from: from each block on, the instance
    /// holding the longest run (ties by address), so the fewest segments.
    #[must_use]
    pub fn segments(&self, from: usize) -> Vec<Segment> {
        let end = self.pooled();
        let mut out = Vec::new();
        let mut pos = from;
        while pos < end {
            let run = |name: &String| {
                self.per_block[pos..end]
                    .iter()
                    .take_while(|h| h.contains(name))
                    .count()
            };
            let Some((instance, len)) = self.per_block[pos]
                .iter()
                .map(|name| (name, run(name)))
                .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
            else {
                break;
            };
            out.push(Segment {
                instance: instance.clone(),
                start: pos,
                end: pos + len,
            });
            pos += len;
        }
        out
    }

    /// How many leading blocks `instance` holds.
    #[must_use]
    pub fn held_by(&self, instance: &str) -> usize {
        self.holders
            .iter()
            .find(|h| h.instance == instance)
            .map_or(0, |h| h.blocks)
    }
}

/// Live leases at `now_ms` (server clock): address to epoch. Malformed leases are not live.
pub(crate) fn live_leases(leases: &[(Vec<u8>, Vec<u8>)], now_ms: u64) -> HashMap<String, u64> {
    leases
        .iter()
        .filter_map(|(field, value)| {
            let (deadline, epoch) = parse_lease(value)?;
            let instance = String::from_utf8(field.clone()).ok()?;
            (deadline > now_ms).then_some((instance, epoch))
        })
        .collect()
}

/// Walks the blocks in order: an instance's prefix runs while each block has a valid entry of it.
pub(crate) fn holders(live: &HashMap<String, u64>, blocks: &[Vec<(Vec<u8>, Vec<u8>)>]) -> Holders {
    let mut out = Holders::default();
    // Instances whose prefix still runs, with their count so far and disk blocks.
    let mut running: HashMap<&str, (usize, usize)> = HashMap::new();
    for (index, entries) in blocks.iter().enumerate() {
        let mut here: HashMap<&str, IndexTier> = HashMap::new();
        for (field, value) in entries {
            let Ok(instance) = std::str::from_utf8(field) else {
                out.malformed += 1;
                continue;
            };
            let Some((tier, epoch)) = parse_entry(value) else {
                out.malformed += 1;
                continue;
            };
            match live.get_key_value(instance) {
                Some((name, &lease_epoch)) if epoch >= lease_epoch => {
                    here.insert(name.as_str(), tier);
                }
                _ => out.stale.push(StaleEntry {
                    block: index,
                    instance: field.clone(),
                    value: value.clone(),
                }),
            }
        }
        if index == 0 {
            running = here.keys().map(|&name| (name, (0, 0))).collect();
        }
        let mut names: Vec<String> = here.keys().map(|&n| n.to_owned()).collect();
        names.sort_unstable();
        out.per_block.push(names);
        running.retain(|name, (count, disk)| match here.get(name) {
            Some(tier) => {
                *count += 1;
                *disk += usize::from(*tier == IndexTier::Disk);
                true
            }
            None => {
                out.holders.push(Holder {
                    instance: (*name).to_owned(),
                    blocks: *count,
                    disk_blocks: *disk,
                });
                false
            }
        });
    }
    out.holders.extend(
        running
            .into_iter()
            .map(|(name, (blocks, disk_blocks))| Holder {
                instance: name.to_owned(),
                blocks,
                disk_blocks,
            }),
    );
    out.holders.retain(|h| h.blocks > 0);
    out.holders.sort_by(|a, b| {
        b.blocks
            .cmp(&a.blocks)
            .then_with(|| a.instance.cmp(&b.instance))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{entry_value, lease_value};

    fn entry(instance: &str, tier: IndexTier, epoch: u64) -> (Vec<u8>, Vec<u8>) {
        (
            instance.as_bytes().to_vec(),
            entry_value(tier, epoch).into_bytes(),
        )
    }

    #[test]
    fn prefixes_run_until_an_instance_misses_a_block_and_stale_entries_do_not_count() {
        let leases = vec![
            (b"a".to_vec(), lease_value(2_000, 5).into_bytes()),
            (b"b".to_vec(), lease_value(2_000, 1).into_bytes()),
            (b"dead".to_vec(), lease_value(999, 1).into_bytes()),
            (b"junk".to_vec(), b"not a lease".to_vec()),
        ];
        let live = live_leases(&leases, 1_000);
        assert_eq!(live.len(), 2);
        let blocks = vec![
            vec![
                entry("a", IndexTier::Host, 5),
                entry("b", IndexTier::Host, 1),
                entry("dead", IndexTier::Host, 1),
            ],
            vec![
                entry("a", IndexTier::Disk, 6),
                entry("b", IndexTier::Host, 1),
                (b"a".to_vec(), b"?".to_vec()),
            ],
            // a's entry here predates its lease's epoch: a lost removal, not held.
            vec![
                entry("a", IndexTier::Host, 4),
                entry("b", IndexTier::Host, 2),
            ],
            // b holds block 3, but its prefix ended nowhere: it holds 0..3.
            vec![entry("b", IndexTier::Host, 1)],
        ];
        let found = holders(&live, &blocks);
        assert_eq!(
            found.holders,
            vec![
                Holder {
                    instance: "b".into(),
                    blocks: 4,
                    disk_blocks: 0
                },
                Holder {
                    instance: "a".into(),
                    blocks: 2,
                    disk_blocks: 1
                },
            ]
        );
        assert_eq!(found.longest(), 4);
        assert_eq!(found.held_by("a"), 2);
        assert_eq!(found.held_by("nobody"), 0);
        let stale: Vec<_> = found
            .stale
            .iter()
            .map(|s| (s.block, s.instance.as_slice()))
            .collect();
        assert_eq!(stale, vec![(0, b"dead".as_slice()), (2, b"a".as_slice())]);
        assert_eq!(
            found.stale[1].value,
            entry_value(IndexTier::Host, 4).into_bytes()
        );
        assert_eq!(found.malformed, 1);
        // The pool holds all four blocks (b alone here); from block 2 on, b.
        assert_eq!(found.pooled(), 4);
        let from_two = found.segments(2);
        assert_eq!(from_two.len(), 1);
        assert_eq!(
            (
                from_two[0].instance.as_str(),
                from_two[0].start,
                from_two[0].end
            ),
            ("b", 2, 4)
        );
    }

    #[test]
    fn a_prompt_split_over_instances_loads_in_the_fewest_segments() {
        let live = live_leases(
            &[
                (b"a".to_vec(), lease_value(10, 0).into_bytes()),
                (b"b".to_vec(), lease_value(10, 0).into_bytes()),
                (b"c".to_vec(), lease_value(10, 0).into_bytes()),
            ],
            0,
        );
        let at = |names: &[&str]| -> Vec<(Vec<u8>, Vec<u8>)> {
            names.iter().map(|n| entry(n, IndexTier::Host, 0)).collect()
        };
        // a: 0-1, b: 1-3, c: 2-4, nobody: 5.
        let blocks = vec![
            at(&["a"]),
            at(&["a", "b"]),
            at(&["b", "c"]),
            at(&["b", "c"]),
            at(&["c"]),
            at(&[]),
        ];
        let found = holders(&live, &blocks);
        assert_eq!(found.longest(), 2);
        assert_eq!(found.pooled(), 5);
        let plan: Vec<_> = found
            .segments(0)
            .into_iter()
            .map(|s| (s.instance, s.start, s.end))
            .collect();
        assert_eq!(plan, vec![("a".into(), 0, 2), ("c".into(), 2, 5)]);
        assert!(found.segments(5).is_empty());
    }

    #[test]
    fn an_instance_missing_the_first_block_holds_nothing() {
        let live = live_leases(&[(b"a".to_vec(), lease_value(10, 0).into_bytes())], 0);
        let blocks = vec![vec![], vec![entry("a", IndexTier::Host, 0)]];
        let found = holders(&live, &blocks);
        assert!(found.holders.is_empty());
        assert_eq!(found.longest(), 0);
        assert_eq!(holders(&live, &[]).holders, vec![]);
    }
}
