//! Egress queue disciplines of a link: one FIFO queue, or strict priority by traffic class with
//! anti-starvation.
//!
//! The FIFO discipline is the link's original model (a `busy_until` clock: a packet's departure is known
//! when it is queued). Strict priority needs a real queue per class: a packet's departure depends on what
//! arrives after it. [`PriorityQueue`] serves frames as `mtu`-byte segments, the way a NIC with traffic
//! classes interleaves its queues packet by packet: a collective segment goes before the next segment of a
//! 4 MiB KV frame already on the wire, so a high class waits at most one segment of a lower one.

use std::collections::VecDeque;
use std::time::Duration;

use transfer_engine::TrafficClass;

/// How a link orders the packets waiting for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueDiscipline {
    /// One queue, first in first out, whatever the class: `queue_bytes` shared by every class (a plain
    /// NIC send queue). The default.
    #[default]
    Fifo,
    /// One queue of `queue_bytes` per [`TrafficClass`], served in strict priority (collective first) one
    /// `mtu`-byte segment at a time; a frame departs when its last segment does. A lower class that has
    /// had data waiting for `max_starvation` while higher classes sent gets one turn: its head frame,
    /// whole.
    Priority {
        /// Segment size, in bytes: the granularity at which a higher class overtakes a lower one.
        mtu: u32,
        /// Longest a lower class with data waits before it gets one turn.
        max_starvation: Duration,
    },
}

impl QueueDiscipline {
    /// Strict priority with RoCE's 4 KiB MTU and the engine's default starvation limit (5 ms).
    #[must_use]
    pub fn priority() -> Self {
        QueueDiscipline::Priority {
            mtu: 4096,
            max_starvation: Duration::from_millis(5),
        }
    }
}

/// What a priority queue says to a packet offered to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enqueue {
    /// Queued; its departure is reported by [`PriorityQueue::advance`].
    Queued,
    /// Its class's queue is full; try again at `retry_at` (the queue's next event).
    Full { retry_at: Duration },
    /// Larger than a whole class queue: it can never fit.
    TooLarge,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u64,
    remaining: u64,
}

/// Strict priority by class at segment granularity, with anti-starvation.
///
/// Time is kept as nanoseconds x bandwidth (`u128`), so serializing any number of segments of any size
/// accumulates no rounding.
#[derive(Debug, Clone)]
pub(crate) struct PriorityQueue {
    mtu: u64,
    max_starvation: Duration,
    bandwidth: u64,
    queue_bytes: u64,
    /// When the next segment may start (scaled time).
    clock: u128,
    queues: [VecDeque<Entry>; 3],
    queued_bytes: [u64; 3],
    /// Since when each class has had data waiting while a higher class was served.
    waiting_since: [Option<Duration>; 3],
    /// A starving class in the middle of its turn (its head frame goes out whole).
    turn: Option<usize>,
}

impl PriorityQueue {
    pub(crate) fn new(
        mtu: u32,
        max_starvation: Duration,
        bandwidth: u64,
        queue_bytes: u64,
    ) -> Self {
        Self {
            mtu: u64::from(mtu.max(1)),
            max_starvation,
            bandwidth: bandwidth.max(1),
            queue_bytes,
            clock: 0,
            queues: Default::default(),
            queued_bytes: [0; 3],
            waiting_since: [None; 3],
            turn: None,
        }
    }

    fn scaled(&self, t: Duration) -> u128 {
        t.as_nanos() * u128::from(self.bandwidth)
    }

    /// Scaled time to `Duration`, rounded up (a departure is never reported before its last bit).
    fn unscaled(&self, c: u128) -> Duration {
        let ns = c.div_ceil(u128::from(self.bandwidth));
        Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
    }

    /// Bytes waiting (all classes), the partly sent head frames' remainders included.
    pub(crate) fn backlog(&self) -> u64 {
        self.queued_bytes.iter().sum()
    }

    fn is_empty(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
    }

    /// The class served at `at`, and whether it is a starvation turn.
    fn choose(&self, at: Duration) -> Option<(usize, bool)> {
        if let Some(c) = self.turn {
            return Some((c, true));
        }
        let starving = (0..3).rev().find(|&c| {
            !self.queues[c].is_empty()
                && self.waiting_since[c]
                    .is_some_and(|s| at.saturating_sub(s) >= self.max_starvation)
        });
        if let Some(c) = starving {
            return Some((c, true));
        }
        (0..3)
            .find(|&c| !self.queues[c].is_empty())
            .map(|c| (c, false))
    }

    /// The earliest starvation deadline of a class below `class` with data waiting (now, if it has no
    /// mark yet: it gets one when the next segment is chosen).
    fn next_deadline(&self, class: usize, at: Duration) -> Option<Duration> {
        (class + 1..3)
            .filter(|&c| !self.queues[c].is_empty())
            .map(|c| self.waiting_since[c].unwrap_or(at) + self.max_starvation)
            .min()
    }

    /// Serves every segment that starts before `now`; returns the frames that finished, with the time
    /// their last bit left. Segments starting at `now` or later wait: a packet arriving at `now` may
    /// still overtake them.
    pub(crate) fn advance(&mut self, now: Duration) -> Vec<(u64, Duration)> {
        let now_c = self.scaled(now);
        let mut done = Vec::new();
        while self.clock < now_c {
            let at = self.unscaled(self.clock);
            let Some((class, turn)) = self.choose(at) else {
                self.clock = now_c;
                break;
            };
            if turn {
                self.turn = Some(class);
            }
            for lower in class + 1..3 {
                if !self.queues[lower].is_empty() {
                    self.waiting_since[lower].get_or_insert(at);
                }
            }
            self.waiting_since[class] = None;
            // Serve whole segments up to the next point where the choice could change: `now` (an
            // arrival), or a lower class's starvation deadline (not during a turn).
            let mut limit = now_c;
            if !turn && let Some(d) = self.next_deadline(class, at) {
                limit = limit.min(self.scaled(d));
            }
            let seg = u128::from(self.mtu) * 1_000_000_000;
            let segments = limit.saturating_sub(self.clock).div_ceil(seg).max(1);
            let head = self.queues[class]
                .front_mut()
                .expect("chosen class has data");
            let bytes = (segments * u128::from(self.mtu)).min(u128::from(head.remaining)) as u64;
            head.remaining -= bytes;
            self.queued_bytes[class] -= bytes;
            self.clock += u128::from(bytes) * 1_000_000_000;
            if head.remaining == 0 {
                let id = head.id;
                self.queues[class].pop_front();
                done.push((id, self.unscaled(self.clock)));
                if self.turn == Some(class) {
                    self.turn = None;
                }
            }
        }
        done
    }

    /// When the queue next needs [`PriorityQueue::advance`] if nothing arrives: the head frame's
    /// departure, or a starvation deadline that changes the order. Call after `advance(now)`.
    pub(crate) fn next_event(&self) -> Option<Duration> {
        if self.is_empty() {
            return None;
        }
        let at = self.unscaled(self.clock);
        let (class, turn) = self.choose(at)?;
        let head = self.queues[class].front()?;
        let done = self.unscaled(self.clock + u128::from(head.remaining) * 1_000_000_000);
        let deadline = if turn {
            None
        } else {
            self.next_deadline(class, at)
        };
        Some(deadline.map_or(done, |d| d.min(done)))
    }

    /// Offers frame `id` of `len` bytes in `class` at `now` (after `advance(now)`).
    pub(crate) fn enqueue(
        &mut self,
        now: Duration,
        id: u64,
        len: u64,
        class: TrafficClass,
    ) -> Enqueue {
        let c = class.index();
        if len > self.queue_bytes {
            return Enqueue::TooLarge;
        }
        if self.queued_bytes[c] + len > self.queue_bytes {
            let retry_at = self
                .next_event()
                .unwrap_or(now)
                .max(now + Duration::from_nanos(1));
            return Enqueue::Full { retry_at };
        }
        if self.is_empty() {
            self.clock = self.clock.max(self.scaled(now));
        }
        self.queues[c].push_back(Entry { id, remaining: len });
        self.queued_bytes[c] += len;
        Enqueue::Queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: fn(u64) -> Duration = Duration::from_micros;

    /// 1 GB/s (1 byte a nanosecond), 1000-byte segments, 1 ms starvation limit, 1 MB per class.
    fn queue() -> PriorityQueue {
        PriorityQueue::new(1000, Duration::from_millis(1), 1_000_000_000, 1_000_000)
    }

    /// Runs the queue to `until`, following its own events.
    fn drain(q: &mut PriorityQueue, until: Duration) -> Vec<(u64, Duration)> {
        let mut out = Vec::new();
        while let Some(t) = q.next_event().filter(|t| *t <= until) {
            out.extend(q.advance(t));
        }
        out
    }

    #[test]
    fn a_higher_class_overtakes_a_lower_frame_at_the_next_segment() {
        let mut q = queue();
        assert_eq!(
            q.enqueue(US(0), 1, 10_000, TrafficClass::BulkKv),
            Enqueue::Queued
        );
        assert_eq!(q.next_event(), Some(US(10)));
        // 2.5 us in, a collective frame arrives: it starts after the third segment (3 us).
        assert!(q.advance(Duration::from_nanos(2500)).is_empty());
        q.enqueue(
            Duration::from_nanos(2500),
            2,
            2000,
            TrafficClass::Collective,
        );
        let out = drain(&mut q, US(100));
        assert_eq!(out, vec![(2, US(5)), (1, US(12))]);
    }

    #[test]
    fn same_class_is_first_in_first_out_and_idle_time_is_not_served() {
        let mut q = queue();
        q.enqueue(US(0), 1, 1500, TrafficClass::UrgentKv);
        q.enqueue(US(0), 2, 500, TrafficClass::UrgentKv);
        assert_eq!(
            drain(&mut q, US(10)),
            vec![(1, Duration::from_nanos(1500)), (2, US(2))]
        );
        assert!(q.advance(US(50)).is_empty());
        q.enqueue(US(50), 3, 1000, TrafficClass::BulkKv);
        assert_eq!(drain(&mut q, US(100)), vec![(3, US(51))]);
    }

    #[test]
    fn a_starving_class_gets_one_whole_frame_per_limit() {
        let mut q = queue();
        q.enqueue(US(0), 100, 5000, TrafficClass::BulkKv);
        q.enqueue(US(0), 101, 5000, TrafficClass::BulkKv);
        // Collective load that never lets up: 10 us frames back to back for 3 ms.
        let mut out = Vec::new();
        let mut id = 1000;
        let mut t = US(0);
        while t < US(3000) {
            out.extend(q.advance(t));
            if q.queued_bytes[0] < 20_000 {
                q.enqueue(t, id, 10_000, TrafficClass::Collective);
                id += 1;
            }
            t = q.next_event().unwrap().min(t + US(5));
        }
        let bulk: Vec<_> = out.iter().filter(|(id, _)| *id < 1000).collect();
        assert_eq!(bulk.len(), 2, "{bulk:?}");
        // The first turn comes at the limit (1 ms, at a segment boundary), and takes 5 us.
        assert_eq!(bulk[0].1, US(1005));
        assert_eq!(bulk[1].1, US(2010));
    }

    #[test]
    fn a_full_class_queue_refuses_but_other_classes_have_their_own() {
        let mut q = PriorityQueue::new(1000, Duration::from_millis(1), 1_000_000_000, 4000);
        assert_eq!(
            q.enqueue(US(0), 1, 4000, TrafficClass::BulkKv),
            Enqueue::Queued
        );
        assert_eq!(
            q.enqueue(US(0), 2, 1000, TrafficClass::BulkKv),
            Enqueue::Full { retry_at: US(4) }
        );
        assert_eq!(
            q.enqueue(US(0), 3, 4000, TrafficClass::Collective),
            Enqueue::Queued
        );
        assert_eq!(
            q.enqueue(US(0), 4, 4001, TrafficClass::Collective),
            Enqueue::TooLarge
        );
        assert_eq!(q.backlog(), 8000);
    }
}
