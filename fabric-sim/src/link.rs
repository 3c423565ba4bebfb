//! A one-way link: bandwidth, propagation delay and a bounded queue with tail drop, served FIFO (the
//! default) or in strict priority by traffic class ([`QueueDiscipline`]).

use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use transfer_engine::TrafficClass;

use crate::fault::{FaultRule, PacketInfo, Verdict, judge};
use crate::qdisc::{Enqueue, PriorityQueue, QueueDiscipline};

/// How a link behaves before any fault rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkConfig {
    /// Serialization rate, in bytes per second (must be non-zero).
    pub bandwidth: u64,
    /// One-way propagation delay.
    pub delay: Duration,
    /// Most bytes waiting to be serialized; a packet that would overflow it is refused (or, if it can
    /// never fit, tail dropped).
    pub queue_bytes: u64,
}

impl Default for LinkConfig {
    /// A data-centre link: 100 Gb/s (12.5 GB/s), 5 us one way, 4 MiB of queue.
    fn default() -> Self {
        Self {
            bandwidth: 12_500_000_000,
            delay: Duration::from_micros(5),
            queue_bytes: 4 << 20,
        }
    }
}

/// What the link says to a packet offered to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Queued: it finishes serializing at `done` and arrives at `arrives` (before faults).
    Queued {
        /// When its last bit leaves.
        done: Duration,
        /// When its last bit arrives, before any fault delays it.
        arrives: Duration,
    },
    /// The queue is full now; it has room for this packet at `retry_at`. A backpressured sender holds
    /// the packet and tries again then; traffic that does not wait is lost ([`LinkStats::tail_drops`]).
    Full {
        /// When the packet would fit.
        retry_at: Duration,
    },
    /// Larger than the whole queue: it can never fit and is tail dropped.
    TooLarge,
}

/// Counters of one link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LinkStats {
    /// Packets put on the link.
    pub packets: u64,
    /// Bytes put on the link.
    pub bytes: u64,
    /// Packets lost to a full queue (or too large for it).
    pub tail_drops: u64,
    /// Packets lost by a fault rule (loss, burst loss, partition).
    pub fault_drops: u64,
    /// Packets delivered with a flipped bit.
    pub corrupted: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Packets delivered late by a fault rule (jitter, reordering).
    pub delayed: u64,
}

/// One way between two nodes.
#[derive(Debug, Clone)]
pub struct Link {
    cfg: LinkConfig,
    busy_until: Duration,
    faults: Vec<FaultRule>,
    rng: ChaCha8Rng,
    stats: LinkStats,
    discipline: QueueDiscipline,
    priority: Option<PriorityQueue>,
    /// The pending wake-up of a priority queue: (when, generation); older generations are stale.
    pub(crate) tick: Option<(Duration, u64)>,
}

impl Link {
    /// A link with no faults; `rng` drives its fault rules.
    #[must_use]
    pub fn new(cfg: LinkConfig, rng: ChaCha8Rng) -> Self {
        Self {
            cfg,
            busy_until: Duration::ZERO,
            faults: Vec::new(),
            rng,
            stats: LinkStats::default(),
            discipline: QueueDiscipline::Fifo,
            priority: None,
            tick: None,
        }
    }

    /// The queue discipline.
    #[must_use]
    pub fn discipline(&self) -> QueueDiscipline {
        self.discipline
    }

    /// Sets the queue discipline. Set it before any packet is queued: packets already waiting in the
    /// old discipline's queue are forgotten.
    pub fn set_discipline(&mut self, discipline: QueueDiscipline) {
        self.discipline = discipline;
        self.priority = match discipline {
            QueueDiscipline::Fifo => None,
            QueueDiscipline::Priority {
                mtu,
                max_starvation,
            } => Some(PriorityQueue::new(
                mtu,
                max_starvation,
                self.cfg.bandwidth,
                self.cfg.queue_bytes,
            )),
        };
        self.tick = None;
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    /// The fault rules, in the order they apply.
    #[must_use]
    pub fn faults(&self) -> &[FaultRule] {
        &self.faults
    }

    /// Appends a fault rule (it applies after the ones already there).
    pub fn add_fault(&mut self, rule: FaultRule) {
        self.faults.push(rule);
    }

    /// Removes every fault rule.
    pub fn clear_faults(&mut self) {
        self.faults.clear();
    }

    /// Bytes waiting to be serialized at `now` (under strict priority: every class's, as of the last time
    /// the queue was advanced).
    #[must_use]
    pub fn backlog(&self, now: Duration) -> u64 {
        if let Some(q) = &self.priority {
            return q.backlog();
        }
        let busy = self.busy_until.saturating_sub(now);
        (busy.as_nanos() * u128::from(self.cfg.bandwidth.max(1)) / 1_000_000_000) as u64
    }

    /// Time to serialize `len` bytes.
    #[must_use]
    pub fn serialization(&self, len: u64) -> Duration {
        let nanos = u128::from(len) * 1_000_000_000 / u128::from(self.cfg.bandwidth.max(1));
        Duration::from_nanos(nanos.min(u128::from(u64::MAX)) as u64)
    }

    /// Offers a packet of `len` bytes at `now` to the FIFO queue (whatever the discipline: the simulator
    /// routes packets of a priority link through its class queues instead). Nothing changes unless it is
    /// [`Offer::Queued`].
    pub fn offer(&mut self, now: Duration, len: u64) -> Offer {
        if len > self.cfg.queue_bytes {
            self.stats.tail_drops += 1;
            return Offer::TooLarge;
        }
        let backlog = self.backlog(now);
        if backlog + len > self.cfg.queue_bytes {
            let room = self.serialization(self.cfg.queue_bytes - len);
            let retry_at = self.busy_until.saturating_sub(room).max(now);
            // Rounding can leave a nanosecond's worth of bytes: never ask to retry at `now`.
            return Offer::Full {
                retry_at: retry_at.max(now + Duration::from_nanos(1)),
            };
        }
        let done = self.busy_until.max(now) + self.serialization(len);
        self.busy_until = done;
        self.stats.packets += 1;
        self.stats.bytes += len;
        Offer::Queued {
            done,
            arrives: done + self.cfg.delay,
        }
    }

    /// Serves a priority link's queue up to `now`: the ids of frames that finished, and when their last
    /// bit left. A FIFO link has nothing to serve.
    pub(crate) fn advance(&mut self, now: Duration) -> Vec<(u64, Duration)> {
        self.priority
            .as_mut()
            .map(|q| q.advance(now))
            .unwrap_or_default()
    }

    /// When a priority link's queue next needs [`Link::advance`].
    pub(crate) fn next_event(&self) -> Option<Duration> {
        self.priority.as_ref().and_then(PriorityQueue::next_event)
    }

    /// Whether packets go through class queues rather than [`Link::offer`].
    pub(crate) fn is_priority(&self) -> bool {
        self.priority.is_some()
    }

    /// Queues frame `id` in its class's queue (priority links; call [`Link::advance`] first).
    pub(crate) fn enqueue(
        &mut self,
        now: Duration,
        id: u64,
        len: u64,
        class: TrafficClass,
    ) -> Enqueue {
        let Some(q) = self.priority.as_mut() else {
            return Enqueue::TooLarge;
        };
        let verdict = q.enqueue(now, id, len, class);
        match verdict {
            Enqueue::Queued => {
                self.stats.packets += 1;
                self.stats.bytes += len;
            }
            Enqueue::TooLarge => self.stats.tail_drops += 1,
            Enqueue::Full { .. } => {}
        }
        verdict
    }

    /// Records a packet that was lost because the queue was full and its sender does not wait.
    pub fn tail_drop(&mut self) {
        self.stats.tail_drops += 1;
    }

    /// Runs the fault rules on a queued packet and counts the outcome.
    pub fn judge(&mut self, packet: &PacketInfo) -> Verdict {
        let verdict = judge(&mut self.faults, packet, &mut self.rng);
        match verdict {
            Verdict::Pass => {}
            Verdict::Deliver(_) => self.stats.delayed += 1,
            Verdict::Drop => self.stats.fault_drops += 1,
            Verdict::Corrupt { .. } => self.stats.corrupted += 1,
            Verdict::Duplicate(_) => self.stats.duplicated += 1,
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn link(queue: u64) -> Link {
        let cfg = LinkConfig {
            bandwidth: 1_000_000_000,
            delay: Duration::from_micros(10),
            queue_bytes: queue,
        };
        Link::new(cfg, ChaCha8Rng::seed_from_u64(0))
    }

    #[test]
    fn serializes_at_bandwidth_then_propagates() {
        let mut l = link(10_000);
        let us = Duration::from_micros;
        assert_eq!(
            l.offer(Duration::ZERO, 1000),
            Offer::Queued {
                done: us(1),
                arrives: us(11)
            }
        );
        assert_eq!(
            l.offer(Duration::ZERO, 1000),
            Offer::Queued {
                done: us(2),
                arrives: us(12)
            }
        );
        assert_eq!(l.backlog(Duration::ZERO), 2000);
        assert_eq!(l.backlog(us(1)), 1000);
        assert_eq!(l.backlog(us(5)), 0);
    }

    #[test]
    fn a_full_queue_says_when_there_is_room_and_oversized_packets_are_dropped() {
        let mut l = link(3000);
        for _ in 0..3 {
            assert!(matches!(
                l.offer(Duration::ZERO, 1000),
                Offer::Queued { .. }
            ));
        }
        let Offer::Full { retry_at } = l.offer(Duration::ZERO, 1000) else {
            panic!("queue of 3000 bytes holds three packets of 1000");
        };
        assert_eq!(retry_at, Duration::from_micros(1));
        assert!(matches!(l.offer(retry_at, 1000), Offer::Queued { .. }));
        assert_eq!(l.offer(retry_at, 3001), Offer::TooLarge);
        assert_eq!(l.stats().tail_drops, 1);
    }
}
