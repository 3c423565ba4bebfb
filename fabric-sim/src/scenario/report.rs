//! What a scenario run measured, and the invariants every run must keep.

use serde::Serialize;

use crate::sim::RunEnd;

/// What a scenario run measured. Block counts are from the consumer's side.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    /// The seed (replays the run exactly).
    pub seed: u64,
    /// Wire mode.
    pub mode: String,
    /// Blocks in the transfer (layers x blocks).
    pub blocks_total: u64,
    /// Blocks the receiving engine delivered.
    pub blocks_delivered: u64,
    /// Blocks not delivered and reported for recompute by either engine (or lost with a crashed sender).
    pub blocks_recompute: u64,
    /// Blocks neither delivered nor reported (must be 0 when `finished`).
    pub blocks_unresolved: u64,
    /// Delivered blocks whose bytes differ from the source block's (must always be 0).
    pub corrupt_delivered: u64,
    /// Extra `BlockDelivered` events for a block already delivered (must be 0).
    pub duplicate_deliveries: u64,
    /// Blocks the sender reported for recompute although the receiver delivered them (its ack was lost):
    /// wasted work, never wrong data.
    pub recompute_but_delivered: u64,
    /// Blocks the receiving engine itself reported for recompute.
    pub receiver_recompute: u64,
    /// Blocks still undelivered when a crashed sender took its session with it (counted in recompute).
    pub lost_with_sender: u64,
    /// Data frames sent again.
    pub retransmits: u64,
    /// Payload bytes sent again.
    pub retransmit_bytes: u64,
    /// Payload bytes of the transfer.
    pub payload_bytes: u64,
    /// `retransmit_bytes / payload_bytes`.
    pub retransmit_overhead: f64,
    /// Data frames sent for the first time.
    pub first_sends: u64,
    /// Most retransmits the engine-wide budget allows for this many first sends over this much time
    /// (burst + ratio x sends + refill per second x seconds).
    pub retransmit_budget_limit: f64,
    /// Resends parked because the budget was spent (each refusal counts).
    pub budget_exhausted: u64,
    /// Data frames the receiver refused for a bad payload checksum.
    pub checksum_failures: u64,
    /// Frames either engine refused (corrupted headers, unknown sessions).
    pub frames_refused: u64,
    /// Frames lost to full queues.
    pub tail_drops: u64,
    /// Frames lost to fault rules.
    pub fault_drops: u64,
    /// Frames delivered corrupted.
    pub frames_corrupted: u64,
    /// Frames delivered twice.
    pub frames_duplicated: u64,
    /// Virtual time until every block was resolved (delivered or recompute), or until the run stopped.
    pub virtual_ms: f64,
    /// Delivered payload over `virtual_ms`, in GB/s (1e9 bytes per second, as everywhere in te-bench).
    pub goodput_gbps: f64,
    /// Every block delivered or reported for recompute no later than the session deadline.
    pub finished: bool,
    /// Every session on both engines ended (nothing hangs) before the run limit.
    pub idle: bool,
    /// How the run ended.
    pub end: RunEnd,
    /// Sessions alive on either engine when the run stopped.
    pub live_sessions: usize,
    /// Session deadline, in ms.
    pub deadline_ms: f64,
}

impl ScenarioReport {
    /// The invariants every run must keep, whatever the faults; the first broken one, described.
    pub fn check_invariants(&self) -> Result<(), String> {
        let seed = self.seed;
        let fail = |what: String| Err(format!("seed {seed}: {what}; report: {self:?}"));
        if self.corrupt_delivered != 0 {
            return fail(format!(
                "{} corrupt blocks delivered",
                self.corrupt_delivered
            ));
        }
        if self.duplicate_deliveries != 0 {
            return fail(format!(
                "{} blocks delivered twice",
                self.duplicate_deliveries
            ));
        }
        if self.blocks_delivered + self.blocks_recompute != self.blocks_total {
            return fail(format!(
                "delivered {} + recompute {} != total {}",
                self.blocks_delivered, self.blocks_recompute, self.blocks_total
            ));
        }
        if !self.finished {
            return fail("not every block was resolved by the deadline".into());
        }
        if !self.idle {
            return fail(format!(
                "sessions still alive at the run limit ({:?}, {} live)",
                self.end, self.live_sessions
            ));
        }
        Ok(())
    }
}
