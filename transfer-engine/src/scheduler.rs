//! Traffic shaping and the order in which sessions get to send: strict priority between traffic classes
//! with anti-starvation, a token bucket per class, and a cap on all KV traffic as a share of the link.

use std::time::{Duration, Instant};

use crate::bucket::{DEFAULT_CELL_BYTES, TokenBucket};
use crate::{Error, TrafficClass};

/// Shaping settings; all of them can be changed at run time with [`crate::Engine::set_shaping`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ShapingConfig {
    /// The link's bandwidth in bytes per second; `None` leaves KV unshaped.
    pub link_bytes_per_sec: Option<u64>,
    /// Largest share of the link that KV (urgent and bulk together) may take, leaving the rest for
    /// collectives (0.4 by default).
    pub kv_share: f64,
    /// Optional rate per class (bytes per second), indexed by [`TrafficClass::index`].
    pub class_rates: [Option<u64>; 3],
    /// Burst allowance of every bucket, in bytes (several times the largest unit).
    pub burst_bytes: u64,
    /// Metering cell, in bytes.
    pub cell_bytes: u64,
    /// Longest a lower class with data waits while higher classes send, before it gets one turn.
    pub max_starvation: Duration,
}

impl Default for ShapingConfig {
    fn default() -> Self {
        Self {
            link_bytes_per_sec: None,
            kv_share: 0.4,
            class_rates: [None; 3],
            burst_bytes: 16 << 20,
            cell_bytes: DEFAULT_CELL_BYTES,
            max_starvation: Duration::from_millis(5),
        }
    }
}

/// The shaping state: buckets, and since when each class has been waiting for a turn.
#[derive(Debug)]
pub(crate) struct Scheduler {
    cfg: ShapingConfig,
    kv: Option<TokenBucket>,
    classes: [Option<TokenBucket>; 3],
    /// Since when each class has been waiting for a turn.
    waiting_since: [Option<Instant>; 3],
}

impl Scheduler {
    pub(crate) fn new(cfg: ShapingConfig) -> Result<Self, Error> {
        if !(cfg.kv_share > 0.0 && cfg.kv_share <= 1.0) {
            return Err(Error::InvalidShaping(format!(
                "KV share {} must be in (0, 1]",
                cfg.kv_share
            )));
        }
        let bucket = |rate: u64| TokenBucket::new(rate, cfg.burst_bytes, cfg.cell_bytes);
        let kv = cfg
            .link_bytes_per_sec
            .map(|link| bucket((link as f64 * cfg.kv_share) as u64))
            .transpose()?;
        let mut classes = [None, None, None];
        for (slot, rate) in classes.iter_mut().zip(cfg.class_rates) {
            *slot = rate.map(bucket).transpose()?;
        }
        Ok(Self {
            cfg,
            kv,
            classes,
            waiting_since: [None; 3],
        })
    }

    pub(crate) fn config(&self) -> &ShapingConfig {
        &self.cfg
    }

    /// Classes in the order they should be offered a turn: any class starved for longer than the limit
    /// first (lowest priority first), then strict priority.
    pub(crate) fn order(&self, now: Instant) -> [TrafficClass; 3] {
        let starving = |c: TrafficClass| {
            self.waiting_since[c.index()]
                .is_some_and(|t| now.saturating_duration_since(t) > self.cfg.max_starvation)
        };
        let mut order = TrafficClass::ALL;
        order.sort_by_key(|c| {
            (
                !starving(*c),
                if starving(*c) {
                    usize::MAX - c.index()
                } else {
                    c.index()
                },
            )
        });
        order
    }

    /// `None` when `class` may send now, otherwise when it may.
    pub(crate) fn ready_at(&mut self, now: Instant, class: TrafficClass) -> Option<Instant> {
        let own = self.classes[class.index()]
            .as_mut()
            .and_then(|b| b.ready_at(now));
        let kv = if class == TrafficClass::Collective {
            None
        } else {
            self.kv.as_mut().and_then(|b| b.ready_at(now))
        };
        own.into_iter().chain(kv).max()
    }

    /// Records that `class` was offered a turn and had nothing to send: it is not starving.
    pub(crate) fn mark_idle(&mut self, class: TrafficClass) {
        self.waiting_since[class.index()] = None;
    }

    /// Records that `class` may have work waiting (since now, unless it was already waiting).
    pub(crate) fn mark_waiting(&mut self, now: Instant, class: TrafficClass) {
        self.waiting_since[class.index()].get_or_insert(now);
    }

    /// Charges `bytes` just sent in `class`, and gives the class a fresh turn.
    pub(crate) fn charge(&mut self, now: Instant, class: TrafficClass, bytes: u64) {
        if let Some(b) = self.classes[class.index()].as_mut() {
            b.charge(now, bytes);
        }
        if class != TrafficClass::Collective
            && let Some(b) = self.kv.as_mut()
        {
            b.charge(now, bytes);
        }
        self.waiting_since[class.index()] = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_priority_unless_a_class_starves() {
        let now = crate::tests_support::epoch();
        let mut s = Scheduler::new(ShapingConfig::default()).unwrap();
        assert_eq!(s.order(now), TrafficClass::ALL);
        s.mark_waiting(now, TrafficClass::BulkKv);
        assert_eq!(s.order(now + Duration::from_millis(1)), TrafficClass::ALL);
        let later = now + Duration::from_millis(6);
        assert_eq!(
            s.order(later)[0],
            TrafficClass::BulkKv,
            "bulk waited past the limit"
        );
        s.charge(later, TrafficClass::BulkKv, 100);
        assert_eq!(s.order(later), TrafficClass::ALL);
    }

    #[test]
    fn kv_is_capped_at_its_share_of_the_link_and_collectives_are_not() {
        let now = crate::tests_support::epoch();
        let cfg = ShapingConfig {
            link_bytes_per_sec: Some(1_000_000_000),
            burst_bytes: 1 << 20,
            ..Default::default()
        };
        let mut s = Scheduler::new(cfg).unwrap();
        s.charge(now, TrafficClass::BulkKv, 4 << 20);
        let at = s
            .ready_at(now, TrafficClass::UrgentKv)
            .expect("the KV cap binds urgent KV too");
        // 3 MiB of debt at 400 MB/s: about 7.9 ms.
        let wait = (at - now).as_secs_f64();
        assert!((wait - 3.0 * 1048576.0 / 4e8).abs() < 2e-4, "{wait}");
        assert_eq!(s.ready_at(now, TrafficClass::Collective), None);
        assert!(
            Scheduler::new(ShapingConfig {
                kv_share: 0.0,
                ..Default::default()
            })
            .is_err()
        );
    }
}
