//! A periodic, latency-sensitive collective flow (a tensor-parallel all-reduce, say) sharing a link with KV,
//! and the latency of each of its operations.
//!
//! Every `period` the flow issues one operation of `op_bytes`, cut into packets of `packet_bytes` in class
//! [`transfer_engine::TrafficClass::Collective`]. Unlike [`crate::CrossTraffic`] it never drops: a
//! collective runs over a reliable transport, so a packet that finds its queue full waits at the sender
//! (backpressure), in order. An operation's latency runs from its issue to the arrival of its last packet
//! at the peer. Collective packets bypass fault rules and node crashes: they model traffic of other
//! processes on the same hosts, measured, not judged.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::NodeId;

/// A periodic collective flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveFlow {
    /// Bytes of one operation.
    pub op_bytes: u64,
    /// Bytes per packet (the last packet of an operation may be shorter).
    pub packet_bytes: u64,
    /// Time between the issues of two operations.
    pub period: Duration,
    /// When the first operation is issued (virtual time since the epoch).
    pub start: Duration,
    /// Operations issued in all.
    pub ops: u64,
}

impl CollectiveFlow {
    /// A decode-time tensor-parallel all-reduce: 256 KiB (hidden 4096 x batch 32 x 2 bytes) every 500 us
    /// (two all-reduces per layer, 32 layers, a 32 ms decode step), in 64 KiB packets, from time zero.
    #[must_use]
    pub fn all_reduce(ops: u64) -> Self {
        Self {
            op_bytes: 256 << 10,
            packet_bytes: 64 << 10,
            period: Duration::from_micros(500),
            start: Duration::ZERO,
            ops,
        }
    }

    /// Offered load, in bytes per second.
    #[must_use]
    pub fn rate(&self) -> f64 {
        self.op_bytes as f64 / self.period.as_secs_f64().max(1e-12)
    }
}

/// Names a collective flow of a [`crate::Sim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CollectiveId(pub usize);

/// One finished operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveOp {
    /// When it was issued (virtual time since the epoch).
    pub issued: Duration,
    /// From issue to the arrival of its last packet.
    pub latency: Duration,
}

/// What a collective flow measured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectiveStats {
    /// Operations issued so far.
    pub issued: u64,
    /// Finished operations, in the order they finished.
    pub done: Vec<CollectiveOp>,
}

impl CollectiveStats {
    /// Latencies of the finished operations issued within `window`, sorted.
    #[must_use]
    pub fn latencies(&self, window: std::ops::Range<Duration>) -> Vec<Duration> {
        let mut l: Vec<Duration> = self
            .done
            .iter()
            .filter(|op| window.contains(&op.issued))
            .map(|op| op.latency)
            .collect();
        l.sort();
        l
    }
}

/// The value at quantile `q` (0..=1, nearest rank) of sorted `samples`.
#[must_use]
pub fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    let last = sorted.len().checked_sub(1)?;
    let rank = ((last as f64) * q.clamp(0.0, 1.0)).round() as usize;
    sorted.get(rank).copied()
}

/// A flow inside the simulation: its backlog of packets and its operations in flight.
#[derive(Debug, Clone)]
pub(crate) struct FlowState {
    pub(crate) from: NodeId,
    pub(crate) to: NodeId,
    pub(crate) flow: CollectiveFlow,
    /// Packets not yet accepted by the link: (operation, bytes).
    pub(crate) backlog: VecDeque<(u64, u64)>,
    /// A wake-up is scheduled (the link was full).
    pub(crate) waiting: bool,
    /// Operations in flight: issue time and packets still to arrive.
    open: BTreeMap<u64, (Duration, u64)>,
    pub(crate) stats: CollectiveStats,
}

impl FlowState {
    pub(crate) fn new(from: NodeId, to: NodeId, flow: CollectiveFlow) -> Self {
        Self {
            from,
            to,
            flow,
            backlog: VecDeque::new(),
            waiting: false,
            open: BTreeMap::new(),
            stats: CollectiveStats::default(),
        }
    }

    /// Issues the next operation at `now`; returns when the one after it is due, if any.
    pub(crate) fn issue(&mut self, now: Duration) -> Option<Duration> {
        let op = self.stats.issued;
        self.stats.issued += 1;
        let packet = self.flow.packet_bytes.max(1);
        let mut left = self.flow.op_bytes.max(1);
        let mut packets = 0;
        while left > 0 {
            let len = left.min(packet);
            self.backlog.push_back((op, len));
            left -= len;
            packets += 1;
        }
        self.open.insert(op, (now, packets));
        (self.stats.issued < self.flow.ops).then(|| now + self.flow.period)
    }

    /// A packet of operation `op` arrived at `now`.
    pub(crate) fn arrived(&mut self, op: u64, now: Duration) {
        let Some((issued, left)) = self.open.get_mut(&op) else {
            return;
        };
        *left -= 1;
        if *left == 0 {
            let issued = *issued;
            self.open.remove(&op);
            self.stats.done.push(CollectiveOp {
                issued,
                latency: now - issued,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_finishes_with_its_last_packet() {
        let mut f = FlowState::new(NodeId(0), NodeId(1), CollectiveFlow::all_reduce(2));
        assert_eq!(f.issue(Duration::ZERO), Some(Duration::from_micros(500)));
        assert_eq!(f.backlog.len(), 4);
        for _ in 0..3 {
            f.arrived(0, Duration::from_micros(10));
        }
        assert!(f.stats.done.is_empty());
        f.arrived(0, Duration::from_micros(20));
        assert_eq!(f.stats.done[0].latency, Duration::from_micros(20));
        assert_eq!(f.issue(Duration::from_micros(500)), None, "two ops in all");
        let l = f.stats.latencies(Duration::ZERO..Duration::from_secs(1));
        assert_eq!(quantile(&l, 0.99), Some(Duration::from_micros(20)));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
