//! Fault rules: values that look at each packet on a link and say what happens to it.
//!
//! Rules apply in order and the first one that does not answer [`Verdict::Pass`] wins (turmoil's model).
//! Each link owns its own copies, so a stateful rule (Gilbert-Elliott's good/bad state) follows the
//! packets of that link only. Every random choice comes from the link's seeded generator.

use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use transfer_engine::HEADER_LEN;

use crate::NodeId;

/// What a rule sees of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketInfo {
    /// Sending node.
    pub from: NodeId,
    /// Receiving node.
    pub to: NodeId,
    /// Virtual time since the simulation's epoch when the packet is put on the link.
    pub at: Duration,
    /// Bytes on the wire, header included.
    pub len: usize,
    /// Whether the packet carries KV payload (a data frame) rather than control.
    pub data: bool,
}

/// Which bytes a corruption rule may flip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorruptTarget {
    /// A payload byte (a header byte when the frame has no payload).
    Payload,
    /// A header byte: the header checksum must refuse it.
    Header,
    /// Any byte of the frame.
    Any,
}

/// What happens to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// This rule has no opinion; ask the next one (delivered normally when every rule passes).
    Pass,
    /// Delivered, `0` later than the link alone would deliver it.
    Deliver(Duration),
    /// Lost.
    Drop,
    /// Delivered with the bits of `mask` flipped in byte `offset` of the frame.
    Corrupt {
        /// Byte of the frame (header included) to flip.
        offset: usize,
        /// Bits to flip (never zero).
        mask: u8,
    },
    /// Delivered twice: normally, and once more `0` after that.
    Duplicate(Duration),
}

/// The Gilbert-Elliott bursty-loss model: a good state that loses `loss_good` of packets and a bad state
/// that loses `loss_bad`; each step moves good -> bad with probability `enter` and bad -> good with
/// probability `exit`. The long-run share of steps in the bad state is `enter / (enter + exit)`, and
/// bursts last `1 / exit` steps on average.
///
/// The chain steps once per packet, and, when `slot` is non-zero, once more per `slot` of time since the
/// previous packet: a burst is an event in time, so a sender that backs off for a millisecond must not find
/// the burst still waiting for it as a per-packet chain would.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GilbertElliott {
    /// Probability per packet of going from good to bad.
    pub enter: f64,
    /// Probability per packet of going from bad to good.
    pub exit: f64,
    /// Loss probability in the good state.
    pub loss_good: f64,
    /// Loss probability in the bad state.
    pub loss_bad: f64,
    /// Idle time worth one step of the chain (zero: the chain steps only per packet).
    pub slot: Duration,
    bad: bool,
    last: Option<Duration>,
}

impl GilbertElliott {
    /// The classic two-parameter form (Gilbert's): nothing lost in the good state, everything in the bad.
    #[must_use]
    pub fn new(enter: f64, exit: f64) -> Self {
        Self {
            enter,
            exit,
            loss_good: 0.0,
            loss_bad: 1.0,
            slot: Duration::ZERO,
            bad: false,
            last: None,
        }
    }

    /// The same model, also stepping once per `slot` of idle time.
    #[must_use]
    pub fn with_slot(mut self, slot: Duration) -> Self {
        self.slot = slot;
        self
    }

    /// The long-run loss rate: the time spent in each state times its loss.
    #[must_use]
    pub fn mean_loss(&self) -> f64 {
        let total = self.enter + self.exit;
        if total <= 0.0 {
            return self.loss_good;
        }
        let bad = self.enter / total;
        bad * self.loss_bad + (1.0 - bad) * self.loss_good
    }

    /// Moves the chain on to a packet sent at `at` and says whether it is lost.
    pub fn lose(&mut self, at: Duration, rng: &mut ChaCha8Rng) -> bool {
        let idle = self
            .last
            .map_or(Duration::ZERO, |last| at.saturating_sub(last));
        self.last = Some(at);
        if !self.slot.is_zero() && idle >= self.slot {
            // n steps at once: P(bad) relaxes towards its stationary share by (1 - enter - exit)^n.
            let n = (idle.as_nanos() / self.slot.as_nanos()) as f64;
            let total = self.enter + self.exit;
            if total > 0.0 {
                let stationary = self.enter / total;
                let from = if self.bad { 1.0 } else { 0.0 };
                let p_bad = stationary + (from - stationary) * (1.0 - total).powf(n);
                self.bad = chance(rng, p_bad);
            }
        }
        let flip = if self.bad { self.exit } else { self.enter };
        if chance(rng, flip) {
            self.bad = !self.bad;
        }
        chance(
            rng,
            if self.bad {
                self.loss_bad
            } else {
                self.loss_good
            },
        )
    }
}

/// One fault, as a value. Probabilities are per packet, in `0.0..=1.0`.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultRule {
    /// Each packet is lost with probability `p`.
    Loss {
        /// Loss probability.
        p: f64,
    },
    /// Bursty loss.
    BurstLoss(GilbertElliott),
    /// With probability `p`, one byte of `target` gets one random bit flipped.
    Corrupt {
        /// Corruption probability.
        p: f64,
        /// Which bytes may be hit.
        target: CorruptTarget,
    },
    /// With probability `p`, a packet is delivered twice, the copy up to `spread` later.
    Duplicate {
        /// Duplication probability.
        p: f64,
        /// Largest extra delay of the copy.
        spread: Duration,
    },
    /// With probability `p`, a packet is held back by up to `hold`, so packets sent after it overtake it.
    Reorder {
        /// Reordering probability.
        p: f64,
        /// Largest hold.
        hold: Duration,
    },
    /// Every packet is delayed by a uniform random `0..max` (which reorders packets closer than `max`).
    Jitter {
        /// Largest extra delay.
        max: Duration,
    },
    /// Every packet put on the link from `start` until `end` (virtual time since the epoch) is lost;
    /// `None` never heals.
    Partition {
        /// When the partition starts.
        start: Duration,
        /// When it heals.
        end: Option<Duration>,
    },
}

impl FaultRule {
    /// This rule's verdict on one packet.
    pub fn on_packet(&mut self, packet: &PacketInfo, rng: &mut ChaCha8Rng) -> Verdict {
        match self {
            FaultRule::Loss { p } => {
                if chance(rng, *p) {
                    Verdict::Drop
                } else {
                    Verdict::Pass
                }
            }
            FaultRule::BurstLoss(ge) => {
                if ge.lose(packet.at, rng) {
                    Verdict::Drop
                } else {
                    Verdict::Pass
                }
            }
            FaultRule::Corrupt { p, target } => {
                if packet.len == 0 || !chance(rng, *p) {
                    return Verdict::Pass;
                }
                let header = HEADER_LEN.min(packet.len);
                let range = match target {
                    CorruptTarget::Payload if packet.len > HEADER_LEN => HEADER_LEN..packet.len,
                    CorruptTarget::Payload | CorruptTarget::Header => 0..header,
                    CorruptTarget::Any => 0..packet.len,
                };
                Verdict::Corrupt {
                    offset: rng.random_range(range),
                    mask: 1 << rng.random_range(0..8u32),
                }
            }
            FaultRule::Duplicate { p, spread } => {
                if chance(rng, *p) {
                    Verdict::Duplicate(uniform(rng, *spread))
                } else {
                    Verdict::Pass
                }
            }
            FaultRule::Reorder { p, hold } => {
                if chance(rng, *p) {
                    Verdict::Deliver(uniform(rng, *hold))
                } else {
                    Verdict::Pass
                }
            }
            FaultRule::Jitter { max } => Verdict::Deliver(uniform(rng, *max)),
            FaultRule::Partition { start, end } => {
                if packet.at >= *start && end.is_none_or(|end| packet.at < end) {
                    Verdict::Drop
                } else {
                    Verdict::Pass
                }
            }
        }
    }
}

/// Applies `rules` in order; the first verdict that is not [`Verdict::Pass`] wins.
pub fn judge(rules: &mut [FaultRule], packet: &PacketInfo, rng: &mut ChaCha8Rng) -> Verdict {
    for rule in rules {
        let verdict = rule.on_packet(packet, rng);
        if verdict != Verdict::Pass {
            return verdict;
        }
    }
    Verdict::Pass
}

/// True with probability `p` (clamped to 0..=1); draws nothing when `p` is 0, so a rule that is off
/// leaves the random stream of the others untouched.
fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    if p <= 0.0 {
        return false;
    }
    rng.random_bool(p.min(1.0))
}

/// A uniform random duration in `0..max` (zero when `max` is zero).
fn uniform(rng: &mut ChaCha8Rng, max: Duration) -> Duration {
    let nanos = max.as_nanos().min(u128::from(u64::MAX)) as u64;
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rng.random_range(0..nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn packet(at_ms: u64) -> PacketInfo {
        PacketInfo {
            from: NodeId(0),
            to: NodeId(1),
            at: Duration::from_millis(at_ms),
            len: 1000,
            data: true,
        }
    }

    #[test]
    fn first_rule_that_is_not_pass_wins() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut rules = vec![
            FaultRule::Loss { p: 0.0 },
            FaultRule::Jitter {
                max: Duration::from_millis(1),
            },
            FaultRule::Loss { p: 1.0 },
        ];
        assert!(matches!(
            judge(&mut rules, &packet(0), &mut rng),
            Verdict::Deliver(_)
        ));
    }

    #[test]
    fn gilbert_elliott_loses_its_mean_share_in_bursts() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut ge = GilbertElliott::new(0.03, 0.07);
        assert!((ge.mean_loss() - 0.3).abs() < 1e-9);
        let n = 200_000;
        let (mut lost, mut runs, mut prev) = (0, 0, false);
        for _ in 0..n {
            let l = ge.lose(Duration::ZERO, &mut rng);
            lost += usize::from(l);
            runs += usize::from(l && !prev);
            prev = l;
        }
        let rate = lost as f64 / f64::from(n);
        assert!((rate - 0.3).abs() < 0.02, "loss rate {rate}");
        let mean_burst = lost as f64 / runs as f64;
        assert!(mean_burst > 10.0, "mean burst {mean_burst}");
    }

    #[test]
    fn a_slotted_chain_forgets_its_burst_over_idle_time() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let slot = Duration::from_micros(5);
        let mut ge = GilbertElliott::new(0.03, 0.07).with_slot(slot);
        // Packets 1 ms apart: ~200 slots each, so every packet sees the stationary 30%, independently.
        let n = 20_000u32;
        let lost = (0..n)
            .filter(|i| ge.lose(Duration::from_millis(u64::from(*i)), &mut rng))
            .count();
        let rate = lost as f64 / f64::from(n);
        assert!((rate - 0.3).abs() < 0.02, "loss rate {rate}");
    }

    #[test]
    fn partitions_drop_only_inside_their_window() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut p = FaultRule::Partition {
            start: Duration::from_millis(10),
            end: Some(Duration::from_millis(20)),
        };
        assert_eq!(p.on_packet(&packet(9), &mut rng), Verdict::Pass);
        assert_eq!(p.on_packet(&packet(10), &mut rng), Verdict::Drop);
        assert_eq!(p.on_packet(&packet(20), &mut rng), Verdict::Pass);
    }

    #[test]
    fn header_corruption_stays_in_the_header() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut rule = FaultRule::Corrupt {
            p: 1.0,
            target: CorruptTarget::Header,
        };
        for _ in 0..100 {
            let Verdict::Corrupt { offset, mask } = rule.on_packet(&packet(0), &mut rng) else {
                panic!("p = 1 must corrupt");
            };
            assert!(offset < HEADER_LEN && mask.count_ones() == 1);
        }
    }
}
