//! Exponential backoff with jitter, driven by a seeded generator.

use std::time::Duration;

use rand::Rng;

/// Retransmit delay schedule: `base * 2^attempt`, capped at `max`, plus up to `jitter` of itself at random.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Backoff {
    /// Delay before the first retransmit.
    pub base: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Fraction of the delay added at random (0.0..=1.0), so retransmits of many units spread out.
    pub jitter: f64,
}

impl Backoff {
    /// A schedule from `base` doubling up to `max`, with `jitter` (0.0..=1.0) of each delay at random.
    #[must_use]
    pub fn new(base: Duration, max: Duration, jitter: f64) -> Self {
        Self { base, max, jitter }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            max: Duration::from_millis(500),
            jitter: 0.25,
        }
    }
}

impl Backoff {
    /// Delay to wait after send number `attempt` (0 for the first transmission) before giving up on it.
    pub fn delay(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(30)).unwrap_or(u32::MAX);
        let delay = self.base.saturating_mul(factor).min(self.max);
        let jitter = self.jitter.clamp(0.0, 1.0);
        if jitter == 0.0 {
            return delay;
        }
        delay + delay.mul_f64(rng.random_range(0.0..jitter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn doubles_then_caps_and_jitters_within_bounds() {
        let b = Backoff {
            base: Duration::from_millis(10),
            max: Duration::from_millis(70),
            jitter: 0.5,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for (attempt, nominal) in [(0, 10), (1, 20), (2, 40), (3, 70), (40, 70)] {
            let d = b.delay(attempt, &mut rng);
            let nominal = Duration::from_millis(nominal);
            assert!(
                d >= nominal && d < nominal.mul_f64(1.5),
                "attempt {attempt}: {d:?}"
            );
        }
        let exact = Backoff { jitter: 0.0, ..b };
        assert_eq!(exact.delay(1, &mut rng), Duration::from_millis(20));
    }

    #[test]
    fn same_seed_same_schedule() {
        let b = Backoff::default();
        let run = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..8).map(|a| b.delay(a, &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }
}
