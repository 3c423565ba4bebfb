//! What `te-bench serve --verify` checks, kept apart from the node's bounded memory of finished sessions
//! so that a client finishing thousands of sessions a second cannot make it forget honest ones.
//!
//! Each incoming session's notice (its region, layers and destination blocks) is kept until its end
//! arrives, at most [`KEEP_PENDING`] at once; at its end only the bytes that session wrote are compared
//! with its client's pattern (docs/PROTOCOL.md §15: the byte at region offset `o` of engine `e`'s pattern,
//! wherever the session's blocks lie), so one check costs what the session moved, not the whole region.
//! A session that could not be checked is printed with the reason and counted, never dropped: its end
//! came without its notice, its notice was pushed out by newer ones, it ended early or with blocks to
//! recompute, or the event feed fell behind. [`Verifier::summary`] says how many of each.
//!
//! (`recompute` comes from the end's own counters and the bytes from the region as it is then: a later
//! session of the same client into the same blocks writes the same pattern, so it cannot hide a fault.)

use std::collections::{HashMap, VecDeque};

use backends::IncomingSession;
use transfer_engine::{BlockId, KvLayout, MemoryRegion, RegionId, SHARD_BYTES, SessionId};

/// Sessions whose notice is kept while they run; beyond it the oldest is reported as not checked.
pub(crate) const KEEP_PENDING: usize = 1 << 16;

/// What the verifier has found so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) verified: u64,
    pub(crate) mismatched: u64,
    pub(crate) not_checked: u64,
    /// Engine events the feed dropped before they were read (their sessions are reported when their
    /// notices are pushed out).
    pub(crate) events_missed: u64,
}

/// Incoming sessions waiting for their end, and the tally.
#[derive(Debug, Default)]
pub(crate) struct Verifier {
    pending: HashMap<SessionId, IncomingSession>,
    order: VecDeque<SessionId>,
    tally: Tally,
}

impl Verifier {
    /// Keeps `s` until its end; returns the line for a session pushed out to make room, if any.
    pub(crate) fn incoming(&mut self, s: &IncomingSession) -> Option<String> {
        let mut line = None;
        while self.pending.len() >= KEEP_PENDING {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if self.pending.remove(&oldest).is_some() {
                self.tally.not_checked += 1;
                line = Some(format!(
                    "session {oldest}: not checked: more than {KEEP_PENDING} sessions awaited their end"
                ));
            }
        }
        self.pending.insert(s.session, s.clone());
        self.order.push_back(s.session);
        // The queue of ids may hold ids already finished; keep it from growing past twice the map.
        if self.order.len() > 2 * KEEP_PENDING {
            self.order.retain(|id| self.pending.contains_key(id));
        }
        line
    }

    /// The verdict line of receiving session `session`, which ended with `recompute` blocks to recompute:
    /// its blocks read through `memory`, laid out as `layout` says (the whole region against the pattern
    /// when the layout is unknown).
    pub(crate) fn completed(
        &mut self,
        session: SessionId,
        recompute: u64,
        memory: impl FnOnce(RegionId) -> anyhow::Result<MemoryRegion>,
        layout: impl FnOnce(RegionId) -> Option<KvLayout>,
    ) -> String {
        let Some(s) = self.pending.remove(&session) else {
            self.tally.not_checked += 1;
            return format!(
                "session {session}: not checked: its notice was not seen (the node dropped it, or the \
                 event feed fell behind)"
            );
        };
        if recompute > 0 {
            self.tally.not_checked += 1;
            return format!("session {session}: not checked: {recompute} blocks to recompute");
        }
        let seed = s.peer.0;
        let checked = memory(s.region).and_then(|m| match layout(s.region) {
            Some(l) => wrote_pattern(&m, &l, &s, seed),
            None => crate::tcp::holds_pattern(&m, seed),
        });
        match checked {
            Ok(true) => {
                self.tally.verified += 1;
                format!("session {session}: verified (engine {seed}'s pattern)")
            }
            Ok(false) => {
                self.tally.mismatched += 1;
                format!(
                    "session {session}: MISMATCH: the blocks it wrote do not hold engine {seed}'s pattern"
                )
            }
            Err(e) => {
                self.tally.not_checked += 1;
                format!("session {session}: not checked: {e}")
            }
        }
    }

    /// Session `session` ended early (its line is printed with the reason where the event is).
    pub(crate) fn aborted(&mut self, session: SessionId) {
        if self.pending.remove(&session).is_some() {
            self.tally.not_checked += 1;
        }
    }

    /// The event feed dropped `n` events.
    pub(crate) fn missed(&mut self, n: u64) {
        self.tally.events_missed += n;
    }

    pub(crate) fn tally(&self) -> Tally {
        self.tally
    }

    /// One line: how many sessions were verified, mismatched and not checked, and how many wait (worded
    /// unlike a session's verdict, which tools match by `verified`, `MISMATCH` and `not checked`).
    pub(crate) fn summary(&self) -> String {
        let t = self.tally;
        format!(
            "verify totals: {} passed, {} failed, {} unchecked, {} running, {} events missed",
            t.verified,
            t.mismatched,
            t.not_checked,
            self.pending.len(),
            t.events_missed
        )
    }
}

/// Whether every chunk of the blocks `s` wrote holds engine `seed`'s pattern at its offset.
fn wrote_pattern(
    memory: &MemoryRegion,
    layout: &KvLayout,
    s: &IncomingSession,
    seed: u64,
) -> anyhow::Result<bool> {
    let mut want = Vec::new();
    for layer in s.layers.clone() {
        for &block in &s.blocks {
            for (at, len) in layout.chunks(BlockId { layer, block }) {
                let (at, len) = (usize::try_from(at)?, usize::try_from(len)?);
                if !holds_range(memory, seed, at..at + len, &mut want)? {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

/// Whether bytes `range` of `memory` are the pattern's: the pattern restarts at every piece of
/// `SHARD_BYTES`, so each piece the range touches is made from its start up to what the range needs.
fn holds_range(
    memory: &MemoryRegion,
    seed: u64,
    range: std::ops::Range<usize>,
    want: &mut Vec<u8>,
) -> anyhow::Result<bool> {
    let mut at = range.start;
    while at < range.end {
        let piece = at - at % SHARD_BYTES;
        let end = range.end.min(piece + SHARD_BYTES);
        want.resize(end - piece, 0);
        crate::tcp::pattern(seed, piece, want);
        if *memory.read(at..end)? != want[at - piece..] {
            return Ok(false);
        }
        at = end;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use transfer_engine::{Dtype, PeerId};

    use super::*;

    fn layout() -> KvLayout {
        KvLayout::new(2, 4, 4096, 16, Dtype::Bf16).unwrap()
    }

    fn session(id: u64, blocks: Vec<u32>) -> IncomingSession {
        IncomingSession {
            session: SessionId(id),
            peer: PeerId(9),
            region: RegionId(1),
            layers: 0..2,
            blocks,
        }
    }

    /// A region holding engine 9's pattern, with the byte at `damaged` changed.
    fn region(damaged: Option<usize>) -> MemoryRegion {
        let mut bytes = vec![0u8; layout().total_bytes() as usize];
        crate::tcp::pattern(9, 0, &mut bytes);
        if let Some(at) = damaged {
            bytes[at] ^= 0xFF;
        }
        MemoryRegion::from_vec(bytes)
    }

    fn check(v: &mut Verifier, id: u64, damaged: Option<usize>) -> String {
        v.completed(
            SessionId(id),
            0,
            |_| Ok(region(damaged)),
            |_| Some(layout()),
        )
    }

    #[test]
    fn only_the_blocks_a_session_wrote_are_checked() {
        let mut v = Verifier::default();
        let l = layout();
        let at = |layer, block| l.chunks(BlockId { layer, block })[0].0 as usize;
        v.incoming(&session(1, vec![2]));
        // A damaged byte in a block the session did not write does not concern it.
        assert!(check(&mut v, 1, Some(at(1, 3))).contains("verified"));
        v.incoming(&session(2, vec![2]));
        let line = check(&mut v, 2, Some(at(1, 2) + 100));
        assert!(line.contains("MISMATCH"), "{line}");
        assert_eq!((v.tally().verified, v.tally().mismatched), (1, 1));
    }

    #[test]
    fn a_block_across_a_pattern_piece_is_checked_against_both_pieces() {
        // Blocks of 768 KiB: block 1 spans the first two 1 MiB pieces of the pattern.
        let l = KvLayout::new(1, 4, 768 << 10, 16, Dtype::Bf16).unwrap();
        let memory = MemoryRegion::zeroed(l.total_bytes() as usize);
        memory
            .fill_with(|offset, b| crate::tcp::pattern(9, offset, b))
            .unwrap();
        let mut v = Verifier::default();
        let s = IncomingSession {
            layers: 0..1,
            ..session(1, vec![1])
        };
        v.incoming(&s);
        let line = v.completed(SessionId(1), 0, |_| Ok(memory.clone()), |_| Some(l));
        assert!(line.contains("verified"), "{line}");
    }

    #[test]
    fn a_session_that_cannot_be_checked_is_said_and_counted() {
        let mut v = Verifier::default();
        let line = check(&mut v, 5, None);
        assert!(
            line.contains("not checked: its notice was not seen"),
            "{line}"
        );
        v.incoming(&session(6, vec![0]));
        let line = v.completed(SessionId(6), 3, |_| Ok(region(None)), |_| Some(layout()));
        assert!(
            line.contains("not checked: 3 blocks to recompute"),
            "{line}"
        );
        v.incoming(&session(7, vec![0]));
        v.aborted(SessionId(7));
        v.missed(4);
        assert_eq!(v.tally().not_checked, 3);
        assert_eq!(
            v.summary(),
            "verify totals: 0 passed, 0 failed, 3 unchecked, 0 running, 4 events missed"
        );
    }

    #[test]
    fn a_flood_of_sessions_pushes_out_the_oldest_with_a_line_never_silently() {
        let mut v = Verifier::default();
        v.incoming(&session(0, vec![1]));
        let mut pushed = Vec::new();
        for id in 1..=KEEP_PENDING as u64 {
            pushed.extend(v.incoming(&session(id, vec![1])));
        }
        assert_eq!(pushed.len(), 1);
        let first = format!("session {}: not checked: more than", SessionId(0));
        assert!(pushed[0].starts_with(&first), "{pushed:?}");
        // The newest still verifies; sessions that ended leave no trace behind.
        assert!(check(&mut v, KEEP_PENDING as u64, None).contains("verified"));
        for id in 1..KEEP_PENDING as u64 {
            v.aborted(SessionId(id));
        }
        assert_eq!(
            v.summary(),
            format!(
                "verify totals: 1 passed, 0 failed, {KEEP_PENDING} unchecked, 0 running, 0 events \
                 missed"
            )
        );
    }
}
