//! Tensor-parallel ranks: each rank's worker holds its own heads' shard of every layer in its own memory,
//! so a consumer's rank *i* loads from the producer's rank *i*, and only between instances of the same
//! tensor-parallel size. MLA KV (one latent vector per token, the same on every rank) is the exception:
//! any producer rank can serve any consumer rank, so it moves once per consumer rank, whatever the sizes.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::error::ConnectorError;

/// One worker's place in its instance's tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TpRank {
    /// This worker's rank, `0..size`.
    pub rank: u32,
    /// Ranks in the instance (vLLM's `tensor_parallel_size`).
    pub size: u32,
}

impl TpRank {
    /// The only rank of an instance without tensor parallelism.
    pub const SINGLE: TpRank = TpRank { rank: 0, size: 1 };

    /// Rank `rank` of `size`, checked.
    pub fn new(rank: u32, size: u32) -> Result<TpRank, ConnectorError> {
        let tp = TpRank { rank, size };
        tp.validate()?;
        Ok(tp)
    }

    /// Checks that the rank lies in `0..size`.
    pub fn validate(self) -> Result<(), ConnectorError> {
        if self.size == 0 || self.rank >= self.size {
            return Err(ConnectorError::Config(format!(
                "tensor-parallel rank {} of size {}: the rank must lie in 0..size",
                self.rank, self.size
            )));
        }
        Ok(())
    }
}

impl std::fmt::Display for TpRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} of {}", self.rank, self.size)
    }
}

/// What one rank tells its instance's scheduler (vLLM's `get_handshake_metadata`), so the scheduler can
/// name every rank's control address in the transfer parameters it hands consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankHandshake {
    /// The worker's rank.
    pub tp: TpRank,
    /// Where the worker serves lookups and loads (`None`: it does not save).
    pub control: Option<SocketAddr>,
}

/// A rank's KV arrangement as far as pairing cares: whether it is MLA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RankKv {
    #[serde(flatten)]
    pub(crate) tp: TpRank,
    /// The rank's KV is MLA (the same on every rank).
    pub(crate) mla: bool,
}

/// Checks that the `consumer` rank may load from the `producer` rank: the same rank of the same size, or
/// MLA KV on both sides. The error names both sides.
pub(crate) fn check_pairing(producer: RankKv, consumer: RankKv) -> Result<(), String> {
    if producer.mla && consumer.mla {
        return Ok(());
    }
    if producer.tp.size != consumer.tp.size {
        return Err(format!(
            "tensor-parallel sizes differ: the producer runs {} ranks, the consumer {}; KV heads are not \
             split or merged between tensor-parallel sizes (only MLA KV, the same on every rank, moves \
             between them)",
            producer.tp.size, consumer.tp.size
        ));
    }
    if producer.tp.rank != consumer.tp.rank {
        return Err(format!(
            "the consumer's {} reached the producer's {}: each rank loads its own heads' shard from the \
             producer rank of the same number",
            consumer.tp, producer.tp
        ));
    }
    Ok(())
}

/// The producer rank whose control address a consumer rank asks, among `ranks` (indexed by producer
/// rank): its own number, wrapped when the producer has fewer ranks (MLA; otherwise the producer refuses).
pub(crate) fn rank_control(ranks: &[SocketAddr], consumer: TpRank) -> Option<SocketAddr> {
    (!ranks.is_empty()).then(|| ranks[consumer.rank as usize % ranks.len()])
}

/// The control addresses of every rank of an instance of `tp.size` ranks, in rank order, from their
/// handshakes; the error says which rank is missing or wrong.
pub(crate) fn rank_controls(
    tp: TpRank,
    handshakes: &[RankHandshake],
) -> Result<Vec<SocketAddr>, ConnectorError> {
    fn bad<T>(m: String) -> Result<T, ConnectorError> {
        Err(ConnectorError::Config(m))
    }
    if let Some(h) = handshakes.iter().find(|h| h.tp.size != tp.size) {
        return bad(format!(
            "a handshake from {} in an instance of {} ranks",
            h.tp, tp.size
        ));
    }
    (0..tp.size)
        .map(|rank| {
            let mut of_rank = handshakes.iter().filter(|h| h.tp.rank == rank);
            match (of_rank.next(), of_rank.next()) {
                (None, _) => bad(format!("no handshake from rank {rank} of {}", tp.size)),
                (Some(_), Some(_)) => bad(format!("two handshakes from rank {rank}")),
                (Some(h), None) => h.control.map_or_else(
                    || {
                        bad(format!(
                            "rank {rank} serves no control address (it does not save)"
                        ))
                    },
                    Ok,
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(rank: u32, size: u32, mla: bool) -> RankKv {
        RankKv {
            tp: TpRank { rank, size },
            mla,
        }
    }

    #[test]
    fn ranks_pair_one_to_one_and_mla_pairs_freely() {
        assert!(check_pairing(kv(1, 2, false), kv(1, 2, false)).is_ok());
        let e = check_pairing(kv(0, 2, false), kv(0, 1, false)).unwrap_err();
        assert!(e.contains("producer runs 2 ranks, the consumer 1"), "{e}");
        let e = check_pairing(kv(0, 2, false), kv(1, 2, false)).unwrap_err();
        assert!(
            e.contains("rank 1 of 2 reached the producer's rank 0 of 2"),
            "{e}"
        );
        assert!(check_pairing(kv(0, 2, true), kv(3, 4, true)).is_ok());
        assert!(check_pairing(kv(0, 2, true), kv(0, 1, false)).is_err());
    }

    #[test]
    fn handshakes_give_one_address_per_rank() {
        let tp = TpRank::new(0, 2).unwrap();
        let at = |p| Some(SocketAddr::from(([127, 0, 0, 1], p)));
        let h = |rank, port| RankHandshake {
            tp: TpRank { rank, size: 2 },
            control: at(port),
        };
        let ranks = rank_controls(tp, &[h(1, 11), h(0, 10)]).unwrap();
        assert_eq!(ranks, vec![at(10).unwrap(), at(11).unwrap()]);
        assert!(rank_controls(tp, &[h(0, 10)]).is_err());
        assert!(rank_controls(tp, &[h(0, 10), h(0, 12), h(1, 11)]).is_err());
        assert_eq!(rank_control(&ranks, TpRank { rank: 3, size: 4 }), at(11));
        assert!(TpRank::new(2, 2).is_err());
    }
}
