//! The engine-wide retransmit budget: the storm guard.

/// Retransmits allowed across all sessions: `burst` to start with, plus `ratio` for every first
/// transmission, never more than `burst` saved up. When it is empty a slice that needs resending waits
/// (its last copy may still be acknowledged) instead of going out again, and the session deadline hands
/// its blocks back for recompute if nothing arrives: loss can never snowball into a storm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetransmitBudget {
    /// Retransmits allowed with no first transmissions to earn them, and the most saved up.
    pub burst: f64,
    /// Retransmits earned per first transmission.
    pub ratio: f64,
    tokens: f64,
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
            tokens: burst,
        }
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
    fn spends_burst_then_earns_by_ratio() {
        let mut b = RetransmitBudget::new(2.0, 0.5);
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
