//! Fast failure on a dead peer: when every write to a peer fails (an error completion, or writes that never
//! complete) and none succeeds for [`RdmaConfig::unreachable_after`](crate::rdma::RdmaConfig), or the
//! frames that ask it for an answer (an open, a unit, a close) get none for
//! [`RdmaConfig::answer_timeout`](crate::rdma::RdmaConfig), its sessions end at once with recompute and a
//! reason, instead of at their deadline. One write that completes, or any message from the peer,
//! clears the peer's record. (A peer's process that closed or died does not always fail writes: on `shm`
//! they stay queued for it, unanswered.)

use std::collections::HashMap;
use std::time::{Duration, Instant};

use transfer_engine::PeerId;

/// A peer whose writes have been failing since `since`.
struct Failing {
    since: Instant,
    errors: u64,
    last: String,
}

/// Failing peers, by the time their writes started failing, and peers owing an answer, by the time the
/// oldest unanswered frame left.
#[derive(Default)]
pub(super) struct Reach {
    failing: HashMap<PeerId, Failing>,
    awaiting: HashMap<PeerId, Instant>,
    /// When each peer last sent this node a message.
    heard: HashMap<PeerId, Instant>,
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

    /// A write to `peer` completed, or a message from it arrived: it is reachable.
    pub(super) fn succeeded(&mut self, peer: PeerId) {
        self.failing.remove(&peer);
        self.awaiting.remove(&peer);
    }

    /// A message from `peer` arrived at `now`.
    pub(super) fn heard_from(&mut self, peer: PeerId, now: Instant) {
        self.heard.insert(peer, now);
        self.succeeded(peer);
    }

    /// Of `peers`, those this node has not heard from for `quiet` and is not already waiting on: each is
    /// to be pinged (and is counted as asked from `now`). A peer never heard from counts from `now`.
    pub(super) fn due_for_ping(
        &mut self,
        peers: &[PeerId],
        now: Instant,
        quiet: Duration,
    ) -> Vec<PeerId> {
        let mut ping = Vec::new();
        for &p in peers {
            let heard = *self.heard.entry(p).or_insert(now);
            if now.saturating_duration_since(heard) >= quiet && !self.awaiting.contains_key(&p) {
                self.awaiting.insert(p, now);
                ping.push(p);
            }
        }
        ping
    }

    /// A frame that asks `peer` for an answer left at `now`.
    pub(super) fn asked(&mut self, peer: PeerId, now: Instant) {
        self.awaiting.entry(peer).or_insert(now);
    }

    /// The peers whose writes have failed, with none succeeding, for `after` or longer, or that have owed an
    /// answer for `answer_timeout` or longer (taken out of the record), each with the reason to give their
    /// sessions.
    pub(super) fn unreachable(
        &mut self,
        now: Instant,
        after: Duration,
        answer_timeout: Duration,
    ) -> Vec<(PeerId, String)> {
        let silent: Vec<PeerId> = self
            .awaiting
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= answer_timeout)
            .map(|(p, _)| *p)
            .collect();
        let mut dead: Vec<(PeerId, String)> = silent
            .into_iter()
            .filter_map(|p| {
                let since = self.awaiting.remove(&p)?;
                self.failing.remove(&p);
                Some((
                    p,
                    format!(
                        "peer {} unreachable: no answer for {:.1} s to the frames sent to it",
                        p.0,
                        now.saturating_duration_since(since).as_secs_f64()
                    ),
                ))
            })
            .collect();
        let failed: Vec<PeerId> = self
            .failing
            .iter()
            .filter(|(_, f)| now.saturating_duration_since(f.since) >= after)
            .map(|(p, _)| *p)
            .collect();
        dead.extend(failed.into_iter().filter_map(|p| {
                let f = self.failing.remove(&p)?;
                let reason = format!(
                    "peer {} unreachable: its writes failed for {:.1} s with none completing ({} errors, \
                     last: {})",
                    p.0,
                    now.saturating_duration_since(f.since).as_secs_f64(),
                    f.errors,
                    f.last
                );
                self.awaiting.remove(&p);
                Some((p, reason))
            }));
        dead
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
            r.unreachable(t0 + Duration::from_millis(500), after, after)
                .is_empty()
        );
        r.succeeded(PeerId(2));
        r.failed(PeerId(2), t0 + Duration::from_millis(600), "canceled");
        assert!(
            r.unreachable(t0 + Duration::from_millis(1500), after, after)
                .is_empty(),
            "the clock restarted"
        );
        let dead = r.unreachable(t0 + Duration::from_millis(1700), after, after);
        assert_eq!(dead.len(), 1);
        assert!(
            dead[0].1.contains("peer 2 unreachable") && dead[0].1.contains("canceled"),
            "{}",
            dead[0].1
        );
        assert!(
            r.unreachable(t0 + Duration::from_secs(9), after, after)
                .is_empty(),
            "reported once"
        );
    }

    #[test]
    fn a_peer_that_answers_nothing_is_unreachable_and_one_answer_clears_it() {
        let t0 = Instant::now();
        let mut r = Reach::default();
        let after = Duration::from_secs(1);
        r.asked(PeerId(3), t0);
        r.asked(PeerId(3), t0 + Duration::from_millis(900));
        r.succeeded(PeerId(3));
        r.asked(PeerId(3), t0 + Duration::from_millis(950));
        assert!(
            r.unreachable(t0 + Duration::from_millis(1900), after, after)
                .is_empty(),
            "the answer restarted the clock, and later frames do not"
        );
        let dead = r.unreachable(t0 + Duration::from_millis(1950), after, after);
        assert_eq!(dead.len(), 1);
        assert!(
            dead[0].1.contains("peer 3 unreachable: no answer"),
            "{}",
            dead[0].1
        );
        assert!(
            r.unreachable(t0 + Duration::from_secs(9), after, after)
                .is_empty(),
            "reported once"
        );
    }
}
