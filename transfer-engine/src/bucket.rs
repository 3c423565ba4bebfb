//! A token bucket for bytes, on the `governor` crate's GCRA with an injected clock.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::clock::FakeRelativeClock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::Error;

/// Default metering cell: 64 KiB. Whole cells keep the limiter's arithmetic exact at 25 GB/s and above.
pub const DEFAULT_CELL_BYTES: u64 = 64 << 10;

/// Meters bytes at `rate` bytes per second with bursts of up to `burst` bytes. Time is passed in.
///
/// Bytes are charged after they are sent: a send may leave the bucket in debt (at most one unit's worth),
/// and the bucket is not ready again until the debt is repaid. Fractions of a cell are carried over, so
/// the long-run rate is exact whatever the unit sizes.
pub struct TokenBucket {
    limiter: RateLimiter<NotKeyed, InMemoryState, FakeRelativeClock, NoOpMiddleware<Nanos>>,
    clock: FakeRelativeClock,
    epoch: Option<Instant>,
    elapsed: Duration,
    cell_bytes: u64,
    burst_cells: u32,
    rate: u64,
    /// Bytes paid for but not yet sent (positive) or sent but not yet paid for (negative).
    credit: i64,
}

impl std::fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenBucket")
            .field("rate", &self.rate)
            .field(
                "burst_bytes",
                &(u64::from(self.burst_cells) * self.cell_bytes),
            )
            .field("credit", &self.credit)
            .finish()
    }
}

impl TokenBucket {
    /// A full bucket of `burst` bytes refilled at `rate` bytes per second, metered in `cell_bytes` cells.
    pub fn new(rate: u64, burst: u64, cell_bytes: u64) -> Result<Self, Error> {
        let (limiter, burst_cells) = Self::limiter(rate, burst, cell_bytes)?;
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::direct_with_clock(limiter, clock.clone());
        Ok(Self {
            limiter,
            clock,
            epoch: None,
            elapsed: Duration::ZERO,
            cell_bytes,
            burst_cells,
            rate,
            credit: 0,
        })
    }

    fn limiter(rate: u64, burst: u64, cell_bytes: u64) -> Result<(Quota, u32), Error> {
        let invalid = |what: String| Error::InvalidShaping(format!("token bucket: {what}"));
        if rate == 0 || cell_bytes == 0 {
            return Err(invalid(format!(
                "rate {rate} B/s and cell {cell_bytes} B must be positive"
            )));
        }
        let burst_cells = u32::try_from(burst.div_ceil(cell_bytes).max(1))
            .map_err(|_| invalid(format!("burst of {burst} bytes is too many cells")))?;
        let period = Duration::from_secs_f64(cell_bytes as f64 / rate as f64);
        let quota = Quota::with_period(period)
            .ok_or_else(|| {
                invalid(format!(
                    "{rate} B/s is too fast for {cell_bytes}-byte cells: use larger cells"
                ))
            })?
            .allow_burst(NonZeroU32::new(burst_cells).expect("at least one cell"));
        Ok((quota, burst_cells))
    }

    /// Changes rate and burst at run time; the bucket starts full at the new setting.
    pub fn reconfigure(&mut self, rate: u64, burst: u64) -> Result<(), Error> {
        let (quota, burst_cells) = Self::limiter(rate, burst, self.cell_bytes)?;
        self.limiter = RateLimiter::direct_with_clock(quota, self.clock.clone());
        self.burst_cells = burst_cells;
        self.rate = rate;
        self.credit = self.credit.min(0);
        Ok(())
    }

    /// The configured rate, bytes per second.
    #[must_use]
    pub fn rate(&self) -> u64 {
        self.rate
    }

    fn sync(&mut self, now: Instant) {
        let epoch = *self.epoch.get_or_insert(now);
        let elapsed = now.saturating_duration_since(epoch);
        if elapsed > self.elapsed {
            self.clock.advance(elapsed - self.elapsed);
            self.elapsed = elapsed;
        }
    }

    /// Takes up to `cells` whole cells if the limiter allows them now; `Err(when)` says when it will.
    fn take_cells(&mut self, cells: u64) -> Result<(), Instant> {
        let n = NonZeroU32::new(cells.min(u64::from(self.burst_cells)) as u32)
            .expect("at least one cell");
        match self.limiter.check_n(n) {
            Ok(Ok(())) => {
                self.credit += (u64::from(n.get()) * self.cell_bytes) as i64;
                Ok(())
            }
            Ok(Err(not_until)) => {
                let at = Duration::from_nanos(not_until.earliest_possible().as_u64());
                Err(self.epoch.expect("synced") + at)
            }
            Err(_) => unreachable!("never more cells than the burst"),
        }
    }

    /// `None` when bytes may be sent now; otherwise the earliest time they may.
    pub fn ready_at(&mut self, now: Instant) -> Option<Instant> {
        self.sync(now);
        while self.credit < 0 {
            let cells = self.credit.unsigned_abs().div_ceil(self.cell_bytes);
            if let Err(at) = self.take_cells(cells) {
                // Debt beyond one burst is repaid a burst at a time: add the time the rest takes.
                let rest = cells.saturating_sub(u64::from(self.burst_cells));
                let rest =
                    Duration::from_secs_f64((rest * self.cell_bytes) as f64 / self.rate as f64);
                return Some(at.max(now + Duration::from_nanos(1)) + rest);
            }
        }
        None
    }

    /// Charges `bytes` just sent.
    pub fn charge(&mut self, now: Instant, bytes: u64) {
        self.sync(now);
        self.credit -= bytes as i64;
        if self.credit < 0 {
            let cells = self.credit.unsigned_abs().div_ceil(self.cell_bytes);
            let _ = self.take_cells(cells);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `unit` bytes whenever the bucket allows over `seconds` of hand-stepped time; returns B/s.
    fn achieved(rate: u64, unit: u64, seconds: f64) -> f64 {
        let mut bucket =
            TokenBucket::new(rate, 16 * unit.max(DEFAULT_CELL_BYTES), DEFAULT_CELL_BYTES).unwrap();
        let start = crate::tests_support::epoch();
        // Long enough for a few hundred units, so one unit more or less is well under the tolerance.
        let seconds = seconds.max(300.0 * unit as f64 / rate as f64);
        let end = start + Duration::from_secs_f64(seconds);
        let mut now = start;
        let mut sent = 0u64;
        // Drain the initial burst first, so the figure is the sustained rate.
        while bucket.ready_at(now).is_none() {
            bucket.charge(now, unit);
        }
        let measure_from = now;
        while now < end {
            match bucket.ready_at(now) {
                None => {
                    bucket.charge(now, unit);
                    sent += unit;
                }
                Some(at) => now = at,
            }
        }
        sent as f64 / (now - measure_from).as_secs_f64()
    }

    #[test]
    fn sustained_rate_is_within_two_percent_from_100_mb_to_25_gb_per_second() {
        for rate in [
            100_000_000u64,
            1_000_000_000,
            10_000_000_000,
            25_000_000_000,
        ] {
            for unit in [4096u64, 65536, 1 << 20] {
                let got = achieved(rate, unit, 0.05);
                let err = (got - rate as f64).abs() / rate as f64;
                assert!(
                    err < 0.02,
                    "rate {rate} unit {unit}: achieved {got:.0} ({:.2}% off)",
                    err * 100.0
                );
            }
        }
    }

    #[test]
    fn burst_then_wait_then_reconfigure() {
        let now = crate::tests_support::epoch();
        let mut b = TokenBucket::new(1 << 20, 4 << 20, 1 << 20).unwrap();
        // Four units of burst, and a fifth on credit: bytes are charged after they are sent.
        for _ in 0..5 {
            assert_eq!(b.ready_at(now), None);
            b.charge(now, 1 << 20);
        }
        let at = b.ready_at(now).expect("burst spent");
        assert!(
            at - now >= Duration::from_millis(990) && at - now <= Duration::from_millis(1010),
            "{:?}",
            at - now
        );
        assert_eq!(b.ready_at(at), None);
        b.reconfigure(8 << 20, 8 << 20).unwrap();
        assert_eq!(b.rate(), 8 << 20);
        assert!(TokenBucket::new(0, 1, 1).is_err());
    }

    #[test]
    fn a_unit_larger_than_the_burst_goes_into_debt_and_waits_it_off() {
        let now = crate::tests_support::epoch();
        let mut b = TokenBucket::new(1_000_000, 65536, 65536).unwrap();
        assert_eq!(b.ready_at(now), None);
        b.charge(now, 10 * 65536);
        let at = b.ready_at(now).unwrap();
        let wait = at - now;
        assert!(wait >= Duration::from_millis(500), "{wait:?}");
    }
}
