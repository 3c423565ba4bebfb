//! Round-trip time estimation (RFC 6298), so retransmit timers follow the path instead of a constant.

use std::time::Duration;

/// Smoothed round-trip time and its variation, from samples of units acknowledged on their first send
/// (Karn's rule: a resent unit's ack could belong to either send, so it gives no sample).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
}

impl RttEstimator {
    /// Adds one sample.
    pub(crate) fn on_sample(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let delta = srtt.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + delta) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
    }

    /// The retransmit timeout: `srtt + 4 * rttvar`, never below `floor` (also the value before any sample).
    pub(crate) fn rto(&self, floor: Duration) -> Duration {
        self.srtt
            .map_or(floor, |srtt| (srtt + self.rttvar * 4).max(floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_samples_and_respects_the_floor() {
        let mut r = RttEstimator::default();
        let ms = Duration::from_millis;
        assert_eq!(r.rto(ms(5)), ms(5));
        r.on_sample(ms(20));
        assert_eq!(r.rto(ms(5)), ms(20) + ms(40));
        for _ in 0..50 {
            r.on_sample(ms(20));
        }
        assert!(r.rto(ms(5)) < ms(21), "{:?}", r.rto(ms(5)));
        assert_eq!(r.rto(ms(30)), ms(30));
    }
}
