//! Which instance a request goes to: round robin, least loaded, by cache alone, or by expected time to
//! first token (cache and load). Pure and deterministic: the caller passes what the index and each
//! instance's load say.

use std::str::FromStr;

/// How a router chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutePolicy {
    /// Each instance in turn.
    RoundRobin,
    /// The instance with the least work queued.
    LeastLoaded,
    /// The instance holding the longest prefix of the prompt (ties in turn); blind to load.
    CacheAware,
    /// The instance with the least expected time to first token: work queued, plus the prompt's blocks
    /// it would compute, plus the transfer of those it would pull from another.
    CacheLoad,
}

impl FromStr for RoutePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<RoutePolicy, String> {
        match s {
            "round-robin" => Ok(RoutePolicy::RoundRobin),
            "least-loaded" => Ok(RoutePolicy::LeastLoaded),
            "cache" => Ok(RoutePolicy::CacheAware),
            "cache-load" => Ok(RoutePolicy::CacheLoad),
            other => Err(format!(
                "unknown routing policy {other:?} (round-robin, least-loaded, cache, cache-load)"
            )),
        }
    }
}

impl RoutePolicy {
    /// The name [`RoutePolicy::from_str`] reads.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            RoutePolicy::RoundRobin => "round-robin",
            RoutePolicy::LeastLoaded => "least-loaded",
            RoutePolicy::CacheAware => "cache",
            RoutePolicy::CacheLoad => "cache-load",
        }
    }
}

/// One instance as the router sees it for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Leading blocks of the prompt the instance holds itself.
    pub held: usize,
    /// Seconds of work queued ahead of a new request there.
    pub queued: f64,
}

/// What a request costs, wherever it goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestCost {
    /// The prompt's blocks.
    pub blocks: usize,
    /// Leading blocks some instance holds (the pool's best), loadable by any instance; 0 when instances
    /// load only their own.
    pub pooled: usize,
    /// Seconds to compute one block.
    pub compute_per_block: f64,
    /// Seconds to pull one block from another instance.
    pub transfer_per_block: f64,
}

impl RequestCost {
    /// Expected seconds to first token at `c`: its queue, the blocks neither it nor the pool holds, and
    /// the transfer of the pool's blocks it lacks.
    #[must_use]
    pub fn expected_ttft(&self, c: &Candidate) -> f64 {
        let reused = c.held.max(self.pooled).min(self.blocks);
        let pulled = self.pooled.saturating_sub(c.held);
        c.queued
            + (self.blocks - reused) as f64 * self.compute_per_block
            + pulled as f64 * self.transfer_per_block
    }
}

/// A router: its policy and whose turn it is.
#[derive(Debug, Clone)]
pub struct Router {
    policy: RoutePolicy,
    turn: usize,
}

impl Router {
    /// A router choosing by `policy`.
    #[must_use]
    pub fn new(policy: RoutePolicy) -> Router {
        Router { policy, turn: 0 }
    }

    /// Its policy.
    #[must_use]
    pub fn policy(&self) -> RoutePolicy {
        self.policy
    }

    /// The index of the candidate `cost` should go to. Ties go to the first in turn after the last
    /// choice, so equal instances share the work. Panics if `candidates` is empty.
    pub fn choose(&mut self, cost: &RequestCost, candidates: &[Candidate]) -> usize {
        assert!(!candidates.is_empty(), "no instance to route to");
        let n = candidates.len();
        let order = (0..n).map(|k| (self.turn + k) % n);
        let chosen = match self.policy {
            RoutePolicy::RoundRobin => self.turn % n,
            RoutePolicy::LeastLoaded => best(order, |i| candidates[i].queued),
            RoutePolicy::CacheAware => best(order, |i| -(candidates[i].held as f64)),
            RoutePolicy::CacheLoad => best(order, |i| cost.expected_ttft(&candidates[i])),
        };
        self.turn = (chosen + 1) % n;
        chosen
    }
}

/// The first index in `order` with the lowest score.
fn best(order: impl Iterator<Item = usize>, score: impl Fn(usize) -> f64) -> usize {
    let mut chosen = None;
    let mut lowest = f64::INFINITY;
    for i in order {
        let s = score(i);
        if chosen.is_none() || s < lowest {
            chosen = Some(i);
            lowest = s;
        }
    }
    chosen.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(pooled: usize) -> RequestCost {
        RequestCost {
            blocks: 10,
            pooled,
            compute_per_block: 0.05,
            transfer_per_block: 0.005,
        }
    }

    fn idle(held: usize) -> Candidate {
        Candidate { held, queued: 0.0 }
    }

    #[test]
    fn each_policy_chooses_what_it_names_and_shares_ties() {
        let cs = [
            idle(0),
            idle(4),
            Candidate {
                held: 8,
                queued: 1.0,
            },
        ];
        let mut rr = Router::new(RoutePolicy::RoundRobin);
        let turns: Vec<_> = (0..4).map(|_| rr.choose(&cost(0), &cs)).collect();
        assert_eq!(turns, [0, 1, 2, 0]);
        assert_eq!(
            Router::new(RoutePolicy::CacheAware).choose(&cost(0), &cs),
            2
        );
        // Ties among the idle: in turn.
        let mut ll = Router::new(RoutePolicy::LeastLoaded);
        assert_eq!([ll.choose(&cost(0), &cs), ll.choose(&cost(0), &cs)], [0, 1]);
        // Cache and load: 8 held but a second queued loses to 4 held and idle (0.3 s of compute).
        assert_eq!(Router::new(RoutePolicy::CacheLoad).choose(&cost(0), &cs), 1);
        // With the pool's 8 blocks loadable anywhere, instance 1 pulls 4 (20 ms) and instance 0 pulls 8.
        let pooled = cost(8);
        assert!(pooled.expected_ttft(&cs[1]) < pooled.expected_ttft(&cs[0]));
        assert_eq!(Router::new(RoutePolicy::CacheLoad).choose(&pooled, &cs), 1);
    }

    #[test]
    fn names_parse_and_unknown_ones_are_refused() {
        for (name, p) in [
            ("round-robin", RoutePolicy::RoundRobin),
            ("least-loaded", RoutePolicy::LeastLoaded),
            ("cache", RoutePolicy::CacheAware),
            ("cache-load", RoutePolicy::CacheLoad),
        ] {
            assert_eq!(name.parse::<RoutePolicy>(), Ok(p));
            assert_eq!(p.name(), name);
        }
        assert!(
            "random"
                .parse::<RoutePolicy>()
                .unwrap_err()
                .contains("cache-load")
        );
    }
}
