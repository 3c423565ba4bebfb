//! The engine-wide retransmit budget: the storm guard.

use std::time::Instant;

/// Retransmits allowed across all sessions: `burst` to start with, plus `ratio` for every first
/// transmission and `per_second` as time passes, never more than `burst` saved up. When it is empty a
/// unit that needs resending is parked: it waits (its last copy may still be acknowledged), gives its
/// place in the window to first sends, and goes out again when the budget allows; the session deadline
/// hands its blocks back for recompute if that never happens. Loss can never snowball into a storm.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RetransmitBudget {
    /// Retransmits allowed with no first transmissions to earn them, and the most saved up.
    pub burst: f64,
    /// Retransmits earned per first transmission.
    pub ratio: f64,
    /// Retransmits earned per second of time.
    pub per_second: f64,
    tokens: f64,
    last_refill: Option<Instant>,
}

impl Default for RetransmitBudget {
    fn default() -> Self {
        Self::new(1024.0, 0.5)
    }
}

impl RetransmitBudget {
    /// A full budget.
    #[must_use]
    pub fn new(burst: f64, ratio: f64) -> Self {
        Self {
            burst,
            ratio,
            per_second: burst,
            tokens: burst,
            last_refill: None,
        }
    }

    /// The same budget earning `per_second` retransmits per second of time.
    #[must_use]
    pub fn with_refill(mut self, per_second: f64) -> Self {
        self.per_second = per_second;
        self
    }

    /// Adds what time has earned since the last call.
    pub fn refill(&mut self, now: Instant) {
        if let Some(last) = self.last_refill {
            let earned = now.saturating_duration_since(last).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + earned).min(self.burst);
        }
        self.last_refill = Some(now);
    }

    /// Records a first transmission.
    pub fn on_first_send(&mut self) {
        self.tokens = (self.tokens + self.ratio).min(self.burst);
    }

    /// Takes one retransmit from the budget; false when it is spent.
    pub fn try_take(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Retransmits available now.
    #[must_use]
    pub fn available(&self) -> f64 {
        self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earns_with_time_up_to_the_burst() {
        let t0 = crate::tests_support::epoch();
        let mut b = RetransmitBudget::new(4.0, 0.0).with_refill(100.0);
        b.refill(t0);
        while b.try_take() {}
        b.refill(t0 + std::time::Duration::from_millis(25));
        assert!(
            b.try_take() && b.try_take() && !b.try_take(),
            "2.5 earned in 25 ms"
        );
        b.refill(t0 + std::time::Duration::from_secs(60));
        assert_eq!(b.available(), 4.0);
    }

    #[test]
    fn spends_burst_then_earns_by_ratio() {
        let mut b = RetransmitBudget::new(2.0, 0.5).with_refill(0.0);
        assert!(b.try_take() && b.try_take() && !b.try_take());
        b.on_first_send();
        assert!(!b.try_take());
        b.on_first_send();
        assert!(b.try_take());
        for _ in 0..100 {
            b.on_first_send();
        }
        assert_eq!(b.available(), 2.0);
    }
}
