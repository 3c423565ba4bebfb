//! Fast failure on a dead peer: when every write to a peer fails (an error completion, or writes that never
//! complete) and none succeeds for [`RdmaConfig::unreachable_after`](crate::rdma::RdmaConfig), its sessions
//! end at once with recompute and a reason, instead of at their deadline. One write that completes clears
//! the peer's record.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use transfer_engine::PeerId;

/// A peer whose writes have been failing since `since`.
struct Failing {
    since: Instant,
    errors: u64,
    last: String,
}

/// Failing peers, by the time their writes started failing.
#[derive(Default)]
pub(super) struct Reach {
    failing: HashMap<PeerId, Failing>,
}

impl Reach {
    /// A write to `peer` failed with `why`.
    pub(super) fn failed(&mut self, peer: PeerId, now: Instant, why: &str) {
        let f = self.failing.entry(peer).or_insert_with(|| Failing {
            since: now,
            errors: 0,
            last: String::new(),
        });
        f.errors += 1;
        why.clone_into(&mut f.last);
    }

    /// A write to `peer` completed: it is reachable.
    pub(super) fn succeeded(&mut self, peer: PeerId) {
        self.failing.remove(&peer);
    }

    /// The peers whose writes have failed, with none succeeding, for `after` or longer (taken out of the
    /// record), each with the reason to give their sessions.
    pub(super) fn unreachable(&mut self, now: Instant, after: Duration) -> Vec<(PeerId, String)> {
        let dead: Vec<PeerId> = self
            .failing
            .iter()
            .filter(|(_, f)| now.saturating_duration_since(f.since) >= after)
            .map(|(p, _)| *p)
            .collect();
        dead.into_iter()
            .filter_map(|p| {
                let f = self.failing.remove(&p)?;
                let reason = format!(
                    "peer {} unreachable: its writes failed for {:.1} s with none completing ({} errors, \
                     last: {})",
                    p.0,
                    now.saturating_duration_since(f.since).as_secs_f64(),
                    f.errors,
                    f.last
                );
                Some((p, reason))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_unreachable_only_after_failing_without_a_success() {
        let t0 = Instant::now();
        let mut r = Reach::default();
        let after = Duration::from_secs(1);
        r.failed(PeerId(2), t0, "canceled");
        assert!(
            r.unreachable(t0 + Duration::from_millis(500), after)
                .is_empty()
        );
        r.succeeded(PeerId(2));
        r.failed(PeerId(2), t0 + Duration::from_millis(600), "canceled");
        assert!(
            r.unreachable(t0 + Duration::from_millis(1500), after)
                .is_empty(),
            "the clock restarted"
        );
        let dead = r.unreachable(t0 + Duration::from_millis(1700), after);
        assert_eq!(dead.len(), 1);
        assert!(
            dead[0].1.contains("peer 2 unreachable") && dead[0].1.contains("canceled"),
            "{}",
            dead[0].1
        );
        assert!(
            r.unreachable(t0 + Duration::from_secs(9), after).is_empty(),
            "reported once"
        );
    }
}
