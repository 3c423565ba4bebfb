//! Tier moves as engine sessions: what a tier manager decides (a block from GPU to host, host to GPU, host to
//! remote, ...) carried out by the pair's two engines like any transfer, so every moved block is checksummed
//! and acknowledged, comes back for recompute when it cannot be moved, and a GPU tier's bytes go through the
//! GPU placer (feature `cuda`; refused with a clear error without it or without a driver).
//!
//! Each tier is one KV region registered on both ends of the pair ([`TierRegions::register`]), so a move in
//! either direction is a session from the producer's registration of its source tier to the consumer's
//! registration of its destination tier. Moves between the same two tiers go as one session.

use std::collections::BTreeMap;
use std::time::Duration;

use transfer_engine::policy::{BlockKey, Tier, TierMove};
use transfer_engine::{BlockId, KvLayout, MemoryRegion, RegionHandle, TransferRequest};

use super::{CONSUMER, LoopbackPair, stalled};
use crate::TransportError;
use crate::node::LogKind;

/// Each tier's region, as the producer and the consumer registered it.
#[derive(Debug, Default)]
pub struct TierRegions {
    regions: BTreeMap<Tier, (RegionHandle, RegionHandle)>,
}

/// How one tier move ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierMoveReport {
    /// The move.
    pub moved: TierMove,
    /// `Ok` once every layer of the block is in its new tier (or for a drop, or a move within one tier,
    /// which move nothing); otherwise why not. The block's old copy is untouched either way.
    pub result: Result<(), String>,
}

impl TierRegions {
    /// No tiers yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `memory` (a KV region of `layout`: one slot per block) as tier `tier`'s store on both ends
    /// of `pair`. A tier registered again replaces the old registration for later moves.
    pub fn register(
        &mut self,
        pair: &LoopbackPair,
        tier: Tier,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<(), TransportError> {
        let sending = pair.producer().register_kv_region(layout, memory.clone())?;
        let receiving = pair.consumer().register_kv_region(layout, memory)?;
        self.regions.insert(tier, (sending, receiving));
        Ok(())
    }
}

/// Moves between two tiers, gathered for one session.
#[derive(Default)]
struct Batch {
    moves: Vec<usize>,
    src_blocks: Vec<u32>,
    dst_blocks: Vec<u32>,
}

impl LoopbackPair {
    /// Carries out `moves` between the tiers in `tiers`. `locate(key, tier)` names the slot (block index)
    /// `key` has, or is to take, in `tier`'s region, or `None` when that tier has no room for it. Each
    /// session has `deadline`: a block not moved by then is reported failed. Returns one report per move, in
    /// order, once every session is over (an error if one is still running a few seconds past its deadline).
    pub fn run_tier_moves(
        &self,
        tiers: &TierRegions,
        moves: &[TierMove],
        mut locate: impl FnMut(BlockKey, Tier) -> Option<u32>,
        deadline: Duration,
    ) -> Result<Vec<TierMoveReport>, TransportError> {
        let limit = deadline + Duration::from_secs(5);
        let mut results: Vec<Result<(), String>> = vec![Ok(()); moves.len()];
        let mut batches: BTreeMap<(Tier, Tier), Batch> = BTreeMap::new();
        for (i, m) in moves.iter().enumerate() {
            let Some(to) = m.to.filter(|to| *to != m.from) else {
                continue; // a drop or a move within one tier: nothing to copy
            };
            if !tiers.regions.contains_key(&m.from) || !tiers.regions.contains_key(&to) {
                results[i] = Err(format!(
                    "no region registered for tier {:?} or {to:?}",
                    m.from
                ));
                continue;
            }
            let (Some(src), Some(dst)) = (locate(m.key, m.from), locate(m.key, to)) else {
                results[i] = Err(format!(
                    "no slot for block {:?} in tier {:?} or {to:?}",
                    m.key, m.from
                ));
                continue;
            };
            let b = batches.entry((m.from, to)).or_default();
            b.moves.push(i);
            b.src_blocks.push(src);
            b.dst_blocks.push(dst);
        }
        let seen = self.consumer().log_mark();
        let mut sessions = Vec::new();
        for ((from, to), batch) in batches {
            let (src, _) = &tiers.regions[&from];
            let (_, dst) = &tiers.regions[&to];
            let layers = src.layout.map_or(0, |l| l.layers);
            let req = TransferRequest::blocks(
                CONSUMER,
                src,
                batch.src_blocks.clone(),
                dst,
                batch.dst_blocks.clone(),
                0..layers,
            )
            .map(|r| r.with_deadline(deadline));
            let refused = |e: &dyn std::fmt::Display, results: &mut Vec<Result<(), String>>| {
                for &i in &batch.moves {
                    results[i] = Err(e.to_string());
                }
            };
            match req {
                Ok(req) => match self.submit(req) {
                    Ok(session) => sessions.push((session, batch)),
                    Err(e) => refused(&e, &mut results),
                },
                Err(e) => refused(&e, &mut results),
            }
        }
        let ids: Vec<_> = sessions.iter().map(|(s, _)| *s).collect();
        let outcomes = match self.wait_all(&ids, limit) {
            Ok(outcomes) => outcomes,
            Err(pending) => {
                for s in &pending {
                    let _ = self.cancel(*s); // nothing left running behind the error
                }
                return Err(stalled(pending.len(), limit));
            }
        };
        // Why the consumer refused a unit during these moves (a GPU move without a driver, say).
        let (entries, _) = self.consumer().log_entries_after(seen);
        let last_refusal = entries
            .iter()
            .rev()
            .find(|e| e.kind == LogKind::Refused)
            .and_then(|e| e.error.as_ref().map(ToString::to_string));
        // Waiting stops at the first session that cannot be waited for; the ones after it share its error.
        let stopped = outcomes
            .last()
            .and_then(|o| o.as_ref().err())
            .map(ToString::to_string);
        for (n, (_, batch)) in sessions.iter().enumerate() {
            let outcome = outcomes.get(n);
            let lost = |block: u32, out: &crate::board::Outcome| -> Option<String> {
                out.recompute
                    .iter()
                    .any(|b: &BlockId| b.block == block)
                    .then(|| {
                        out.reason.clone().unwrap_or_else(|| match &last_refusal {
                            Some(e) => format!("not moved: {e}"),
                            None => "not moved: the session handed it back".into(),
                        })
                    })
            };
            for (&i, &src_block) in batch.moves.iter().zip(&batch.src_blocks) {
                results[i] = match outcome {
                    Some(Ok(out)) => lost(src_block, out).map_or(Ok(()), Err),
                    Some(Err(e)) => Err(e.to_string()),
                    None => Err(stopped.clone().unwrap_or_default()),
                };
            }
        }
        Ok(moves
            .iter()
            .zip(results)
            .map(|(m, result)| TierMoveReport { moved: *m, result })
            .collect())
    }
}
